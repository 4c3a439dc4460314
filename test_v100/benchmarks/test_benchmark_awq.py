"""benchmarks/kernels/benchmark_awq.py: its arguments and tuning candidates (CPU), and a small run
with --tune into a temporary config folder (GPU)."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks.kernels.benchmark_awq import candidates, main, parse_args
from vllm_volta.model_executor.layers.quantization import w4_linear


@pytest.mark.parametrize("m", [1, 4, 5, 8, 9, 16, 64, 256, 2048])
def test_every_candidate_is_a_valid_launch(m):
    launches = candidates(m)
    assert launches and all(w4_linear.check_config(c, m) is None for c in launches)
    kinds = {c["kernel"] for c in launches}
    assert ("gemv" in kinds) == (m <= 8) and ("gemm" in kinds) == (m >= 2) and ("dense" in kinds) == (m >= 64)


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="--rows must be positive"):
        parse_args(["--rows", "0"])
    assert parse_args([]).rows == [1, 2, 4, 8, 16, 32, 64, 128, 256, 2048]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_small_run_tunes_and_reports(tmp_path, monkeypatch):
    from vllm_volta.kernel_configs import clear_kernel_config_cache

    monkeypatch.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    try:
        result = main(["--shapes", "o", "--rows", "1", "9", "--tune", "--output-json", str(tmp_path / "out.json")])
    finally:
        clear_kernel_config_cache()
    assert json.loads((tmp_path / "out.json").read_text())["benchmark"] == "kernels/awq"
    assert [r["m"] for r in result["results"]] == [1, 9]
    assert all(r["us"]["w4"] > 0 and r["weight_gb_per_s"]["fp16"] > 0 for r in result["results"])
    (written,) = result["tuned_files"]
    table = json.loads(open(written).read())
    assert set(table) == {"1", "9"} and table["1"]["kernel"] == "gemv"
