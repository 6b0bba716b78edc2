// One weight row's integer quants and scales read out of quant_gemm.h's packed layout,
// without SIMD: what the portable GEMM loops and the embedding gather (embedding.cpp) read.
// Internal to the CPU kernels.
#pragma once

#include <cstdint>

#include "kv_convert.h"   // half_to_float
#include "quant_kernels.h"

namespace sonarspec {

// Row `lane` (0..15) of a 16-row group: its 32 quants of the 32-column block at `blk`, less
// the format's offset - Q8_0 -128..127, Q4_0 -8..7, Q5_0 -16..15, Q4_1 0..15, Q5_1 0..31 -
// so that a weight is d * q (+ m for Q4_1 / Q5_1).
inline void unpack_block(const uint8_t* blk, WeightFormat f, int64_t lane, int32_t q[32]) {
  const uint8_t* quants = blk + quants_offset(f) + 4 * lane;
  const int32_t off = quant_offset(f);
  if (f == WeightFormat::kQ8_0) {
    for (int c = 0; c < 8; ++c)
      for (int t = 0; t < 4; ++t) q[4 * c + t] = quants[64 * c + t] - off;
    return;
  }
  const uint32_t qh = has_fifth_bit(f) ? fifth_bits(blk, f, lane) : 0;
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < 4; ++t) {
      const uint8_t byte = quants[64 * c + t];
      const int col = 4 * c + t;
      q[col] = static_cast<int32_t>((byte & 0x0f) | ((qh >> col) & 1) << 4) - off;
      q[16 + col] = static_cast<int32_t>((byte >> 4) | ((qh >> (16 + col)) & 1) << 4) - off;
    }
}

// Columns of one K-quant sub-block: 32 (Q4_K, Q5_K; 8 per super-block) or 16 (Q6_K; 16).
constexpr int k_sub_columns(WeightFormat f) { return f == WeightFormat::kQ6_K ? 16 : 32; }

// Row `lane`'s sub-block `sub` of the K-quant super-block at `blk`: its quants (Q4_K 0..15,
// Q5_K 0..31, Q6_K -32..31), integer scale sc and min mn (Q6_K: its int8 scale, mn 0). A
// weight is (d * sc) * q - dmin * mn (Q6_K: (d * sc) * q).
inline void unpack_k_sub(const uint8_t* blk, WeightFormat f, int64_t lane, int sub, int32_t* q, int32_t* sc,
                         int32_t* mn) {
  if (f != WeightFormat::kQ6_K) {
    uint8_t bytes[12];
    for (int p = 0; p < 12; ++p) bytes[p] = blk[kQ4kScales + 32 * (p / 2) + 2 * lane + p % 2];
    q4k_scale_min(bytes, sub, sc, mn);
    for (int c = 0; c < 8; ++c)
      for (int t = 0; t < 4; ++t) {
        const uint8_t byte = blk[kQ4kQuants + 64 * (8 * (sub / 2) + c) + 4 * lane + t];
        const int high = f == WeightFormat::kQ5_K ? (blk[kQ5kHigh + 64 * c + 4 * lane + t] >> sub) & 1 : 0;
        q[4 * c + t] = ((sub % 2 ? byte >> 4 : byte) & 0x0f) | high << 4;
      }
    return;
  }
  *sc = static_cast<int8_t>(blk[kQ6kScales + 32 * (sub / 2) + 2 * lane + sub % 2]);
  *mn = 0;
  const int h = sub / 8, r0 = 16 * (sub % 8);
  for (int u = 0; u < 4; ++u)
    for (int t = 0; t < 4; ++t) {
      const uint8_t low = blk[kQ6kLow + 64 * (16 * h + (r0 % 64) / 4 + u) + 4 * lane + t];
      const uint8_t high = blk[kQ6kHigh + 64 * (8 * h + (r0 % 32) / 4 + u) + 4 * lane + t];
      q[4 * u + t] = (((low >> (4 * (r0 / 64))) & 15) | ((high >> (2 * (r0 / 32))) & 3) << 4) - 32;
    }
}

// Row `lane`'s float16 scale d and offset m (Q4_1, Q5_1; dmin of Q4_K, Q5_K) of a packed
// block or K-quant super-block: both begin with the 16 rows' d, then their m.
inline float lane_scale(const uint8_t* blk, int64_t lane) {
  return half_to_float(reinterpret_cast<const uint16_t*>(blk)[lane]);
}
inline float lane_min(const uint8_t* blk, int64_t lane) {
  return half_to_float(reinterpret_cast<const uint16_t*>(blk)[16 + lane]);
}

}  // namespace sonarspec
