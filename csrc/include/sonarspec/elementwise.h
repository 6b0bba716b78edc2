// Row-wise elementwise kernels for small CPU steps, float32. Framework free.
#pragma once

#include <cstdint>

namespace sonarspec {

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, for rows of length n.
void rms_norm_cpu(const float* x, const float* weight, float* out, int64_t rows, int64_t n, float eps);

// x: (rows, 2n) = [gate | up]; out: (rows, n) = silu(gate) * up.
void silu_and_mul_cpu(const float* x, float* out, int64_t rows, int64_t n);

// Rotate-half RoPE: x, out (rows, heads, d); cos, sin (rows, d / 2) - every head of a
// row shares its row's angles.
void rope_cpu(const float* x, const float* cos, const float* sin, float* out, int64_t rows, int64_t heads,
              int64_t d);

}  // namespace sonarspec
