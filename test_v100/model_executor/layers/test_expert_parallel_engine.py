"""Expert parallelism through the engine on CPU (gloo): with enable_expert_parallel and two ranks,
Mixtral, Qwen2-MoE (shared expert), Qwen3.5-MoE (Gated DeltaNet, shared expert) and Gemma 4's MoE
kind (experts beside a dense MLP) give the greedy tokens of one process, and of plain tensor
parallelism where a shared expert joins the experts' all-reduce; each rank's model holds only its
own experts (whole) while the other layers stay tensor-parallel; bad configurations are refused."""

from __future__ import annotations

import pytest
import torch

from test_v100.model_executor.models.hf_compare import load_ours
from test_v100.worker.tiny_models import VOCAB_SIZE, random_prompts, save_tiny_model, tiny_config
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.model_executor.layers.expert_parallel import expert_parallel, linear_placement
from vllm_volta.model_executor.layers.moe import MoE
from vllm_volta.sampling_params import SamplingParams

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) expert parallelism")

ARCHS = ("mixtral", "qwen2_moe", "qwen3_5_moe", "gemma4")


def _save(path, arch: str) -> None:
    if arch == "gemma4":  # 4 experts, top-2, beside the GeGLU MLP
        from test_v100.model_executor.models.test_gemma4 import save_hf, text_config
        save_hf(text_config("moe", vocab_size=VOCAB_SIZE), path)
        return
    if arch != "qwen2_moe":
        save_tiny_model(path, arch, seed=ARCHS.index(arch))
        return
    # Qwen2-MoE on tiny_models' shapes: top-2 of 4 experts plus the gated shared expert.
    import transformers
    common = {k: getattr(tiny_config("qwen2"), k) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "max_position_embeddings", "initializer_range", "rms_norm_eps", "tie_word_embeddings")}
    cfg = transformers.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                      shared_expert_intermediate_size=64, intermediate_size=128, **common)
    torch.manual_seed(1)
    transformers.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    paths = {}
    for arch in ARCHS:
        paths[arch] = tmp_path_factory.mktemp(arch)
        _save(paths[arch], arch)
    return paths


def _greedy(path, prompts, **engine_kwargs) -> list[list[int]]:
    if not torch.cuda.is_available():
        engine_kwargs.setdefault("cpu_kvcache_space", 0.01)
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(path), skip_tokenizer_init=True,
                                                   max_num_batched_tokens=32, **engine_kwargs))
    try:
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        final = {}
        while engine.has_unfinished_requests():
            final.update({o.request_id: o for o in engine.step(finished_only=True)})
    finally:
        engine.shutdown()
    return [list(final[str(i)].outputs[0].token_ids) for i in range(len(prompts))]


@cpu_only
@pytest.mark.parametrize("arch", ARCHS)
def test_ep2_matches_one_process_and_tp2(checkpoints, arch):
    """Tensor parallelism too where the shared expert now shares the routed experts' all-reduce
    (elsewhere the TP path is the layer's, whose shares test_expert_parallel.py sums)."""
    prompts = random_prompts(3, 5, 40, seed=ARCHS.index(arch))
    one = _greedy(checkpoints[arch], prompts)
    assert _greedy(checkpoints[arch], prompts, tensor_parallel_size=2, enable_expert_parallel=True) == one
    if arch in ("qwen2_moe", "qwen3_5_moe"):
        assert _greedy(checkpoints[arch], prompts, tensor_parallel_size=2) == one


def _moes(model) -> dict[str, MoE]:
    return {name: m for name, m in model.named_modules() if isinstance(m, MoE)}


@pytest.mark.parametrize("arch", ARCHS)
def test_each_rank_loads_only_its_experts(checkpoints, arch, set_tp):
    whole = load_ours(checkpoints[arch])
    whole_moes = _moes(whole)
    assert whole_moes
    rank_bytes = []
    for rank in range(2):
        set_tp(rank, 2)
        with expert_parallel(True):
            ours = load_ours(checkpoints[arch])
        for name, moe in _moes(ours).items():
            full = whole_moes[name]
            p = linear_placement(full.num_experts, 2, rank)
            assert moe.w13.shape[0] == p.num_local < full.num_experts
            # Whole experts, exactly the checkpoint's (as the one-rank model loaded them).
            torch.testing.assert_close(moe.w13, full.w13[p.start:p.start + p.num_local], rtol=0, atol=0)
            torch.testing.assert_close(moe.w2, full.w2[p.start:p.start + p.num_local], rtol=0, atol=0)
            shared = getattr(moe, "shared_expert", None)
            if shared is not None:  # the shared expert stays tensor-parallel
                assert shared.gate_up_proj.weight.shape[0] == full.shared_expert.gate_up_proj.weight.shape[0] // 2
        rank_bytes.append(sum(m.w13.nbytes + m.w2.nbytes for m in _moes(ours).values()))
    assert sum(rank_bytes) == sum(m.w13.nbytes + m.w2.nbytes for m in whole_moes.values())


@pytest.mark.parametrize("ep", [True, False], ids=["ep", "tp"])
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_5_moe"])
def test_rank_shares_sum_to_the_whole_block(checkpoints, arch, ep, set_tp):
    """Each rank's forward_local (routed experts plus the TP-sharded shared expert, before the
    all-reduce) over both ranks adds up to the one-rank MoE block."""
    name, whole = next(iter(_moes(load_ours(checkpoints[arch])).items()))
    x = torch.randn(7, whole.gate.weight.shape[1], generator=torch.Generator().manual_seed(2))
    total = torch.zeros_like(x)
    for rank in range(2):
        set_tp(rank, 2)
        with expert_parallel(ep):
            total += _moes(load_ours(checkpoints[arch]))[name].forward_local(x)
    torch.testing.assert_close(total, whole(x), atol=1e-5, rtol=1e-5)


@cpu_only
def test_too_many_ranks_for_the_experts_is_refused(tmp_path):
    save_tiny_model(tmp_path, "mixtral", num_local_experts=1, num_experts_per_tok=1)
    with pytest.raises(Exception, match=r"enable_expert_parallel: num_experts \(1\) must be at least the expert "
                                        r"parallel size \(tensor_parallel_size=2\)"):
        _greedy(tmp_path, [[5, 6, 7]], tensor_parallel_size=2, enable_expert_parallel=True)


@cpu_only
def test_a_dense_model_runs_with_the_flag(tmp_path):
    save_tiny_model(tmp_path, "qwen2")
    prompts = random_prompts(2, 5, 20, seed=9)
    assert _greedy(tmp_path, prompts, enable_expert_parallel=True) == _greedy(tmp_path, prompts)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_ep2_on_gpus_matches_one_gpu(checkpoints, arch):
    """Two GPUs (NCCL), float32: the experts' decode GEMVs with other ranks' pairs weighted 0, and
    the host-grouped cuBLAS loop over local experts for prompts."""
    prompts = random_prompts(3, 5, 40, seed=ARCHS.index(arch))
    common = dict(dtype="float32", gpu_memory_utilization=0.2)
    one = _greedy(checkpoints[arch], prompts, **common)
    assert _greedy(checkpoints[arch], prompts, tensor_parallel_size=2, enable_expert_parallel=True, **common) == one
