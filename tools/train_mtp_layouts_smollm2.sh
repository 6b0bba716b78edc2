#!/bin/bash
# The normalisation experiment on SmolLM2-135M-Instruct: MTP heads of the RMSNorm layout and
# of the EAGLE-1 layout trained from scratch with equal data (the chat corpus, Q4_1 target
# features as served), steps, seed and schedule, then both validation curves plotted and
# both heads' engine acceptance (greedy K = 3 on held-out corpus prompts, output checked
# equal to plain decoding) compared. Resumable: re-running continues where it stopped.
#
#   tools/train_mtp_layouts_smollm2.sh [WORK_DIR] [STEPS] [WINDOWS]
#       (default runs/layouts 500 2000: about 15 min of features, then 20-25 min per head on 2 cores)
#
# Needs the corpus: mkdir -p runs/chat_corpus && xz -dc data/smollm2_chat_corpus.jsonl.xz > runs/chat_corpus/corpus.jsonl
set -euo pipefail
WORK=${1:-runs/layouts}
STEPS=${2:-500}
WINDOWS=${3:-2000}
PY=${PYTHON:-python}
for LAYOUT in rmsnorm eagle1; do
  $PY -m sonarspec_ext.cli train-mtp --target smollm2 --data runs/chat_corpus/corpus.jsonl \
    --out "$WORK/$LAYOUT" --work "$WORK/work" --layout $LAYOUT --max-steps "$STEPS" --max-windows "$WINDOWS" \
    --seq-len 256 --batch-size 8 --unroll 2 --ce-weight 1.0 --lr 1e-3 --draft-vocab 8192 \
    --feature-dtype bfloat16 --export-dtype bfloat16 --eval-every 50 --seed 0 --resume
done
$PY tools/plot_mtp_experiment.py "$WORK" --png docs/bench/smollm2_mtp_layouts.png --json docs/bench/smollm2_mtp_layouts.json
