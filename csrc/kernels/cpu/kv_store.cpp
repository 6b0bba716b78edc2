#include <cstring>

#include "sonarspec/kv_store.h"

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

}  // namespace sonarspec
