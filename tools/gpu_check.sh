#!/usr/bin/env bash
# The one-shot GPU check: everything issue 5 asks a GPU to show, in one call.
#
#   OUT=/path/to/results GIT_COMMIT=$(git rev-parse --short HEAD) bash tools/gpu_check.sh
#
# Run from the repository root, with the GPU image's python3 (CuPy, numpy,
# tokenizers, safetensors, torch); rawpage need not be installed, it runs from
# this tree. pytest and transformers are unpacked from .gpu-wheels/ if the image
# lacks them (fill it beforehand with tools/gpu_wheels.sh and carry it along).
#
# Steps, each cut off at its share of the time left (GPU_CHECK_BUDGET seconds in
# all, default 450), so a hang costs one step, not the table:
#   env         GPU, driver, CUDA, CuPy, torch versions
#   kernels     the kernel tests and the cuda backend tests on --device cuda
#   microbench  decode/prefill attention and rms_norm against copy bandwidth and SDPA
#   throughput  512 requests on a Llama-3-8B-shaped dummy model; decode step at
#               batch 256 against its roofline; startup time
#   baseline    the same workload through transformers' generate, static batches of 64
#   parity      logits against transformers on Llama-3.2-1B shapes, bfloat16 and float32
#   memcheck    compute-sanitizer over a few small kernel tests, if it is installed
# Writes under $OUT: gpu_check.log (all output), kernel_tests.log, memcheck.log,
# results.json (every figure) and summary.md (the table, printed last).
set -uo pipefail  # not -e: a failing step must not stop the others
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-450}
PARTS=$(mktemp -d)
DEPS=$(mktemp -d)
export PYTHONPATH="$DEPS:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec > >(tee "$OUT/gpu_check.log") 2>&1

# step NAME SECONDS CMD...: run CMD for at most SECONDS, or what is left minus the
# time the summary needs; skip it when that is too little to be worth starting.
step() {
  local name=$1 want=$2
  shift 2
  local left=$((BUDGET - SECONDS - 15))
  local t=$((want < left ? want : left))
  if ((t < 20)); then
    echo "== $name: skipped, ${left}s left"
    return
  fi
  echo "== $name (at ${SECONDS}s, up to ${t}s)"
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$t" "$@"
  echo "== $name: exit $? after $((SECONDS - start))s"
}

sanitizer=$(command -v compute-sanitizer ||
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)

step deps 40 "$PY" -m tools.gpu_check.deps --wheelhouse .gpu-wheels --target "$DEPS"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
step env 30 "$PY" -m tools.gpu_check.env --result-file "$PARTS/env.json"
step kernels 150 env RAWPAGE_KERNEL_DEVICES=cuda "$PY" -m pytest -q -p no:cacheprovider -m "not slow" \
  tests/kernels/test_elementwise.py tests/kernels/test_paged_attention.py tests/kernels/test_model_sim.py \
  tests/test_cuda_backend.py 2>&1 | tee "$OUT/kernel_tests.log"
step microbench 90 "$PY" -m tools.gpu_check.microbench --result-file "$PARTS/microbench.json"
step throughput 150 "$PY" -m tools.gpu_check.throughput --engine rawpage \
  --config tools/configs/llama-3-8b/config.json --result-file "$PARTS/throughput_rawpage.json"
step baseline 100 "$PY" -m tools.gpu_check.throughput --engine hf \
  --config tools/configs/llama-3-8b/config.json --result-file "$PARTS/throughput_hf.json"
step parity 100 "$PY" -m tools.gpu_check.parity --config tools/configs/llama-3.2-1b/config.json \
  --device cuda --result-file "$PARTS/parity.json"
if [ -n "$sanitizer" ]; then
  step memcheck 90 env RAWPAGE_KERNEL_DEVICES=cuda RAWPAGE_CUDA_NO_POOL=1 "$sanitizer" --tool memcheck \
    --print-limit 20 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_elementwise.py \
    tests/kernels/test_paged_attention.py \
    -k "bfloat16 and (test_rms_norm or test_write_kv or test_decode_long_context or test_prefill_query_as_a_view)" \
    >"$OUT/memcheck.log" 2>&1
else
  echo "compute-sanitizer not found: memcheck skipped" | tee "$OUT/memcheck.log"
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
header="GPU check, $(date -u +%Y-%m-%d), ${gpu:-unknown GPU}, commit ${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, ${SECONDS}s"
"$PY" -m tools.gpu_check.summary --parts "$PARTS" --kernel-log "$OUT/kernel_tests.log" \
  --memcheck-log "$OUT/memcheck.log" --out-json "$OUT/results.json" --out-md "$OUT/summary.md" --header "$header"
exec 1>&- 2>&-
wait  # for tee to write the end of gpu_check.log
