#!/usr/bin/env bash
# llama.cpp's own benchmark (llama-bench, a binary you built) on GGUF files, beside
# `sonarspec bench --spec quantized`: decode (tg) and prompt (pp) speed, 2 threads by
# default, JSON lines per file. The Q8_0 / BF16 files that command compares are made by
# llama.cpp's quantizer; pass them (or any GGUF) after the binary.
#   bash tools/bench_llamacpp.sh LLAMA_BENCH OUT.jsonl FILE.gguf [FILE.gguf ...]
# Environment: THREADS (2), TG (128), PP (256), REPS (3).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bash tools/bench_llamacpp.sh LLAMA_BENCH OUT.jsonl FILE.gguf [FILE.gguf ...]" >&2
  exit 2
fi
BIN="$1"; OUT="$2"; shift 2
[ -x "$BIN" ] || { echo "bench_llamacpp: $BIN is not an executable llama-bench" >&2; exit 2; }
: > "$OUT"
for f in "$@"; do
  [ -f "$f" ] || { echo "bench_llamacpp: $f not found" >&2; exit 2; }
  "$BIN" -m "$f" -t "${THREADS:-2}" -n "${TG:-128}" -p "${PP:-256}" -r "${REPS:-3}" -o jsonl >> "$OUT"
done
python3 - "$OUT" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    kind = f"tg{r['n_gen']}" if r["n_gen"] else f"pp{r['n_prompt']}"
    print(f"{r['model_type']:28s} {kind:6s} {r['avg_ts']:8.1f} +- {r['stddev_ts']:.1f} tok/s  ({r['n_threads']} threads)")
PY
