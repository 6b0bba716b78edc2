#include <cstring>

#include "sonarspec/kv_store.h"

#include "kv_convert.h"

namespace sonarspec {
namespace {

// write(i, slot) for every token i with a slot in the pool; negative slots (padding) are
// skipped, slots past the pool skipped and counted.
template <typename F>
int64_t for_each_slot(const int64_t* slot_mapping, int64_t num_tokens, int64_t num_slots, F&& write) {
  int64_t skipped = 0;
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    if (slot >= num_slots) {
      ++skipped;
      continue;
    }
    write(i, slot);
  }
  return skipped;
}

}  // namespace

int64_t kv_store_cpu(const void* k_src, const void* v_src, void* k_pool, void* v_pool,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t row_bytes,
                     int64_t num_slots) {
  const char* ks = static_cast<const char*>(k_src);
  const char* vs = static_cast<const char*>(v_src);
  char* kp = static_cast<char*>(k_pool);
  char* vp = static_cast<char*>(v_pool);
  return for_each_slot(slot_mapping, num_tokens, num_slots, [&](int64_t i, int64_t slot) {
    std::memcpy(kp + slot * row_bytes, ks + i * row_bytes, row_bytes);
    std::memcpy(vp + slot * row_bytes, vs + i * row_bytes, row_bytes);
  });
}

int64_t kv_store_rows_cpu(const float* k_src, const float* v_src, void* k_pool, void* v_pool, DType dtype,
                          const int64_t* slot_mapping, int64_t num_tokens, int64_t row_elems, int64_t num_slots) {
  const int64_t row_bytes = row_elems * dtype_size(dtype);
  char* kp = static_cast<char*>(k_pool);
  char* vp = static_cast<char*>(v_pool);
  return for_each_slot(slot_mapping, num_tokens, num_slots, [&](int64_t i, int64_t slot) {
    kv_narrow_row(k_src + i * row_elems, dtype, kp + slot * row_bytes, row_elems);
    kv_narrow_row(v_src + i * row_elems, dtype, vp + slot * row_bytes, row_elems);
  });
}

}  // namespace sonarspec
