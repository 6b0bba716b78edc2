// One chunk of paged attention: up to 16 keys against up to 16 query rows, folded into
// the rows' online-softmax states. Internal to paged_attention.cpp; one instantiation per
// instruction set, chosen once per CPU (each CPU always runs the same one, so results do not
// depend on the batch, only - in the last bits - on the CPU kind).
#pragma once

#include <cstdint>

#include "vec.h"   // prefetch_lines

namespace sonarspec {

constexpr int kChunk = 16;
constexpr int kMaxGroup = 16;  // query rows of one task

// The rows of the next chunk of keys, which an update prefetches while it computes a chunk
// (see chunk_update_takes_row_shares): `bytes` from each address of k and v.
struct ChunkAhead {
  const char* k[kChunk];
  const char* v[kChunk];
  int n = 0;
  int64_t bytes = 0;
};

// Accumulates keys slots[0..n) (rows of k_pool / v_pool, row stride `row` floats, this KV
// head's slice at kv_off) into the state of `group` query rows qs: m, l running max and sum;
// o (group, head_dim) unnormalised outputs; prefetches `ahead`.
using ChunkUpdate = void (*)(const float* const* qs, const float* k_pool, const float* v_pool, const int64_t* slots,
                             int n, int64_t row, int64_t kv_off, int64_t head_dim, int group, float scale, float* m,
                             float* l, float* const* o, const ChunkAhead& ahead);

// The chunk update for this CPU and head_dim: attention_chunk_avx512.cpp's where the CPU
// has AVX-512 and head_dim is a multiple of 32, else attention_chunk_avx2.cpp's where it
// has AVX2 and head_dim is a multiple of 16, else portable (attention_chunk.cpp).
ChunkUpdate chunk_update_for_cpu(int64_t head_dim);

// The same reading bfloat16 pools directly (widened exactly, then the same arithmetic as
// the float32 update of the same file), from the AVX-512 or AVX2 file as above; null where
// neither suits (the caller widens chunks first).
using ChunkUpdateBF16 = void (*)(const float* const* qs, const uint16_t* k_pool, const uint16_t* v_pool,
                                 const int64_t* slots, int n, int64_t row, int64_t kv_off, int64_t head_dim, int group,
                                 float scale, float* m, float* l, float* const* o, const ChunkAhead& ahead);
ChunkUpdateBF16 chunk_update_bf16_for_cpu(int64_t head_dim);

// What chunk_update_for_cpu's update is given to prefetch. Portable: this KV head's slice of
// every row of the next chunk, fetched before the chunk. AVX2 and AVX-512 (true): whole slot
// rows - the slices of every KV head the caller's item reads - but only this head's share
// of the next chunk's rows, the heads of an item taking consecutive shares, spread through
// the update's score steps. Against fetching before each chunk, at 3072 bfloat16 keys a
// decode token's attention took 0.66-0.73x the time on AMD Zen 3 (AVX2) and 0.65-0.68x on
// AMD Zen 4 (AVX-512), and the AVX-512 update's fetches into L2 rather than L1 took it a
// further 0.85-0.88x at 512-3072 keys.
bool chunk_update_takes_row_shares(int64_t head_dim);

// Each file's updates, or null where the CPU or head_dim does not suit it.
ChunkUpdate chunk_update_avx512(int64_t head_dim);
ChunkUpdateBF16 chunk_update_bf16_avx512(int64_t head_dim);
ChunkUpdate chunk_update_avx2(int64_t head_dim);
ChunkUpdateBF16 chunk_update_bf16_avx2(int64_t head_dim);

// Prefetches the key and value rows of `ahead` [from, to).
template <int kLocality = 3>
inline void prefetch_ahead(const ChunkAhead& ahead, int from, int to) {
  for (int c = from; c < to; ++c) {
    prefetch_lines<kLocality>(ahead.k[c], ahead.bytes);
    prefetch_lines<kLocality>(ahead.v[c], ahead.bytes);
  }
}

}  // namespace sonarspec
