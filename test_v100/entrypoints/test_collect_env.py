"""`vllm-volta collect-env`: on this CPU machine, and with VLLM_VOLTA_DEVICE_CAPABILITY (the GPU
decisions of that capability); every reported decision checked against the platform layer and
the extension asked directly."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_volta.entrypoints import collect_env
from vllm_volta.entrypoints.cli import main, parse_args

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU machine's report")


def report() -> dict:
    return dict(collect_env.collect())


@cpu_only
def test_cpu_report_matches_the_platform_and_the_extension(clean_env):
    from vllm_volta import _C
    from vllm_volta.platforms.cpu import CpuPlatform

    r = report()
    assert r["device"]["platform"] == "CpuPlatform" and r["device"]["VLLM_VOLTA_DEVICE_CAPABILITY"] == "unset"
    ext = r["extension vllm_volta._C"]
    assert (ext["BUILT_WITH_CUDA"], ext["V100_ADAPTER"]) == (bool(_C.BUILT_WITH_CUDA), bool(_C.V100_ADAPTER))
    assert r["versions"]["torch"] == torch.__version__
    for ckpt in ("bfloat16", "float16", "float32"):
        assert r["dtype"][f"--dtype auto, {ckpt} checkpoint"].startswith("float32 (CPU: ")
    chosen = CpuPlatform().get_attn_backend(dtype=torch.float32, head_size=128).name
    assert r["attention"]["chosen"] == chosen and r["attention"][chosen].startswith("CHOSEN")
    assert r["runtime"]["CUDA graphs"].startswith("none")
    assert not any("emulated" in title for title in r)  # no override: no GPU sections


@cpu_only
@pytest.mark.parametrize("cap,run_dtype,bf16_ok,all_reduce", [
    ("7.0", "float16", False, "off"), ("7.5", "float16", False, "off"), ("8.0", "bfloat16", True, "available"),
])
def test_capability_override_reports_that_gpus_decisions(clean_env, cap, run_dtype, bf16_ok, all_reduce):
    from vllm_volta.platforms.attention_selector import check_attn_backend
    from vllm_volta.platforms.cuda import CudaPlatform

    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    r = report()
    dev, dt, attn = r["device (emulated GPU)"], r["dtype (emulated GPU)"], r["attention (emulated GPU)"]
    assert (dev["platform"], dev["capability used"], dev["VLLM_VOLTA_DEVICE_CAPABILITY"]) == ("CudaPlatform", cap, cap)
    assert dt["--dtype auto, bfloat16 checkpoint"].split()[0] == run_dtype
    assert dt["--dtype auto, float32 checkpoint"].split()[0] == "float16"
    assert dt["--dtype bfloat16"].startswith("accepted" if bf16_ok else "refused:") and (bf16_ok or "--dtype half" in dt["--dtype bfloat16"])
    plat = CudaPlatform()
    dtype = getattr(torch, run_dtype)
    assert attn["chosen"] == plat.get_attn_backend(dtype=dtype, head_size=128).name
    for name in plat.get_attn_backend_priority():  # every rejected backend with its reasons
        _, reasons = check_attn_backend(name, capability=plat.get_device_capability(), dtype=dtype,
                                        head_size=128, device_type="cuda")
        if reasons:
            assert attn[name] == "rejected: " + "; ".join(reasons)
    assert r["runtime (emulated GPU)"]["custom all-reduce"].startswith(all_reduce)
    assert r["runtime (emulated GPU)"]["CUDA graphs"].startswith("FULL_AND_PIECEWISE")


@cpu_only
def test_user_kernel_config_folder_is_listed(clean_env, tmp_path):
    (tmp_path / "op=gemv,n=1,dtype=float16,device_name=cpu.json").write_text("{}")
    (tmp_path / "op=gemv,n=1,dtype=float16,device_name=NVIDIA_H200.json").write_text("{}")
    clean_env.setenv("VLLM_VOLTA_KERNEL_CONFIG_DIR", str(tmp_path))
    kc = report()["kernel configs"]
    assert kc["searched"][0] == str(tmp_path)
    assert kc[str(tmp_path)].startswith("2 files, 1 for this device: op=gemv")


@cpu_only
def test_attention_env_override_is_reported(clean_env):
    clean_env.setenv("VLLM_VOLTA_ATTENTION_BACKEND", "torch_sdpa")
    assert report()["attention"]["VLLM_VOLTA_ATTENTION_BACKEND"] == "TORCH_SDPA"


@cpu_only
def test_cli_prints_text_and_json(clean_env, capsys):
    assert parse_args(["collect-env", "--json"]).json is True
    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0")
    main(["collect-env", "--json"])
    data = json.loads(capsys.readouterr().out)  # log lines go to stderr: stdout is the JSON alone
    assert data["device (emulated GPU)"]["capability used"] == "7.0"
    main(["collect-env"])
    text = capsys.readouterr().out
    assert "== attention (emulated GPU) ==" in text and "  chosen: " in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_report_matches_the_device_and_the_extension(clean_env):
    from vllm_volta import _C
    from vllm_volta.platforms import get_current_platform

    r = report()
    plat = get_current_platform()
    cap = "%d.%d" % torch.cuda.get_device_capability(0)
    assert (r["device"]["platform"], r["device"]["physical capability"], r["device"]["capability used"]) == (
        "CudaPlatform", cap, cap)
    ext = r["extension vllm_volta._C"]
    assert (ext["BUILT_WITH_CUDA"], ext["V100_ADAPTER"], ext["CUDA_ARCHS"]) == (
        True, bool(_C.V100_ADAPTER), _C.CUDA_ARCHS or "none")
    run_dtype = plat.resolve_dtype("auto", torch.bfloat16)
    assert r["attention"]["chosen"] == plat.get_attn_backend(dtype=run_dtype, head_size=128).name
    assert r["versions"]["driver"][0].isdigit()
    if run_dtype == torch.float16:
        assert r["linear kernels"]["dense"].startswith("gemv kernel")
        assert "w4_gemv" in r["linear kernels"]["AWQ / GPTQ 4-bit"]
        assert "Q4_K" in r["linear kernels"]["GGUF"] and "gguf_gemv" in r["linear kernels"]["GGUF"]
        assert "moe_w4 GEMVs" in r["linear kernels"]["mixture of experts"]
        assert r["linear kernels"]["mixture of experts"].startswith("on the device")
    fp8 = r["linear kernels"]["FP8"]
    assert "fp8_gemv" in fp8  # float16, or bfloat16 on an SM80+ build: the W8A16 kernels serve it
    cap_used = tuple(int(v) for v in r["device"]["capability used"].split("."))
    if cap_used < (8, 9):
        assert fp8.endswith("no FP8 tensor cores below SM89")
    else:
        assert "W8A8" in fp8 or fp8.endswith("triton is not installed: no W8A8 GEMM")


@cpu_only
@pytest.mark.parametrize("cap", ["7.0", "7.5", "8.0", "8.9", "9.0"])
def test_quantized_paths_follow_the_capability_and_the_build(clean_env, cap):
    """FP8 by capability (W8A8 only from SM89), GGUF / MoE / KV-cache lines as the layers decide them."""
    from vllm_volta import _C
    from vllm_volta.attention.kv_cache_dtype import KV_CACHE_DTYPES
    from vllm_volta.model_executor.layers.quantization.gguf import kernels_reason

    clean_env.setenv("VLLM_VOLTA_DEVICE_CAPABILITY", cap)
    r = report()
    lin, attn = r["linear kernels (emulated GPU)"], r["attention (emulated GPU)"]
    run_dtype = torch.bfloat16 if float(cap) >= 8.0 else torch.float16
    fp8 = lin["FP8"]
    try:
        import triton  # noqa: F401
        has_triton = True
    except ImportError:
        has_triton = False
    if float(cap) < 8.9:
        assert fp8.endswith("no FP8 tensor cores below SM89") and "W8A8" not in fp8
    elif has_triton:
        assert fp8.startswith("checkpoints with FP8 activations: Triton W8A8")
    else:
        assert fp8.endswith("triton is not installed: no W8A8 GEMM")
    if not _C.BUILT_WITH_CUDA:  # a CPU build: no CUDA kernel serves any of them
        assert "fp8_gemv" not in fp8.split("weight-only")[-1] and "dequantized each call" in fp8
        assert lin["GGUF"] == ("every type dequantized at load into dense layers: "
                               + kernels_reason(torch.device("cuda"), run_dtype))
        assert lin["mixture of experts"].endswith("this build has no CUDA mixture-of-experts kernels")
    kv = attn["--kv-cache-dtype"]
    assert kv.startswith(", ".join(KV_CACHE_DTYPES) + ": auto holds " + str(run_dtype).removeprefix("torch."))
    assert ("decoded in software" in kv) == (attn["chosen"] == "VOLTA_PAGED")


def test_kv_cache_line_names_the_float32_refusal_on_volta_paged():
    from vllm_volta.attention.kv_cache_dtype import check_backend_supports

    class Paged:
        name = "VOLTA_PAGED"

    with pytest.raises(ValueError):  # the engine refuses it: the report must say so
        check_backend_supports(Paged, torch.float32, "fp8")
    assert "FP8 refused here" in collect_env._kv_cache_dtypes("VOLTA_PAGED", torch.float32)
    check_backend_supports(Paged, torch.float16, "fp8")
    assert "decoded in software" in collect_env._kv_cache_dtypes("VOLTA_PAGED", torch.float16)
