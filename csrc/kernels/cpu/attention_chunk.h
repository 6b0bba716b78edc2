// One chunk of paged attention: up to 16 keys against up to 16 query rows, folded into
// the rows' online-softmax states. Internal to paged_attention.cpp; one instantiation per
// instruction set, chosen once per CPU (each CPU always runs the same one, so results do not
// depend on the batch, only - in the last bits - on the CPU kind).
#pragma once

#include <cstdint>

namespace sonarspec {

constexpr int kChunk = 16;
constexpr int kMaxGroup = 16;  // query rows of one task

// Accumulates keys slots[0..n) (rows of k_pool / v_pool, row stride `row` floats, this KV
// head's slice at kv_off) into the state of `group` query rows qs: m, l running max and sum;
// o (group, head_dim) unnormalised outputs.
using ChunkUpdate = void (*)(const float* const* qs, const float* k_pool, const float* v_pool, const int64_t* slots,
                             int n, int64_t row, int64_t kv_off, int64_t head_dim, int group, float scale, float* m,
                             float* l, float* const* o);

// The chunk update for this CPU: AVX-512 where it has AVX512F, else AVX2, else portable.
ChunkUpdate chunk_update_for_cpu();

// The same reading bfloat16 pools directly (widened in registers, the same arithmetic as
// the float32 update on the widened rows), where the CPU has AVX-512 and head_dim is a
// multiple of 64; else null (the caller widens chunks first).
using ChunkUpdateBF16 = void (*)(const float* const* qs, const uint16_t* k_pool, const uint16_t* v_pool,
                                 const int64_t* slots, int n, int64_t row, int64_t kv_off, int64_t head_dim, int group,
                                 float scale, float* m, float* l, float* const* o);
ChunkUpdateBF16 chunk_update_bf16_for_cpu(int64_t head_dim);

}  // namespace sonarspec
