// One task per (query token, KV head, group of up to 16 query heads): the query heads that
// share the KV head (GQA) are processed together, so each key and value row is read once
// per group (larger groups split into several tasks). Keys go in
// chunks of up to 16: scores for the chunk, one online-softmax update (running max,
// rescaled sums) with a vectorised exp, then the value rows. With a tree mask the pass is
// a two-level cascade: the committed prefix [key_begin, key_end) first, then the query's
// ancestors in the tree block; the running (max, sum) state merges the two levels by
// log-sum-exp, so no mask over the whole sequence is built.
#include "sonarspec/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "sonarspec/thread_pool.h"
#include "vec.h"

namespace sonarspec {
namespace {

constexpr int kChunk = 16;
constexpr int kMaxGroup = 16;  // query heads of one KV head handled in one task

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

#define PA_NS portable
#define PA_ATTR
#define PA_DOT dot
#define PA_VALUES values_axpy
#define PA_EXP exp_inplace
#include "paged_attention_chunk.inc"
#undef PA_NS
#undef PA_ATTR
#undef PA_DOT
#undef PA_VALUES
#undef PA_EXP
#if defined(__x86_64__)
#define PA_NS avx2
#define PA_ATTR __attribute__((target("avx2,fma")))
#define PA_DOT dot_avx2
#define PA_VALUES values_avx2
#define PA_EXP exp_inplace_avx2
#include "paged_attention_chunk.inc"
#undef PA_NS
#undef PA_ATTR
#undef PA_DOT
#undef PA_VALUES
#undef PA_EXP
#endif

using ChunkUpdate = void (*)(const float* const*, const float*, const float*, const int64_t*, int, int64_t, int64_t,
                             int64_t, int, float, float*, float*, float* const*);

// The chunk update for this CPU: the AVX2 one inlines its vector helpers.
ChunkUpdate chunk_update_for_cpu() {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return avx2::chunk_update;
#endif
  return portable::chunk_update;
}

}  // namespace

int64_t paged_attention_cpu(const float* q, const float* k_pool, const float* v_pool,
                            const int64_t* block_table, int64_t batch_size, int64_t max_pages,
                            int64_t page_size, const int64_t* token_seq,
                            const int64_t* key_begin, const int64_t* key_end, const int64_t* tree_begin,
                            const int64_t* tree_mask, float* out,
                            int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t num_slots, float scale, int num_threads) {
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0 || page_size < 1 || max_pages < 0) return -1;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t subgroups = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t row = num_kv_heads * head_dim;
  const int64_t max_kv_len = max_pages * page_size, num_pages = num_slots / page_size;
  std::atomic<int64_t> bad{0};
  static const ChunkUpdate chunk_update = chunk_update_for_cpu();
  auto task = [&](int64_t item) {
    const int64_t t = item / (num_kv_heads * subgroups), rest_item = item % (num_kv_heads * subgroups);
    const int64_t kvh = rest_item / subgroups, g0 = rest_item % subgroups * kMaxGroup;
    const int gn = static_cast<int>(std::min<int64_t>(kMaxGroup, group - g0));
    const float* qs[kMaxGroup];
    float* o[kMaxGroup];
    float m[kMaxGroup], l[kMaxGroup];
    for (int g = 0; g < gn; ++g) {
      const int64_t h = kvh * group + g0 + g;
      qs[g] = q + (t * num_heads + h) * head_dim;
      o[g] = out + (t * num_heads + h) * head_dim;
      std::fill(o[g], o[g] + head_dim, 0.f);
      m[g] = -INFINITY;
      l[g] = 0.f;
    }
    // An index outside the tables makes the token bad (its output is not attention over
    // its keys): a row outside the block table, a key range past it, a page id outside the pool.
    if (token_seq[t] < 0 || token_seq[t] >= batch_size || key_begin[t] < 0 || key_end[t] > max_kv_len) {
      bad.fetch_add(gn);
      return;
    }
    bool invalid = false;
    const int64_t* pages = block_table + token_seq[t] * max_pages;
    int64_t slots[kChunk];
    int n = 0;
    auto push = [&](int64_t s) {
      slots[n++] = s;
      if (n == kChunk) {
        chunk_update(qs, k_pool, v_pool, slots, n, row, kvh * head_dim, head_dim, gn, scale, m, l, o);
        n = 0;
      }
    };
    const int64_t lo = key_begin[t], hi = key_end[t];
    for (int64_t j = lo; j < hi;) {  // level 1: the committed prefix, a page at a time
      const int64_t page = j / page_size, end = std::min(hi, (page + 1) * page_size);
      if (pages[page] < 0 || pages[page] >= num_pages) {
        invalid = true;
        break;
      }
      const int64_t base = pages[page] * page_size - page * page_size;
      for (; j < end; ++j) push(base + j);
    }
    const uint64_t bits = tree_mask ? static_cast<uint64_t>(tree_mask[t]) : 0;
    for (uint64_t rest = invalid ? 0 : bits; rest; rest &= rest - 1) {  // level 2: ancestors in the tree block
      const int64_t j = tree_begin[t] + __builtin_ctzll(rest);
      const int64_t page = j >= 0 && j < max_kv_len ? pages[j / page_size] : -1;
      if (page < 0 || page >= num_pages) {
        invalid = true;
        break;
      }
      push(page * page_size + j % page_size);
    }
    if (invalid) {
      for (int g = 0; g < gn; ++g) std::fill(o[g], o[g] + head_dim, 0.f);
      bad.fetch_add(gn);
      return;
    }
    if (n) chunk_update(qs, k_pool, v_pool, slots, n, row, kvh * head_dim, head_dim, gn, scale, m, l, o);
    for (int g = 0; g < gn; ++g) {
      if (l[g] > 0.f) {
        scale_row(o[g], 1.f / l[g], head_dim);
      } else {
        bad.fetch_add(1);
      }
    }
  };
  const int64_t items = num_tokens * num_kv_heads * subgroups;
  int64_t work = 0;  // visible keys summed over tokens: decides whether threads pay off
  for (int64_t t = 0; t < num_tokens; ++t) {
    work += std::max<int64_t>(0, std::min(key_end[t], max_kv_len) - std::max<int64_t>(0, key_begin[t]));
    if (tree_mask) work += __builtin_popcountll(static_cast<uint64_t>(tree_mask[t]));
  }
  const int threads = work * num_heads * head_dim >= (1 << 16) ? std::max(1, num_threads) : 1;
  parallel_items(items, threads, task);
  return bad.load() / num_heads;
}

}  // namespace sonarspec
