// Small inline helpers shared by the CPU kernels: AVX2/FMA where the CPU has it (chosen
// at run time), portable loops elsewhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() / _mm256_undefined_*()
// (self-initialised variables), which -Wmaybe-uninitialized and -Wuninitialized report
// inside the intrinsic headers once inlined into a kernel: the AVX-512 kernel files wrap
// their AVX-512 sections in these.
#define SONARSPEC_INTRINSIC_WARNINGS_OFF                                                        \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define SONARSPEC_INTRINSIC_WARNINGS_ON _Pragma("GCC diagnostic pop")

namespace sonarspec {

// bfloat16 (raw bits) -> float32, exact: the bits are the high half of the float's.
inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Whether the environment variable `name` is set to something other than empty or "0..."
// (the SONARSPEC_NO_* switches).
inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// Dot product with four independent accumulators (lets the compiler vectorise).
inline float dot4(const float* a, const float* b, int64_t n) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

#if defined(__x86_64__)
inline bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// Eight values as float32: a load, or eight bfloat16 (raw bits) widened exactly.
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The sum of v's 8 lanes in one fixed order: the two halves, then pairs, then the last two.
__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// The largest of v's 8 lanes (NaN-free inputs): the two halves, then pairs, then the last two.
__attribute__((target("avx2,fma"))) inline float hmax_avx2(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

__attribute__((target("avx2,fma"))) inline float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum_avx2(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) inline void axpy_avx2(float* y, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// The vectorised exps' constants (Cephes expf): the lower bound, log2(e), ln 2 as a high
// and a low part, then the polynomial's coefficients, highest degree first.
constexpr float kExpLow = -87.3f, kExpLog2e = 1.44269504088896341f, kExpLn2Hi = 0.693359375f,
                kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp on eight floats <= 0 (Cephes expf: range reduction by ln 2, degree-6 polynomial;
// relative error about 2e-7); arguments below -87.3 give 0.
__attribute__((target("avx2,fma"))) inline __m256 exp_neg_avx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(kExpLow);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

__attribute__((target("avx2,fma"))) inline void exp_inplace_avx2(float* x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_neg_avx2(_mm256_loadu_ps(x + i)));
  const int rem = n - i < 8 ? n - i : 8;
  if (rem > 0) {
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < rem; ++j) tail[j] = x[i + j];
    _mm256_store_ps(tail, exp_neg_avx2(_mm256_load_ps(tail)));
    for (int j = 0; j < rem; ++j) x[i + j] = tail[j];
  }
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return dot_avx2(a, b, n);
#endif
  return dot4(a, b, n);
}

// y += a * x
inline void axpy(float* y, float a, const float* x, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return axpy_avx2(y, a, x, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void scale_row(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

// x[i] = exp(x[i]) for x[i] <= 0
inline void exp_inplace(float* x, int n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return exp_inplace_avx2(x, n);
#endif
  for (int i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

// Fetches the cache lines of `bytes` bytes at `p` into every cache level (kLocality 3) or
// into L2 and beyond (2).
template <int kLocality = 3>
inline void prefetch_lines(const char* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, kLocality);
}

}  // namespace sonarspec
