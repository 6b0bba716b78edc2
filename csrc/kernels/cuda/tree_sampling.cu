// Tree walk, one thread block per request. Every thread follows the same walk (the
// decisions read values all threads see after a barrier); the row copies, residual
// updates and the final inverse-CDF draw are spread over the block.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <climits>
#include <cstdint>

#include "sonarspec/rejection_sampling.h"

namespace sonarspec {
namespace {

constexpr int kThreads = 256;
using Reduce = cub::BlockReduce<double, kThreads>;
using Scan = cub::BlockScan<double, kThreads>;

struct Shared {
  union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  double value;
  long long found;
  int bad;
};

// Block-wide sum; every thread gets the result.
__device__ double block_sum(Shared& sh, double local) {
  const double s = Reduce(sh.tmp.reduce).Sum(local);
  if (threadIdx.x == 0) sh.value = s;
  __syncthreads();
  const double out = sh.value;
  __syncthreads();
  return out;
}

// First index whose running sum of w exceeds target (the last index with mass if rounding
// leaves the scan short).
__device__ int64_t block_draw(Shared& sh, const double* w, int64_t vocab, double target) {
  if (threadIdx.x == 0) sh.found = LLONG_MAX;
  __syncthreads();
  double running = 0.0;
  for (int64_t base = 0; base < vocab; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const double r = i < vocab ? w[i] : 0.0;
    double incl, chunk;
    Scan(sh.tmp.scan).InclusiveSum(r, incl, chunk);
    if (i < vocab && running + incl > target && running + incl - r <= target) atomicMin(&sh.found, i);
    __syncthreads();
    running += chunk;
    const bool done = sh.found != LLONG_MAX;
    __syncthreads();  // all have read sh.found before the next chunk may set it
    if (done) break;
  }
  __syncthreads();
  if (sh.found != LLONG_MAX) return sh.found;
  for (int64_t i = vocab - 1; i >= 0; --i)
    if (w[i] > 0.0) return i;
  return vocab - 1;
}

__global__ void tree_sampling_kernel(const int64_t* __restrict__ candidates, const int64_t* __restrict__ first_child,
                                     const int64_t* __restrict__ next_sibling, const float* __restrict__ target_probs,
                                     const float* __restrict__ draft_probs, const double* __restrict__ uniforms,
                                     int64_t* __restrict__ out_tokens, int64_t* __restrict__ accept_index,
                                     int64_t* __restrict__ num_accepted, double* __restrict__ work, int64_t nodes,
                                     int64_t vocab) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t *cand = candidates + b * nodes, *first = first_child + b * nodes, *next = next_sibling + b * nodes;
  int64_t *out = out_tokens + b * nodes, *path = accept_index + b * nodes;
  const double* u = uniforms + b * (nodes + 1);
  double* w = work + b * vocab;
  for (int64_t i = tid; i < nodes; i += kThreads) out[i] = path[i] = -1;
  if (tid == 0) {
    int bad = 0;
    for (int64_t i = 0; i < nodes; ++i) {
      bad |= (first[i] != -1 && (first[i] <= i || first[i] >= nodes)) ||
             (next[i] != -1 && (next[i] <= i || next[i] >= nodes)) || (i > 0 && (cand[i] < 0 || cand[i] >= vocab));
    }
    sh.bad = bad;
    num_accepted[b] = 0;
  }
  __syncthreads();
  if (sh.bad) return;
  if (tid == 0) path[0] = 0;
  int64_t node = 0, tries = 0, depth = 0;
  while (true) {
    const float* p = target_probs + (b * nodes + node) * vocab;
    const float* q = draft_probs ? draft_probs + (b * nodes + node) * vocab : nullptr;
    double local = 0.0;
    for (int64_t i = tid; i < vocab; i += kThreads) local += (w[i] = p[i]);
    double total = block_sum(sh, local);  // its barrier also publishes w
    int64_t child = first[node], accepted = -1;
    while (child != -1 && tries < nodes) {
      const int64_t x = cand[child];
      const double qx = q ? static_cast<double>(q[x]) : 1.0;
      if (u[tries++] * qx * total < w[x]) { accepted = child; break; }
      if (q) {
        const double inv = 1.0 / total;
        local = 0.0;
        for (int64_t i = tid; i < vocab; i += kThreads) local += fmax(w[i] * inv - static_cast<double>(q[i]), 0.0);
        const double t = block_sum(sh, local);
        if (t > 0.0) {
          for (int64_t i = tid; i < vocab; i += kThreads) w[i] = fmax(w[i] * inv - static_cast<double>(q[i]), 0.0);
          total = t;
        }
      } else if (total - w[x] > 0.0) {
        total -= w[x];
        __syncthreads();  // everyone has read w[x]
        if (tid == 0) w[x] = 0.0;
      }
      __syncthreads();
      child = next[child];
    }
    if (accepted < 0) {
      const int64_t tok = block_draw(sh, w, vocab, u[nodes] * total);
      if (tid == 0) {
        out[depth] = tok;
        num_accepted[b] = depth;
      }
      return;
    }
    if (tid == 0) {
      out[depth] = cand[accepted];
      path[depth + 1] = accepted;
    }
    ++depth;
    node = accepted;
    __syncthreads();  // w is rewritten for the next node
  }
}

}  // namespace

int tree_speculative_sampling_cuda(const int64_t* candidates, const int64_t* first_child,
                                   const int64_t* next_sibling, const float* target_probs, const float* draft_probs,
                                   const double* uniforms, int64_t* out_tokens, int64_t* accept_index,
                                   int64_t* num_accepted, double* work, int64_t batch, int64_t nodes, int64_t vocab,
                                   void* stream) {
  if (batch == 0) return 0;
  tree_sampling_kernel<<<static_cast<unsigned>(batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      candidates, first_child, next_sibling, target_probs, draft_probs, uniforms, out_tokens, accept_index,
      num_accepted, work, nodes, vocab);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sonarspec
