// y = x @ w^T (+ bias) with w kept in a GGUF block format (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): 32 weights
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
// K-quants keep GGUF's super-blocks of 256 columns, their bytes permuted the same way:
// per 16-row group and super-block, Q4_K has the rows' float16 d, float16 dmin, then its
// 12 scale bytes as 6 runs of 2 bytes x 16 rows, then its 128 quant bytes as 32 chunks of
// 4 bytes x 16 rows (chunk c holds bytes 4c..4c+3: low nibbles are columns 64 (c / 8) +
// 4 (c % 8) + 0..3, high nibbles the same + 32); a weight of sub-block j (32 columns) is
// (d * sc_j) * q - dmin * m_j with llama.cpp's 6-bit sc_j, m_j. Q6_K has the rows' float16
// d, its 16 int8 scales as 8 runs of 2 bytes x 16 rows, its 128 low-nibble bytes (ql) and
// 64 high-bit bytes (qh) as chunks of 4 bytes x 16 rows; a weight of sub-block i (16
// columns) is (d * sc_i) * (q - 32), q of 6 bits (GGUF's Q6_K bit layout). Q5_K is Q4_K's
// layout followed by its 32 fifth-bit bytes (qh) as 8 chunks of 4 bytes x 16 rows (bit j of
// qh byte l: column l of sub-block j).
//
// Arithmetic (the contract the tests check): each row of x is quantized per block of 32
// to int8, scale dx = amax / 127 and q = round(x / dx) (x * (1 / dx) in float32, nearest,
// ties to even, clamped to +-127; dx = 0 for an all-zero block); per block, the integer
// dot product of the quants is exact, and the output accumulates, block by block in
// order, fma(float(isum), d * dx, acc) (Q4_1 then fma(m, dx * sum(qx), acc)). Every output
// Q4_K (and Q5_K) accumulates per sub-block of 32 as Q4_1 does, with scale d * sc_j and offset
// -(dmin * m_j) (both exact in float32); Q6_K per sub-block of 16, fma(float(isum - 32 *
// sum(qx of the 16)), (d * sc_i) * dx, acc), in column order. Every output
// depends on its own row of x and row of w only - never on m, the column range or the
// thread count - and every kernel (quant_kernel()) computes exactly the same.
#pragma once

#include <cstdint>

#include "sonarspec/small_gemm.h"   // WeightFormat

namespace sonarspec {

// Columns of one block of `format`: 32, or 256 for the K-quants (Q4_K, Q5_K, Q6_K).
int64_t quant_block_columns(WeightFormat format);

// Bytes of a packed (n, k) matrix of `format` (k a multiple of its block columns).
int64_t quant_packed_bytes(WeightFormat format, int64_t n, int64_t k);

// x: (m, k) float32; w: packed as above; bias: (n,) or null; y: (m, n). k a multiple of
// the format's block columns.
void quant_gemm(const float* x, const uint8_t* w, WeightFormat format, const float* bias, float* y, int64_t m,
                int64_t n, int64_t k, int num_threads);

// The column kernel quant_gemm runs here, chosen once: "vnni" (AVX-512 F/BW/VL + VNNI),
// else "avxvnni" (AVX2, FMA, F16C and VPDPBUSD on 256-bit vectors: AVX-VNNI, or AVX-512
// VNNI + VL), else "avx2" (AVX2, FMA, F16C), else "portable". The environment variable
// SONARSPEC_QUANT_KERNEL=avxvnni|avx2|portable caps the choice (for tests and comparisons);
// all four compute the same bits.
const char* quant_kernel();

}  // namespace sonarspec
