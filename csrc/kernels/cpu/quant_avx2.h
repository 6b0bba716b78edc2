// What quant_gemm's 256-bit column kernels share (quant_gemm_avx2_cols.inc: 32-column
// formats, quant_gemm_avx2_k_cols.inc: K-quants; both built by quant_gemm_avx2.cpp): the
// activation broadcast, the stores of 8 weight rows' outputs, and the walk over 8-row halves
// of the column range in passes of activation rows. Internal to those files.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#define QV_ATTR __attribute__((target("avx2,fma,f16c")))

namespace sonarspec {
namespace avx2 {

constexpr int kRowsPerPass = 4;   // activation rows per pass: 2 x 4 accumulators + temporaries in 16 registers

QV_ATTR inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// acc[r] (8 weight rows' outputs of activation row r0 + r) to y; the first `lanes` of them.
template <int R>
QV_ATTR inline void store_rows(const __m256 (&acc)[R], float* y, int64_t r0, int64_t ldy, int lanes) {
  for (int r = 0; r < R; ++r) {
    if (lanes == 8) {
      _mm256_storeu_ps(y + (r0 + r) * ldy, acc[r]);
      continue;
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, acc[r]);
    std::copy(out, out + lanes, y + (r0 + r) * ldy);
  }
}

// fn(std::integral_constant<int, R>{}, r0, group, h, out, lanes) for each 8-row half h of
// the 16-row groups over columns [n_begin, n_end) (n_begin a multiple of 8) and each pass
// of R <= kRowsPerPass activation rows from r0.
template <typename Fn>
inline void for_halves(int64_t m, const uint8_t* w, int64_t group_bytes, float* y, int64_t n_begin, int64_t n_end,
                       Fn&& fn) {
  for (int64_t j = n_begin; j < n_end; j += 8) {
    const uint8_t* group = w + (j / 16) * group_bytes;
    const int h = static_cast<int>((j / 8) % 2);
    const int lanes = static_cast<int>(std::min<int64_t>(8, n_end - j));
    for (int64_t r0 = 0; r0 < m; r0 += kRowsPerPass) {
      switch (std::min<int64_t>(kRowsPerPass, m - r0)) {
        case 1: fn(std::integral_constant<int, 1>{}, r0, group, h, y + j, lanes); break;
        case 2: fn(std::integral_constant<int, 2>{}, r0, group, h, y + j, lanes); break;
        case 3: fn(std::integral_constant<int, 3>{}, r0, group, h, y + j, lanes); break;
        default: fn(std::integral_constant<int, 4>{}, r0, group, h, y + j, lanes); break;
      }
    }
  }
}

}  // namespace avx2
}  // namespace sonarspec
#endif
