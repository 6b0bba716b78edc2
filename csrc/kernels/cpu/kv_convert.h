// Conversions between float32 rows and KV pools of 16-bit floats (bfloat16, float16):
// narrowing rounds to nearest even, widening is exact, so attention over a 16-bit pool
// equals float32 attention over the rounded keys and values. Internal to the CPU kernels.
#pragma once

#include <cstdint>

#include "sonarspec/kv_store.h"   // DType

namespace sonarspec {

// float16 bits -> float32, exact (subnormals, infinities and NaN included).
float half_to_float(uint16_t h);

// dst[c * d + i] = pool[slots[c] * row + off + i] as float32, for c < n, i < d.
void kv_widen_rows(const void* pool, DType dtype, const int64_t* slots, int n, int64_t row, int64_t off, int64_t d,
                   float* dst);

// dst[i] = src[i] rounded to dtype, i < n (float32: copied).
void kv_narrow_row(const float* src, DType dtype, void* dst, int64_t n);

}  // namespace sonarspec
