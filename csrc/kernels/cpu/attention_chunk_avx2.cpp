// The AVX2 chunk update of paged attention (head_dim a multiple of 16), reading float32 or
// bfloat16 pools in place: a bfloat16 row is widened exactly eight values at a time, so both
// pools give the same bits. Query rows go in passes of up to three that share every key and
// value vector loaded (and widened): scores four keys at a time, one accumulator per (row,
// key) over head_dim, folded by a fixed tree of horizontal adds; the online softmax on the
// chunk's 16 scores as two vectors; values with the rows' outputs in registers over the
// chunk, 32 (or 16) columns at a time. Its share of the next chunk's slot rows (attention_chunk.h)
// is fetched a few rows at a time between the score steps of all its passes, so that the
// fetches overlap the arithmetic. A row's arithmetic depends only on its query and its keys,
// so results do not depend on which rows share a call.
#include <algorithm>
#include <cmath>

#include "attention_chunk.h"
#include "vec.h"

namespace sonarspec {

#if defined(__x86_64__)
namespace {

#define AVX2_ATTR __attribute__((target("avx2,fma")))

constexpr int kPass = 3;   // query rows per pass: 12 accumulators, 3 broadcasts and a value vector

// The sums of the lanes of a[0..4) in lanes 0..3: pairs of lanes, then pairs of pairs
// (horizontal adds), then the two 128-bit halves.
AVX2_ATTR inline __m128 sum_lanes4(const __m256 (&a)[4]) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// s[r][c0 + c] = (q[r] . k[c0 + c]) * scale for R rows and keys c < 4.
template <int R, typename KV>
AVX2_ATTR inline void scores_rows(const float* const* q, const KV* const* k, int c0, int64_t head_dim, __m128 scale,
                                  float (*s)[kChunk]) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 8) {
    __m256 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q[r] + d);
    for (int c = 0; c < 4; ++c) {
      const __m256 kv = load8(k[c0 + c] + d);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(qv[r], kv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) _mm_store_ps(s[r] + c0, _mm_mul_ps(sum_lanes4(acc[r]), scale));
}

// o[r][d0 + i] = o[r][d0 + i] * f[r] + sum of p[r][c] * v[c][d0 + i] for R rows, c < n in
// order, i < 8 W: the rows' columns in registers over the whole chunk. f[r]: the row's
// rescaling for a new running max (1 where the max held: exact).
template <int R, int W, typename KV>
AVX2_ATTR inline void values_rows(float* const* o, const float* f, const float (*p)[kChunk], const KV* const* v, int n,
                                  int64_t d0) {
  __m256 acc[R][W];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) acc[r][j] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + d0 + 8 * j), _mm256_set1_ps(f[r]));
  for (int c = 0; c < n; ++c) {
    __m256 b[R];
    for (int r = 0; r < R; ++r) b[r] = _mm256_broadcast_ss(&p[r][c]);
    for (int j = 0; j < W; ++j) {
      const __m256 vv = load8(v[c] + d0 + 8 * j);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(b[r], vv, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) _mm256_storeu_ps(o[r] + d0 + 8 * j, acc[r][j]);
}

// One pass of R rows: scores, the online-softmax update, values. Pass `pass` of `passes`
// fetches rows [step * n / steps, (step + 1) * n / steps) of `ahead` before score step
// `step` of the call's passes x 4.
template <int R, typename KV>
AVX2_ATTR inline void pass_rows(const float* const* qs, const KV* const* k, const KV* const* v, int n,
                                int64_t head_dim, float scale, float* m, float* l, float* const* o,
                                const ChunkAhead& ahead, int pass, int passes) {
  alignas(32) float s[R][kChunk];   // whole-vector loads and stores
  float f[R];
  const __m128 sc = _mm_set1_ps(scale);
  for (int c0 = 0; c0 < kChunk; c0 += 4) {
    const int step = 4 * pass + c0 / 4, steps = 4 * passes;
    prefetch_ahead(ahead, step * ahead.n / steps, (step + 1) * ahead.n / steps);
    scores_rows<R>(qs, k, c0, head_dim, sc, s);
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 live0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
  const __m256 live1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lane));
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  for (int r = 0; r < R; ++r) {
    const __m256 a = _mm256_blendv_ps(ninf, _mm256_load_ps(s[r]), live0);
    const __m256 b = _mm256_blendv_ps(ninf, _mm256_load_ps(s[r] + 8), live1);
    const float mx = std::max(m[r], hmax_avx2(_mm256_max_ps(a, b)));
    f[r] = 1.f;
    if (mx > m[r]) {   // new running max: rescale what was accumulated so far (in the value pass)
      f[r] = std::exp(m[r] - mx);
      l[r] *= f[r];
      m[r] = mx;
    }
    const __m256 mv = _mm256_set1_ps(mx);
    const __m256 ea = exp_neg_avx2(_mm256_sub_ps(a, mv)), eb = exp_neg_avx2(_mm256_sub_ps(b, mv));
    _mm256_store_ps(s[r], ea);
    _mm256_store_ps(s[r] + 8, eb);
    l[r] += hsum_avx2(_mm256_add_ps(ea, eb));
  }
  int64_t d0 = 0;
  for (; d0 + 32 <= head_dim; d0 += 32) values_rows<R, 4>(o, f, s, v, n, d0);
  if (d0 < head_dim) values_rows<R, 2>(o, f, s, v, n, d0);
}

template <typename KV>
AVX2_ATTR void update_chunk(const float* const* qs, const KV* k_pool, const KV* v_pool, const int64_t* slots, int n,
                            int64_t row, int64_t kv_off, int64_t head_dim, int group, float scale, float* m, float* l,
                            float* const* o, const ChunkAhead& ahead) {
  if (n < 1 || n > kChunk) return;   // callers pass 1 .. kChunk keys
  const KV* k[kChunk];
  const KV* v[kChunk];
  for (int c = 0; c < kChunk; ++c) {   // past n: the first key's row (a valid one), its score masked
    const int64_t slot = slots[c < n ? c : 0];
    k[c] = k_pool + slot * row + kv_off;
    v[c] = v_pool + slot * row + kv_off;
  }
  const int passes = (group + kPass - 1) / kPass;
  for (int g = 0, p = 0; g < group; g += kPass, ++p) {
    switch (std::min(kPass, group - g)) {
      case 1: pass_rows<1>(qs + g, k, v, n, head_dim, scale, m + g, l + g, o + g, ahead, p, passes); break;
      case 2: pass_rows<2>(qs + g, k, v, n, head_dim, scale, m + g, l + g, o + g, ahead, p, passes); break;
      default: pass_rows<3>(qs + g, k, v, n, head_dim, scale, m + g, l + g, o + g, ahead, p, passes); break;
    }
  }
}

bool suits(int64_t head_dim) { return cpu_has_avx2() && head_dim % 16 == 0; }

}  // namespace

ChunkUpdate chunk_update_avx2(int64_t head_dim) { return suits(head_dim) ? update_chunk<float> : nullptr; }

ChunkUpdateBF16 chunk_update_bf16_avx2(int64_t head_dim) {
  return suits(head_dim) ? update_chunk<uint16_t> : nullptr;
}

#else

ChunkUpdate chunk_update_avx2(int64_t) { return nullptr; }
ChunkUpdateBF16 chunk_update_bf16_avx2(int64_t) { return nullptr; }

#endif

}  // namespace sonarspec
