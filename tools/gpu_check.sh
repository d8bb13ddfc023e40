#!/usr/bin/env bash
# The one-shot GPU check: everything issue 5 and issue 11 ask a GPU to show, in
# one call, in at most 6 minutes (so a 15-minute GPU loan leaves time to fix and rerun).
#
#   OUT=/path/to/results GIT_COMMIT=$(git rev-parse --short HEAD) bash tools/gpu_check.sh
#
# Run from the repository root, with the GPU image's python3 (CuPy, numpy,
# tokenizers, safetensors, torch); rawpage need not be installed, it runs from
# this tree. pytest and transformers are unpacked from .gpu-wheels/ if the image
# lacks them (fill it beforehand with tools/gpu_wheels.sh and carry it along).
#
# Steps, most important first, each cut off at its share of the time left
# (GPU_CHECK_BUDGET seconds in all, default 345), so a hang costs one step:
#   env         GPU, driver, CUDA, CuPy, torch versions. If CuPy cannot use the
#               GPU, the check stops here with CuPy's error and exits 1.
#   warm        every kernel module through NVRTC at once, one process per build, into
#               CuPy's disk cache (decode attention alone is 7 builds of 24 kernels; compiled
#               one by one inside the steps, they ran every step past its time)
#   kernels     the kernel tests and the cuda backend tests on --device cuda, with
#               RAWPAGE_REQUIRE_GPU=1: a test that cannot reach the GPU fails
#   parity      logits against transformers on Llama-3.2-1B shapes, bfloat16 and float32
#   families    bfloat16 logits against transformers' float32 per family at real widths, 2 layers
#               each, transformers' own bfloat16 the yardstick: Qwen3-8B, Gemma-3-12B,
#               Mixtral-8x7B, Phi-3-mini
#   quant       int4: 1B-shape logit parity (our AWQ packer), 8B-layer decode B=1 vs
#               roofline and bf16, GEMM B=256 vs bf16 cuBLAS, GEMV/scratch crossover
#   throughput  512 requests on a Llama-3-8B-shaped dummy model (graphs on); decode
#               step wall, GPU and roofline times at batch 1 and 256; startup time
#   breakdown   ncu's per-kernel times of one eager decode step at batch 1 and 256,
#               if ncu is installed
#   microbench  decode/prefill attention and rms_norm against copy bandwidth and SDPA
#   lora        multi-LoRA (issue 21): batch 64 mixing 8 rank-16 adapters against no LoRA,
#               Llama-3-8B-shaped dummy model, decode tokens/s (tools/bench_lora.py)
#   vision      images (issue 45): the tiny Gemma 3 VLM on cuda in float32 against transformers'
#               recorded outputs (encoder embeddings, logits, greedy tokens; tools/gpu_check/vision.py),
#               and the tiny Qwen2.5-VL's ViT embeddings and greedy tokens
#   spec        n-gram speculative decoding (issue 19): batch 1, k = 4, Llama-3-8B-shaped dummy
#               model, graphs on, a repetitive prompt; decode tokens/s against no speculation,
#               acceptance rate, verification step cost against a decode step (tools/gpu_check/spec.py)
#   baseline    the throughput workload through transformers' generate, static batches of 64
#   memcheck    compute-sanitizer over a few small kernel tests, if it is installed
# Writes under $OUT: gpu_check.log (all output), kernel_tests.log, memcheck.log,
# results.json (every figure), summary.md (the table, printed last), and the
# record docs/gpu/<date>-<gpu>-<commit>.json and .md (also left in docs/gpu/).
# Exit status: 0 if every correctness check passed (kernel tests with no
# unexpected skip, parity, memcheck), 1 otherwise. Slow is not a failure.
#
# With --tp N (N >= 2) it checks tensor parallelism instead, and only that: it refuses
# to run (exit 2) unless nvidia-smi lists at least N GPUs, then runs the tensor-parallel
# tests and tools/bench_tp.py at sizes 1, 2, ..., N (powers of two) on a Llama-3-8B-shaped
# dummy model, writing tp.log and tp.json under $OUT (docs/deploy.md says what to expect).
set -uo pipefail  # not -e: a failing step must not stop the others
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--tp" ]]; then
  TP=${2:-}
  if ! [[ "$TP" =~ ^[0-9]+$ ]] || ((TP < 2)); then
    echo "gpu_check.sh: --tp needs a number of GPUs >= 2, got '${TP}'" >&2
    exit 2
  fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if ((gpus < TP)); then
    echo "gpu_check.sh --tp $TP: refusing to run: it needs $TP GPUs and nvidia-smi lists ${gpus}" >&2
    exit 2
  fi
  OUT=${OUT:?set OUT to the folder for the results}
  mkdir -p "$OUT"
  sizes=1
  for ((n = 2; n <= TP; n *= 2)); do sizes="$sizes,$n"; done
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  {
    timeout 120 "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider tests/test_tensor_parallel.py
    timeout 480 "${PYTHON:-python3}" -m tools.bench_tp --device cuda --tp "$sizes" --model tools/configs/llama-3-8b \
      --num-requests 256 --input-len 128:512 --output-len 128:256 --max-num-seqs 256 --max-model-len 2048 \
      --result-file "$OUT/tp.json"
  } 2>&1 | tee "$OUT/tp.log"
  exit "${PIPESTATUS[0]}"
