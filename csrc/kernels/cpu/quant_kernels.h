// The column kernels behind quant_gemm (see sonarspec/quant_gemm.h for the layout and the
// arithmetic). Internal to quant_gemm*.cpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "sonarspec/small_gemm.h"   // WeightFormat
#include "vec.h"   // prefetch_lines
#include "weight_prefetch.h"

namespace sonarspec {

// Rows of activations quantized per block of 32 columns.
struct QuantizedRows {
  const int8_t* q = nullptr;     // (m, k) quants
  const float* d = nullptr;      // (m, kb) scales
  const int32_t* s = nullptr;    // (m, kb) sums of each block's quants
  const int32_t* s16 = nullptr;  // (m, 2 kb) sums of each half block's quants (Q6_K's sub-blocks)
  const float* ds = nullptr;     // (m, kb) d * float(s)
  int64_t k = 0, kb = 0;         // columns, blocks of 32 (k = 32 kb)
};

constexpr bool is_k_quant(WeightFormat f) {
  return f == WeightFormat::kQ4_K || f == WeightFormat::kQ5_K || f == WeightFormat::kQ6_K;
}

// Columns of one block: 32, or a K-quant super-block of 256.
constexpr int64_t block_columns(WeightFormat f) { return is_k_quant(f) ? 256 : 32; }

// Bytes of one block of one 16-row group (quant_gemm.h's layout).
constexpr int64_t quant_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ8_0: return 32 + 512;
    case WeightFormat::kQ4_1: return 64 + 256;
    case WeightFormat::kQ5_0: return 32 + 64 + 256;
    case WeightFormat::kQ5_1: return 64 + 64 + 256;
    case WeightFormat::kQ4_K: return 16 * 144;
    case WeightFormat::kQ5_K: return 16 * 176;
    case WeightFormat::kQ6_K: return 16 * 210;
    default: return 32 + 256;
  }
}

// Byte offsets inside a packed K-quant super-block of 16 rows.
constexpr int64_t kQ4kScales = 64, kQ4kQuants = 64 + 192;                    // after d, dmin (Q4_K, Q5_K)
constexpr int64_t kQ5kHigh = kQ4kQuants + 2048;                               // Q5_K's fifth bits
constexpr int64_t kQ6kScales = 32, kQ6kLow = 32 + 256, kQ6kHigh = 32 + 256 + 2048;   // after d

// Q4_K's (and Q5_K's) 6-bit scale and min of sub-block j from its 12 scale bytes b (llama.cpp's packing).
inline void q4k_scale_min(const uint8_t* b, int j, int32_t* sc, int32_t* m) {
  if (j < 4) {
    *sc = b[j] & 63;
    *m = b[j + 4] & 63;
  } else {
    *sc = (b[j + 4] & 0x0f) | ((b[j - 4] >> 6) << 4);
    *m = (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
  }
}

// The integer offset folded into Q8_0 (weights stored as q + 128), Q4_0 (q - 8) and Q5_0
// (q - 16) sums.
constexpr int32_t quant_offset(WeightFormat f) {
  return f == WeightFormat::kQ8_0 ? 128 : f == WeightFormat::kQ4_0 ? 8 : f == WeightFormat::kQ5_0 ? 16 : 0;
}

// 32-column formats with an offset per block (m), and with a fifth bit per quant (qh).
constexpr bool has_min(WeightFormat f) { return f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1; }
constexpr bool has_fifth_bit(WeightFormat f) { return f == WeightFormat::kQ5_0 || f == WeightFormat::kQ5_1; }

// Byte offsets in a packed 32-column block: the fifth bits (2 runs of 2 bytes x 16 rows),
// then the quant chunks.
constexpr int64_t fifth_bits_offset(WeightFormat f) { return has_min(f) ? 64 : 32; }
constexpr int64_t quants_offset(WeightFormat f) { return fifth_bits_offset(f) + (has_fifth_bit(f) ? 64 : 0); }

// Whether f is one of the block formats (not float32 / bfloat16).
constexpr bool is_quantized(WeightFormat f) {
  return f == WeightFormat::kQ8_0 || f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1 || has_fifth_bit(f) ||
         is_k_quant(f);
}

// Row r's 32 fifth bits (bit j: column j) of a packed Q5_0 / Q5_1 block.
inline uint32_t fifth_bits(const uint8_t* blk, WeightFormat f, int64_t r) {
  const uint8_t* h = blk + fifth_bits_offset(f) + 2 * r;
  return h[0] | h[1] << 8 | static_cast<uint32_t>(h[32]) << 16 | static_cast<uint32_t>(h[33]) << 24;
}

// Quantizes blocks of 32 floats: q[32 b + t], d[b], s[b] (sum of the block's quants),
// s16[2 b + h] (sums of its halves) and ds[b] = d[b] * s[b], by quant_gemm.h's rule. Every
// version gives identical results.
void quantize_blocks_scalar(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                            float* ds);
void quantize_blocks_vnni(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                          float* ds);
void quantize_blocks_avx2(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                          float* ds);

// y[i, j] for rows i < m and columns j in [n_begin, n_end), n_begin a multiple of 16.
void quant_cols_scalar(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                       int64_t n_begin, int64_t n_end);
void quant_cols_vnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end);
void quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end);
// The AVX2 kernel (every block format) and its twin with VPDPBUSD for the integer dot
// products of passes of two or more activation rows (AVX-VNNI, or AVX-512 VNNI + VL).
void quant_cols_avxvnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                        int64_t n_begin, int64_t n_end);

