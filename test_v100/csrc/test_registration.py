"""Dispatcher introspection of the built extension: vLLM's schemas, and exactly one kernel
per (op, dispatch key), with the CUDA kernel coming from the adapter exactly in a V100 build."""

from __future__ import annotations

import re

import pytest
import torch

import vllm_volta._C as C
import vllm_volta._custom_ops  # noqa: F401

# Ops whose CUDA kernel is the native one, or the V100 adapter when C.V100_ADAPTER.
ADAPTED_OPS = {
    "rms_norm": "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()",
    "fused_add_rms_norm": "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()",
    "silu_and_mul": "silu_and_mul(Tensor! result, Tensor input) -> ()",
    "gelu_and_mul": "gelu_and_mul(Tensor! out, Tensor input) -> ()",
    "gelu_tanh_and_mul": "gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()",
}

# Volta-safe CUDA kernels registered in every CUDA build (no CPU kernel), plus Meta.
CUDA_ONLY_OPS = {
    "awq_dequantize": "awq_dequantize(Tensor! out, Tensor qweight, Tensor qzeros, Tensor scales) -> ()",
    "awq_gemv": "awq_gemv(Tensor! out, Tensor input, Tensor qweight, Tensor qzeros, Tensor scales) -> ()",
    "reshape_and_cache": ("reshape_and_cache(Tensor key, Tensor value, Tensor! kv_cache, Tensor slot_mapping, "
                          "float k_scale=1.0, float v_scale=1.0) -> ()"),
    "paged_attention_decode": (
        "paged_attention_decode(Tensor! out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor seq_lens, "
        "float scale, int max_seq_len, int partition_size=512, int num_threads=128, int sliding_window=0, "
        "float logits_soft_cap=0.0, float k_scale=1.0, float v_scale=1.0) -> ()"
    ),
    "rotary_embedding": (
        "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
        "bool is_neox) -> ()"
    ),
    "gumbel_sample": ("gumbel_sample(Tensor! sampled, Tensor logits, Tensor temperature, Tensor seeds, "
                      "Tensor! workspace, int seed_offset=0, Tensor!? sampled_host=None) -> ()"),
    "greedy_sample": ("greedy_sample(Tensor! sampled, Tensor logits, Tensor! workspace, "
                      "Tensor!? sampled_host=None) -> ()"),
    "stage_decode_inputs": (
        "stage_decode_inputs(Tensor! token_table, Tensor! seq_lens, Tensor! block_table, Tensor src_token_table, "
        "Tensor src_seq_lens, Tensor src_block_table, Tensor? input_ids=None) -> ()"
    ),
    "gemv": ("gemv(Tensor! out, Tensor input, Tensor weight, Tensor? bias, int rows_per_block=0, "
             "Tensor? norm_weight=None, float epsilon=0.0) -> ()"),
    "gemv_rope_cache": (
        "gemv_rope_cache(Tensor! out, Tensor input, Tensor weight, Tensor? bias, Tensor positions, Tensor! kv_cache, "
        "Tensor slot_mapping, Tensor cos_sin_cache, bool is_neox, Tensor? norm_weight=None, float epsilon=0.0) -> ()"
    ),
}

_LINE = re.compile(r"^(\w+)(?: \(inactive\))?: registered at (\S+?):\d+")


def same_schema(actual: torch._C.FunctionSchema, namespace: str, vllm_schema: str) -> bool:
    return str(actual) == str(torch._C.parse_schema(f"{namespace}::{vllm_schema}"))


def registrations(qualified_name: str) -> dict[str, list[str]]:
    """dispatch key -> source files of every kernel registered for it (inactive ones too)."""
    found: dict[str, list[str]] = {}
    for line in torch._C._dispatch_dump(qualified_name).splitlines():
        m = _LINE.match(line)
        if m and m.group(1) != "debug":  # "debug:" is where the schema was defined
            found.setdefault(m.group(1), []).append(m.group(2))
    return found


@pytest.mark.parametrize("op", list(ADAPTED_OPS) + list(CUDA_ONLY_OPS))
def test_schema(op):
    assert same_schema(getattr(torch.ops._C, op).default._schema, "_C", {**ADAPTED_OPS, **CUDA_ONLY_OPS}[op])


@pytest.mark.parametrize("op", list(ADAPTED_OPS))
def test_exactly_one_kernel_per_dispatch_key(op):
    regs = registrations(f"_C::{op}")
    expected_keys = {"CPU", "Meta"} | ({"CUDA"} if C.BUILT_WITH_CUDA else set())
    assert set(regs) == expected_keys, regs
    for key, files in regs.items():
        assert len(files) == 1, f"_C::{op} has {len(files)} kernels for {key}: {files}"
    # CPU runs the adapter's code in every build.
    assert regs["CPU"][0].endswith("torch_bindings.cpp")
    if C.BUILT_WITH_CUDA:
        source = "torch_bindings.cpp" if C.V100_ADAPTER else "cuda_bindings.cpp"
        assert regs["CUDA"][0].endswith(source), (C.V100_ADAPTER, regs["CUDA"])


@pytest.mark.parametrize("op", list(CUDA_ONLY_OPS))
def test_cuda_only_ops_have_one_cuda_kernel_in_every_cuda_build(op):
    regs = registrations(f"_C::{op}")
    assert set(regs) == {"Meta"} | ({"CUDA"} if C.BUILT_WITH_CUDA else set()), regs
    assert all(len(files) == 1 for files in regs.values()), regs
    if C.BUILT_WITH_CUDA:
        assert regs["CUDA"][0].endswith("cuda_bindings.cpp")


@pytest.mark.parametrize("op", list(ADAPTED_OPS))
def test_adapter_library_mirrors_schemas(op):
    regs = registrations(f"_C_adapter::{op}")
    assert set(regs) == {"CPU"} | ({"CUDA"} if C.BUILT_WITH_CUDA else set())
    assert all(len(files) == 1 for files in regs.values())
    assert same_schema(getattr(torch.ops._C_adapter, op).default._schema, "_C_adapter", ADAPTED_OPS[op])


def test_build_info_is_consistent_with_the_adapter_rule():
    archs = [a for a in C.CUDA_ARCHS.split(",") if a]
    if not C.BUILT_WITH_CUDA:
        assert archs == [] and C.V100_ADAPTER == 0
        return
    numeric = [int(re.match(r"\d+", a).group()) for a in archs]
    assert numeric, "a CUDA build must record its target archs"
    assert bool(C.V100_ADAPTER) == all(n < 80 for n in numeric), (C.CUDA_ARCHS, C.V100_ADAPTER)
