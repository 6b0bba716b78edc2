// quant_gemm's K-quant columns with AVX2 (Q4_K, Q5_K, Q6_K; quant_gemm_avx2.cpp has the
// 32-column formats): each 64-byte chunk of 16 rows is two 32-byte halves of 8 rows, and
// VPMADDUBSW multiplies a half's quants (unsigned bytes) by an activation row's 4 quants
// broadcast, VPMADDWD by ones folding the 16-bit pair sums to one int32 per row. A pair sum
// is at most 2 x 15 x 127 = 3810 for Q4_K, 7874 for Q5_K and 16002 for Q6_K (6-bit quants
// before their offset of 32), so pair sums are added in 16 bits over 8, 4 and 2 chunks
// before each fold: the integer sums are exact, and the float steps are
// quant_cols_scalar's, lane by lane - the same bits as the portable loops and the VNNI
// kernel.
#include "quant_avx2.h"
#include "quant_kernels.h"

namespace sonarspec {

#if defined(__x86_64__)
namespace {

using avx2::bcast4;

QV_ATTR inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 8 rows' 16-bit values at p (16 bytes) widened to int32 lanes.
QV_ATTR inline __m256i rows16(const uint8_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

QV_ATTR inline __m256 halves8(const uint8_t* p) {   // 8 rows' float16 values
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Scale byte p of Q4_K's 12 (rows 8h..8h+7), from the runs of 2 bytes.
QV_ATTR inline __m256i scale_byte(const uint8_t* blk, int h, int p) {
  const __m256i v = rows16(blk + kQ4kScales + 32 * (p / 2) + 16 * h);
  return p % 2 ? _mm256_srli_epi32(v, 8) : _mm256_and_si256(v, _mm256_set1_epi32(0xff));
}

template <int R>
QV_ATTR inline void fold(__m256i (&pairs)[R], __m256i (&isum)[R]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) {
    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs[r], ones));
    pairs[r] = _mm256_setzero_si256();
  }
}

// Rows [r0, r0 + R) of x against weight rows 8h..8h+7 of one group for the H halves h =
// h0 .. h0 + H - 1 (H = 2: the whole group in one pass, as in quant_gemm_avx2.cpp); half
// h's outputs go to y + 8 (h - h0), its first lanes[h - h0] lanes.
template <int R, int H, WeightFormat F>
QV_ATTR void half_rows(const QuantizedRows& x, int64_t r0, const uint8_t* group, int h0, float* y, int64_t ldy,
                       const int (&lanes)[H]) {
  constexpr int64_t bb = quant_block_bytes(F);
  const __m256i low4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3);
  const bool prefetch = H == 2 || h0 == 0;
  __m256 acc[H][R];
  for (int u = 0; u < H; ++u)
    for (int r = 0; r < R; ++r) acc[u][r] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < x.k / 256; ++sb) {
    const uint8_t* blk = group + sb * bb;
    __m256 d[H];   // each half's super-block scales
    for (int u = 0; u < H; ++u) d[u] = halves8(blk + 16 * (h0 + u));
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.q + (r0 + r) * x.k + sb * 256;
    if constexpr (F == WeightFormat::kQ6_K) {
      for (int sub = 0; sub < 16; ++sub) {
        if (prefetch && sub % 4 == 0) prefetch_span<Prefetch::kNear>(blk + (sub / 4) * (bb / 4), bb / 4);
        const int half = sub / 8, q0 = 16 * (sub % 8);
        const __m128i lo_shift = _mm_cvtsi32_si128(4 * (q0 / 64)), hi_shift = _mm_cvtsi32_si128(2 * (q0 / 32));
        for (int u = 0; u < H; ++u) {
          const int h = h0 + u;
          const __m256i run = rows16(blk + kQ6kScales + 32 * (sub / 2) + 16 * h);
          const __m256i sc =
              _mm256_srai_epi32(sub % 2 ? _mm256_slli_epi32(run, 16) : _mm256_slli_epi32(run, 24), 24);
          const __m256 scale = _mm256_mul_ps(d[u], _mm256_cvtepi32_ps(sc));
          __m256i pairs[R], isum[R];
          for (int r = 0; r < R; ++r) {
            pairs[r] = _mm256_setzero_si256();
            isum[r] = _mm256_set1_epi32(-32 * x.s16[2 * ((r0 + r) * x.kb + sb * 8) + sub]);
          }
          for (int c = 0; c < 4; ++c) {
            const __m256i ql = load32(blk + kQ6kLow + 64 * (16 * half + (q0 % 64) / 4 + c) + 32 * h);
            const __m256i qh = load32(blk + kQ6kHigh + 64 * (8 * half + (q0 % 32) / 4 + c) + 32 * h);
            const __m256i q = _mm256_or_si256(
                _mm256_and_si256(_mm256_srl_epi16(ql, lo_shift), low4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, hi_shift), three), 4));
            for (int r = 0; r < R; ++r)
              pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(q, bcast4(xq[r] + 16 * sub + 4 * c)));
            if (c % 2) fold(pairs, isum);
          }
          for (int r = 0; r < R; ++r) {
            const float dx = x.d[(r0 + r) * x.kb + sb * 8 + sub / 2];
            acc[u][r] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(scale, _mm256_set1_ps(dx)), acc[u][r]);
          }
        }
      }
    } else {   // Q4_K, Q5_K
      __m256 dmin[H];
      for (int u = 0; u < H; ++u) dmin[u] = halves8(blk + 32 + 16 * (h0 + u));
      for (int g = 0; g < 4; ++g) {
        if (prefetch) prefetch_span<Prefetch::kNear>(blk + g * (bb / 4), bb / 4);
        const __m128i lo_bit = _mm_cvtsi32_si128(2 * g), hi_bit = _mm_cvtsi32_si128(2 * g + 1);
        __m256i lo_pairs[H][R], hi_pairs[H][R], lo_sum[H][R], hi_sum[H][R];
        for (int u = 0; u < H; ++u)
          for (int r = 0; r < R; ++r)
            lo_pairs[u][r] = hi_pairs[u][r] = lo_sum[u][r] = hi_sum[u][r] = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
          for (int u = 0; u < H; ++u) {
            const int h = h0 + u;
            const __m256i raw = load32(blk + kQ4kQuants + 64 * (8 * g + c) + 32 * h);
            __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            if constexpr (F == WeightFormat::kQ5_K) {
              const __m256i qh = load32(blk + kQ5kHigh + 64 * c + 32 * h);
              lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, lo_bit), one), 4));
              hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, hi_bit), one), 4));
            }
            for (int r = 0; r < R; ++r) {
              const int8_t* xg = xq[r] + 64 * g + 4 * c;
              lo_pairs[u][r] = _mm256_add_epi16(lo_pairs[u][r], _mm256_maddubs_epi16(lo, bcast4(xg)));
              hi_pairs[u][r] = _mm256_add_epi16(hi_pairs[u][r], _mm256_maddubs_epi16(hi, bcast4(xg + 32)));
            }
            if (F == WeightFormat::kQ4_K ? c == 7 : c % 4 == 3) {
              fold(lo_pairs[u], lo_sum[u]);
              fold(hi_pairs[u], hi_sum[u]);
            }
          }
        }
        for (int u = 0; u < H; ++u) {
          const int h = h0 + u;
          for (int part = 0; part < 2; ++part) {
            const int j = 2 * g + part;   // q4k_scale_min, 8 rows at once
            const __m256i sc = j < 4 ? _mm256_and_si256(scale_byte(blk, h, j), _mm256_set1_epi32(63))
                : _mm256_or_si256(_mm256_and_si256(scale_byte(blk, h, j + 4), _mm256_set1_epi32(0x0f)),
                                  _mm256_slli_epi32(_mm256_srli_epi32(scale_byte(blk, h, j - 4), 6), 4));
            const __m256i mn = j < 4 ? _mm256_and_si256(scale_byte(blk, h, j + 4), _mm256_set1_epi32(63))
                : _mm256_or_si256(_mm256_srli_epi32(scale_byte(blk, h, j + 4), 4),
                                  _mm256_slli_epi32(_mm256_srli_epi32(scale_byte(blk, h, j), 6), 4));
            const __m256 scale = _mm256_mul_ps(d[u], _mm256_cvtepi32_ps(sc));
            const __m256 mins = _mm256_mul_ps(dmin[u], _mm256_cvtepi32_ps(mn));
            for (int r = 0; r < R; ++r) {
              const int64_t b = (r0 + r) * x.kb + sb * 8 + j;
              const __m256i isum = part ? hi_sum[u][r] : lo_sum[u][r];
              acc[u][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scale, _mm256_set1_ps(x.d[b])),
                                          acc[u][r]);
              acc[u][r] = _mm256_fnmadd_ps(mins, _mm256_set1_ps(x.ds[b]), acc[u][r]);
            }
          }
        }
      }
    }
  }
  for (int u = 0; u < H; ++u) avx2::store_rows(acc[u], y + 8 * u, r0, ldy, lanes[u]);
}

