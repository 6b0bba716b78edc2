// One thread block per sequence block; threads stride over its tokens. Reads the
// accepted count from device memory, so no host synchronisation is needed.
#include <cuda_runtime.h>

#include <cstdint>

#include "sonarspec/shifted_scatter.h"

namespace sonarspec {
namespace {

__global__ void shifted_scatter_kernel(const int64_t* __restrict__ in, int64_t* __restrict__ out,
                                       const int64_t* __restrict__ block_starts,
                                       const int64_t* __restrict__ block_lens,
                                       const int64_t* __restrict__ next_tokens,
                                       const int64_t* __restrict__ accepted, int64_t num_tokens) {
  const int64_t b = blockIdx.x;
  const int64_t s = block_starts[b], len = block_lens[b], acc = accepted[b];
  if (s < 0 || s > num_tokens || len < 1 || len > num_tokens - s || acc < 0 || acc >= len) return;
  const int64_t next = next_tokens[b];
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    out[s + j] = (j == acc || j == len - 1) ? next : in[s + j + 1];
  }
}

}  // namespace

int shifted_scatter_cuda(const int64_t* in, int64_t* out, const int64_t* block_starts,
                         const int64_t* block_lens, const int64_t* next_tokens, const int64_t* accepted,
                         int64_t num_blocks, int64_t num_tokens, void* stream) {
  if (num_blocks == 0) return 0;
  shifted_scatter_kernel<<<static_cast<unsigned>(num_blocks), 32, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, block_starts, block_lens, next_tokens, accepted, num_tokens);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sonarspec
