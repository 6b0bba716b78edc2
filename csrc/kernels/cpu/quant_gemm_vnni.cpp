// quant_gemm's column kernel with AVX-512 VNNI: one 64-byte load is 4 columns x 16 weight
// rows, and VPDPBUSD multiplies it (unsigned weight bytes) by an activation row's 4 int8
// quants broadcast to every lane, accumulating 16 int32 sums - so each weight byte is
// loaded once for up to 8 activation rows. Same arithmetic as quant_cols_scalar.
#include <algorithm>
#include <cmath>

#include "quant_kernels.h"
#include "vec.h"   // SONARSPEC_INTRINSIC_WARNINGS_*

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sonarspec {

#if defined(__x86_64__)
SONARSPEC_INTRINSIC_WARNINGS_OFF
namespace {

#define QG_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

QG_ATTR inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// Bits n..n+3 of each lane of qh moved to bit 4 of the lane's 4 bytes: Q5_0 / Q5_1's fifth
// bits of 4 columns (x 0x00204081 puts bit i at bit 8i, which no other bit reaches).
QG_ATTR inline __m512i fifth(__m512i qh, int n) {
  const __m512i v = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(n)), _mm512_set1_epi32(0x0f));
  return _mm512_slli_epi32(
      _mm512_and_si512(_mm512_mullo_epi32(v, _mm512_set1_epi32(0x00204081)), _mm512_set1_epi32(0x01010101)), 4);
}

// Rows [r0, r0 + R) of x against the 16 weight rows of one group; lanes < lanes are stored.
template <int R, WeightFormat F, Prefetch P>
QG_ATTR void group_rows(const QuantizedRows& x, int64_t r0, const uint8_t* group, float* y, int64_t ldy,
                        int lanes) {
  constexpr int64_t bb = quant_block_bytes(F), qoff = quants_offset(F);
  constexpr int32_t off = quant_offset(F);
  const int64_t kb = x.kb;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* blk = group + b * bb;
    const uint8_t* qs = blk + qoff;
    prefetch_ahead<P == Prefetch::kFar && R == 1 ? Prefetch::kNone : P>(blk, bb);
    __m512i isum[R];
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) {
      isum[r] = _mm512_set1_epi32(-off * x.s[(r0 + r) * kb + b]);
      xq[r] = x.q + (r0 + r) * x.k + b * 32;
    }
    if (F == WeightFormat::kQ8_0) {
      for (int c = 0; c < 8; ++c) {
        const __m512i wv = _mm512_loadu_si512(qs + 64 * c);
        for (int r = 0; r < R; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], wv, bcast4(xq[r] + 4 * c));
      }
    } else {
      __m512i qh = _mm512_setzero_si512();
      if constexpr (has_fifth_bit(F)) {
        const uint8_t* h = blk + fifth_bits_offset(F);
        qh = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h))),
                             _mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 32))), 16));
      }
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(qs + 64 * c);
        __m512i lo = _mm512_and_si512(raw, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        if constexpr (has_fifth_bit(F)) {
          lo = _mm512_or_si512(lo, fifth(qh, 4 * c));
          hi = _mm512_or_si512(hi, fifth(qh, 16 + 4 * c));
        }
        for (int r = 0; r < R; ++r) {
          isum[r] = _mm512_dpbusd_epi32(isum[r], lo, bcast4(xq[r] + 4 * c));
          isum[r] = _mm512_dpbusd_epi32(isum[r], hi, bcast4(xq[r] + 16 + 4 * c));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[(r0 + r) * kb + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), scale, acc[r]);
    }
    if (has_min(F)) {
      const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.ds[(r0 + r) * kb + b]), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy, mask, acc[r]);
}

// K-quant super-blocks (quant_gemm.h): rows [r0, r0 + R) of x against one group's 16 rows.
// Q4_K: per pair of sub-blocks, 8 chunks give both sub-blocks' sums (low and high nibbles);
// the 6-bit scales and mins of the 16 rows are decoded as 16-lane vectors.
QG_ATTR inline __m512i q4k_byte(const __m512i* runs, int p) {   // scale byte p of the 16 rows
  return p % 2 ? _mm512_srli_epi32(runs[p / 2], 8) : _mm512_and_si512(runs[p / 2], _mm512_set1_epi32(0xff));
}

