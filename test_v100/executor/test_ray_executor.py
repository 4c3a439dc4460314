"""RayExecutor: tensor parallelism over Ray actors.

The Ray runs happen in a child process inside network and PID namespaces of their own
(`unshare --net --pid`, loopback only), so Ray's head, the gloo rendezvous and every rank bind
127.0.0.1 and never the machine's interfaces, and no Ray process outlives the test. The child
writes what it saw as JSON; this process checks it against transformers and the 1-rank engine.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from test_v100.worker.tiny_models import hf_greedy, random_prompts, tiny_model_dir
from vllm_volta.engine.arg_utils import EngineArgs
from vllm_volta.engine.engine_errors import is_fatal
from vllm_volta.engine.llm_engine import LLMEngine
from vllm_volta.executor.ray_utils import NodeInfo, assign_ranks, tcp_init_method
from vllm_volta.sampling_params import SamplingParams, StructuredOutputsParams

REPO = Path(__file__).resolve().parents[2]
HAS_RAY = importlib.util.find_spec("ray") is not None


def _netns_works() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc",
                                "ip", "link", "set", "lo", "up"],
                               capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


needs_ray = pytest.mark.skipif(
    not HAS_RAY, reason="ray is not installed (pip install -e '.[ray]'; the [test] extra leaves "
                        "it out)")
needs_netns = pytest.mark.skipif(
    not _netns_works(), reason="needs `unshare --net --pid` and `ip` (root or user namespaces) to "
                               "run Ray on 127.0.0.1 in network and PID namespaces of its own")

PROMPTS = random_prompts(3, 3, 30, seed=11)
GREEDY = dict(temperature=0, max_tokens=5, ignore_eos=True)
SEEDED = dict(temperature=0.8, seed=5, max_tokens=4, ignore_eos=True, logprobs=2)
GUIDED_REGEX = r"[a-c]{2}-[0-9]{3}"
GUIDED = dict(temperature=0, max_tokens=30,
              structured_outputs=StructuredOutputsParams(regex=GUIDED_REGEX))


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str = ""):
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}{i}", prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step(finished_only=True)})
    return [final[f"{tag}{i}"] for i in range(len(prompts))]


def _summary(outs) -> list[dict]:
    return [{"tokens": list(o.outputs[0].token_ids),
             "logprobs": [{str(k): v.logprob for k, v in row.items()}
                          for row in (o.outputs[0].logprobs or [])]} for o in outs]


def ray_scenario(model: str, out_path: str, engine_kwargs: dict) -> None:
    """Runs in the child, next to a Ray head started with `ray start` on 127.0.0.1 (RAY_ADDRESS
    names it): a TP=2 engine on it, a driver-only error, then a killed rank."""
    import ray

    from vllm_volta.executor.ray_executor import RayExecutor
    result: dict = {}
    common = dict(model=model, distributed_executor_backend="ray", **engine_kwargs)
    try:  # more ranks than the head has CPUs (or GPUs)
        LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=4, **common))
    except ValueError as e:
        result["too_many_error"] = str(e)
    engine = LLMEngine.from_engine_args(EngineArgs(
        tensor_parallel_size=2, max_num_batched_tokens=32, **common))
    try:
        executor = engine.executor
        result["executor"] = type(executor).__name__
        assert isinstance(executor, RayExecutor)
        total = ray.cluster_resources()  # the engine connected to the running head
        result["rendezvous"] = executor._init_method
        result["greedy"] = _summary(run(engine, PROMPTS, SamplingParams(**GREEDY), "g"))
        result["seeded"] = _summary(run(engine, PROMPTS[:2], SamplingParams(**SEEDED), "s"))
        guided = run(engine, PROMPTS[:2], SamplingParams(**GUIDED), "j")  # grammar on rank 0
        result["guided"] = [{"tokens": list(o.outputs[0].token_ids), "text": o.outputs[0].text}
                            for o in guided]
        # Only the driver fails (bad input) and rank 1 finishes: its own error, group intact.
        from vllm_volta.core.scheduler import SchedulerOutput
        refs = executor._submit("execute_model", [("not a schedule",), (SchedulerOutput(),)])
        try:
            executor._gather(refs, "execute_model")
        except Exception as e:
            result["driver_error"] = f"{type(e).__name__}: {e}"
        result["after_driver_error"] = _summary(run(engine, PROMPTS[:1], SamplingParams(**GREEDY), "d"))
        ray.kill(executor.workers[1], no_restart=True)
        start = time.monotonic()
        try:
            run(engine, PROMPTS[:1], SamplingParams(**GREEDY), "k")
            result["dead_error"] = None
        except RuntimeError as e:
            result["dead_error"] = str(e)
        result["dead_error_s"] = time.monotonic() - start
        try:  # the group stays broken: the next step fails at once, naming why
            run(engine, PROMPTS[:1], SamplingParams(**GREEDY), "k2")
            result["next_error"] = None
        except RuntimeError as e:
            result["next_error"] = str(e)
    finally:
        start = time.monotonic()
        engine.shutdown()
        result["shutdown_s"] = time.monotonic() - start
    result["connection_closed"] = not ray.is_initialized()  # the engine opened it
    # Actors and placement group gone: the head's resources are all free again.
    ray.init()
    deadline, free = time.monotonic() + 20, {}
    while time.monotonic() < deadline:
        free = ray.available_resources()
        if all(free.get(k, 0) == total[k] for k in ("CPU", "GPU") if k in total):
            break
        time.sleep(0.5)
    result["resources_freed"] = all(free.get(k, 0) == total[k] for k in ("CPU", "GPU") if k in total)
    ray.shutdown()
    Path(out_path).write_text(json.dumps(result))


def local_ray_scenario(model: str, out_path: str, engine_kwargs: dict) -> None:
    """Runs in the child with no Ray running: the executor starts a local instance, and the
    engine's shutdown stops it."""
    import ray
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=model, tensor_parallel_size=2, distributed_executor_backend="ray", **engine_kwargs))
    try:
        result = {"started": ray.is_initialized(),
                  "greedy": _summary(run(engine, PROMPTS[:1], SamplingParams(**GREEDY)))}
    finally:
        engine.shutdown()
    result["stopped"] = not ray.is_initialized()
    Path(out_path).write_text(json.dumps(result))


