"""Piecewise CUDA graphs: steps with prompt tokens, replayed between eager attention calls.

A step that is not pure decode (new prompts, prompt chunks next to decodes) cannot replay one
graph: its attention kernels depend on the step's sequences (variable-length prefill, which rows
decode). Everything between two attention calls can: the embedding, norms, projections and the
MLP. So for each token count T of a list (8 ... 2048), the model's forward is captured as L + 1
graphs cut at its L attention calls. A step of n tokens replays the graphs of the smallest T >= n
(rows n..T-1 are padding: stale token ids whose rows are dropped) and runs each layer's attention
eagerly in between, on its real n rows: RoPE, the KV-cache write and the attention read the
query/key/value the graph left in static buffers, and the attention output is copied into the
static buffer the next graph reads. This is vLLM's piecewise mode (its `FULL_AND_PIECEWISE`:
full graphs for pure decode, pieces for the rest); vLLM cuts the graph with torch.compile, here
the Attention layers' `capture_hook` cuts the capture.

Why: launching each layer's kernels from Python costs host time in every such step (a serving
engine's core thread at 256 streams on the H200 spent 37% of its time in the eager forward). On
the H200 a lone 512-token prompt of the Qwen2.5-1.5B shape took 8.6 ms eagerly, 5.4 ms in pieces.

The attention calls run eagerly on the step's own metadata, so models with several KV-cache
groups need nothing staged here: each layer takes its group's block table and slot mapping from it
(AttentionMetadata.for_group), and no captured piece reads a slot mapping.

Every size reads and writes the same static buffers (views of the largest) and allocates from
the decode graphs' memory pool, captured largest first: what one size's graphs allocate is
reused by the next, as replays of different sizes never overlap.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vllm_volta.attention.layer import Attention
from vllm_volta.attention.metadata import AttentionMetadata
from vllm_volta.logger import init_logger
from vllm_volta.worker.driver_graph import choose_capture_path, new_capture

if TYPE_CHECKING:
    from vllm_volta.worker.inputs import ModelInput
    from vllm_volta.worker.model_runner import ModelRunner

logger = init_logger(__name__)

MAX_PIECEWISE_TOKENS = 2048  # larger steps keep the GPU busy longer than their launches take


def piecewise_sizes(max_num_batched_tokens: int, cap: int = MAX_PIECEWISE_TOKENS) -> list[int]:
    """Token counts to capture: 8, 16, 32, 64, then multiples of 64 to 512 and of 128 to `cap`,
    and the token budget itself when it is below `cap` (every step then fits a size)."""
    limit = min(max_num_batched_tokens, cap)
    sizes = [8, 16, 32, 64] + list(range(128, 512, 64)) + list(range(512, cap + 1, 128))
    return sorted({s for s in sizes if s <= limit} | {limit})


@dataclass
class _Call:
    """One attention call of the captured forward: the layer and its cache and RoPE."""

    layer: Attention
    kv_cache: torch.Tensor
    rotary_emb: Any


class _GraphChain:
    """Consecutive captures on one pool: `cut()` ends the running graph and starts the next."""

    def __init__(self, use_driver: bool, pool: Any) -> None:
        self.use_driver = use_driver
        self.pool = pool
        self.graphs: list[Any] = []
        self._open: Any = None

    def start(self) -> None:
        graph, ctx, self.pool = new_capture(self.use_driver, self.pool)
        ctx.__enter__()
        self._open = (graph, ctx)

    def stop(self, exc: BaseException | None = None) -> None:
        if self._open is None:  # a failed cut(): its capture already ended
            return
        graph, ctx = self._open
        self._open = None
        if exc is not None:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
            return
        ctx.__exit__(None, None, None)
        self.graphs.append(graph)
        if self.pool is None:  # torch's graph: its own pool, shared by the next captures
            self.pool = graph.pool()

    def cut(self) -> None:
        self.stop()
        self.start()


class PiecewiseGraphRunner:
    """Captured pieces of one model + KV cache for each token count, and how to replay them."""

    def __init__(self, runner: ModelRunner, sizes: list[int], pool: Any = None) -> None:
        self.runner = runner
        self.sizes = sizes
        self.max_size = sizes[-1]
        self.pool = pool
        self.layers = [m for m in runner.model.modules() if isinstance(m, Attention)]
        if not self.layers:
            raise ValueError("piecewise CUDA graphs need a model with Attention layers")
        widths = {(m.num_heads * m.head_size, m.num_kv_heads * m.head_size) for m in self.layers}
        if len(widths) != 1:
            raise ValueError(f"piecewise CUDA graphs need one attention shape in all layers, got {widths}")
        (q_width, kv_width), = widths
        n, device, dtype = self.max_size, runner.device, runner.dtype
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        # Between the pieces: query / key / value (written by a piece, read by the attention),
        # the attention output (the other way) and the forward's output.
        self.query = torch.zeros(n, q_width, dtype=dtype, device=device)
        self.key = torch.zeros(n, kv_width, dtype=dtype, device=device)
        self.value = torch.zeros(n, kv_width, dtype=dtype, device=device)
        self.attn_out = torch.zeros(n, q_width, dtype=dtype, device=device)
        self.hidden = torch.zeros(n, runner.model_config.text_config.hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, list[Any]] = {}
        self.calls: list[_Call] = []
        self.num_replays = 0  # observable: tests check the pieces are really used

    @classmethod
    def capture(cls, runner: ModelRunner, max_num_batched_tokens: int, pool: Any = None
                ) -> PiecewiseGraphRunner:
        graphs = cls(runner, piecewise_sizes(max_num_batched_tokens), pool)
        graphs._capture_all()
        return graphs

    # ---- capture ----------------------------------------------------------------
    def _metadata(self, size: int) -> AttentionMetadata:
        """What the captured forward is given: only the attention layers read it, and they are
        cut out (a decode-sized projection would read slot_mapping: none is at these sizes)."""
        device = self.input_ids.device
        return AttentionMetadata(
            num_actual_tokens=size,
            query_start_loc=torch.tensor([0, size], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([size], dtype=torch.int32, device=device),
            block_table=torch.zeros(1, 1, dtype=torch.int32, device=device),
            slot_mapping=self.slot_mapping[:size], max_query_len=size, max_seq_len=size,
            query_start_loc_cpu=torch.tensor([0, size], dtype=torch.int32),
            seq_lens_cpu=torch.tensor([size], dtype=torch.int32))

    def _forward(self, size: int, md: AttentionMetadata, hook: Any) -> None:
        """The model's forward over the static buffers, with `hook` in place of every attention."""
        runner = self.runner
        for layer in self.layers:
            layer.capture_hook = hook
        try:
            out = runner.model(self.input_ids[:size], self.positions[:size], runner.kv_caches, md,
                               final_norm=False)
            self.hidden[:size].copy_(out)
        finally:
            for layer in self.layers:
                layer.capture_hook = None

    def _hand_over(self, size: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                   ) -> torch.Tensor:
        self.query[:size].copy_(query)
        self.key[:size].copy_(key)
        self.value[:size].copy_(value)
        return self.attn_out[:size]

    def _capture_size(self, size: int, use_driver: bool) -> None:
        calls: list[_Call] = []
        chain = _GraphChain(use_driver, self.pool)

        def cut(layer: Attention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, rope: tuple | None, kv_cached: bool) -> torch.Tensor:
            if kv_cached:
                raise RuntimeError("a projection wrote the KV cache inside a piecewise capture")
            out = self._hand_over(size, query, key, value)
            calls.append(_Call(layer, kv_cache, None if rope is None else rope[0]))
            chain.cut()
            return out

        md = self._metadata(size)
        # One run outside the capture first: library handles and kernels load lazily.
        self._forward(size, md, lambda _l, q, k, v, *_: self._hand_over(size, q, k, v))
        torch.cuda.synchronize(self.runner.device)
        chain.start()
        try:
            self._forward(size, md, cut)
        except BaseException as e:
            chain.stop(e)
            raise
        chain.stop()
        self.pool = chain.pool
        if not self.calls:
            self.calls = calls
        if [c.layer for c in calls] != [c.layer for c in self.calls]:
            raise RuntimeError("the model called its attention layers in another order")
        self.graphs[size] = chain.graphs

    @torch.inference_mode()
    def _capture_all(self) -> None:
        device = self.runner.device
        before = torch.cuda.mem_get_info(device)[0]
        start = time.perf_counter()
        use_driver, how = choose_capture_path()
        for size in reversed(self.sizes):  # largest first: smaller sizes reuse its memory
            self._capture_size(size, use_driver)
        torch.cuda.synchronize(device)
        used = before - torch.cuda.mem_get_info(device)[0]
        logger.info("Captured piecewise CUDA graphs (%s) for steps of up to %d tokens: %d sizes "
                    "x %d pieces around the attention layers, %.1f s, %.0f MiB", how, self.max_size,
                    len(self.sizes), len(self.calls) + 1, time.perf_counter() - start, used / 2**20)

    # ---- replay -----------------------------------------------------------------
    def can_run(self, inp: ModelInput) -> bool:
        return 0 < inp.num_tokens <= self.max_size

    def padded_size(self, num_tokens: int) -> int:
        return next(s for s in self.sizes if s >= num_tokens)

    def run(self, inp: ModelInput) -> torch.Tensor:
        """The step's forward (the residual stream before the final norm, [n, hidden])."""
        n = inp.num_tokens
        graphs = self.graphs[self.padded_size(n)]
        self.input_ids[:n].copy_(inp.input_ids if inp.replace_ids is None else inp.replace_ids)
        md, positions = inp.attn_metadata, inp.positions
        query, key, value, attn_out = self.query[:n], self.key[:n], self.value[:n], self.attn_out[:n]
        for graph, call in zip(graphs, self.calls):
            graph.replay()
            rope = None if call.rotary_emb is None else (call.rotary_emb, positions)
            attn_out.copy_(call.layer.forward(query, key, value, call.kv_cache, md, rope=rope))
        graphs[-1].replay()
        self.num_replays += 1
        return self.hidden[:n]
