// Writes new keys/values into a paged KV pool: pool[slot_mapping[i]] = src[i].
// Framework free: raw pointers and sizes; CUDA launchers take a stream and return
// the launch status instead of throwing.
#pragma once

#include <cstdint>

namespace sonarspec {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int64_t dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// src: (num_tokens, row_bytes) rows; pool: (num_slots, row_bytes). Negative slots
// (padding) are skipped; slots past the pool are skipped and counted in the return
// value (CPU).
int64_t kv_store_cpu(const void* k_src, const void* v_src, void* k_pool, void* v_pool,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t row_bytes,
                     int64_t num_slots);

// The same from float32 rows (num_tokens, row_elems) into pools of `dtype`: bfloat16 and
// float16 rounded to nearest even, float32 copied.
int64_t kv_store_rows_cpu(const float* k_src, const float* v_src, void* k_pool, void* v_pool, DType dtype,
                          const int64_t* slot_mapping, int64_t num_tokens, int64_t row_elems, int64_t num_slots);

// Returns 0 on success, else the cudaError_t of the launch.
int kv_store_cuda(const void* k_src, const void* v_src, void* k_pool, void* v_pool,
                  const int64_t* slot_mapping, int64_t num_tokens, int64_t row_bytes,
                  int64_t num_slots, void* stream);

}  // namespace sonarspec