// fn(std::integral_constant<WeightFormat, F>{}) for the 32-column block format f (Q8_0,
// Q4_0, Q5_0, Q5_1, else Q4_1): how each kernel picks its template instantiation for them.
template <typename Fn>
void with_format(WeightFormat f, Fn&& fn) {
  switch (f) {
    case WeightFormat::kQ8_0: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ8_0>{});
    case WeightFormat::kQ4_0: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ4_0>{});
    case WeightFormat::kQ5_0: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ5_0>{});
    case WeightFormat::kQ5_1: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ5_1>{});
    default: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ4_1>{});
  }
}

// with_format's counterpart that also takes the K-quants (kernels with K-quant loops).
template <typename Fn>
void with_any_format(WeightFormat f, Fn&& fn) {
  switch (f) {
    case WeightFormat::kQ4_K: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ4_K>{});
    case WeightFormat::kQ5_K: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ5_K>{});
    case WeightFormat::kQ6_K: return fn(std::integral_constant<WeightFormat, WeightFormat::kQ6_K>{});
    default: return with_format(f, fn);
  }
}

// fn(std::integral_constant<int, R>{}) for R = min(rows, 8) >= 1: a kernel's rows per pass.
template <typename Fn>
void with_rows(int64_t rows, Fn&& fn) {
  switch (rows < 8 ? rows : 8) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    default: return fn(std::integral_constant<int, 8>{});
  }
}

// How the column kernels prefetch their weight stream (weight_prefetch.h) - the hardware
// prefetchers alone let the dot products and the weight stream take turns (a SmolLM2 Q4_1
// decode forward took 1.5x as long without it on an Intel VM). kNear: into L1,
// kPrefetchBlocks blocks ahead (the K-quants kPrefetchBytes); kFar: into L2, kFarBlocks blocks
// (kFarBytes) ahead. Groups follow each other in memory, so this runs on into the next group;
// a prefetch past the matrix is harmless.
constexpr int64_t kPrefetchBlocks = 8, kFarBlocks = 32;
constexpr int64_t kPrefetchBytes = 2560, kFarBytes = 10240;   // the K-quants' (about Q4_1's distances)

// The cache lines of `bytes` bytes at p, prefetched near_ahead bytes further on into L1
// (kNear) or far_ahead bytes further on into L2 (kFar).
template <Prefetch P>
inline void prefetch_weights(const uint8_t* p, int64_t bytes, int64_t near_ahead, int64_t far_ahead) {
  if constexpr (P == Prefetch::kNear) {
    prefetch_lines<3>(reinterpret_cast<const char*>(p) + near_ahead, bytes);
  } else if constexpr (P == Prefetch::kFar) {
    prefetch_lines<2>(reinterpret_cast<const char*>(p) + far_ahead, bytes);
  }
}

// The block of block_bytes at blk, kPrefetchBlocks or kFarBlocks blocks ahead.
template <Prefetch P>
inline void prefetch_ahead(const uint8_t* blk, int64_t block_bytes) {
  prefetch_weights<P>(blk, block_bytes, kPrefetchBlocks * block_bytes, kFarBlocks * block_bytes);
}

// The K-quant kernels walk a super-block in quarters: each prefetches its own bytes
// kPrefetchBytes or kFarBytes ahead.
template <Prefetch P>
inline void prefetch_span(const uint8_t* p, int64_t bytes) {
  prefetch_weights<P>(p, bytes, kPrefetchBytes, kFarBytes);
}

}  // namespace sonarspec