def _run_in_netns(scenario: str, model: Path, out_path: Path, engine_kwargs: dict,
                  num_gpus: int | None, timeout: float,
                  module: str = "test_v100.executor.test_ray_executor") -> dict:
    """`scenario` (a function of `module`, this one by default) in a child in new network and PID
    namespaces, next to a Ray head of 3 CPUs and `num_gpus` GPUs started with `ray start` on
    127.0.0.1, or with no Ray running when `num_gpus` is None."""
    code = (f"import json, sys; from {module} import {scenario}; "
            f"{scenario}(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))")
    ray_tmp = tempfile.mkdtemp(prefix="vvray")  # short: Ray's socket paths must stay < 108 chars
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_USAGE_STATS_ENABLED": "0", "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo",
           "RAY_AUTH_MODE": "disabled",  # loopback only, in a namespace of its own
           "RAY_TMPDIR": ray_tmp}  # never the host's /tmp/ray (another cluster's address file)
    env.pop("RAY_ADDRESS", None)
    ray_cli = f'"{sys.executable}" -m ray.scripts.scripts'
    if num_gpus is None:
        # A Ray that the executor starts picks its node IP itself: loopback, by this switch.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        script = 'ip link set lo up && exec "$0" "$@"'
    else:
        # The namespace is the child's own: Ray's default port cannot clash with anything. In
        # a PID namespace too: `ray stop` sees only this head's processes, and whatever is
        # left when the shell exits is killed with the namespace.
        env["RAY_ADDRESS"] = "127.0.0.1:6379"
        script = (f'ip link set lo up && {ray_cli} start --head --node-ip-address=127.0.0.1 '
                  f'--port=6379 --num-cpus=3 --num-gpus={num_gpus} --include-dashboard=false '
                  f'--temp-dir="$RAY_TMPDIR/ray" 1>&2 && "$0" "$@"; rc=$?; '
                  f'{ray_cli} stop >/dev/null 2>&1; exit $rc')
    cmd = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", script,
           sys.executable, "-c", code, str(model), str(out_path), json.dumps(engine_kwargs)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if proc.returncode != 0 or not out_path.exists():
        pytest.fail(f"Ray child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-6000:]}")
    return json.loads(out_path.read_text())