// Q5_K (F) adds each quant's fifth bit from its qh chunk (bit j for sub-block j).
template <int R, WeightFormat F, Prefetch P>
QG_ATTR void q4k_rows(const QuantizedRows& x, int64_t r0, const uint8_t* group, float* y, int64_t ldy, int lanes) {
  constexpr int64_t bb = quant_block_bytes(F);
  const __m512i low4 = _mm512_set1_epi8(0x0f), six = _mm512_set1_epi32(63), four = _mm512_set1_epi32(0x0f);
  const __m512i one = _mm512_set1_epi8(1);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < x.k / 256; ++sb) {
    const uint8_t* blk = group + sb * bb;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    __m512i runs[6];
    for (int p = 0; p < 6; ++p)
      runs[p] = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ4kScales + 32 * p)));
    for (int g = 0; g < 4; ++g) {
      prefetch_span<P>(blk + g * (bb / 4), bb / 4);
      __m512i lo_sum[R], hi_sum[R];
      const int8_t* xq[R];
      for (int r = 0; r < R; ++r) {
        lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
        xq[r] = x.q + (r0 + r) * x.k + sb * 256 + 64 * g;
      }
      const __m128i lo_bit = _mm_cvtsi32_si128(2 * g), hi_bit = _mm_cvtsi32_si128(2 * g + 1);
      for (int c = 0; c < 8; ++c) {
        const __m512i raw = _mm512_loadu_si512(blk + kQ4kQuants + 64 * (8 * g + c));
        __m512i lo = _mm512_and_si512(raw, low4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        if constexpr (F == WeightFormat::kQ5_K) {
          const __m512i qh = _mm512_loadu_si512(blk + kQ5kHigh + 64 * c);
          lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(qh, lo_bit), one), 4));
          hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(qh, hi_bit), one), 4));
        }
        for (int r = 0; r < R; ++r) {
          lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], lo, bcast4(xq[r] + 4 * c));
          hi_sum[r] = _mm512_dpbusd_epi32(hi_sum[r], hi, bcast4(xq[r] + 32 + 4 * c));
        }
      }
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * g + half;   // q4k_scale_min, 16 rows at once
        const __m512i sc = j < 4 ? _mm512_and_si512(q4k_byte(runs, j), six)
            : _mm512_or_si512(_mm512_and_si512(q4k_byte(runs, j + 4), four),
                              _mm512_slli_epi32(_mm512_srli_epi32(q4k_byte(runs, j - 4), 6), 4));
        const __m512i mn = j < 4 ? _mm512_and_si512(q4k_byte(runs, j + 4), six)
            : _mm512_or_si512(_mm512_srli_epi32(q4k_byte(runs, j + 4), 4),
                              _mm512_slli_epi32(_mm512_srli_epi32(q4k_byte(runs, j), 6), 4));
        const __m512 scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
        const __m512 mins = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn));
        for (int r = 0; r < R; ++r) {
          const int64_t b = (r0 + r) * x.kb + sb * 8 + j;
          const __m512i isum = half ? hi_sum[r] : lo_sum[r];
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(scale, _mm512_set1_ps(x.d[b])), acc[r]);
          acc[r] = _mm512_fnmadd_ps(mins, _mm512_set1_ps(x.ds[b]), acc[r]);
        }
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy, mask, acc[r]);
}

// Q6_K: per sub-block of 16 columns, 4 chunks of 6-bit quants assembled from ql and qh.
template <int R, Prefetch P>
QG_ATTR void q6k_rows(const QuantizedRows& x, int64_t r0, const uint8_t* group, float* y, int64_t ldy, int lanes) {
  constexpr int64_t bb = quant_block_bytes(WeightFormat::kQ6_K);
  const __m512i low4 = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < x.k / 256; ++sb) {
    const uint8_t* blk = group + sb * bb;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    for (int sub = 0; sub < 16; ++sub) {
      if (sub % 4 == 0) prefetch_span<P>(blk + (sub / 4) * (bb / 4), bb / 4);
      const __m512i run = _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6kScales + 32 * (sub / 2))));
      const __m512i sc = _mm512_srai_epi32(sub % 2 ? _mm512_slli_epi32(run, 16) : _mm512_slli_epi32(run, 24), 24);
      const __m512 scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
      const int h = sub / 8, q0 = 16 * (sub % 8);
      const __m128i lo_shift = _mm_cvtsi32_si128(4 * (q0 / 64)), hi_shift = _mm_cvtsi32_si128(2 * (q0 / 32));
      __m512i isum[R];
      const int8_t* xq[R];
      for (int r = 0; r < R; ++r) {
        const int64_t b = (r0 + r) * x.kb + sb * 8;
        isum[r] = _mm512_set1_epi32(-32 * x.s16[2 * b + sub]);
        xq[r] = x.q + (r0 + r) * x.k + sb * 256 + 16 * sub;
      }
      for (int u = 0; u < 4; ++u) {
        const __m512i ql = _mm512_loadu_si512(blk + kQ6kLow + 64 * (16 * h + (q0 % 64) / 4 + u));
        const __m512i qh = _mm512_loadu_si512(blk + kQ6kHigh + 64 * (8 * h + (q0 % 32) / 4 + u));
        const __m512i q = _mm512_or_si512(
            _mm512_and_si512(_mm512_srl_epi16(ql, lo_shift), low4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(qh, hi_shift), three), 4));
        for (int r = 0; r < R; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], q, bcast4(xq[r] + 4 * u));
      }
      for (int r = 0; r < R; ++r) {
        const float dx = x.d[(r0 + r) * x.kb + sb * 8 + sub / 2];
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(scale, _mm512_set1_ps(dx)), acc[r]);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy, mask, acc[r]);
}

