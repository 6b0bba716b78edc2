// The gated MLP as one native call: both GEMMs stream their weights once for all rows,
// and the intermediate activations stay in per-thread scratch instead of tensors.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sonarspec/elementwise.h"
#include "sonarspec/small_gemm.h"

namespace sonarspec {

void small_mlp(const float* x, const void* gate_up, WeightFormat gate_up_format, const void* down,
               WeightFormat down_format, float* y, int64_t m, int64_t hidden, int64_t inter, int num_threads) {
  thread_local std::vector<float> gu, act;
  gu.resize(static_cast<size_t>(m * 2 * inter));
  act.resize(static_cast<size_t>(m * inter));
  small_gemm_any(x, gate_up, gate_up_format, nullptr, gu.data(), m, 2 * inter, hidden, num_threads);
  silu_and_mul_cpu(gu.data(), act.data(), m, inter);
  small_gemm_any(act.data(), down, down_format, nullptr, y, m, hidden, inter, num_threads);
}

}  // namespace sonarspec
