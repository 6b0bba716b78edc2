#!/usr/bin/env bash
# One-shot check on a machine with an NVIDIA GPU (written for an H200; about 9 minutes,
# each stage under its own time limit so that one hang cannot eat the rest), in order of
# importance, should the machine's time run out: builds sonarspec with its CUDA kernels
# into a private target directory; the CUDA attention kernel's tests; the realistic-model
# benchmark (random weights in Llama-3.1-8B's shape: HBM floor, decoding eager and with
# CUDA graphs, forward cost over 1 + K tokens and trees, speculation at controlled
# acceptance - tools/bench_gpu_model.py); the GPU tests of the whole engine; the same
# benchmark in SmolLM2-135M's shape, and the 8B shape at batch 32 with steps of up to 256
# tokens graphed; the speculation benchmark on the packaged models with
# and without CUDA graphs (the default on CUDA); the other kernel tests and kernel timings. Results go to $OUT
# (a temp dir if unset). The CUTLASS headers come from third_party/cutlass (bash
# tools/fetch_cutlass.sh beforehand) or SONARSPEC_CUTLASS_DIR (where the GPU machine has
# no network: carry the headers the GEMM includes, `nvcc -M` lists them).
#   bash tools/gpu_check.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
PY=${PYTHON:-python3}
failed=()
LOG="$OUT/log.txt"   # every stage's output (few files come back from a GPU machine)
STAGES=${STAGES:-all}   # or some, e.g. STAGES="tests_engine spec_cuda" (the build always runs)
stage() {   # stage NAME SECONDS CMD...: runs CMD under a time limit, its output appended to $LOG
  local name=$1 limit=$2
  shift 2
  [[ $STAGES == all || $name == build* || " $STAGES " == *" $name "* ]] || return 0
  echo "== $name (limit ${limit}s)" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0))s" | tee -a "$LOG"
  [ "$rc" = 0 ] || failed+=("$name:$rc")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
[ -f third_party/cutlass/include/cutlass/gemm/device/gemm.h ] || echo "note: no CUTLASS headers: the padded GEMM is not built"
site=$(mktemp -d)
LOG="$OUT/build.log" stage build 300 "$PY" -m pip install -v --no-build-isolation --no-deps --target "$site" .
export PYTHONPATH="$site"
if ! "$PY" -c "from sonarspec_ext import _C; i = _C.build_info(); print(i); assert i['cuda'] and _C.cuda_available(), i" \
    2>&1 | tee -a "$LOG"; then
  echo "no usable CUDA build: building without CUDA kernels so the engine can still be measured"
  rm -rf "$site" && site=$(mktemp -d) && export PYTHONPATH="$site"
  SONARSPEC_CUDA=0 stage build_cpu_only 300 "$PY" -m pip install -q --no-build-isolation --no-deps --target "$site" .
fi
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$LOG"
stage tests_attention 90 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_paged_attention_cuda.py \
  tests/cuda/test_elementwise_cuda.py tests/cuda/test_padded_gemm_cuda.py
stage bench_8b 200 "$PY" tools/bench_gpu_model.py --shape llama3-8b --json "$OUT/gpu_model_llama3_8b.json"
stage tests_engine 150 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_cuda_engine.py
stage bench_smollm2 100 "$PY" tools/bench_gpu_model.py --shape smollm2 --json "$OUT/gpu_model_smollm2.json"
# steps up to 256 tokens graphed (the engine's default is 64): batch 32 decoding and its verification
stage bench_8b_graph256 150 "$PY" tools/bench_gpu_model.py --shape llama3-8b --graph-max-tokens 256 --batches 32 \
  --parts decode replay --replay-batches 32 --replay-gemm auto --json "$OUT/gpu_model_llama3_8b_graph256.json"
SPEC_ARGS=${SPEC_ARGS:---ks 4 --mtp-ks 3 --repeats 1 --max-tokens 64 --batch-sizes 1 --no-transformers}
# shellcheck disable=SC2086
stage spec_cuda 90 "$PY" -m sonarspec_ext.cli bench --spec all --device cuda --dtype bfloat16 $SPEC_ARGS \
  --no-cuda-graphs --json "$OUT/spec_cuda.json"
# shellcheck disable=SC2086
stage spec_cuda_graphs 90 "$PY" -m sonarspec_ext.cli bench --spec all --device cuda --dtype bfloat16 $SPEC_ARGS \
  --cuda-graphs --json "$OUT/spec_cuda_graphs.json"
stage tests_kernels 120 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_native.py \
  tests/unit/test_shifted_scatter.py tests/spec/test_spec_sampling_op.py tests/spec/test_tree_sampling.py \
  tests/spec/test_mtp.py -k "cuda or native or scatter or sampling"
stage kernels 90 "$PY" tools/gpu_bench.py --json "$OUT/gpu_bench.json"
echo "results in $OUT; failed stages: ${failed[*]:-none}"
[ ${#failed[@]} = 0 ]
