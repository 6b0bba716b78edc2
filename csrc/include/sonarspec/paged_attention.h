// Paged attention for small query counts (decode, verification chains, short prefill
// chunks) on the CPU, float32 queries and outputs. Each query token reads its sequence's keys straight from
// the page pool through its block table, so no K/V gather or mask tensor is materialised.
// Framework free: raw pointers and sizes.
#pragma once

#include <cstdint>

#include "sonarspec/kv_store.h"   // DType

namespace sonarspec {

// q, out: (num_tokens, num_heads, head_dim) float32; k_pool, v_pool: (num_slots,
// num_kv_heads, head_dim) of kv_dtype (float32, or bfloat16 / float16 widened exactly as
// they are read) with slot = page * page_size + offset; block_table: (batch_size, max_pages)
// page ids of each sequence; token_seq: (num_tokens,) row of block_table for each query
// (every index is checked: a row outside the table, a page id outside the pool or a
// position past the table reads no keys);
// query token t attends to
// positions [key_begin[t], key_end[t]) of its sequence (causal limit and sliding window)
// and, when tree_mask is not null, also to positions tree_begin[t] + j for every bit j set
// in tree_mask[t] (a draft tree block: the query's ancestors, itself included; up to 64
// nodes). tree_begin may be null when tree_mask is.
// Query heads map to KV heads in groups of any size (GQA). Returns the number of bad
// tokens - a token_seq row outside the table, a key range outside [0, max_pages *
// page_size), a page id outside the pool, or no key at all - whose output is zero; -1
// for inconsistent sizes.
int64_t paged_attention_cpu(const float* q, const void* k_pool, const void* v_pool, DType kv_dtype,
                            const int64_t* block_table, int64_t batch_size, int64_t max_pages,
                            int64_t page_size, const int64_t* token_seq,
                            const int64_t* key_begin, const int64_t* key_end, const int64_t* tree_begin,
                            const int64_t* tree_mask, float* out,
                            int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t num_slots, float scale, int num_threads);

}  // namespace sonarspec
