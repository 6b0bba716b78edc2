// bfloat16 dot-product GEMM rows for CPUs with AVX512_BF16 (VDPBF16PS): both operands
// bfloat16, products exact, sums in float32. Internal to small_gemm.cpp.
#pragma once

#include <cstdint>

#include "sonarspec/small_gemm.h"   // bf16_dot_available

namespace sonarspec {

// y[i, j] = sum_t xb[i, t] * w[j, t] for rows i in [0, m), columns j in [n_begin, n_end).
// xb: (m, ldx) bfloat16 bits, zero-padded from k to ldx (a multiple of 32);
// w: (n, k) bfloat16 bits; y: (m, n) float32. Column j's result depends only on row i of
// xb, column j of w and j's place in the 4-aligned column blocks, never on m or on which
// rows share a pass - so one row decoded alone equals the same row verified among others.
void bf16_dot_rows(const uint16_t* xb, int64_t ldx, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                   int64_t n_begin, int64_t n_end);

// Rounds m rows of k floats to bfloat16 (nearest, ties to even; NaN stays NaN) into
// (m, ldx) with zeros after column k.
void round_rows_to_bf16(const float* x, uint16_t* xb, int64_t m, int64_t k, int64_t ldx);

}  // namespace sonarspec
