// y = x @ w^T (+ bias) with w kept in a GGUF block format (Q8_0, Q4_0, Q4_1): 32 weights
// of a row share a float16 scale d (Q4_1 also a float16 offset m), so a weight is
// d * q (Q8_0, q int8), d * (q - 8) (Q4_0, q in 0..15) or d * q + m (Q4_1, q in 0..15).
//
// Packed layout (ops.quantized packs GGUF blocks into it at load): the rows of w in
// groups of 16 (the last one padded with zero rows), group after group; within a group,
// for each block of 32 columns in turn, the 16 rows' float16 scales d (32 bytes), for
// Q4_1 their offsets m (32 bytes), then the quants as 64-byte chunks of 4 consecutive
// columns of all 16 rows (row r at bytes 4r..4r+3): Q8_0 eight chunks of columns 4c..4c+3
// with q + 128 as unsigned bytes; Q4_0/Q4_1 four chunks whose low nibbles are columns
// 4c..4c+3 and high nibbles columns 16+4c..16+4c+3. One vector load is then 16 rows x 4
// columns, the operand of one integer dot-product instruction.
//
// Arithmetic (the contract the tests check): each row of x is quantized per block of 32
// to int8, scale dx = amax / 127 and q = round(x / dx) (x * (1 / dx) in float32, nearest,
// ties to even, clamped to +-127; dx = 0 for an all-zero block); per block, the integer
// dot product of the quants is exact, and the output accumulates, block by block in
// order, fma(float(isum), d * dx, acc) (Q4_1 then fma(m, dx * sum(qx), acc)). Every output
// depends on its own row of x and row of w only - never on m, the column range or the
// thread count - and every kernel (quant_kernel()) computes exactly the same.
#pragma once

#include <cstdint>

#include "sonarspec/small_gemm.h"   // WeightFormat

namespace sonarspec {

// Bytes of a packed (n, k) matrix of `format` (k a multiple of 32).
int64_t quant_packed_bytes(WeightFormat format, int64_t n, int64_t k);

// x: (m, k) float32; w: packed as above; bias: (n,) or null; y: (m, n). k % 32 == 0.
void quant_gemm(const float* x, const uint8_t* w, WeightFormat format, const float* bias, float* y, int64_t m,
                int64_t n, int64_t k, int num_threads);

// The column kernel quant_gemm runs here, chosen once: "vnni" (AVX-512 F/BW/VL + VNNI),
// else "avx2" (AVX2, FMA, F16C), else "portable". The environment variable
// SONARSPEC_QUANT_KERNEL=avx2|portable caps the choice (for tests and comparisons); all
// three compute the same bits.
const char* quant_kernel();

}  // namespace sonarspec
