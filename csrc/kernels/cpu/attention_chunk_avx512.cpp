// The AVX-512 chunk update of paged attention (head_dim a multiple of 32), reading float32
// or bfloat16 pools in place. Rows are taken 32 values at a time as two vectors, the even
// and the odd elements: for bfloat16 that is one load, a shift and a mask (no shuffles, no
// widened copy), for float32 two loads and two permutes - the same values either way, so
// both pools give the same bits. Scores: up to three query rows per pass share each key's
// vectors, one accumulator per (row, key) for eight keys, folded by a fixed tree of
// shuffles into one vector of scores; the online softmax runs on that vector; values: up to
// four rows' outputs (64 columns) stay in registers over the chunk. Its share of the next
// chunk's slot rows (attention_chunk.h) is fetched a few rows at a time between the score
// steps of all its passes, so that the fetches overlap the arithmetic, into L2 (more misses
// in flight than fetches into L1 allow). Every row's arithmetic
// depends only on its query and its keys, so results do not depend on which rows share a
// call. Scores from bfloat16 keys as VDPBF16PS dot products (the query rounded to bfloat16,
// keys used as stored, the same folding tree) measured 1.2-1.6x this update's time on AMD
// Zen 4 at 1024-3072 keys, for decode and verification blocks alike
// (tools/bench_attention_context.py): not used.
#include <algorithm>
#include <cmath>

#include "attention_chunk.h"
#include "vec.h"

namespace sonarspec {

#if defined(__x86_64__)
SONARSPEC_INTRINSIC_WARNINGS_OFF
namespace {

#define AVX512_ATTR __attribute__((target("avx2,fma,avx512f,avx512vl,avx512dq")))

constexpr int64_t kMaxPairDim = 256;   // head_dim limit (the query's copy on the stack)

// 32 values at p as (even elements, odd elements).
AVX512_ATTR inline void load_pairs(const uint16_t* p, __m512& even, __m512& odd) {
  const __m512i x = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
AVX512_ATTR inline void load_pairs(const float* p, __m512& even, __m512& odd) {
  const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
  even = _mm512_permutex2var_ps(a, ie, b);
  odd = _mm512_permutex2var_ps(a, io, b);
}
// The inverse: 32 floats at p from their even and odd elements.
AVX512_ATTR inline void store_pairs(float* p, __m512 even, __m512 odd) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  _mm512_storeu_ps(p, _mm512_permutex2var_ps(even, lo, odd));
  _mm512_storeu_ps(p + 16, _mm512_permutex2var_ps(even, hi, odd));
}

// The sums of the lanes of a[0..8): sum c in lanes 4 * (c / 4) * 2 + c % 4 (lanes 0-3 and
// 8-11). Pairs interleaved and added (32-bit, then 64-bit unpacks), then 128-bit lanes.
AVX512_ATTR inline __m512 sum_lanes8(const __m512 (&a)[8]) {
  __m512 b[4], c[2];
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 2; ++i) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // c[i], every 128-bit lane: partial sums of keys 4i .. 4i + 3 over that lane of the inputs.
  const __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  return _mm512_add_ps(d, _mm512_shuffle_f32x4(d, d, 0xB1));
}

// exp of 16 floats <= 0: vec.h's exp_neg_avx2, the same operations on every lane (so the
// same bits as its two halves), at full width.
AVX512_ATTR inline __m512 exp_neg16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(kExpLow);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x));
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

AVX512_ATTR inline float max_lanes(__m512 x) {
  return hmax_avx2(_mm256_max_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1)));
}

AVX512_ATTR inline float add_lanes(__m512 x) {
  return hsum_avx2(_mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1)));
}

