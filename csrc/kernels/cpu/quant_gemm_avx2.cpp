// quant_gemm's column kernel and activation quantizer with AVX2, for CPUs without AVX-512
// VNNI: each 64-byte chunk of the packed layout (4 columns x 16 weight rows) is two 32-byte
// halves of 8 rows, and VPMADDUBSW multiplies a half (unsigned bytes) by an activation
// row's 4 quants broadcast (signed), giving 16-bit sums of column pairs that VPMADDWD by
// ones folds to one int32 per weight row. No 16-bit sum can saturate: a Q4 block's eight
// pair sums add up to at most 8 x 2 x 15 x 127 = 30480, so they are summed in 16 bits and
// folded once per block; Q8_0's bytes are made signed again (q + 128 -> q) and multiplied
// as |q| x (x signed like q), at most 2 x 128 x 127 = 32512 per pair, folded per chunk. The
// integer dot products are therefore exact, and the float step per block is
// quant_cols_scalar's, lane by lane: the same bits as the portable loops and the VNNI
// kernel. K-quants: see quant_gemm_avx2_k.cpp. The activations are quantized by
// quantize_blocks_scalar's rule, 8 lanes at a time.
#include <algorithm>
#include <cmath>

#include "quant_avx2.h"
#include "quant_kernels.h"

namespace sonarspec {

#if defined(__x86_64__)
namespace {

using avx2::bcast4;

// Bits n..n+3 of each lane of qh moved to bit 4 of the lane's 4 bytes (as in the VNNI kernel).
QV_ATTR inline __m256i fifth(__m256i qh, int n) {
  const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_set1_epi32(n)), _mm256_set1_epi32(0x0f));
  return _mm256_slli_epi32(
      _mm256_and_si256(_mm256_mullo_epi32(v, _mm256_set1_epi32(0x00204081)), _mm256_set1_epi32(0x01010101)), 4);
}

// Which of a group's passes over the activation rows a call runs.
struct Passes {
  int index;
  int count;
};

