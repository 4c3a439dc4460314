#!/usr/bin/env bash
# GPU verification in both modes, as the issues ask: native (extension built for the GPU present)
# and Volta (extension built with TORCH_CUDA_ARCH_LIST="7.5+PTX" -> V100 adapter on, run with
# VLLM_VOLTA_DEVICE_CAPABILITY=7.0). Every log and JSON goes to OUTDIR.
#
#   benchmarks/gpu_verify.sh OUTDIR [build] [tests] [kernels] [e2e] [serving] [serving_load]
#                                   [serving_tok] [subset]
#
# `subset` runs only the test files in SUBSET (default: the features not yet run on a GPU), both
# modes at once, within SUBSET_TIMEOUT seconds each (default 240).
#
# The Volta tree is a copy of this checkout (VOLTA_TREE, default /tmp/volta-tree) with its own
# in-place build, so both extensions exist side by side. The steps write more than ten files; where
# only a few files come back from the machine, give a scratch OUTDIR and pack it afterwards
# (e.g. `tar -czf "$OUT/gpu_verify.tgz" -C /tmp/gv .`).
set -uo pipefail
out=${1:?usage: gpu_verify.sh OUTDIR [build] [tests] [kernels] [e2e] [serving] [serving_load] [serving_tok] [subset]}
shift
steps=${*:-build tests kernels e2e serving}
root=$(cd "$(dirname "$0")/.." && pwd)
volta=${VOLTA_TREE:-/tmp/volta-tree}
mkdir -p "$out"
cd "$root" || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}

in_volta() { (cd "$volta" && VLLM_VOLTA_DEVICE_CAPABILITY=7.0 PYTHONPATH="$volta:${PYTHONPATH:-}" "$@"); }
note() { echo "[gpu_verify $(date +%T)] $*"; }

do_build() {
  note "building native (in place) and Volta (7.5+PTX, $volta) extensions"
  rm -rf "$volta" && mkdir -p "$volta"
  tar --exclude=./build --exclude=./.git --exclude=./.whl --exclude='*.so' -cf - . | tar -xf - -C "$volta"
  (cd "$volta" && TORCH_CUDA_ARCH_LIST="7.5+PTX" python setup.py build_ext --inplace) \
    >"$out/build_volta.log" 2>&1 &
  local vpid=$!
  python -m pip install --no-build-isolation --no-deps -e . >"$out/build_native.log" 2>&1 \
    || { note "native build FAILED"; tail -30 "$out/build_native.log"; }
  wait $vpid || { note "volta build FAILED"; tail -30 "$out/build_volta.log"; }
  grep -h "vllm-volta:" "$out/build_native.log" "$out/build_volta.log" | sort -u
}

do_tests() {
  note "test suite on the GPU, native mode"
  timeout "${TEST_TIMEOUT:-600}" python -m pytest -q -m "not default_model" --durations=20 test_v100 \
    >"$out/tests_native.log" 2>&1
  tail -4 "$out/tests_native.log"
  note "test suite on the GPU, Volta mode (compile checks already ran in native mode)"
  in_volta timeout "${TEST_TIMEOUT:-600}" python -m pytest -q -m "not default_model" --durations=20 \
    --ignore=test_v100/csrc/test_compile.py test_v100 >"$out/tests_volta.log" 2>&1
  tail -4 "$out/tests_volta.log"
}