// Scores of R rows against the chunk's 16 keys: s[r] = (q[r] . k[c]) * scale in lane c.
// qd[r]: the row's query as (even, odd) vectors per 32 values. Pass `pass` of `passes`
// fetches rows [step * n / steps, (step + 1) * n / steps) of `ahead` before score step
// `step` (eight keys by 32 values) of the call's passes x 2 x head_dim / 32.
template <int R, typename KV>
AVX512_ATTR inline void scores_rows(const float* const* qd, const KV* const* k, int64_t head_dim, float scale,
                                    __m512* s, const ChunkAhead& ahead, int pass, int passes) {
  __m512 half[2][R];
  const int64_t per_half = head_dim / 32, steps = 2 * per_half * passes;
  for (int c0 = 0; c0 < kChunk; c0 += 8) {
    __m512 acc[R][8];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 8; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < head_dim; j += 32) {
      const int64_t step = (2 * pass + c0 / 8) * per_half + j / 32;
      prefetch_ahead<2>(ahead, static_cast<int>(step * ahead.n / steps), static_cast<int>((step + 1) * ahead.n / steps));
      for (int c = 0; c < 8; ++c) {
        __m512 e, o;
        load_pairs(k[c0 + c] + j, e, o);
        for (int r = 0; r < R; ++r) {
          acc[r][c] = _mm512_fmadd_ps(_mm512_load_ps(qd[r] + j), e, acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(_mm512_load_ps(qd[r] + j + 16), o, acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r) half[c0 / 8][r] = sum_lanes8(acc[r]);
  }
  const __m512i join = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) s[r] = _mm512_mul_ps(_mm512_permutex2var_ps(half[0][r], join, half[1][r]), sc);
}

// o[r] = o[r] * f[r] + sum of p[r][c] * v[c] for R rows, c < n in order, over columns [d0,
// d0 + 32 P): the rows' columns in registers over the whole chunk, as (even, odd) vectors.
// f[r]: the row's rescaling for a new running max (1 where the max held: exact).
template <int R, int P, typename KV>
AVX512_ATTR inline void values_block(float* const* o, const float* f, const float (*p)[kChunk], const KV* const* v,
                                     int n, int64_t d0) {
  __m512 acc[R][2 * P];
  for (int r = 0; r < R; ++r) {
    const __m512 fr = _mm512_set1_ps(f[r]);
    for (int j = 0; j < P; ++j) {
      load_pairs(o[r] + d0 + 32 * j, acc[r][2 * j], acc[r][2 * j + 1]);
      acc[r][2 * j] = _mm512_mul_ps(acc[r][2 * j], fr);
      acc[r][2 * j + 1] = _mm512_mul_ps(acc[r][2 * j + 1], fr);
    }
  }
  for (int c = 0; c < n; ++c) {
    __m512 vv[2 * P];
    for (int j = 0; j < P; ++j) load_pairs(v[c] + d0 + 32 * j, vv[2 * j], vv[2 * j + 1]);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(p[r][c]);
      for (int j = 0; j < 2 * P; ++j) acc[r][j] = _mm512_fmadd_ps(a, vv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < P; ++j) store_pairs(o[r] + d0 + 32 * j, acc[r][2 * j], acc[r][2 * j + 1]);
}

// The value pass of R rows: 64 columns at a time, then 32.
template <int R, typename KV>
AVX512_ATTR inline void values_rows(float* const* o, const float* f, const float (*p)[kChunk], const KV* const* v,
                                    int n, int64_t head_dim) {
  int64_t d0 = 0;
  for (; d0 + 64 <= head_dim; d0 += 64) values_block<R, 2>(o, f, p, v, n, d0);
  if (d0 < head_dim) values_block<R, 1>(o, f, p, v, n, d0);
}

template <typename KV>
AVX512_ATTR void update_chunk(const float* const* qs, const KV* k_pool, const KV* v_pool, const int64_t* slots, int n,
                              int64_t row, int64_t kv_off, int64_t head_dim, int group, float scale, float* m,
                              float* l, float* const* o, const ChunkAhead& ahead) {
  if (n < 1 || n > kChunk) return;   // callers pass 1 .. kChunk keys
  const KV* k[kChunk];
  const KV* v[kChunk];
  for (int c = 0; c < kChunk; ++c) {   // past n: the first key's row (a valid one), its score masked
    const int64_t slot = slots[c < n ? c : 0];
    k[c] = k_pool + slot * row + kv_off;
    v[c] = v_pool + slot * row + kv_off;
  }
  const __mmask16 live = n >= kChunk ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
  alignas(64) float p[kMaxGroup][kChunk];
  float f[kMaxGroup];   // each row's rescaling of o, applied by its value pass
  for (int g0 = 0; g0 < group; g0 += 3) {   // scores and the online-softmax update, three rows at a time
    const int gn = std::min(3, group - g0);
    alignas(64) float qd[3][kMaxPairDim];
    const float* qp[3];
    for (int r = 0; r < gn; ++r) {
      for (int64_t j = 0; j < head_dim; j += 32) {
        __m512 e, od;
        load_pairs(qs[g0 + r] + j, e, od);
        _mm512_store_ps(qd[r] + j, e);
        _mm512_store_ps(qd[r] + j + 16, od);
      }
      qp[r] = qd[r];
    }
    __m512 s[3];
    const int pass = g0 / 3, passes = (group + 2) / 3;
    if (gn == 3) scores_rows<3>(qp, k, head_dim, scale, s, ahead, pass, passes);
    else if (gn == 2) scores_rows<2>(qp, k, head_dim, scale, s, ahead, pass, passes);
    else scores_rows<1>(qp, k, head_dim, scale, s, ahead, pass, passes);
    for (int r = 0; r < gn; ++r) {
      const int g = g0 + r;
      const __m512 sr = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, s[r]);
      const float mx = std::max(m[g], max_lanes(sr));
      f[g] = 1.f;
      if (mx > m[g]) {   // new running max: rescale what was accumulated so far
        f[g] = std::exp(m[g] - mx);
        l[g] *= f[g];
        m[g] = mx;
      }
      const __m512 e = _mm512_maskz_mov_ps(live, exp_neg16(_mm512_sub_ps(sr, _mm512_set1_ps(mx))));
      _mm512_store_ps(p[g], e);
      l[g] += add_lanes(e);
    }
  }
  for (int g0 = 0; g0 < group; g0 += 4) {   // values, four rows at a time
    switch (std::min(4, group - g0)) {
      case 1: values_rows<1>(o + g0, f + g0, p + g0, v, n, head_dim); break;
      case 2: values_rows<2>(o + g0, f + g0, p + g0, v, n, head_dim); break;
      case 3: values_rows<3>(o + g0, f + g0, p + g0, v, n, head_dim); break;
      default: values_rows<4>(o + g0, f + g0, p + g0, v, n, head_dim); break;
    }
  }
}

bool has_avx512() {
  static const bool yes = cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq");
  return yes;
}

bool suits(int64_t head_dim) { return has_avx512() && head_dim % 32 == 0 && head_dim <= kMaxPairDim; }

}  // namespace

ChunkUpdate chunk_update_avx512(int64_t head_dim) { return suits(head_dim) ? update_chunk<float> : nullptr; }

ChunkUpdateBF16 chunk_update_bf16_avx512(int64_t head_dim) {
  return suits(head_dim) ? update_chunk<uint16_t> : nullptr;
}

SONARSPEC_INTRINSIC_WARNINGS_ON
#else

ChunkUpdate chunk_update_avx512(int64_t) { return nullptr; }
ChunkUpdateBF16 chunk_update_bf16_avx512(int64_t) { return nullptr; }

#endif

}  // namespace sonarspec
