// The portable chunk update of paged attention and the choice of update per CPU; see
// attention_chunk.h.
#include "attention_chunk.h"

#include <algorithm>
#include <cmath>

#include "vec.h"

namespace sonarspec {
namespace {

// Accumulates one chunk of keys (slots[0..n)) into the online-softmax state of `group`
// query rows: scores one dot product at a time, the running max and rescaled sums, then
// o[g] += s[g][c] * v[c] for c in order.
void chunk_update_portable(const float* const* qs, const float* k_pool, const float* v_pool, const int64_t* slots,
                           int n, int64_t row, int64_t kv_off, int64_t head_dim, int group, float scale, float* m,
                           float* l, float* const* o, const ChunkAhead& ahead) {
  prefetch_ahead(ahead, 0, ahead.n);
  float s[kMaxGroup][kChunk];
  const float* k[kChunk];
  const float* v[kChunk];
  for (int c = 0; c < n; ++c) {
    k[c] = k_pool + slots[c] * row + kv_off;
    v[c] = v_pool + slots[c] * row + kv_off;
  }
  for (int c = 0; c < n; ++c)
    for (int g = 0; g < group; ++g) s[g][c] = dot(qs[g], k[c], head_dim) * scale;
  for (int g = 0; g < group; ++g) {
    float mx = m[g];
    for (int c = 0; c < n; ++c) mx = std::max(mx, s[g][c]);
    if (mx > m[g]) {  // new running max: rescale what was accumulated so far
      const float r = std::exp(m[g] - mx);
      l[g] *= r;
      scale_row(o[g], r, head_dim);
      m[g] = mx;
    }
    for (int c = 0; c < n; ++c) s[g][c] -= mx;
    exp_inplace(s[g], n);
    for (int c = 0; c < n; ++c) l[g] += s[g][c];
  }
  for (int c = 0; c < n; ++c)
    for (int g = 0; g < group; ++g) axpy(o[g], s[g][c], v[c], head_dim);
}

}  // namespace

ChunkUpdate chunk_update_for_cpu(int64_t head_dim) {
  if (const ChunkUpdate wide = chunk_update_avx512(head_dim)) return wide;
  if (const ChunkUpdate narrow = chunk_update_avx2(head_dim)) return narrow;
  return chunk_update_portable;
}

bool chunk_update_takes_row_shares(int64_t head_dim) {
  return chunk_update_avx512(head_dim) != nullptr || chunk_update_avx2(head_dim) != nullptr;
}

ChunkUpdateBF16 chunk_update_bf16_for_cpu(int64_t head_dim) {
  if (const ChunkUpdateBF16 wide = chunk_update_bf16_avx512(head_dim)) return wide;
  return chunk_update_bf16_avx2(head_dim);
}

}  // namespace sonarspec
