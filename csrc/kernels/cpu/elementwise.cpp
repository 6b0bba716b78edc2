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

void silu_and_mul_cpu(const float* x, float* out, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x + r * 2 * n;
    const float* up = gate + n;
    float* o = out + r * n;
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
