// A query token's key list for paged_attention.cpp: its committed prefix through its
// sequence's block table, then its tree ancestors, every index checked once when listed.
// Internal to the CPU kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention_chunk.h"   // kChunk

namespace sonarspec {

// Keys per split: a token with more keys gets one online-softmax state per split of its
// key list (tasks that run in parallel), merged in split order at the end. A function of the
// token's own key list, so its result does not depend on the batch. 256 keys: at 600-3072
// keys of SmolLM2's shape (3 KV heads on 2 threads) one step's attention took 0.77-1.0x
// the time of 512-key runs (tools/bench_attention_context.py, builds alternated).
constexpr int64_t kSplitChunks = 16;

// A query token's keys: the list [prefix positions lo..hi) then its tree ancestors.
struct TokenKeys {
  int64_t lo = 0, prefix = 0, len = 0, chunks = 0, splits = 0;
  const int64_t* pages = nullptr;
  int64_t ancestors[64];   // slots of the tree ancestors

  // Lists token t's keys with every index checked; false (the token is bad: its output is
  // zero, not attention over its keys) for a row outside the block table, a key range past
  // it or a page id outside the pool.
  bool list(int64_t t, const int64_t* block_table, int64_t batch_size, int64_t max_pages, int64_t page_size,
            int64_t num_pages, const int64_t* token_seq, const int64_t* key_begin, const int64_t* key_end,
            const int64_t* tree_begin, const int64_t* tree_mask) {
    const int64_t max_kv_len = max_pages * page_size;   // below 2^63: paged_attention_cpu checks
    bool ok = token_seq[t] >= 0 && token_seq[t] < batch_size && key_begin[t] >= 0 && key_end[t] <= max_kv_len;
    if (!ok) return false;
    pages = block_table + token_seq[t] * max_pages;
    lo = key_begin[t];
    // 0 <= key_begin, key_end <= max_kv_len: the difference cannot overflow where it is taken
    prefix = key_end[t] > key_begin[t] ? key_end[t] - key_begin[t] : 0;
    for (int64_t p = lo / page_size; ok && prefix > 0 && p <= (key_end[t] - 1) / page_size; ++p)
      ok = pages[p] >= 0 && pages[p] < num_pages;
    if (!ok) return false;   // (a key range of valid pages lies in the pool: len cannot overflow)
    int64_t na = 0;
    const uint64_t bits = tree_mask ? static_cast<uint64_t>(tree_mask[t]) : 0;
    for (uint64_t rest = bits; rest; rest &= rest - 1) {
      const int64_t begin = tree_begin[t], bit = __builtin_ctzll(rest);
      const int64_t j = begin > INT64_MAX - bit ? -1 : begin + bit;   // past any table: no overflow
      const int64_t page = j >= 0 && j < max_kv_len ? pages[j / page_size] : -1;
      ok = page >= 0 && page < num_pages;
      if (!ok) return false;
      ancestors[na++] = page * page_size + j % page_size;
    }
    len = prefix + na;
    chunks = (len + kChunk - 1) / kChunk;
    splits = std::max<int64_t>(1, (chunks + kSplitChunks - 1) / kSplitChunks);
    return true;
  }

  // The pool slots of positions j .. j + n of the sequence (their pages checked when the keys
  // were listed): one division, then page by page.
  void slots(int64_t j, int n, int64_t page_size, int64_t* out) const {
    int64_t p = j / page_size, off = j % page_size;
    for (int i = 0; i < n; ++i) {
      out[i] = pages[p] * page_size + off;
      if (++off == page_size) off = 0, ++p;
    }
  }

  // The slots of chunk c of the key list (prefix positions, then tree ancestors); returns
  // how many keys it has.
  int chunk_slots(int64_t c, int64_t page_size, int64_t* out) const {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, len - c * kChunk));
    const int in_prefix = static_cast<int>(std::clamp<int64_t>(prefix - c * kChunk, 0, n));
    slots(lo + c * kChunk, in_prefix, page_size, out);
    for (int i = in_prefix; i < n; ++i) out[i] = ancestors[c * kChunk + i - prefix];
    return n;
  }
};

}  // namespace sonarspec
