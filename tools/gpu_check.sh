#!/usr/bin/env bash
# One-shot check on a machine with an NVIDIA GPU (written for an H200; under 8 minutes):
# builds sonarspec with its CUDA kernels into a private target directory, runs the GPU
# tests (CUDA kernels against their CPU twins and torch references) and times the CUDA
# kernels against a device-to-device copy (and the CUTLASS MLP against torch's), then
# runs the speculation benchmark and the verification-cost benchmark on the GPU. Results
# go to $OUT (a temp dir if unset). The CUTLASS headers come from third_party/cutlass
# (bash tools/fetch_cutlass.sh beforehand where the GPU machine has no network; carry
# third_party/ along).
#   bash tools/gpu_check.sh
set -euo pipefail
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
site=$(mktemp -d)
echo "== build (CUDA arch ${SONARSPEC_CUDA_ARCH:-90})"
"$PY" -m pip install -q --no-build-isolation --no-deps --target "$site" . 2>&1 | tail -20 | tee "$OUT/build.log"
export PYTHONPATH="$site"
"$PY" -c "from sonarspec_ext import _C; i = _C.build_info(); print(i); assert i['cuda'] and _C.cuda_available(), i"
[ -f third_party/cutlass/include/cutlass/gemm/device/gemm.h ] || echo "note: no CUTLASS headers: the padded GEMM is not built"
echo "== GPU tests"
set +e
"$PY" -m pytest -q -p no:cacheprovider tests/test_native.py tests/test_shifted_scatter.py tests/test_spec_sampling_op.py \
  tests/test_padded_gemm_cuda.py tests/test_mtp.py -k "cuda or native or scatter or sampling or padded" 2>&1 | tee "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}
set -e
echo "== kernel timings"
"$PY" tools/gpu_bench.py --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/bench.log"
echo "== speculation on the GPU (packaged models, bfloat16, batch 1 and 8)"
"$PY" -m sonarspec_ext.cli bench --spec all --device cuda --dtype bfloat16 --ks 2 4 --mtp-ks 1 3 --repeats 2 \
  --max-tokens 64 --no-transformers --json "$OUT/spec_cuda.json" 2>&1 | tee "$OUT/spec_cuda.log"
echo "== verification cost on the GPU (packaged target and a random 200M Llama, bfloat16)"
"$PY" tools/bench_verify_cost.py --device cuda --dtype bfloat16 --synthetic-200m --rounds 3 \
  --json "$OUT/verify_cost_cuda.json" 2>&1 | tee "$OUT/verify_cost_cuda.log" || true
echo "results in $OUT (tests exit status $tests_rc)"
exit "$tests_rc"
