#!/bin/bash
# Trains MTP heads for the packaged target: the RMSNorm layout (shipped as assets/mtp)
# and the EAGLE-1 layout with equal data, steps and seed (the normalisation experiment),
# then plots both validation curves. Resumable: re-running continues where it stopped.
#
#   tools/train_mtp_heads.sh [WORK_DIR]      (default runs/mtp; about 25 min per head on 2 cores)
set -euo pipefail
WORK=${1:-runs/mtp}
PY=${PYTHON:-python}
STDLIB=$($PY -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
for LAYOUT in rmsnorm eagle1; do
  $PY -m sonarspec_ext.cli train-mtp --data "$STDLIB" --exclude "site-packages/*" "test*" "*/test*" "*/idle_test/*" \
    --out "$WORK/$LAYOUT" --work "$WORK/work" --layout $LAYOUT --max-steps 1200 --max-windows 4000 \
    --unroll 2 --lr 1.5e-3 --eval-every 100 --export-dtype bfloat16 --resume
done
$PY tools/plot_mtp_experiment.py "$WORK" --png docs/bench/mtp_layouts.png --json docs/bench/mtp_layouts.json
