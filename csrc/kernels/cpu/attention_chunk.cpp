// The chunk kernels of paged attention; see attention_chunk.h.
#include "attention_chunk.h"

#include <algorithm>
#include <cmath>

#include "vec.h"

namespace sonarspec {
namespace {

// The value pass of a chunk: o[g] += s[g][c] * v[c] for c in order, one axpy at a time.
void values_axpy(float* const* o, const float (*s)[kChunk], const float* const* v, int n, int group,
                 int64_t head_dim) {
  for (int c = 0; c < n; ++c)
    for (int g = 0; g < group; ++g) axpy(o[g], s[g][c], v[c], head_dim);
}

#if defined(__x86_64__)
// The same with 32 columns of up to two heads' outputs held in registers over the whole
// chunk (head_dim a multiple of 32): every output element takes the same fused
// multiply-adds in the same order as axpy_avx2, without reloading and storing the
// outputs for every key.
__attribute__((target("avx2,fma"))) void values_avx2(float* const* o, const float (*s)[kChunk],
                                                     const float* const* v, int n, int group, int64_t head_dim) {
  if (head_dim % 32 != 0) return values_axpy(o, s, v, n, group, head_dim);
  for (int g0 = 0; g0 < group; g0 += 2) {   // 8 accumulators + 4 value vectors of the 16 registers
    const int gn = std::min(2, group - g0);
    for (int64_t d = 0; d < head_dim; d += 32) {
      __m256 acc[2][4];
      for (int g = 0; g < gn; ++g)
        for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_loadu_ps(o[g0 + g] + d + 8 * j);
      for (int c = 0; c < n; ++c) {
        __m256 vv[4];
        for (int j = 0; j < 4; ++j) vv[j] = _mm256_loadu_ps(v[c] + d + 8 * j);
        for (int g = 0; g < gn; ++g) {
          const __m256 a = _mm256_set1_ps(s[g0 + g][c]);
          for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_fmadd_ps(a, vv[j], acc[g][j]);
        }
      }
      for (int g = 0; g < gn; ++g)
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o[g0 + g] + d + 8 * j, acc[g][j]);
    }
  }
}
#endif

// Scores of a chunk: s[g][c] = (q[g] . k[c]) * scale.
void scores_dot(const float* const* qs, const float* const* k, int n, int group, int64_t head_dim, float scale,
                float (*s)[kChunk]) {
  for (int c = 0; c < n; ++c)
    for (int g = 0; g < group; ++g) s[g][c] = dot(qs[g], k[c], head_dim) * scale;
}

#if defined(__x86_64__)
// dst[c] = (sum of the lanes of acc[c]) * scale for c < n: eight sums by a tree of
// horizontal adds.
__attribute__((target("avx2,fma"))) inline void store_scores(const __m256 (&acc)[8], __m256 scale, float* dst,
                                                             int n) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  const __m256 r = _mm256_mul_ps(_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                               _mm256_permute2f128_ps(u0, u1, 0x31)), scale);
  alignas(32) float out[8];
  _mm256_store_ps(out, r);
  for (int c = 0; c < n; ++c) dst[c] = out[c];
}

// The same eight keys at a time (head_dim a multiple of 8): one accumulator per key over
// head_dim, the eight reduced together by a tree of horizontal adds - a horizontal sum per
// eight scores instead of one per score.
__attribute__((target("avx2,fma"))) void scores_avx2(const float* const* qs, const float* const* k, int n, int group,
                                                     int64_t head_dim, float scale, float (*s)[kChunk]) {
  if (head_dim % 8 != 0) return scores_dot(qs, k, n, group, head_dim, scale, s);
  const __m256 sc = _mm256_set1_ps(scale);
  for (int c0 = 0; c0 < n; c0 += 8) {
    const int cn = std::min(8, n - c0);
    const float* kr[8];
    for (int c = 0; c < 8; ++c) kr[c] = k[c0 + (c < cn ? c : 0)];   // past n: a valid row, discarded
    for (int g = 0; g < group; ++g) {
      __m256 acc[8];
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qs[g] + d);
        for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[c] + d), acc[c]);
      }
      store_scores(acc, sc, s[g] + c0, cn);
    }
  }
}
#endif

#define PA_NS portable
#define PA_ATTR
#define PA_SCORES scores_dot
#define PA_VALUES values_axpy
#define PA_EXP exp_inplace
#include "paged_attention_chunk.inc"
#undef PA_NS
#undef PA_ATTR
#undef PA_SCORES
#undef PA_VALUES
#undef PA_EXP
#if defined(__x86_64__)
#define PA_NS avx2
#define PA_ATTR __attribute__((target("avx2,fma")))
#define PA_SCORES scores_avx2
#define PA_VALUES values_avx2
#define PA_EXP exp_inplace_avx2
#include "paged_attention_chunk.inc"
#undef PA_NS
#undef PA_ATTR
#undef PA_SCORES
#undef PA_VALUES
#undef PA_EXP
#endif

}  // namespace

ChunkUpdate chunk_update_for_cpu(int64_t head_dim) {
  if (const ChunkUpdate wide = chunk_update_avx512(head_dim)) return wide;
#if defined(__x86_64__)
  if (cpu_has_avx2()) return avx2::chunk_update;
#endif
  (void)head_dim;
  return portable::chunk_update;
}

}  // namespace sonarspec
