// Shifted-buffer scatter for MTP heads: the head at position i reads token i + 1, so its
// input buffer is the target's input shifted one step left within each sequence's
// block, with the next target token (correction or bonus) written where the accepted
// prefix ends:
//   out[s + j]     = in[s + j + 1]   for j in [0, len - 1)
//   out[s + len-1] = next[b]
//   out[s + acc]   = next[b]         (acc = accepted drafts of block b, 0 <= acc < len)
// Framework free; the CUDA launcher takes a stream and returns the launch status.
#pragma once

#include <cstdint>

namespace sonarspec {

// in, out: (num_tokens,). Blocks with an out-of-range accepted count are left unshifted;
// returns the number of blocks whose range [start, start + len) is not inside
// [0, num_tokens) (also left untouched).
int64_t shifted_scatter_cpu(const int64_t* in, int64_t* out, const int64_t* block_starts,
                            const int64_t* block_lens, const int64_t* next_tokens,
                            const int64_t* accepted, int64_t num_blocks, int64_t num_tokens);

// Returns 0 on success, else the cudaError_t of the launch. Blocks with an out-of-range
// accepted count or range are left untouched.
int shifted_scatter_cuda(const int64_t* in, int64_t* out, const int64_t* block_starts,
                         const int64_t* block_lens, const int64_t* next_tokens, const int64_t* accepted,
                         int64_t num_blocks, int64_t num_tokens, void* stream);

}  // namespace sonarspec
