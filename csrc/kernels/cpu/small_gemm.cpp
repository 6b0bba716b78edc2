// Register-blocked small-M GEMM for x86-64 with AVX2/FMA, using the 32 vector registers
// of AVX-512VL where the CPU has them (scalar fallback elsewhere).
// Up to 8 input rows are served by one pass over the weights, so verifying 1 + K
// tokens streams the weights once, like decoding one.
#include "sonarspec/small_gemm.h"
#include "sonarspec/quant_gemm.h"

#include <algorithm>
#include <vector>

#include "amx_gemm.h"
#include "bf16_dot.h"
#include "split_columns.h"

#include "vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sonarspec {
namespace {

inline float to_float(float v) { return v; }
inline float to_float(uint16_t bits) { return bf16_to_float(bits); }

#if defined(__x86_64__)

#define SG_NS avx2
#define SG_ATTR __attribute__((target("avx2,fma")))
#define SG_WIDE 0
#include "small_gemm_kernels.inc"
#undef SG_NS
#undef SG_ATTR
#undef SG_WIDE
#define SG_NS avx512vl
#define SG_ATTR __attribute__((target("avx2,fma,avx512f,avx512vl")))
#define SG_WIDE 1
#include "small_gemm_kernels.inc"
#undef SG_NS
#undef SG_ATTR
#undef SG_WIDE

bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512vl() { return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"); }
#endif

template <typename W>
void rows_scalar(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t n_begin,
                 int64_t n_end) {
  for (int64_t j = n_begin; j < n_end; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float s = 0.f;
      for (int64_t t = 0; t < k; ++t) s += x[i * k + t] * to_float(w[j * k + t]);
      y[i * n + j] = s;
    }
}

void add_bias(const float* bias, float* y, int64_t m, int64_t n, int64_t n_begin, int64_t n_end) {
  if (bias)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = n_begin; j < n_end; ++j) y[i * n + j] += bias[j];
}

template <typename W>
void rows(const float* x, const W* w, const float* bias, float* y, int64_t m, int64_t n, int64_t k,
          int64_t n_begin, int64_t n_end) {
#if defined(__x86_64__)
  static const bool avx2 = has_avx2(), avx512vl = has_avx512vl();
  if (avx512vl) {
    avx512vl::rows_simd<W>(x, w, y, m, n, k, n_begin, n_end);
  } else if (avx2) {
    avx2::rows_simd<W>(x, w, y, m, n, k, n_begin, n_end);
  } else {
    rows_scalar(x, w, y, m, n, k, n_begin, n_end);
  }
#else
  rows_scalar(x, w, y, m, n, k, n_begin, n_end);
#endif
  add_bias(bias, y, m, n, n_begin, n_end);
}

template <typename W>
void small_gemm(const float* x, const W* w, const float* bias, float* y, int64_t m, int64_t n, int64_t k,
                int num_threads) {
  split_columns(m, n, k, sizeof(W), num_threads,
                [&](int64_t b, int64_t e) { rows(x, w, bias, y, m, n, k, b, e); });
}

}  // namespace

void small_gemm_f32(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                    int64_t k, int num_threads) {
  small_gemm(x, w, bias, y, m, n, k, num_threads);
}

void small_gemm_bf16w(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m, int64_t n,
                      int64_t k, int num_threads) {
  thread_local std::vector<uint16_t> xb;
  const int64_t ldx = (k + 31) / 32 * 32;
  xb.resize(static_cast<size_t>(m * ldx));
  round_rows_to_bf16(x, xb.data(), m, k, ldx);
  if (amx_available()) {
    thread_local std::vector<uint16_t> tiles;
    tiles.resize(static_cast<size_t>(amx_packed_size(m, k)));
    amx_pack_rows(xb.data(), ldx, m, k, tiles.data());
    const uint16_t* packed = tiles.data();   // the workers see their own thread_local tiles
    split_columns(m, n, k, sizeof(uint16_t), num_threads, [&](int64_t b, int64_t e) {
      amx_gemm_cols(packed, m, w, n, k, y, b, e);
      add_bias(bias, y, m, n, b, e);
    }, 16);
    return;
  }
  if (bf16_dot_available()) {
    const uint16_t* rounded = xb.data();   // the workers see their own thread_local xb
    split_columns(m, n, k, sizeof(uint16_t), num_threads, [&](int64_t b, int64_t e) {
      bf16_dot_rows(rounded, ldx, w, y, m, n, k, b, e);
      add_bias(bias, y, m, n, b, e);
    });
    return;
  }
  // Without VDPBF16PS: the same rounded activations, widened, through the FMA kernel.
  thread_local std::vector<float> xr;
  xr.resize(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < k; ++t) xr[i * k + t] = bf16_to_float(xb[i * ldx + t]);
  small_gemm(xr.data(), w, bias, y, m, n, k, num_threads);
}

void small_gemm_any(const float* x, const void* w, WeightFormat format, const float* bias, float* y, int64_t m,
                    int64_t n, int64_t k, int num_threads) {
  switch (format) {
    case WeightFormat::kF32: return small_gemm(x, static_cast<const float*>(w), bias, y, m, n, k, num_threads);
    case WeightFormat::kBF16:
      return small_gemm_bf16w(x, static_cast<const uint16_t*>(w), bias, y, m, n, k, num_threads);
    default: return quant_gemm(x, static_cast<const uint8_t*>(w), format, bias, y, m, n, k, num_threads);
  }
}

}  // namespace sonarspec