// Rows [r0, r0 + R) of x against the first 8 H weight rows of one 16-row group (H = 2: the
// whole group in one pass, each activation broadcast shared by both halves and the weight
// stream prefetched without the pause that a second pass over the group would leave);
// half u's outputs go to y + 8 u, its first lanes[u] lanes.
template <int R, int H, WeightFormat F>
QV_ATTR void group_rows(const QuantizedRows& x, int64_t r0, const uint8_t* group, float* y, int64_t ldy,
                        const int (&lanes)[H], const Passes& passes) {
  constexpr int64_t bb = quant_block_bytes(F), qoff = quants_offset(F);
  constexpr int32_t off = quant_offset(F);
  const int64_t kb = x.kb;
  const int64_t share = passes.count > 1 ? kb * bb * passes.index : 0;   // x passes.count: this pass's share
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
  __m256 acc[H][R];
  for (int u = 0; u < H; ++u)
    for (int r = 0; r < R; ++r) acc[u][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* blk = group + b * bb;
    if (passes.count == 1) {
      prefetch_ahead<Prefetch::kNear>(blk, bb);
    } else {   // bytes [share + b bb, share + (b + 1) bb) / count of the next group
      for (int64_t l = ((share + b * bb) / passes.count) & ~int64_t{63}; l < (share + (b + 1) * bb) / passes.count;
           l += 64)
        __builtin_prefetch(group + kb * bb + l);
    }
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.q + (r0 + r) * x.k + b * 32;
    __m256i isum[H][R];
    for (int u = 0; u < H; ++u)
      for (int r = 0; r < R; ++r) isum[u][r] = _mm256_setzero_si256();
    if (F == WeightFormat::kQ8_0) {
      for (int c = 0; c < 8; ++c) {
        for (int u = 0; u < H; ++u) {
          const __m256i wq = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qoff + 32 * u + 64 * c)), flip);
          const __m256i wabs = _mm256_sign_epi8(wq, wq);
          for (int r = 0; r < R; ++r) {
            const __m256i pairs = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast4(xq[r] + 4 * c), wq));
            isum[u][r] = _mm256_add_epi32(isum[u][r], _mm256_madd_epi16(pairs, ones));
          }
        }
      }
    } else {
      __m256i pairs[H][R], qh[H];
      for (int u = 0; u < H; ++u) {
        for (int r = 0; r < R; ++r) pairs[u][r] = _mm256_setzero_si256();
        qh[u] = _mm256_setzero_si256();
        if constexpr (has_fifth_bit(F)) {
          const uint8_t* hp = blk + fifth_bits_offset(F) + 16 * u;
          qh[u] = _mm256_or_si256(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hp))),
                                  _mm256_slli_epi32(_mm256_cvtepu16_epi32(
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hp + 32))), 16));
        }
      }
      for (int c = 0; c < 4; ++c) {
        for (int u = 0; u < H; ++u) {
          const __m256i raw =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qoff + 32 * u + 64 * c));
          __m256i lo = _mm256_and_si256(raw, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          if constexpr (has_fifth_bit(F)) {
            lo = _mm256_or_si256(lo, fifth(qh[u], 4 * c));
            hi = _mm256_or_si256(hi, fifth(qh[u], 16 + 4 * c));
          }
          for (int r = 0; r < R; ++r) {
            pairs[u][r] = _mm256_add_epi16(pairs[u][r], _mm256_maddubs_epi16(lo, bcast4(xq[r] + 4 * c)));
            pairs[u][r] = _mm256_add_epi16(pairs[u][r], _mm256_maddubs_epi16(hi, bcast4(xq[r] + 16 + 4 * c)));
          }
          if (has_fifth_bit(F) ? c % 2 == 1 : c == 3) {   // 5-bit pair sums reach 7874: fold every 2 chunks
            for (int r = 0; r < R; ++r) {
              isum[u][r] = _mm256_add_epi32(isum[u][r], _mm256_madd_epi16(pairs[u][r], ones));
              pairs[u][r] = _mm256_setzero_si256();
            }
          }
        }
      }
      if (off) {
        for (int u = 0; u < H; ++u)
          for (int r = 0; r < R; ++r)
            isum[u][r] = _mm256_sub_epi32(isum[u][r], _mm256_set1_epi32(off * x.s[(r0 + r) * kb + b]));
      }
    }
    for (int u = 0; u < H; ++u) {
      const __m256 dw =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * u)));
      for (int r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * kb + b;
        acc[u][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[u][r]), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[i])),
                                    acc[u][r]);
      }
      if (has_min(F)) {
        const __m256 mw =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * u)));
        for (int r = 0; r < R; ++r)
          acc[u][r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.ds[(r0 + r) * kb + b]), acc[u][r]);
      }
    }
  }
  for (int u = 0; u < H; ++u) avx2::store_rows(acc[u], y + 8 * u, r0, ldy, lanes[u]);
}

