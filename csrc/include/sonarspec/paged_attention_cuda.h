// Paged attention on CUDA (csrc/kernels/cuda/paged_attention.cu): the CPU kernel's key
// lists (paged_attention.h) for queries, pools and outputs of one dtype. Framework free:
// raw device pointers and sizes.
#pragma once

#include <cstdint>

#include "sonarspec/kv_store.h"   // DType

namespace sonarspec {

// Keys per split of a token's key list: a token with more gets one partial softmax state
// per split, merged in split order (a function of its own keys: independent of the batch).
constexpr int64_t kSplit = 256;

struct AttentionArgs {
  const void* q;                 // (num_tokens, num_heads, head_dim)
  const void* k_pool;            // (num_pages * page_size, num_kv_heads, head_dim)
  const void* v_pool;
  void* out;                     // (num_tokens, num_heads, head_dim)
  const int64_t* block_table;    // (batch_size, max_pages) page ids
  const int64_t* token_seq;      // (num_tokens,) row of block_table
  const int64_t* key_begin;      // (num_tokens,) prefix positions [key_begin, key_end)
  const int64_t* key_end;
  const int64_t* tree_begin;     // (num_tokens,) or null: tree positions tree_begin + j,
  const int64_t* tree_mask;      //   for each bit j of tree_mask (null: no tree keys)
  float* partial;                // (num_tokens, num_heads, max_splits, head_dim + 2) work
  int64_t* splits_used;          // (num_tokens,) work: splits of each token (0: a bad token)
  int32_t* bad_tokens;           // one counter, incremented per bad token (output zero), or null
  int64_t batch_size, max_pages, page_size, num_pages;
  int64_t num_tokens, num_heads, num_kv_heads, group, head_dim, max_splits;
  float scale;
};

// Head sizes the kernel is built for (32, 64, 96, 128, 256).
bool paged_attention_cuda_supports(int64_t head_dim);

// Splits a token of a table with max_pages pages can need (its prefix and a 64-node tree).
int64_t paged_attention_cuda_max_splits(int64_t max_pages, int64_t page_size);

// A bad token (its sequence row outside the table, its key range or tree positions past
// the table's max_pages * page_size, a page id outside the pool, or no key at all) is
// counted in *bad_tokens and its output is zero; every index is checked before it is read.
// Returns 0 or the launch's cudaError_t (cudaErrorInvalidValue for unsupported sizes).
int paged_attention_cuda(const AttentionArgs& args, DType dtype, void* stream);

}  // namespace sonarspec