def check_ray_tp2(tmp_path_factory, tmp_path, **engine_kwargs) -> None:
    # 4 heads, 2 kv heads: 1 per rank; a tokenizer for the structured-output request.
    path = tiny_model_dir(tmp_path_factory, "qwen2", with_tokenizer=True)
    on_gpu = torch.cuda.is_available()
    seen = _run_in_netns("ray_scenario", path, tmp_path / "result.json", engine_kwargs,
                         num_gpus=2 if on_gpu else 0, timeout=240)
    assert seen["executor"] == "RayExecutor"
    resource = "GPU" if on_gpu else "CPU"
    assert f"tensor_parallel_size=4 needs 4 {resource}s in the Ray cluster" in seen["too_many_error"]
    assert seen["rendezvous"].startswith("tcp://127.0.0.1:")
    import transformers
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert [s["tokens"] for s in seen["greedy"]] == [hf_greedy(hf_model, p, 5) for p in PROMPTS]
    single = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), max_num_batched_tokens=32, **engine_kwargs))
    try:
        one = _summary(run(single, PROMPTS[:2], SamplingParams(**SEEDED)))
        one_guided = run(single, PROMPTS[:2], SamplingParams(**GUIDED), "j")
    finally:
        single.shutdown()
    for tp2, tp1 in zip(seen["guided"], one_guided):
        assert re.fullmatch(GUIDED_REGEX, tp2["text"]), tp2["text"]
        assert tp2["tokens"] == list(tp1.outputs[0].token_ids)
    for tp2, tp1 in zip(seen["seeded"], one):
        assert tp2["tokens"] == tp1["tokens"]
        for a, b in zip(tp2["logprobs"], tp1["logprobs"]):
            assert a.keys() == b.keys()
            assert all(a[k] == pytest.approx(b[k], abs=1e-4) for k in a)
    # The killed rank is named; the step fails instead of hanging in the collective.
    assert seen["dead_error"] is not None and "rank 1" in seen["dead_error"]
    assert "died" in seen["dead_error"]
    assert seen["dead_error_s"] < 30
    assert "broken" in seen["next_error"] and "rank(s) [1] died" in seen["next_error"]
    assert is_fatal(RuntimeError(seen["dead_error"])) and is_fatal(RuntimeError(seen["next_error"]))
    assert seen["driver_error"].startswith("AttributeError: ")
    assert seen["after_driver_error"][0]["tokens"] == seen["greedy"][0]["tokens"]
    assert seen["shutdown_s"] < 15  # rank 0, stuck with a dead peer, is killed, not awaited
    assert seen["connection_closed"] and seen["resources_freed"]


@needs_ray
@needs_netns
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) tensor parallelism")
def test_ray_tp2_on_cpu(tmp_path_factory, tmp_path):
    check_ray_tp2(tmp_path_factory, tmp_path, cpu_kvcache_space=0.01, async_scheduling=True)


@needs_ray
@needs_netns
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ray_tp2_on_gpus(tmp_path_factory, tmp_path):
    check_ray_tp2(tmp_path_factory, tmp_path, dtype="float32", gpu_memory_utilization=0.2,
                  async_scheduling=True)


def test_ray_worker_mirrors_worker(tmp_path_factory):
    """RayWorker builds what Worker builds (it only takes the device index apart from the
    rank): the same attributes, so a Worker change that RayWorker misses fails here."""
    from vllm_volta.executor.ray_utils import RayWorker
    from vllm_volta.worker.worker import Worker
    path = tiny_model_dir(tmp_path_factory, "qwen2")
    config = EngineArgs(model=str(path), skip_tokenizer_init=True, device="cpu").create_engine_config()
    plain, ray_worker = Worker(config), RayWorker(config, 0, 1, None, 0)
    assert set(vars(ray_worker)) == set(vars(plain))
    assert set(vars(ray_worker.model_runner)) == set(vars(plain.model_runner))
    assert (ray_worker.rank, ray_worker.world_size, ray_worker.device) == (0, 1, plain.device)
    assert ray_worker.model_runner.is_driver


