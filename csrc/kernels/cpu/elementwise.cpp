#include "sonarspec/elementwise.h"

#include <cmath>

#include "vec.h"

namespace sonarspec {

void rms_norm_cpu(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    const float inv = 1.f / std::sqrt(dot4(xr, xr, n) / static_cast<float>(n) + eps);
    for (int64_t j = 0; j < n; ++j) o[j] = xr[j] * inv * weight[j];
  }
}

namespace {

#if defined(__x86_64__)
// gate * sigmoid(gate) * up on eight lanes: sigmoid from t = exp(-|gate|) <= 1, as 1 / (1 + t)
// or t / (1 + t) by the sign, so exp never overflows.
__attribute__((target("avx2,fma"))) inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 t = exp_neg_avx2(_mm256_xor_ps(_mm256_and_ps(g, abs_mask), _mm256_set1_ps(-0.f)));
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 num = _mm256_blendv_ps(one, t, g);   // sign bit of g set: t
  return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(num, _mm256_add_ps(one, t))), u);
}

// Every element, the tail included (zero-padded), takes the same vector formula, so an
// output does not depend on its column or on the row count.
__attribute__((target("avx2,fma"))) void silu_and_mul_avx2(const float* gate, const float* up, float* o, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(o + j, silu_mul8(_mm256_loadu_ps(gate + j), _mm256_loadu_ps(up + j)));
  if (j < n) {
    alignas(32) float g[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t t = j; t < n; ++t) g[t - j] = gate[t], u[t - j] = up[t];
    _mm256_store_ps(g, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    for (int64_t t = j; t < n; ++t) o[t] = g[t - j];
  }
}
#endif

}  // namespace

void silu_and_mul_cpu(const float* x, float* out, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * n;
    const float* up = gate + n;
    float* o = out + r * n;
#if defined(__x86_64__)
    if (cpu_has_avx2()) {
      silu_and_mul_avx2(gate, up, o, n);
      continue;
    }
#endif
    for (int64_t j = 0; j < n; ++j) o[j] = gate[j] / (1.f + std::exp(-gate[j])) * up[j];
  }
}

void rope_cpu(const float* x, const float* cos, const float* sin, float* out, int64_t rows, int64_t heads,
              int64_t d) {
  const int64_t half = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    for (int64_t h = 0; h < heads; ++h) {
      const float* x1 = x + (r * heads + h) * d;
      const float* x2 = x1 + half;
      float* o1 = out + (r * heads + h) * d;
      float* o2 = o1 + half;
      for (int64_t j = 0; j < half; ++j) {
        o1[j] = x1[j] * c[j] - x2[j] * s[j];
        o2[j] = x2[j] * c[j] + x1[j] * s[j];
      }
    }
  }
}

}  // namespace sonarspec