// One activation row (decoding) takes whole 16-row groups per pass (the last group in
// halves when it has 8 columns or fewer); more rows pass over each half, up to
// avx2::kRowsPerPass at a time (two halves' sums for more than one row would not fit the
// registers).
template <WeightFormat F>
void cols(const QuantizedRows& x, int64_t m, const uint8_t* w, int64_t n, float* y, int64_t n_begin, int64_t n_end) {
  const int64_t group_bytes = x.k / 256 * quant_block_bytes(F);
  if (m == 1) {
    for (; n_begin + 8 < n_end; n_begin += 16) {
      const int lanes[2] = {8, static_cast<int>(std::min<int64_t>(8, n_end - n_begin - 8))};
      half_rows<1, 2, F>(x, 0, w + (n_begin / 16) * group_bytes, 0, y + n_begin, n, lanes);
    }
  }
  avx2::for_halves(m, w, group_bytes, y, n_begin, n_end,
                   [&](auto rows, int64_t r0, const uint8_t* group, int h, float* out, int lanes) {
                     const int one_half[1] = {lanes};
                     half_rows<decltype(rows)::value, 1, F>(x, r0, group, h, out, n, one_half);
                   });
}

}  // namespace

void k_quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                       int64_t n_begin, int64_t n_end) {
  switch (f) {
    case WeightFormat::kQ4_K: return cols<WeightFormat::kQ4_K>(x, m, w, n, y, n_begin, n_end);
    case WeightFormat::kQ5_K: return cols<WeightFormat::kQ5_K>(x, m, w, n, y, n_begin, n_end);
    default: return cols<WeightFormat::kQ6_K>(x, m, w, n, y, n_begin, n_end);
  }
}
#else
void k_quant_cols_avx2(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                       int64_t n_begin, int64_t n_end) {
  quant_cols_scalar(x, m, w, f, n, y, n_begin, n_end);
}
#endif

}  // namespace sonarspec
