#include "sonarspec/shifted_scatter.h"

namespace sonarspec {

int64_t shifted_scatter_cpu(const int64_t* in, int64_t* out, const int64_t* block_starts,
                            const int64_t* block_lens, const int64_t* next_tokens,
                            const int64_t* accepted, int64_t num_blocks, int64_t num_tokens) {
  int64_t bad = 0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t s = block_starts[b], len = block_lens[b], acc = accepted[b];
    if (s < 0 || s > num_tokens || len < 1 || len > num_tokens - s) { ++bad; continue; }
    if (acc < 0 || acc >= len) continue;
    for (int64_t j = 0; j + 1 < len; ++j) out[s + j] = in[s + j + 1];
    out[s + len - 1] = next_tokens[b];
    out[s + acc] = next_tokens[b];
  }
  return bad;
}

}  // namespace sonarspec
