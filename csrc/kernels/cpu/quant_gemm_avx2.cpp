// quant_gemm's column kernels and activation quantizer with 256-bit vectors, for CPUs without
// AVX-512 VNNI: each 64-byte chunk of the packed layout (4 columns x 16 weight rows) is two
// 32-byte halves of 8 rows, multiplied by an activation row's 4 quants broadcast (signed).
// With AVX2 alone VPMADDUBSW gives 16-bit sums of column pairs (unsigned weight bytes) that
// VPMADDWD by ones folds to one int32 per weight row. No 16-bit sum can saturate: a Q4
// block's eight pair sums add up to at most 8 x 2 x 15 x 127 = 30480, so they are summed in
// 16 bits and folded once per block; Q8_0's bytes are made signed again (q + 128 -> q) and
// multiplied as |q| x (x signed like q), at most 2 x 128 x 127 = 32512 per pair, folded per
// chunk. With AVX-VNNI (quant_cols_avxvnni) one VPDPBUSD adds the four products per int32
// lane instead, in passes of two or more activation rows (quant_gemm_avx2_cols.inc holds the
// kernel once for both). The integer dot products are exact either way, and the float step
// per block is quant_cols_scalar's, lane by lane: the same bits as the portable loops and the
// AVX-512 VNNI kernel. K-quants: see quant_gemm_avx2_k_cols.inc (both dot products too). The
// activations are quantized by quantize_blocks_scalar's rule, 8 lanes at a time.
#include <algorithm>
#include <cmath>

#include "quant_avx2.h"
#include "quant_kernels.h"

namespace sonarspec {

#if defined(__x86_64__)
namespace {

namespace maddubs {
#define QV_COLS_ATTR __attribute__((target("avx2,fma,f16c")))
#define QV_DPBUSD 0
#include "quant_gemm_avx2_cols.inc"
#include "quant_gemm_avx2_k_cols.inc"
#undef QV_DPBUSD
#undef QV_COLS_ATTR
}  // namespace maddubs

namespace vex_vnni {
#define QV_COLS_ATTR __attribute__((target("avx2,fma,f16c,avxvnni")))
#define QV_DPBUSD 1
#include "quant_gemm_avx2_cols.inc"
#include "quant_gemm_avx2_k_cols.inc"
#undef QV_DPBUSD
#undef QV_COLS_ATTR
}  // namespace vex_vnni

namespace evex_vnni {
#define QV_COLS_ATTR __attribute__((target("avx2,fma,f16c,avx512vnni,avx512vl")))
#define QV_DPBUSD 2
#include "quant_gemm_avx2_cols.inc"
#include "quant_gemm_avx2_k_cols.inc"
#undef QV_DPBUSD
#undef QV_COLS_ATTR
}  // namespace evex_vnni

// The quants of 8 floats: x * inv clamped to +-127, rounded to nearest even, NaN -> 0
// (quantize_blocks_scalar's rule for every input, infinities included).
QV_ATTR inline __m256i quants8(const float* x, __m256 inv) {
  const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
  const __m256 clamped = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
  return _mm256_and_si256(_mm256_cvtps_epi32(clamped), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
}

QV_ATTR inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

}  // namespace

QV_ATTR void quantize_blocks_avx2(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                                  float* ds) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   // undoes the packs' lane interleave
  for (int64_t i = 0; i < num_blocks; ++i) {
    const float* src = x + i * 32;
    __m256 mx = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const __m256 v = _mm256_loadu_ps(src + 8 * c);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v, abs_mask));
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (_mm256_movemask_ps(unordered)) amax = NAN;   // a NaN input makes its block's outputs NaN
    const float di = amax / 127.f;
    const __m256 inv = _mm256_set1_ps(di != 0.f ? 1.f / di : 0.f);
    __m256i qv[4];
    for (int c = 0; c < 4; ++c) qv[c] = quants8(src + 8 * c, inv);
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qv[0], qv[1]), _mm256_packs_epi32(qv[2], qv[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * 32), _mm256_permutevar8x32_epi32(bytes, order));
    s16[2 * i] = hsum8(_mm256_add_epi32(qv[0], qv[1]));
    s16[2 * i + 1] = hsum8(_mm256_add_epi32(qv[2], qv[3]));
    const int32_t sum = s16[2 * i] + s16[2 * i + 1];
    d[i] = di;
    s[i] = sum;
    ds[i] = di * static_cast<float>(sum);
  }
}

// Columns [n_begin, n_end) of format F through the kernels of namespace ns.
#define QV_FORMAT_COLS(ns, F) \
  if constexpr (is_k_quant(F)) ns::k_cols<F>(x, m, w, n, y, n_begin, n_end); \
  else ns::cols<F>(x, m, w, n, y, n_begin, n_end)

void quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end) {
  with_any_format(f, [&](auto fmt) { QV_FORMAT_COLS(maddubs, decltype(fmt)::value); });
}

void quant_cols_avxvnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                        int64_t n_begin, int64_t n_end) {
  static const bool vex = __builtin_cpu_supports("avxvnni");   // else AVX-512 VNNI + VL (quant_gemm.cpp checks)
  with_any_format(f, [&](auto fmt) {
    if (vex) {
      QV_FORMAT_COLS(vex_vnni, decltype(fmt)::value);
    } else {
      QV_FORMAT_COLS(evex_vnni, decltype(fmt)::value);
    }
  });
}
#undef QV_FORMAT_COLS
#else
void quantize_blocks_avx2(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                          float* ds) {
  quantize_blocks_scalar(x, num_blocks, q, d, s, s16, ds);
}

void quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end) {
  quant_cols_scalar(x, m, w, f, n, y, n_begin, n_end);
}

void quant_cols_avxvnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                        int64_t n_begin, int64_t n_end) {
  quant_cols_scalar(x, m, w, f, n, y, n_begin, n_end);
}
#endif

}  // namespace sonarspec
