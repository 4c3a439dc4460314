"""Gated DeltaNet decode kernel (gated_delta_rule_decode) on a Qwen3.5 linear-attention layer.

    python benchmarks/kernels/benchmark_gated_delta_rule.py --batch-sizes 1 8 64 256

Default shape: Qwen3.5-9B (16 key heads, 32 value heads, head dims 128; float32 state of
2 MiB per sequence), float16 activations, gates fused (raw a / b projections, A_log, dt_bias)
as the layer calls it. Each batch size is one CUDA graph of calls over distinct state slots of a
pool larger than the L2 cache, so every call reads and writes its states in DRAM, as a decode
step does. Prints one JSON document: per batch size and tile width (col_threads, 0 = the
launcher's choice) microseconds per call and the achieved state bandwidth (state bytes read +
written per call / time) as a fraction of the device-to-device copy bandwidth measured in the
same run; plus one varlen prefill (--prefill-len tokens of one sequence) in tokens per second.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.kernels.kernel_timing import graph_replay_seconds, num_arg_sets  # noqa: E402
from benchmarks.utils import device_info, log, measure_copy_bandwidth, require_cuda, run_and_emit  # noqa: E402

COL_THREADS = (0, 2, 4, 8)
DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--num-k-heads", type=int, default=16)
    p.add_argument("--num-v-heads", type=int, default=32)
    p.add_argument("--head-k-dim", type=int, default=128)
    p.add_argument("--head-v-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16", help="activation dtype")
    p.add_argument("--prefill-len", type=int, default=2048, help="tokens of the prefill measurement (0: skip)")
    p.add_argument("--output-json", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if not all(b >= 1 for b in args.batch_sizes):
        raise ValueError(f"--batch-sizes must be >= 1, got {args.batch_sizes}")
    if args.num_v_heads % args.num_k_heads:
        raise ValueError(f"--num-v-heads ({args.num_v_heads}) must be a multiple of --num-k-heads "
                         f"({args.num_k_heads})")
    if args.prefill_len < 0:
        raise ValueError(f"--prefill-len must be >= 0, got {args.prefill_len}")
    return args


def _inputs(tokens: int, args: argparse.Namespace, device: torch.device) -> dict[str, torch.Tensor]:
    """q / k / v as views of one conv-output row per token, raw gate projections, A_log, dt_bias."""
    dtype = DTYPES[args.dtype]
    hk, hv, dk, dv = args.num_k_heads, args.num_v_heads, args.head_k_dim, args.head_v_dim
    mixed = torch.randn(tokens, 2 * hk * dk + hv * dv, dtype=dtype, device=device)
    return dict(q=mixed[:, :hk * dk].view(tokens, hk, dk), k=mixed[:, hk * dk:2 * hk * dk].view(tokens, hk, dk),
                v=mixed[:, 2 * hk * dk:].view(tokens, hv, dv), a=torch.randn(tokens, hv, dtype=dtype, device=device),
                b=torch.randn(tokens, hv, dtype=dtype, device=device),
                A_log=torch.empty(hv, device=device).uniform_(1, 16).log(), dt_bias=torch.randn(hv, device=device),
                out=torch.empty(tokens, hv, dv, dtype=dtype, device=device))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = require_cuda("benchmark_gated_delta_rule.py")
    from vllm_volta import _custom_ops as ops

    hv, dk, dv = args.num_v_heads, args.head_k_dim, args.head_v_dim
    slot_bytes = hv * dk * dv * 4
    copy_bw = measure_copy_bandwidth(device)["bandwidth_bytes_per_s"]
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {device}; state {slot_bytes / 2**20:.1f} MiB per sequence")
    max_batch = max(args.batch_sizes)
    # One pool serves every batch size: at least the working set, at least two calls' worth.
    pool = max(num_arg_sets(slot_bytes, max_sets=1 << 20), 2 * max_batch) + 1
    state = torch.zeros(pool, hv, dk, dv, dtype=torch.float32, device=device)
    scale = dk ** -0.5
    results = []
    for batch in args.batch_sizes:
        x = _inputs(batch, args, device)
        sets = min(num_arg_sets(batch * slot_bytes, max_sets=256), (pool - 1) // batch)
        slot_sets = [torch.arange(1 + i * batch, 1 + (i + 1) * batch, dtype=torch.int32, device=device)
                     for i in range(sets)]
        for ct in COL_THREADS:
            def work(ct: int = ct) -> None:
                for slots in slot_sets:
                    ops.gated_delta_rule_decode(x["out"], x["q"], x["k"], x["v"], x["a"], x["b"], state, slots,
                                                scale, True, x["A_log"], x["dt_bias"], ct)
            seconds = graph_replay_seconds(work, device, replays=5) / sets
            state_bytes = 2 * batch * slot_bytes
            results.append({"batch": batch, "col_threads": ct, "us": seconds * 1e6,
                            "state_bytes": state_bytes, "state_gb_per_s": state_bytes / seconds / 1e9,
                            "fraction_of_copy_bandwidth": state_bytes / seconds / copy_bw})
            log(f"B={batch} col_threads={ct}: {seconds * 1e6:.1f} us, "
                f"{state_bytes / seconds / copy_bw:.0%} of copy bandwidth")
    prefill = None
    if args.prefill_len:
        x = _inputs(args.prefill_len, args, device)
        qsl = torch.tensor([0, args.prefill_len], dtype=torch.int32, device=device)
        slots = torch.tensor([1], dtype=torch.int32, device=device)
        seconds = graph_replay_seconds(lambda: ops.gated_delta_rule_prefill(
            x["out"], x["q"], x["k"], x["v"], x["a"], x["b"], state, slots, qsl, None, scale, True, x["A_log"],
            x["dt_bias"], 0), device, replays=3)
        prefill = {"tokens": args.prefill_len, "us": seconds * 1e6, "tokens_per_s": args.prefill_len / seconds}
        log(f"prefill of {args.prefill_len} tokens: {seconds * 1e3:.2f} ms")
    return {"benchmark": "gated_delta_rule_decode", "device": device_info(),
            "shape": {"num_k_heads": args.num_k_heads, "num_v_heads": hv, "head_k_dim": dk, "head_v_dim": dv,
                      "activation_dtype": args.dtype, "state_dtype": "float32", "fused_gates": True},
            "copy_bandwidth_gb_per_s": copy_bw / 1e9, "decode": results, "prefill_one_sequence": prefill}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    run_and_emit(lambda: run(args), args.output_json)


if __name__ == "__main__":
    main()
