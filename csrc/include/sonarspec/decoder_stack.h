// A stack of Llama decoder layers run as one native call for small CPU steps (decode,
// verification, draft steps): RoPE angles gathered from the tables, an MTP head's input
// projection when there is one, then per layer RMSNorm, fused q/k/v GEMM (+ bias), RoPE,
// KV store into the paged pools, paged attention, o GEMM + residual, RMSNorm, gated SiLU
// MLP + residual; then an optional final RMSNorm. It calls the same kernels in the same
// order as the per-op path (small_gemm, rope_cpu, kv_store_cpu, paged_attention_cpu,
// small_mlp, rms_norm_cpu), so both give bit-identical results; what it removes is the
// per-op dispatch between them. float32 activations; each matrix float32, bfloat16 or
// block-quantized in its own format (GGUF files mix them); float32, bfloat16 or float16
// KV pools.
#pragma once

#include <cstdint>

#include "sonarspec/kv_store.h"   // DType
#include "sonarspec/small_gemm.h"   // WeightFormat

namespace sonarspec {

// A weight matrix and how it is stored.
struct WeightMatrix {
  const void* data = nullptr;
  WeightFormat format = WeightFormat::kF32;
};

struct DecoderLayerWeights {
  const float* input_norm = nullptr;  // (hidden,); null: no input norm (EAGLE-1 heads)
  const float* post_norm = nullptr;   // (hidden,)
  // ((num_heads + 2 num_kv_heads) head_dim, hidden): q rows, k rows, v rows in qkv[0]; or,
  // when their formats differ, q, k and v as qkv[0..2]
  WeightMatrix qkv[3];
  const float* qkv_bias = nullptr;    // or null
  WeightMatrix o;                     // (hidden, num_heads head_dim)
  WeightMatrix gate_up;               // (2 inter, hidden): gate rows over up rows
  WeightMatrix down;                  // (hidden, inter)
  void* k_pool = nullptr;             // (num_slots, num_kv_heads, head_dim) of DecoderShape::kv_dtype
  void* v_pool = nullptr;
};

struct DecoderShape {
  int64_t hidden = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, inter = 0, num_slots = 0;
  float eps = 1e-6f;
  float scale = 0.f;   // attention scale (the caller's head_dim ** -0.5)
  DType kv_dtype = DType::kFloat32;   // the KV pools': float32, or bfloat16 / float16 (rounded on store)
};

// The step's attention metadata (see paged_attention.h); tree_begin/tree_mask may be null.
struct StepAttention {
  const int64_t* slot_mapping = nullptr;  // (m,) KV slot of each new token
  const int64_t* block_table = nullptr;   // (batch, max_pages)
  int64_t batch = 0, max_pages = 0, page_size = 0;
  const int64_t* token_seq = nullptr;
  const int64_t* key_begin = nullptr;
  const int64_t* key_end = nullptr;
  const int64_t* tree_begin = nullptr;
  const int64_t* tree_mask = nullptr;
};

// What is fixed per model besides its layers: RoPE tables, an optional MTP-head input
// projection and an optional final norm.
struct DecoderStackWeights {
  const DecoderLayerWeights* layers = nullptr;
  int64_t num_layers = 0;
  const float* cos_table = nullptr;  // (max_positions, head_dim / 2)
  const float* sin_table = nullptr;
  int64_t max_positions = 0;
  // MTP heads: x = fc(cat(enorm(x), hnorm(features))) (+ fc_bias) before the layers;
  // enorm/hnorm null for EAGLE-1 heads. fc null: no input projection.
  WeightMatrix fc;                   // (hidden, 2 hidden)
  const float* fc_bias = nullptr;
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  const float* final_norm = nullptr;  // (hidden,) or null
};

// x: (m, hidden) input rows (token embeddings), used as the residual stream and so
// overwritten; features: (m, hidden) for an MTP head's input projection, else null;
// positions: (m,) RoPE positions. out: (m, hidden) = final_norm(x) (x itself when there is
// no final norm; out may be x). Throws std::out_of_range for a position outside the RoPE
// tables. Returns, summed over layers, the tokens whose KV slot was past the pools (skipped
// as kv_store_cpu does; negative slots mark padding and are not counted) plus the query
// tokens that read no key (a row or page outside the tables, an empty key range).
// Residual streams copied out for a drafter that reads intermediate layers (EAGLE-3
// style): row t's stream after layer layers[j] (0-based) goes to out[(t * count + j) *
// hidden]. count 0: none. A layer index outside [0, num_layers) throws std::out_of_range.
struct LayerCapture {
  const int64_t* layers = nullptr;
  int64_t count = 0;
  float* out = nullptr;
};

int64_t decoder_stack_forward(const DecoderStackWeights& weights, const DecoderShape& shape, float* x,
                              const float* features, int64_t m, const int64_t* positions,
                              const StepAttention& attn, float* out, int num_threads,
                              const LayerCapture& capture = LayerCapture());

}  // namespace sonarspec
