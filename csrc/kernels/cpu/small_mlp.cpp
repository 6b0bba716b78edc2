// The gated MLP as one native call: both GEMMs stream their weights once for all rows,
// and the intermediate activations stay in per-thread scratch instead of tensors.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sonarspec/elementwise.h"
#include "sonarspec/small_gemm.h"

namespace sonarspec {

void small_mlp(const float* x, const void* gate_up, const void* down, float* y, int64_t m, int64_t hidden,
               int64_t inter, bool bf16_weights, int num_threads) {
  thread_local std::vector<float> gu, act;
  gu.resize(static_cast<size_t>(m * 2 * inter));
  act.resize(static_cast<size_t>(m * inter));
  if (bf16_weights) {
    small_gemm_bf16w(x, static_cast<const uint16_t*>(gate_up), nullptr, gu.data(), m, 2 * inter, hidden, num_threads);
  } else {
    small_gemm_f32(x, static_cast<const float*>(gate_up), nullptr, gu.data(), m, 2 * inter, hidden, num_threads);
  }
  silu_and_mul_cpu(gu.data(), act.data(), m, inter);
  if (bf16_weights) {
    small_gemm_bf16w(act.data(), static_cast<const uint16_t*>(down), nullptr, y, m, hidden, inter, num_threads);
  } else {
    small_gemm_f32(act.data(), static_cast<const float*>(down), nullptr, y, m, hidden, inter, num_threads);
  }
}

}  // namespace sonarspec
