// A stack of Llama decoder layers run as one native call for small CPU steps (decode,
// verification, draft steps): per layer RMSNorm, fused q/k/v GEMM (+ bias), RoPE, KV
// store into the paged pools, paged attention, o GEMM + residual, RMSNorm, gated SiLU
// MLP + residual; then an optional final RMSNorm. It calls the same kernels in the same
// order as the per-op path (small_gemm, rope_cpu, kv_store_cpu, paged_attention_cpu,
// small_mlp, rms_norm_cpu), so both give bit-identical results; what it removes is the
// per-op dispatch between them. float32 activations and pools, float32 or bfloat16 weights.
#pragma once

#include <cstdint>

namespace sonarspec {

struct DecoderLayerWeights {
  const float* input_norm = nullptr;  // (hidden,); null: no input norm (EAGLE-1 heads)
  const float* post_norm = nullptr;   // (hidden,)
  const void* qkv = nullptr;          // ((num_heads + 2 num_kv_heads) head_dim, hidden): q rows, k rows, v rows
  const float* qkv_bias = nullptr;    // or null
  const void* o = nullptr;            // (hidden, num_heads head_dim)
  const void* gate_up = nullptr;      // (2 inter, hidden): gate rows over up rows
  const void* down = nullptr;         // (hidden, inter)
  float* k_pool = nullptr;            // (num_slots, num_kv_heads, head_dim)
  float* v_pool = nullptr;
};

struct DecoderShape {
  int64_t hidden = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, inter = 0, num_slots = 0;
  float eps = 1e-6f;
  float scale = 0.f;   // attention scale (the caller's head_dim ** -0.5)
  bool bf16_weights = false;
};

// The step's attention metadata (see paged_attention.h); tree_begin/tree_mask may be null.
struct StepAttention {
  const int64_t* slot_mapping = nullptr;  // (m,) KV slot of each new token
  const int64_t* block_table = nullptr;   // (batch, max_pages)
  int64_t max_pages = 0, page_size = 0;
  const int64_t* token_seq = nullptr;
  const int64_t* key_begin = nullptr;
  const int64_t* key_end = nullptr;
  const int64_t* tree_begin = nullptr;
  const int64_t* tree_mask = nullptr;
};

// x: (m, hidden) residual stream, updated in place; cos, sin: (m, head_dim / 2); out:
// (m, hidden) = final_norm(x) (a copy of x when final_norm is null); out may be x. Returns
// the number of tokens whose KV slot was out of range (skipped, as kv_store_cpu does:
// negative slots mark padding), summed over layers.
int64_t decoder_stack_forward(const DecoderLayerWeights* layers, int64_t num_layers, const DecoderShape& shape,
                              float* x, int64_t m, const float* cos, const float* sin, const StepAttention& attn,
                              const float* final_norm, float* out, int num_threads);

}  // namespace sonarspec