// Whole 16-row groups in one pass (the last group in halves when it has 8 columns or
// fewer), in passes of up to 3 activation rows, as even as they can be (4 rows: 2 + 2, 5:
// 3 + 2, 7: 3 + 2 + 2). Each pass unpacks the group's nibbles again, so fewer passes save
// unpacking, but 3 rows x 2 halves of accumulators and pair sums overflow the 16
// registers: against passes of 2 rows, on a Zen 3 VM (2048 x
// 2048, an A/B in interleaved rounds) Q4_1 at 3 / 4 / 5 / 7 / 8 rows took 0.90 / 1.00 /
// 0.95 / 0.94 / 0.98x the time and Q8_0 0.91 / 1.01 / 0.94 / 0.94 / 0.97x, while passes of
// 3 with a 1-row remainder (4 rows: 3 + 1) lost 6%. With more than one pass, the passes after
// the first read the group from L1 and would leave the memory idle: instead every pass
// prefetches its share of the next group, so that its fetch overlaps all of this group's
// dot products (against no prefetch across passes, passes of 2: Q4_1 at 3 / 4 / 5 / 8 rows
// 0.93 / 0.91 / 0.93 / 0.94x the time, Q8_0 0.93 / 0.83 / 0.90 / 0.89x; a model's forward
// over 5 tokens moved within the VM's noise).
template <WeightFormat F>
void cols(const QuantizedRows& x, int64_t m, const uint8_t* w, int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  const int64_t group_bytes = x.kb * quant_block_bytes(F);
  const int count = static_cast<int>((m + 2) / 3);
  for (int64_t j = n_begin; j < n_end; j += 16) {
    const uint8_t* group = w + (j / 16) * group_bytes;
    const int64_t left = n_end - j;
    int64_t r0 = 0;
    for (int p = 0; p < count; ++p) {
      const int64_t rows = m / count + (p < m % count ? 1 : 0);
      const Passes passes{p, count};
      if (left > 8) {
        const int lanes[2] = {8, static_cast<int>(std::min<int64_t>(8, left - 8))};
        if (rows == 3) group_rows<3, 2, F>(x, r0, group, y + j, n, lanes, passes);
        else if (rows == 2) group_rows<2, 2, F>(x, r0, group, y + j, n, lanes, passes);
        else group_rows<1, 2, F>(x, r0, group, y + j, n, lanes, passes);
      } else {
        const int lanes[1] = {static_cast<int>(left)};
        if (rows == 3) group_rows<3, 1, F>(x, r0, group, y + j, n, lanes, passes);
        else if (rows == 2) group_rows<2, 1, F>(x, r0, group, y + j, n, lanes, passes);
        else group_rows<1, 1, F>(x, r0, group, y + j, n, lanes, passes);
      }
      r0 += rows;
    }
  }
}

// The quants of 8 floats: x * inv clamped to +-127, rounded to nearest even, NaN -> 0
// (quantize_blocks_scalar's rule for every input, infinities included).
QV_ATTR inline __m256i quants8(const float* x, __m256 inv) {
  const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
  const __m256 clamped = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
  return _mm256_and_si256(_mm256_cvtps_epi32(clamped), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
}

QV_ATTR inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

}  // namespace

QV_ATTR void quantize_blocks_avx2(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                                  float* ds) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   // undoes the packs' lane interleave
  for (int64_t i = 0; i < num_blocks; ++i) {
    const float* src = x + i * 32;
    __m256 mx = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const __m256 v = _mm256_loadu_ps(src + 8 * c);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v, abs_mask));
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (_mm256_movemask_ps(unordered)) amax = NAN;   // a NaN input makes its block's outputs NaN
    const float di = amax / 127.f;
    const __m256 inv = _mm256_set1_ps(di != 0.f ? 1.f / di : 0.f);
    __m256i qv[4];
    for (int c = 0; c < 4; ++c) qv[c] = quants8(src + 8 * c, inv);
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qv[0], qv[1]), _mm256_packs_epi32(qv[2], qv[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * 32), _mm256_permutevar8x32_epi32(bytes, order));
    s16[2 * i] = hsum8(_mm256_add_epi32(qv[0], qv[1]));
    s16[2 * i + 1] = hsum8(_mm256_add_epi32(qv[2], qv[3]));
    const int32_t sum = s16[2 * i] + s16[2 * i + 1];
    d[i] = di;
    s[i] = sum;
    ds[i] = di * static_cast<float>(sum);
  }
}

void quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end) {
  if (is_k_quant(f)) return k_quant_cols_avx2(x, m, w, f, n, y, n_begin, n_end);
  with_format(f, [&](auto fmt) { cols<decltype(fmt)::value>(x, m, w, n, y, n_begin, n_end); });
}
#else
void quantize_blocks_avx2(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                          float* ds) {
  quantize_blocks_scalar(x, num_blocks, q, d, s, s16, ds);
}

void quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end) {
  quant_cols_scalar(x, m, w, f, n, y, n_begin, n_end);
}
#endif

}  // namespace sonarspec
