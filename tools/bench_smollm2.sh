#!/usr/bin/env bash
# The SmolLM2-135M-Instruct CPU benchmarks of docs/benchmarks.md and docs/quantization.md,
# in one run (about 30 minutes on 2 cores): plain decoding vs transformers and the
# bandwidth floor, the cost of verification (with and without AMX tiles), throughput vs
# batch and context, every speculation scheme on held-out chat prompts (bfloat16 weights,
# and the file's own Q4_1 blocks), the quantized files beside llama.cpp (with
# llama-cpp-python), and the server under load.
#   bash tools/bench_smollm2.sh [OUT_DIR (docs/bench)]
set -euo pipefail
OUT="${1:-docs/bench}"
HEAD="$(python -c "from sonarspec_ext.assets import installed_head; print(installed_head('smollm2_mtp')[0])")"
mkdir -p "$OUT"
sonarspec bench --model smollm2 --batch-sizes 1 8 --repeats 3 --max-tokens 64 --json "$OUT/smollm2_decode.json"
python tools/bench_verify_cost.py --model smollm2 --rounds 3 --json "$OUT/smollm2_verify_cost.json"
SONARSPEC_NO_AMX=1 python tools/bench_verify_cost.py --model smollm2 --rounds 3 \
  --json "$OUT/smollm2_verify_cost_no_amx.json"
python tools/bench_scaling.py --json "$OUT/smollm2_scaling.json" --plot "$OUT/smollm2_scaling.png"
python tools/bench_weight_layout.py --rounds 10 --chat-rounds 4 --json "$OUT/smollm2_weight_layout_q4_1.json"
python tools/memory_footprint.py --spec mtp --chat-turns 3 --json "$OUT/smollm2_memory.json"
sonarspec bench --spec all --model smollm2 --draft none --mtp "$HEAD" --mtp-ks 1 2 3 --batch-sizes 1 8 \
  --repeats 3 --max-tokens 96 --no-transformers --json "$OUT/smollm2_spec.json" --plot "$OUT/smollm2_spec.png"
sonarspec bench --spec all --model smollm2 --draft none --mtp "$HEAD" --mtp-ks 2 --batch-sizes 8 --spec-max-batch 4 \
  --repeats 3 --max-tokens 96 --no-transformers --json "$OUT/smollm2_spec_load_control.json"
sonarspec bench --spec quantized --model smollm2 --mtp-ks 2 --ks 2 --max-tokens 128 \
  --repeats 3 --json "$OUT/smollm2_quantized.json"
sonarspec bench --spec all --model smollm2 --quantization auto --draft default --ks 2 3 4 --mtp "$HEAD" \
  --mtp-ks 1 2 3 --batch-sizes 1 --repeats 3 --max-tokens 128 --no-transformers --json "$OUT/smollm2_spec_q4_1.json"
sonarspec bench --spec all --model smollm2 --quantization auto --draft default --ks 2 4 --mtp "$HEAD" \
  --mtp-ks 1 2 3 --batch-sizes 1 8 --repeats 3 --max-tokens 128 --no-transformers --spec-control adaptive \
  --json "$OUT/smollm2_spec_q4_1_adaptive.json"
sonarspec bench --spec all --model smollm2 --quantization auto --draft default --draft-quantization q8_0 \
  --ks 1 2 3 --mtp none --batch-sizes 1 --repeats 3 --max-tokens 128 --no-transformers \
  --json "$OUT/smollm2_draft_q8_0.json"
sonarspec bench --spec all --model smollm2 --quantization none --draft default --draft-quantization q8_0 \
  --ks 2 3 --mtp "$HEAD" --mtp-ks 2 3 --batch-sizes 1 --repeats 3 --max-tokens 128 --no-transformers \
  --json "$OUT/smollm2_spec_bf16_drafts.json"
sonarspec bench --spec eagle_tree --model smollm2 --quantization auto --mtp "$HEAD" --mtp-ks 2 3 --tree-top-k 2 \
  --tree-nodes 4 --batch-sizes 1 --repeats 3 --max-tokens 128 --json "$OUT/smollm2_tree_k2_n4_q4_1.json"
for q in none auto; do
  sonarspec bench --spec all --model smollm2 --quantization "$q" --draft none --mtp "$HEAD" --mtp-ks 1 2 3 \
    --batch-sizes 1 --temperature 0.7 --repeats 3 --max-tokens 128 --no-transformers \
    --json "$OUT/smollm2_spec_t07_$q.json"
done
python tools/bench_verify_cost.py --model smollm2 --quantization auto --rounds 3 \
  --json "$OUT/smollm2_verify_cost_q4_1.json"
python tools/bench_draft_stop.py --prompts 80 --configs 2 3 4 4:0.1 4:0.2 --json "$OUT/smollm2_draft_stop.json"
python tools/head_agreement.py --prompts 80 --max-tokens 128 --json "$OUT/smollm2_head_agreement.json"
for w in edit chat; do   # lookup drafts beside the head, on code-editing and held-out chat prompts
  python tools/bench_draft_stop.py --workload "$w" --prompts 40 --max-tokens 256 --configs 3 3+8 \
    --json "$OUT/smollm2_lookup_$w.json"
done
python tools/bench_serve.py --model smollm2 --specs none mtp --concurrency 1 4 16 --requests 16 --max-tokens 96 \
  --json "$OUT/smollm2_serve.json"
python tools/bench_serve.py --model smollm2 --specs mtp --concurrency 1 4 16 --requests 16 --max-tokens 96 \
  --spec-max-batch 1 --json "$OUT/smollm2_serve_load_control.json"
python tools/bench_serve.py --model smollm2 --quantization auto --spec-control adaptive --specs none mtp \
  --concurrency 1 4 16 64 --requests 64 --max-tokens 96 --json "$OUT/smollm2_serve_q4_1.json" \
  --plot "$OUT/smollm2_serve_q4_1.png"
python tools/bench_serve.py --model smollm2 --quantization auto --spec-control adaptive \
  --specs none mtp llama.cpp llama.cpp+lookup --json "$OUT/smollm2_serve_llamacpp_q4_1.json" \
  --plot "$OUT/smollm2_serve_llamacpp_q4_1.png"
python tools/bench_sampled_verification.py --rounds 6 --batch-sizes 1 8 --json "$OUT/smollm2_sampled_verification.json"
python tools/bench_scaling.py --quantization auto --json "$OUT/smollm2_scaling_q4_1.json" \
  --plot "$OUT/smollm2_scaling_q4_1.png"
# every block format's GEMM alone, and K-quant files of a Llama-shaped random model beside llama.cpp
python tools/bench_quant_gemm.py --mib 512 --rounds 3 --json "$OUT/quant_gemm.json"
python tools/bench_k_quants.py --json "$OUT/k_quants.json"