fi
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-345}
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
  local start=$SECONDS status
  timeout --signal=INT --kill-after=10 "$t" "$@"
  status=$?
  echo "== $name: exit $status after $((SECONDS - start))s"
  return $status
}

sanitizer=$(command -v compute-sanitizer ||
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)

step deps 30 "$PY" -m tools.gpu_check.deps --wheelhouse .gpu-wheels --target "$DEPS"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
if step env 30 "$PY" -m tools.gpu_check.env --result-file "$PARTS/env.json"; then
  step warm 90 "$PY" -m tools.gpu_check.warm
  step kernels 110 env RAWPAGE_KERNEL_DEVICES=cuda RAWPAGE_REQUIRE_GPU=1 "$PY" -m pytest -q -ra -p no:cacheprovider \
    -m "not slow" tests/kernels/test_elementwise.py tests/kernels/test_paged_attention.py \
    tests/kernels/test_image_attention.py tests/kernels/test_vision_kernels.py \
    tests/kernels/test_model_sim.py tests/kernels/test_gguf_mmvq.py tests/kernels/test_moe_grouped_gemm.py \
    tests/test_cuda_backend.py tests/test_cublaslt_fp8.py 2>&1 | tee "$OUT/kernel_tests.log"
  # (tests/kernels/ files first and together: pytest 9.1 collects a tests/kernels/ file named
  # after tests/test_*.py without tests/kernels/conftest.py, "fixture 'device' not found")
  step parity 60 "$PY" -m tools.gpu_check.parity --config tools/configs/llama-3.2-1b/config.json \
    --device cuda --result-file "$PARTS/parity.json"
  step throughput 90 "$PY" -m tools.gpu_check.throughput --engine rawpage --decode-batches 1,256 \
    --config tools/configs/llama-3-8b/config.json --result-file "$PARTS/throughput_rawpage.json"
  step vision 45 "$PY" -m tools.gpu_check.vision --device cuda --result-file "$PARTS/vision.json"
  step families 70 "$PY" -m tools.gpu_check.families --device cuda --result-file "$PARTS/families.json"
  step quant 50 "$PY" -m tools.gpu_check.quant --device cuda --result-file "$PARTS/quant.json"
  step breakdown 80 "$PY" -m tools.gpu_check.breakdown --batches 1,256 --timeout 70 \
    --config tools/configs/llama-3-8b/config.json --result-file "$PARTS/breakdown.json"
  step microbench 40 "$PY" -m tools.gpu_check.microbench --result-file "$PARTS/microbench.json"
  step lora 75 "$PY" -m tools.bench_lora --device cuda --model tools/configs/llama-3-8b/config.json \
    --load-format dummy --batch 64 --adapters 8 --rank 16 --prompt-len 128 --output-len 64 --repeats 1 \
    --result-file "$PARTS/lora.json"
  step spec 60 "$PY" -m tools.gpu_check.spec --device cuda --config tools/configs/llama-3-8b/config.json \
    --result-file "$PARTS/spec.json"
  step baseline 45 "$PY" -m tools.gpu_check.throughput --engine hf \
    --config tools/configs/llama-3-8b/config.json --result-file "$PARTS/throughput_hf.json"
  if [ -n "$sanitizer" ]; then
    step memcheck 40 env RAWPAGE_KERNEL_DEVICES=cuda RAWPAGE_CUDA_NO_POOL=1 "$sanitizer" --tool memcheck \
      --print-limit 20 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_elementwise.py \
      tests/kernels/test_paged_attention.py \
      -k "bfloat16 and (test_rms_norm or test_write_kv or test_decode_long_context or test_prefill_query_as_a_view)" \
      >"$OUT/memcheck.log" 2>&1
  else
    echo "compute-sanitizer not found: memcheck skipped" | tee "$OUT/memcheck.log"
  fi
else
  echo "== env failed: CuPy cannot use the GPU (the error is above); no GPU step can run"
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
commit=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
today=$(date -u +%Y-%m-%d)
RECORD_DIR=${RECORD_DIR:-docs/gpu}
header="GPU check, $today, ${gpu:-unknown GPU}, commit $commit, ${SECONDS}s"
"$PY" -m tools.gpu_check.summary --parts "$PARTS" --kernel-log "$OUT/kernel_tests.log" \
  --memcheck-log "$OUT/memcheck.log" --out-json "$OUT/results.json" --out-md "$OUT/summary.md" --header "$header" \
  --record-dir "$RECORD_DIR" --date "$today" --gpu "${gpu:-unknown GPU}" --commit "$commit"
status=$?
cp "$RECORD_DIR"/"$today"-*-"$commit".* "$OUT"/ 2>/dev/null
echo "== gpu_check: exit $status after ${SECONDS}s"
exec 1>&- 2>&-
wait  # for tee to write the end of gpu_check.log
exit $status