// The quants of 16 floats: x * inv clamped to +-127, rounded to nearest even, NaN -> 0
// (quantize_blocks_scalar's rule; clamped before the conversion, which would turn an
// infinite x * inv - a block of magnitudes below ~4e-37, whose 1 / d overflows - into
// INT_MIN).
QG_ATTR inline __m512i quants16(const float* x, __m512 inv) {
  const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), inv);
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.f)), _mm512_set1_ps(127.f));
  return _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), clamped);
}

template <WeightFormat F, Prefetch P>
QG_ATTR void cols(const QuantizedRows& x, int64_t m, const uint8_t* w, int64_t n, float* y, int64_t n_begin,
                  int64_t n_end) {
  const int64_t group_bytes = x.k / block_columns(F) * quant_block_bytes(F);
  for (int64_t j = n_begin; j < n_end; j += 16) {
    const uint8_t* group = w + (j / 16) * group_bytes;
    const int lanes = static_cast<int>(std::min<int64_t>(16, n_end - j));
    for (int64_t r0 = 0; r0 < m; r0 += 8) {
      with_rows(m - r0, [&](auto rows) {
        constexpr int R = decltype(rows)::value;
        if constexpr (F == WeightFormat::kQ4_K || F == WeightFormat::kQ5_K) {
          q4k_rows<R, F, P>(x, r0, group, y + j, n, lanes);
        } else if constexpr (F == WeightFormat::kQ6_K) {
          q6k_rows<R, P>(x, r0, group, y + j, n, lanes);
        } else {
          group_rows<R, F, P>(x, r0, group, y + j, n, lanes);
        }
      });
    }
  }
}

}  // namespace

QG_ATTR void quantize_blocks_vnni(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                                  float* ds) {
  for (int64_t i = 0; i < num_blocks; ++i) {
    const float* src = x + i * 32;
    const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q)) amax = NAN;
    const float di = amax / 127.f;
    const __m512 inv = _mm512_set1_ps(di != 0.f ? 1.f / di : 0.f);
    const __m512i qa = quants16(src, inv), qb = quants16(src + 16, inv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 32), _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 32 + 16), _mm512_cvtepi32_epi8(qb));
    s16[2 * i] = _mm512_reduce_add_epi32(qa);
    s16[2 * i + 1] = _mm512_reduce_add_epi32(qb);
    const int32_t sum = s16[2 * i] + s16[2 * i + 1];
    d[i] = di;
    s[i] = sum;
    ds[i] = di * static_cast<float>(sum);
  }
}

void quant_cols_vnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end) {
  with_any_format(f, [&](auto fmt) {
    with_prefetch([&](auto pf) { cols<decltype(fmt)::value, decltype(pf)::value>(x, m, w, n, y, n_begin, n_end); });
  });
}
SONARSPEC_INTRINSIC_WARNINGS_ON
#else
void quantize_blocks_vnni(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                          float* ds) {
  quantize_blocks_scalar(x, num_blocks, q, d, s, s16, ds);
}

void quant_cols_vnni(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                     int64_t n_begin, int64_t n_end) {
  quant_cols_scalar(x, m, w, f, n, y, n_begin, n_end);
}
#endif

}  // namespace sonarspec