do_subset() {
  local files=${SUBSET:-"test_v100/model_executor/layers/quantization test_v100/csrc/test_awq_ops.py
    test_v100/entrypoints/test_llm_embed.py test_v100/model_executor/layers/test_moe.py
    test_v100/engine/test_llm_engine.py test_v100/entrypoints/openai/test_serving_embedding.py"}
  note "test subset on the GPU, both modes at once: $(echo $files | wc -w) paths"
  timeout "${SUBSET_TIMEOUT:-240}" python -m pytest -q -p no:cacheprovider -rf $files \
    >"$out/subset_native.log" 2>&1 &
  in_volta timeout "${SUBSET_TIMEOUT:-240}" python -m pytest -q -p no:cacheprovider -rf $files \
    >"$out/subset_volta.log" 2>&1
  wait
  for mode in native volta; do echo "$mode: $(tail -n 1 "$out/subset_$mode.log")"; done
}

do_kernels() {
  note "kernel benchmarks"
  python benchmarks/kernels/benchmark_ops.py --output-json "$out/ops_native.json" >/dev/null
  in_volta python benchmarks/kernels/benchmark_ops.py --output-json "$out/ops_volta.json" >/dev/null
  python benchmarks/kernels/benchmark_paged_attention.py --output-json "$out/paged_native.json" >/dev/null
  in_volta python benchmarks/kernels/benchmark_paged_attention.py \
    --output-json "$out/paged_volta.json" >/dev/null
  python benchmarks/kernels/benchmark_gemv.py --output-json "$out/gemv_native.json" >/dev/null
  in_volta python benchmarks/kernels/benchmark_gemv.py --output-json "$out/gemv_volta.json" >/dev/null
  python benchmarks/kernels/benchmark_graph_capture.py --output-json "$out/graph_capture.json" >/dev/null
  python benchmarks/kernels/benchmark_sampling.py --output-json "$out/sampling_native.json" >/dev/null
  in_volta python benchmarks/kernels/benchmark_sampling.py --output-json "$out/sampling_volta.json" >/dev/null
}

do_e2e() {
  note "decode latency at batch 1, Llama-3-8B shape (roofline), both modes"
  python benchmarks/benchmark_modes.py --volta-tree "$volta" --benchmark latency \
    --config llama-3-8b --dtype half --batch-size 1 --input-len 128 --output-len 512 \
    --num-iters 3 --num-iters-warmup 1 --roofline --async-scheduling \
    --output-json "$out/latency_modes.json" >/dev/null
  note "offline throughput, Qwen2.5-1.5B shape, 1000 x 512/256, both modes + transformers"
  python benchmarks/benchmark_modes.py --volta-tree "$volta" --benchmark throughput \
    --config qwen2.5-1.5b --dtype half --max-model-len 1024 --input-len 512 --output-len 256 \
    --num-prompts 1000 --compare-hf --hf-batch-size 256 --async-scheduling --step-stats --gpu-stats \
    --output-json "$out/throughput_modes.json" >/dev/null
}

do_serving() {
  for mode in native volta; do
    note "serving, 16 concurrent clients, $mode mode"
    local cmd=(python benchmarks/benchmark_serving.py --config qwen2.5-1.5b --dtype half
      --max-model-len 1024 --num-prompts 160 --input-len 512 --output-len 128
      --max-concurrency 16 --ignore-eos --async-scheduling --output-json "$out/serving_$mode.json")
    if [ $mode = volta ]; then in_volta "${cmd[@]}" >/dev/null; else "${cmd[@]}" >/dev/null; fi
  done
}

do_serving_load() {
  # The server at 256 concurrent streams against the engine alone at the same batch (README_v100
  # section 5), both modes; same flags and requests on both sides. SERVER_FLAG, if set, is one
  # more flag for the server (e.g. SERVER_FLAG=--no-engine-process: the engine in its process).
  # The server's log (kept) holds its --cudagraph-metrics tables: which steps ran eagerly.
  local flags=(--config qwen2.5-1.5b --dtype half --max-model-len 1024 --max-num-seqs 256
    --async-scheduling --num-prompts 1024 --input-len 512 --output-len 128)
  for mode in native volta; do
    note "engine alone and the server, 256 concurrent streams, $mode mode"
    local engine=(python benchmarks/benchmark_throughput.py "${flags[@]}" --temperature 0
      --output-json "$out/engine_256_$mode.json")
    local server=(python benchmarks/benchmark_serving.py "${flags[@]}" --max-concurrency 256
      --ignore-eos ${SERVER_FLAG:+--server-arg=$SERVER_FLAG} --cudagraph-metrics
      --server-log "$out/server_256_$mode.log" --output-json "$out/serving_256_$mode.json")
    if [ $mode = volta ]; then
      in_volta "${engine[@]}" >/dev/null; in_volta "${server[@]}" >/dev/null
    else
      "${engine[@]}" >/dev/null; "${server[@]}" >/dev/null
    fi
  done
}

do_serving_tok() {
  # The server as users run it: a tokenizer (synthetic, the config's vocabulary size), so the
  # engine core detokenizes every token, and lengths drawn within 50% of 512 / 128, so the
  # closed loop does not run in waves. Both modes; the server's log is kept.
  python benchmarks/synthetic_tokenizer.py --config qwen2.5-1.5b "$out/tokenizer" >/dev/null
  for mode in native volta; do
    note "server with a tokenizer and varied lengths, 256 concurrent streams, $mode mode"
    local server=(python benchmarks/benchmark_serving.py --config qwen2.5-1.5b --dtype half
      --max-model-len 1024 --max-num-seqs 256 --async-scheduling --num-prompts 1536
      --input-len 512 --output-len 128 --random-range-ratio 0.5 --max-concurrency 256
      --ignore-eos --tokenizer "$out/tokenizer" --server-log "$out/server_tok_$mode.log"
      --output-json "$out/serving_tok_$mode.json")
    if [ $mode = volta ]; then in_volta "${server[@]}" >/dev/null; else "${server[@]}" >/dev/null; fi
  done
}

for step in $steps; do "do_$step"; done
note "done"
