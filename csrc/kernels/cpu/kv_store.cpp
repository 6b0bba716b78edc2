#include <cstring>

#include "sonarspec/kv_store.h"

#include "kv_convert.h"

namespace sonarspec {

int64_t kv_store_cpu(const void* k_src, const void* v_src, void* k_pool, void* v_pool,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t row_bytes,
                     int64_t num_slots) {
  int64_t skipped = 0;
  const char* ks = static_cast<const char*>(k_src);
  const char* vs = static_cast<const char*>(v_src);
  char* kp = static_cast<char*>(k_pool);
  char* vp = static_cast<char*>(v_pool);
  for (int64_t i = 0; i < num_tokens; ++i) {
    int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    if (slot >= num_slots) { ++skipped; continue; }
    std::memcpy(kp + slot * row_bytes, ks + i * row_bytes, row_bytes);
    std::memcpy(vp + slot * row_bytes, vs + i * row_bytes, row_bytes);
  }
  return skipped;
}

int64_t kv_store_rows_cpu(const float* k_src, const float* v_src, void* k_pool, void* v_pool, DType dtype,
                          const int64_t* slot_mapping, int64_t num_tokens, int64_t row_elems, int64_t num_slots) {
  const int64_t row_bytes = row_elems * dtype_size(dtype);
  int64_t skipped = 0;
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    if (slot >= num_slots) {
      ++skipped;
      continue;
    }
    kv_narrow_row(k_src + i * row_elems, dtype, static_cast<char*>(k_pool) + slot * row_bytes, row_elems);
    kv_narrow_row(v_src + i * row_elems, dtype, static_cast<char*>(v_pool) + slot * row_bytes, row_elems);
  }
  return skipped;
}

}  // namespace sonarspec
