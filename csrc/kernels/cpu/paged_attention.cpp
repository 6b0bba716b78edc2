// One task per (query token, head): a single pass over the visible keys with an online
// softmax (running max, rescaled sums), accumulating the value rows in float. With a
// tree mask the pass is a two-level cascade: the committed prefix [key_begin, key_end)
// first, then the query's ancestors in the tree block; the running (max, sum) state
// merges the two levels by log-sum-exp, so no mask over the whole sequence is built.
#include "sonarspec/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "sonarspec/thread_pool.h"
#include "vec.h"

namespace sonarspec {
int64_t paged_attention_cpu(const float* q, const float* k_pool, const float* v_pool,
                            const int64_t* block_table, int64_t max_pages, int64_t page_size,
                            const int64_t* token_seq,
                            const int64_t* key_begin, const int64_t* key_end, const int64_t* tree_begin,
                            const int64_t* tree_mask, float* out,
                            int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t num_slots, float scale, int num_threads) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t row = num_kv_heads * head_dim;
  std::atomic<int64_t> bad{0};
  auto task = [&](int64_t item) {
    const int64_t t = item / num_heads, h = item % num_heads, kvh = h / group;
    const float* qv = q + (t * num_heads + h) * head_dim;
    float* o = out + (t * num_heads + h) * head_dim;
    std::fill(o, o + head_dim, 0.f);
    const int64_t b = token_seq[t];
    const int64_t max_kv_len = max_pages * page_size;
    const int64_t lo = std::max<int64_t>(0, key_begin[t]), hi = std::min(key_end[t], max_kv_len);
    const uint64_t bits = tree_mask ? static_cast<uint64_t>(tree_mask[t]) : 0;
    if (lo >= hi && bits == 0) { bad.fetch_add(1); return; }
    const int64_t* pages = block_table + b * max_pages;
    float m = -INFINITY, l = 0.f;
    auto visit_slot = [&](int64_t s) {
      if (s < 0 || s >= num_slots) return;
      const float x = dot4(qv, k_pool + s * row + kvh * head_dim, head_dim) * scale;
      const float* v = v_pool + s * row + kvh * head_dim;
      if (x > m) {  // new running max: rescale what was accumulated so far
        const float c = std::exp(m - x);
        l *= c;
        for (int64_t d = 0; d < head_dim; ++d) o[d] *= c;
        m = x;
      }
      const float p = std::exp(x - m);
      l += p;
      for (int64_t d = 0; d < head_dim; ++d) o[d] += p * v[d];
    };
    for (int64_t j = lo; j < hi;) {  // level 1: the committed prefix, a page at a time
      const int64_t page = j / page_size, end = std::min(hi, (page + 1) * page_size);
      const int64_t base = pages[page] * page_size - page * page_size;
      for (; j < end; ++j) visit_slot(base + j);
    }
    for (uint64_t rest = bits; rest; rest &= rest - 1) {  // level 2: ancestors in the tree block
      const int64_t j = tree_begin[t] + __builtin_ctzll(rest);
      if (j >= 0 && j < max_kv_len) visit_slot(pages[j / page_size] * page_size + j % page_size);
    }
    if (l > 0.f) {
      const float inv = 1.f / l;
      for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
    } else {
      bad.fetch_add(1);
    }
  };
  const int64_t items = num_tokens * num_heads;
  int64_t work = 0;  // visible keys summed over tokens: decides whether threads pay off
  for (int64_t t = 0; t < num_tokens; ++t) {
    work += std::max<int64_t>(0, key_end[t] - key_begin[t]);
    if (tree_mask) work += __builtin_popcountll(static_cast<uint64_t>(tree_mask[t]));
  }
  const int threads = work * num_heads * head_dim >= (1 << 16) ? std::max(1, num_threads) : 1;
  parallel_items(items, threads, task);
  return bad.load() / num_heads;
}

}  // namespace sonarspec
