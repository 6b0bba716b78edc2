// The column kernels behind quant_gemm (see sonarspec/quant_gemm.h for the layout and the
// arithmetic). Internal to quant_gemm*.cpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "sonarspec/small_gemm.h"   // WeightFormat

namespace sonarspec {

// Rows of activations quantized per block of 32 columns.
struct QuantizedRows {
  const int8_t* q = nullptr;    // (m, k) quants
  const float* d = nullptr;     // (m, kb) scales
  const int32_t* s = nullptr;   // (m, kb) sums of each block's quants
  const float* ds = nullptr;    // (m, kb) d * float(s)
  int64_t k = 0, kb = 0;        // columns, blocks of 32 (k = 32 kb)
};

// Bytes of one block of 32 columns of one 16-row group.
constexpr int64_t quant_block_bytes(WeightFormat f) {
  return f == WeightFormat::kQ8_0 ? 32 + 512 : f == WeightFormat::kQ4_1 ? 64 + 256 : 32 + 256;
}

// The integer offset folded into Q8_0 (weights stored as q + 128) and Q4_0 (q - 8) sums.
constexpr int32_t quant_offset(WeightFormat f) {
  return f == WeightFormat::kQ8_0 ? 128 : f == WeightFormat::kQ4_0 ? 8 : 0;
}

// Quantizes blocks of 32 floats: q[32 b + t], d[b], s[b] (sum of the block's quants) and
// ds[b] = d[b] * s[b], by quant_gemm.h's rule. Both versions give identical results.
void quantize_blocks_scalar(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, float* ds);
void quantize_blocks_vnni(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, float* ds);

// y[i, j] for rows i < m and columns j in [n_begin, n_end), n_begin a multiple of 16.
void quant_cols_scalar(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                       int64_t n_begin, int64_t n_end);
void quant_cols_vnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end);
void quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end);

// fn(std::integral_constant<WeightFormat, F>{}) for the block format f (Q8_0, Q4_0, else
// Q4_1): how each kernel picks its template instantiation.
template <typename Fn>
void with_format(WeightFormat f, Fn&& fn) {
  switch (f) {
    case WeightFormat::kQ8_0: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ8_0>{});
    case WeightFormat::kQ4_0: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ4_0>{});
    default: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ4_1>{});
  }
}

// Blocks ahead of the one in use whose cache lines the column kernels prefetch: the
// hardware prefetchers alone let the dot products and the weight stream take turns (a
// SmolLM2 Q4_1 decode forward took 1.5x as long without it). Groups follow each other in
// memory, so this runs on into the next group; a prefetch past the matrix is harmless.
constexpr int64_t kPrefetchBlocks = 8;

inline void prefetch_ahead(const uint8_t* blk, int64_t block_bytes) {
  for (int64_t l = 0; l < block_bytes; l += 64) __builtin_prefetch(blk + kPrefetchBlocks * block_bytes + l);
}

}  // namespace sonarspec
