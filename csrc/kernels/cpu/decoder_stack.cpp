// Decoder layers in one native call; see decoder_stack.h for the contract.
#include "sonarspec/decoder_stack.h"

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "sonarspec/elementwise.h"
#include "sonarspec/kv_store.h"
#include "sonarspec/paged_attention.h"
#include "sonarspec/small_gemm.h"
#include "sonarspec/stack_profile.h"

namespace sonarspec {
namespace {

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// Copies `cols` floats of each of `rows` rows from a row stride of `src_stride` into a
// contiguous (rows, cols) block.
void gather_rows(const float* src, int64_t src_stride, float* dst, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * cols, src + r * src_stride, sizeof(float) * cols);
}

}  // namespace

int64_t decoder_stack_forward(const DecoderStackWeights& w, const DecoderShape& s, float* x, const float* features,
                              int64_t m, const int64_t* positions, const StepAttention& a, float* out,
                              int num_threads, const LayerCapture& capture) {
  for (int64_t j = 0; j < capture.count; ++j) {
    if (capture.layers[j] < 0 || capture.layers[j] >= w.num_layers) {
      throw std::out_of_range("captured layer " + std::to_string(capture.layers[j]) + " is outside the stack's " +
                              std::to_string(w.num_layers) + " layers");
    }
  }
  const int64_t q_dim = s.num_heads * s.head_dim, kv_dim = s.num_kv_heads * s.head_dim;
  const int64_t qk_dim = q_dim + kv_dim, qkv_dim = qk_dim + kv_dim, half = s.head_dim / 2;
  thread_local std::vector<float> h, qkv, part, qk, qk_rot, q, k, v, att, tmp, cos, sin;
  cos.resize(static_cast<size_t>(m * half));
  sin.resize(static_cast<size_t>(m * half));
  for (int64_t t = 0; t < m; ++t) {
    if (positions[t] < 0 || positions[t] >= w.max_positions) {
      throw std::out_of_range("position " + std::to_string(positions[t]) + " is outside the RoPE tables (" +
                              std::to_string(w.max_positions) + " positions)");
    }
    std::memcpy(cos.data() + t * half, w.cos_table + positions[t] * half, sizeof(float) * half);
    std::memcpy(sin.data() + t * half, w.sin_table + positions[t] * half, sizeof(float) * half);
  }
  StackTimer timer(w.num_layers, m);
  h.resize(static_cast<size_t>(m * 2 * s.hidden));
  tmp.resize(static_cast<size_t>(m * s.hidden));
  if (w.fc.data != nullptr) {  // x = fc(cat(enorm(x), hnorm(features)))
    for (int64_t t = 0; t < m; ++t) {
      float* row = h.data() + t * 2 * s.hidden;
      const float* e = x + t * s.hidden;
      const float* f = features + t * s.hidden;
      if (w.enorm != nullptr) {
        rms_norm_cpu(e, w.enorm, row, 1, s.hidden, s.eps);
        rms_norm_cpu(f, w.hnorm, row + s.hidden, 1, s.hidden, s.eps);
      } else {
        std::memcpy(row, e, sizeof(float) * s.hidden);
        std::memcpy(row + s.hidden, f, sizeof(float) * s.hidden);
      }
    }
    small_gemm_any(h.data(), w.fc.data, w.fc.format, w.fc_bias, x, m, s.hidden, 2 * s.hidden, num_threads);
  }
  qkv.resize(static_cast<size_t>(m * qkv_dim));
  qk.resize(static_cast<size_t>(m * qk_dim));
  qk_rot.resize(static_cast<size_t>(m * qk_dim));
  q.resize(static_cast<size_t>(m * q_dim));
  k.resize(static_cast<size_t>(m * kv_dim));
  v.resize(static_cast<size_t>(m * kv_dim));
  att.resize(static_cast<size_t>(m * q_dim));
  int64_t bad = 0;   // slots past the pools, and query tokens that read no key
  timer.mark(StackPhase::kOther);
  for (int64_t l = 0; l < w.num_layers; ++l) {
    const DecoderLayerWeights& L = w.layers[l];
    const float* in = x;
    if (L.input_norm != nullptr) {
      rms_norm_cpu(x, L.input_norm, h.data(), m, s.hidden, s.eps);
      in = h.data();
    }
    timer.mark(StackPhase::kNorm);
    if (L.qkv[1].data == nullptr) {
      small_gemm_any(in, L.qkv[0].data, L.qkv[0].format, L.qkv_bias, qkv.data(), m, qkv_dim, s.hidden, num_threads);
    } else {   // q, k, v in their own formats, their columns placed side by side
      const int64_t dims[3] = {q_dim, kv_dim, kv_dim};
      for (int p = 0, col = 0; p < 3; col += dims[p++]) {
        part.resize(static_cast<size_t>(m * dims[p]));
        small_gemm_any(in, L.qkv[p].data, L.qkv[p].format, L.qkv_bias ? L.qkv_bias + col : nullptr, part.data(), m,
                       dims[p], s.hidden, num_threads);
        for (int64_t t = 0; t < m; ++t)
          std::memcpy(qkv.data() + t * qkv_dim + col, part.data() + t * dims[p], sizeof(float) * dims[p]);
      }
    }
    timer.mark(StackPhase::kQkv);
    gather_rows(qkv.data(), qkv_dim, qk.data(), m, qk_dim);   // cat(q, k) per token
    rope_cpu(qk.data(), cos.data(), sin.data(), qk_rot.data(), m, s.num_heads + s.num_kv_heads, s.head_dim);
    gather_rows(qk_rot.data(), qk_dim, q.data(), m, q_dim);
    gather_rows(qk_rot.data() + q_dim, qk_dim, k.data(), m, kv_dim);
    gather_rows(qkv.data() + qk_dim, qkv_dim, v.data(), m, kv_dim);
    timer.mark(StackPhase::kRope);
    bad += kv_store_rows_cpu(k.data(), v.data(), L.k_pool, L.v_pool, s.kv_dtype, a.slot_mapping, m, kv_dim,
                             s.num_slots);
    timer.mark(StackPhase::kKvStore);
    const int64_t no_keys = paged_attention_cpu(q.data(), L.k_pool, L.v_pool, s.kv_dtype, a.block_table, a.batch, a.max_pages,
                                                a.page_size, a.token_seq, a.key_begin, a.key_end, a.tree_begin,
                                                a.tree_mask, att.data(), m, s.num_heads, s.num_kv_heads, s.head_dim,
                                                s.num_slots, s.scale, num_threads);
    bad += no_keys < 0 ? m : no_keys;
    timer.mark(StackPhase::kAttention);
    small_gemm_any(att.data(), L.o.data, L.o.format, nullptr, tmp.data(), m, s.hidden, q_dim, num_threads);
    add_inplace(x, tmp.data(), m * s.hidden);
    timer.mark(StackPhase::kOutProj);
    rms_norm_cpu(x, L.post_norm, h.data(), m, s.hidden, s.eps);
    timer.mark(StackPhase::kNorm);
    small_mlp(h.data(), L.gate_up.data, L.gate_up.format, L.down.data, L.down.format, tmp.data(), m, s.hidden,
              s.inter, num_threads);
    add_inplace(x, tmp.data(), m * s.hidden);
    for (int64_t j = 0; j < capture.count; ++j) {
      if (capture.layers[j] != l) continue;
      for (int64_t t = 0; t < m; ++t)
        std::memcpy(capture.out + (t * capture.count + j) * s.hidden, x + t * s.hidden, sizeof(float) * s.hidden);
    }
    timer.mark(StackPhase::kMlp);
  }
  if (w.final_norm != nullptr) {
    rms_norm_cpu(x, w.final_norm, out, m, s.hidden, s.eps);
  } else if (out != x) {
    std::memcpy(out, x, sizeof(float) * m * s.hidden);
  }
  timer.mark(StackPhase::kOther);
  return bad;
}

}  // namespace sonarspec
