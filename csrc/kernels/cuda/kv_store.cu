// One block per token; threads copy the key and value rows in 16-byte words when
// the row size allows it, else byte by byte.
#include <cuda_runtime.h>

#include <cstdint>

#include "sonarspec/kv_store.h"

namespace sonarspec {
namespace {

template <typename Word>
__global__ void kv_store_kernel(const Word* __restrict__ k_src, const Word* __restrict__ v_src,
                                Word* __restrict__ k_pool, Word* __restrict__ v_pool,
                                const int64_t* __restrict__ slot_mapping, int64_t row_words,
                                int64_t num_slots) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;  // padding token: nothing to store
  for (int64_t j = threadIdx.x; j < row_words; j += blockDim.x) {
    k_pool[slot * row_words + j] = k_src[token * row_words + j];
    v_pool[slot * row_words + j] = v_src[token * row_words + j];
  }
}

template <typename Word>
cudaError_t launch(const void* k_src, const void* v_src, void* k_pool, void* v_pool,
                   const int64_t* slot_mapping, int64_t num_tokens, int64_t row_bytes,
                   int64_t num_slots, cudaStream_t stream) {
  const int64_t row_words = row_bytes / static_cast<int64_t>(sizeof(Word));
  const int threads = row_words >= 256 ? 256 : (row_words >= 32 ? static_cast<int>(row_words) : 32);
  kv_store_kernel<Word><<<static_cast<unsigned>(num_tokens), threads, 0, stream>>>(
      static_cast<const Word*>(k_src), static_cast<const Word*>(v_src), static_cast<Word*>(k_pool),
      static_cast<Word*>(v_pool), slot_mapping, row_words, num_slots);
  return cudaGetLastError();
}

}  // namespace

int kv_store_cuda(const void* k_src, const void* v_src, void* k_pool, void* v_pool,
                  const int64_t* slot_mapping, int64_t num_tokens, int64_t row_bytes,
                  int64_t num_slots, void* stream) {
  if (num_tokens == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const auto aligned = [&](int64_t n) {
    auto a = [n](const void* p) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    return row_bytes % n == 0 && a(k_src) && a(v_src) && a(k_pool) && a(v_pool);
  };
  cudaError_t err = aligned(16) ? launch<int4>(k_src, v_src, k_pool, v_pool, slot_mapping, num_tokens, row_bytes, num_slots, s)
                  : aligned(4)  ? launch<int32_t>(k_src, v_src, k_pool, v_pool, slot_mapping, num_tokens, row_bytes, num_slots, s)
                                : launch<char>(k_src, v_src, k_pool, v_pool, slot_mapping, num_tokens, row_bytes, num_slots, s);
  return static_cast<int>(err);
}

}  // namespace sonarspec
