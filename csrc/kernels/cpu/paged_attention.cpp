// Tasks of up to 16 query rows that read the same keys: the query heads that share a KV
// head (GQA) times the consecutive tokens of one sequence in the step (a verification
// block, a prefill chunk), so each key and value row is read once per task. A token's keys
// - its committed prefix [key_begin, key_end), then its ancestors in the tree block when
// there is a tree mask - go in chunks of 16: scores for the chunk, one online-softmax update
// (running max, rescaled sums) with a vectorised exp, then the value rows (attention_chunk*.cpp),
// while the next chunk's rows are prefetched. Chunks that every token of a task has in full
// in its prefix run once for all its rows, the rest per token; long key lists are split into
// runs of 16 chunks (256 keys) that run as separate work items, their softmax states merged
// by log-sum-exp in order; an item takes several KV heads where there are enough items, so
// that it reads whole slot rows. Chunks and splits follow each token's own key list, so a
// token's result is the same bits whatever else is in the step.
#include "sonarspec/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_chunk.h"
#include "kv_convert.h"
#include "paged_attention_keys.h"
#include "sonarspec/thread_pool.h"
#include "vec.h"

namespace sonarspec {
namespace {

// Up to kMaxGroup query rows that read the same keys: consecutive tokens of one sequence
// with one key_begin (a verification block) x the query heads of a subgroup of one KV head.
struct Task {
  int64_t tokens[kMaxGroup];
  int nt = 0;
};

// One task's split for KV heads [kvh0, kvh1): the heads' slices of a slot row are read
// together, so a page is read front to back.
struct Item {
  int64_t task, kvh0, kvh1, g0, split;
};

// KV heads one item reads at most.
constexpr int64_t kMaxItemHeads = 8;

}  // namespace

int64_t paged_attention_cpu(const float* q, const void* k_pool, const void* v_pool, DType kv_dtype,
                            const int64_t* block_table, int64_t batch_size, int64_t max_pages,
                            int64_t page_size, const int64_t* token_seq,
                            const int64_t* key_begin, const int64_t* key_end, const int64_t* tree_begin,
                            const int64_t* tree_mask, float* out,
                            int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t num_slots, float scale, int num_threads) {
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0 || page_size < 1 || max_pages < 0) return -1;
  if (max_pages > 0 && page_size > INT64_MAX / max_pages) return -1;   // no table spans 2^63 positions
  const int64_t group = num_heads / num_kv_heads;
  const int64_t row = num_kv_heads * head_dim, elem = dtype_size(kv_dtype);
  const int64_t num_pages = num_slots / page_size;
  int64_t bad = 0;
  // Each token's keys, checked (TokenKeys::list): a bad token's output is zero.
  std::vector<TokenKeys> keys(static_cast<size_t>(num_tokens));
  std::vector<uint8_t> valid(static_cast<size_t>(num_tokens), 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const bool ok = keys[t].list(t, block_table, batch_size, max_pages, page_size, num_pages, token_seq, key_begin,
                                 key_end, tree_begin, tree_mask);
    valid[t] = ok;
    if (!ok) {
      std::fill(out + t * num_heads * head_dim, out + (t + 1) * num_heads * head_dim, 0.f);
      ++bad;
    }
  }
  int64_t work = 0;   // visible keys summed over tokens: decides whether threads pay off
  for (int64_t t = 0; t < num_tokens; ++t) work += valid[t] ? keys[t].len : 0;
  const int threads = work * num_heads * head_dim >= (1 << 16) ? std::max(1, num_threads) : 1;
  // Tasks: runs of valid consecutive tokens of one sequence with one key_begin, x subgroups
  // of a KV head's query heads - rows that share their key reads. Where that leaves fewer
  // than two items per thread, tasks take fewer tokens (any grouping gives the same bits:
  // a row's arithmetic involves no other row).
  const int64_t subgroup = std::min<int64_t>(group, kMaxGroup), subgroups = (group + subgroup - 1) / subgroup;
  int64_t tokens_per_task = std::max<int64_t>(1, kMaxGroup / subgroup);
  std::vector<Task> tasks;
  std::vector<int64_t> task_splits;
  int64_t units = 0, max_splits = 1;   // units: task x subgroup x split
  for (;;) {
    tasks.clear();
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (!valid[t]) continue;
      if (tasks.empty() || tasks.back().nt == tokens_per_task ||
          token_seq[tasks.back().tokens[0]] != token_seq[t] || key_begin[tasks.back().tokens[0]] != key_begin[t])
        tasks.emplace_back();
      tasks.back().tokens[tasks.back().nt++] = t;
    }
    task_splits.assign(tasks.size(), 1);
    units = 0;
    for (size_t i = 0; i < tasks.size(); ++i) {
      for (int a = 0; a < tasks[i].nt; ++a) task_splits[i] = std::max(task_splits[i], keys[tasks[i].tokens[a]].splits);
      max_splits = std::max(max_splits, task_splits[i]);
      units += task_splits[i] * subgroups;
    }
    int most = 1;   // tokens in the fullest task
    for (const Task& task : tasks) most = std::max(most, task.nt);
    if (units * num_kv_heads >= 2 * threads || most == 1) break;
    tokens_per_task = (most + 1) / 2;
  }
  // KV heads per item: as many as leave two items per thread (any grouping gives the same
  // bits: the heads are independent).
  int64_t item_heads = std::min(num_kv_heads, kMaxItemHeads);
  while (item_heads > 1 && units * ((num_kv_heads + item_heads - 1) / item_heads) < 2 * threads)
    item_heads = (item_heads + 1) / 2;
  std::vector<Item> items;
  for (int64_t i = 0; i < static_cast<int64_t>(tasks.size()); ++i)
    for (int64_t kvh = 0; kvh < num_kv_heads; kvh += item_heads)
      for (int64_t g0 = 0; g0 < group; g0 += subgroup)
        for (int64_t s = 0; s < task_splits[i]; ++s)
          items.push_back({i, kvh, std::min(num_kv_heads, kvh + item_heads), g0, s});
  // Split states of tokens with several splits: (token, head, split) -> m, l, o[head_dim].
  const int64_t state = head_dim + 2;
  std::vector<float> partial(max_splits > 1 ? static_cast<size_t>(num_tokens * num_heads * max_splits * state) : 0);
  std::vector<float> sums(static_cast<size_t>(num_tokens * num_heads), 0.f);   // softmax sums, one split
  const ChunkUpdate chunk_update = chunk_update_for_cpu(head_dim);
  const ChunkUpdateBF16 bf16_update = kv_dtype == DType::kBFloat16 ? chunk_update_bf16_for_cpu(head_dim) : nullptr;
  const bool row_shares = chunk_update_takes_row_shares(head_dim);
  static constexpr int64_t kIdentity[kChunk] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  // One chunk of keys (slots[0..n)) for heads [kvh0, kvh0 + nh) of an item: rows r0 .. r0 +
  // rows of each head (head h's at h * kMaxGroup), while each head's update fetches the
  // rows of the next chunk (ahead[0..na)): its slice of all of them, or its share of the
  // whole rows (chunk_update_takes_row_shares). Float32 and (with AVX2 or AVX-512) bfloat16
  // pools are read in place; others have the heads' slices of the chunk's slot rows widened
  // first.
  auto chunk = [&](const int64_t* slots, int n, const int64_t* ahead, int na, int64_t kvh0, int64_t nh,
                   int64_t r0, int rows, const float* const* qs, float* m, float* l, float* const* o) {
    thread_local std::vector<float> kv;
    const float *k = static_cast<const float*>(k_pool), *v = static_cast<const float*>(v_pool);
    const int64_t* at = slots;
    int64_t stride = row, off = kvh0 * head_dim;
    if (kv_dtype != DType::kFloat32 && bf16_update == nullptr) {
      kv.resize(static_cast<size_t>(2 * kChunk * nh * head_dim));
      kv_widen_rows(k_pool, kv_dtype, slots, n, row, off, nh * head_dim, kv.data());
      kv_widen_rows(v_pool, kv_dtype, slots, n, row, off, nh * head_dim, kv.data() + kChunk * nh * head_dim);
      k = kv.data();
      v = kv.data() + kChunk * nh * head_dim;
      at = kIdentity;
      stride = nh * head_dim;
      off = 0;
    }
    for (int64_t h = 0; h < nh; ++h) {
      ChunkAhead next;
      const int from = row_shares ? static_cast<int>(h * na / nh) : 0;
      const int to = row_shares ? static_cast<int>((h + 1) * na / nh) : na;
      const int64_t head = row_shares ? kvh0 : kvh0 + h;
      next.bytes = (row_shares ? nh : 1) * head_dim * elem;
      for (int i = from; i < to; ++i, ++next.n) {
        const int64_t byte = (ahead[i] * row + head * head_dim) * elem;
        next.k[next.n] = static_cast<const char*>(k_pool) + byte;
        next.v[next.n] = static_cast<const char*>(v_pool) + byte;
      }
      const int64_t r = h * kMaxGroup + r0;
      if (bf16_update != nullptr)
        bf16_update(qs + r, static_cast<const uint16_t*>(k_pool), static_cast<const uint16_t*>(v_pool), slots, n, row,
                    (kvh0 + h) * head_dim, head_dim, rows, scale, m + r, l + r, o + r, next);
      else
        chunk_update(qs + r, k, v, at, n, stride, off + h * head_dim, head_dim, rows, scale, m + r, l + r, o + r,
                     next);
    }
  };
  auto run_item = [&](int64_t item_index) {
    const Item& it = items[item_index];
    const Task& task = tasks[it.task];
    const int gn = static_cast<int>(std::min<int64_t>(subgroup, group - it.g0));
    const int64_t nh = it.kvh1 - it.kvh0;
    // Row r of head kv of this item at [kv * kMaxGroup + r]: r = a * gn + g for token a, query head g.
    const float* qs[kMaxItemHeads * kMaxGroup];
    float* o[kMaxItemHeads * kMaxGroup];
    float m[kMaxItemHeads * kMaxGroup], l[kMaxItemHeads * kMaxGroup];
    // A token with fewer splits than this item's index has no keys here and keeps its
    // results untouched (its chunks all lie before `first`, so the common loop is empty).
    thread_local std::vector<float> idle;
    idle.resize(static_cast<size_t>(kMaxItemHeads * kMaxGroup * head_dim));
    int64_t common = INT64_MAX;   // chunks every token has in full in its prefix
    for (int a = 0; a < task.nt; ++a) {
      const int64_t t = task.tokens[a];
      const bool here = keys[t].splits > it.split;
      common = std::min(common, keys[t].prefix / kChunk);
      for (int64_t kv = 0; kv < nh; ++kv)
        for (int g = 0; g < gn; ++g) {
          const int64_t r = kv * kMaxGroup + a * gn + g;
          const int64_t h = (it.kvh0 + kv) * group + it.g0 + g;
          qs[r] = q + (t * num_heads + h) * head_dim;
          o[r] = !here ? idle.data() + r * head_dim
                 : keys[t].splits > 1 ? partial.data() + ((t * num_heads + h) * max_splits + it.split) * state + 2
                                      : out + (t * num_heads + h) * head_dim;
          std::fill(o[r], o[r] + head_dim, 0.f);
          m[r] = -INFINITY;
          l[r] = 0.f;
        }
    }
    const int64_t first = it.split * kSplitChunks, last = first + kSplitChunks;
    const TokenKeys& k0 = keys[task.tokens[0]];
    int64_t slots[2][kChunk];
    const int64_t common_end = std::min(last, common);
    for (int64_t c = first; c < common_end; ++c) {   // keys every token reads, once for all rows
      int64_t* now = slots[c & 1];
      int64_t* next = slots[(c + 1) & 1];
      if (c == first) k0.chunk_slots(c, page_size, now);
      const int na = c + 1 < common_end ? k0.chunk_slots(c + 1, page_size, next) : 0;
      chunk(now, kChunk, next, na, it.kvh0, nh, 0, task.nt * gn, qs, m, l, o);
    }
    for (int a = 0; a < task.nt; ++a) {   // then each token's own chunks, in order
      const TokenKeys& tk = keys[task.tokens[a]];
      const int64_t begin = std::max(first, common), end = std::min(last, tk.chunks);
      for (int64_t c = begin; c < end; ++c) {
        int64_t* now = slots[c & 1];
        int64_t* next = slots[(c + 1) & 1];
        const int n = static_cast<int>(std::min<int64_t>(kChunk, tk.len - c * kChunk));
        if (c == begin) tk.chunk_slots(c, page_size, now);
        const int na = c + 1 < end ? tk.chunk_slots(c + 1, page_size, next) : 0;
        chunk(now, n, next, na, it.kvh0, nh, a * gn, gn, qs, m, l, o);
      }
    }
    for (int a = 0; a < task.nt; ++a) {
      if (keys[task.tokens[a]].splits <= it.split) continue;
      for (int64_t kv = 0; kv < nh; ++kv)
        for (int g = 0; g < gn; ++g) {
          const int64_t r = kv * kMaxGroup + a * gn + g;
          if (keys[task.tokens[a]].splits > 1) {
            o[r][-2] = m[r];
            o[r][-1] = l[r];
          } else {
            sums[task.tokens[a] * num_heads + (it.kvh0 + kv) * group + it.g0 + g] = l[r];
            if (l[r] > 0.f) scale_row(o[r], 1.f / l[r], head_dim);
          }
        }
    }
  };
  parallel_items(static_cast<int64_t>(items.size()), threads, run_item);
  // Tokens with several splits: merge the split states in order (log-sum-exp).
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (!valid[t]) continue;
    bool no_keys = false;   // a head whose softmax sum is not positive read no key
    if (keys[t].splits == 1) {
      for (int64_t h = 0; h < num_heads; ++h) no_keys |= !(sums[t * num_heads + h] > 0.f);
    } else {
      for (int64_t h = 0; h < num_heads; ++h) {
        float* dst = out + (t * num_heads + h) * head_dim;
        const float* st = partial.data() + (t * num_heads + h) * max_splits * state;
        float mx = -INFINITY, sum = 0.f;
        for (int64_t s = 0; s < keys[t].splits; ++s) mx = std::max(mx, st[s * state]);
        std::fill(dst, dst + head_dim, 0.f);
        for (int64_t s = 0; s < keys[t].splits; ++s) {
          const float* ps = st + s * state;
          if (ps[1] <= 0.f) continue;
          const float r = std::exp(ps[0] - mx);
          sum += ps[1] * r;
          axpy(dst, r, ps + 2, head_dim);
        }
        if (sum > 0.f) scale_row(dst, 1.f / sum, head_dim);
        no_keys |= !(sum > 0.f);
      }
    }
    bad += no_keys;
  }
  return bad;
}

}  // namespace sonarspec
