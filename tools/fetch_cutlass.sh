#!/usr/bin/env bash
# Fetches the CUTLASS headers (C++ templates only, nothing installed) for the CUDA
# 64-row-tile GEMM: the pinned nvidia-cutlass wheel from PyPI, its include directory
# extracted to third_party/cutlass/include, where the CMake build looks for it
# (SONARSPEC_CUTLASS_DIR overrides). CPU-only builds do not need it.
#   bash tools/fetch_cutlass.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-third_party/cutlass}
VERSION=4.2.0.0
PY=${PYTHON:-python3}
if [ -f "$DEST/include/cutlass/gemm/device/gemm.h" ]; then
  echo "CUTLASS headers already in $DEST/include"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps "nvidia-cutlass==$VERSION" -d "$tmp"
"$PY" - "$tmp" "$DEST" <<'PYEOF'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "nvidia_cutlass-*.whl"))[0]) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    for n in names:
        out = os.path.join(dest, "include", n[len(prefix):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as src, open(out, "wb") as fh:
            fh.write(src.read())
print(f"CUTLASS headers: {len(names)} files in {os.path.join(dest, 'include')}")
PYEOF