@needs_ray
@needs_netns
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (gloo) tensor parallelism")
def test_ray_started_by_the_executor_when_none_runs(tmp_path_factory, tmp_path):
    path = tiny_model_dir(tmp_path_factory, "qwen2")
    seen = _run_in_netns("local_ray_scenario", path, tmp_path / "result.json",
                         {"skip_tokenizer_init": True, "cpu_kvcache_space": 0.01},
                         num_gpus=None, timeout=180)
    import transformers
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert seen["greedy"][0]["tokens"] == hf_greedy(hf_model, PROMPTS[0], 5)
    assert seen["started"] and seen["stopped"]


def test_missing_ray_is_a_clear_error(tmp_path_factory, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    path = tiny_model_dir(tmp_path_factory, "qwen2")
    with pytest.raises(ImportError, match=r'needs Ray.*pip install -e "\.\[ray\]"'):
        LLMEngine.from_engine_args(EngineArgs(
            model=str(path), skip_tokenizer_init=True, tensor_parallel_size=2,
            distributed_executor_backend="ray", device="cpu"))


def test_backend_field_is_validated():
    from vllm_volta.config import ParallelConfig
    assert ParallelConfig().distributed_executor_backend == "mp"
    assert ParallelConfig(2, distributed_executor_backend="ray").world_size == 2
    with pytest.raises(ValueError, match="distributed_executor_backend must be one of mp, ray, uni"):
        ParallelConfig(distributed_executor_backend="external_launcher")
    with pytest.raises(ValueError, match="distributed_executor_backend='uni' runs one rank"):
        ParallelConfig(2, distributed_executor_backend="uni")


def test_ranks_follow_nodes_and_gpus():
    """Rank 0 on the engine's node, nodes contiguous, GPUs in order; each rank sees the GPUs
    of its node and picks its own by index."""
    infos = [NodeInfo("b", "10.0.0.2", ["1"]), NodeInfo("a", "10.0.0.1", ["3"]),
             NodeInfo("b", "10.0.0.2", ["0"]), NodeInfo("a", "10.0.0.1", ["2"])]
    placed = assign_ranks(infos, driver_ip="10.0.0.2")
    assert [(p.rank, p.actor_index, p.node_ip) for p in placed] == [
        (0, 2, "10.0.0.2"), (1, 0, "10.0.0.2"), (2, 3, "10.0.0.1"), (3, 1, "10.0.0.1")]
    assert [(p.cuda_visible_devices, p.local_device) for p in placed] == [
        ("0,1", 0), ("0,1", 1), ("2,3", 0), ("2,3", 1)]
    cpu = assign_ranks([NodeInfo("n", "127.0.0.1"), NodeInfo("n", "127.0.0.1")], "127.0.0.1")
    assert [(p.rank, p.cuda_visible_devices, p.local_device) for p in cpu] == [
        (0, None, 0), (1, None, 0)]
    assert tcp_init_method("127.0.0.1", 29500) == "tcp://127.0.0.1:29500"
    assert tcp_init_method("fe80::1", 29500) == "tcp://[fe80::1]:29500"


def test_ranks_get_the_engines_settings_but_no_secrets(monkeypatch):
    from vllm_volta.executor.ray_utils import forwarded_env
    for key, value in (("NCCL_SOCKET_IFNAME", "eth0"), ("VLLM_VOLTA_DEVICE_CAPABILITY", "7.0"),
                       ("HF_HOME", "/models"), ("HF_TOKEN", "secret"), ("PATH_UNRELATED", "x"),
                       ("OMP_NUM_THREADS", "8")):
        monkeypatch.setenv(key, value)
    env = forwarded_env()
    kept = ("NCCL_SOCKET_IFNAME", "VLLM_VOLTA_DEVICE_CAPABILITY", "HF_HOME", "OMP_NUM_THREADS")
    assert {k: env.get(k) for k in kept} == {
        "NCCL_SOCKET_IFNAME": "eth0", "VLLM_VOLTA_DEVICE_CAPABILITY": "7.0", "HF_HOME": "/models",
        "OMP_NUM_THREADS": "8"}
    assert "HF_TOKEN" not in env and "PATH_UNRELATED" not in env
