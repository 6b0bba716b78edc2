// One thread block per request. Thread 0 runs the acceptance test (two reads per draft);
// the block then reads the stopping row twice: a block-wide sum of the residual, then a
// chunked inclusive scan that finds the first index whose running sum exceeds u * total.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <climits>
#include <cstdint>

#include "sonarspec/rejection_sampling.h"

namespace sonarspec {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double residual(const float* p, const float* q, int64_t drafted, int64_t i) {
  const double pi = p[i];
  if (q) return fmax(pi - static_cast<double>(q[i]), 0.0);
  return i == drafted ? 0.0 : pi;
}

struct MaxOp {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

__global__ void chain_sampling_kernel(const float* __restrict__ draft_probs, const int64_t* __restrict__ draft_ids,
                                      const float* __restrict__ target_probs, const double* __restrict__ uniforms,
                                      int64_t* __restrict__ out_tokens, int64_t* __restrict__ accepted_num,
                                      int64_t* __restrict__ emitted_num, int64_t k, int64_t vocab) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  using ReduceIdx = cub::BlockReduce<long long, kThreads>;
  using Scan = cub::BlockScan<double, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename ReduceIdx::TempStorage reduce_idx;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ int64_t s_stop, s_drafted;
  __shared__ int s_bad, s_plain;
  __shared__ double s_total, s_running;
  __shared__ long long s_found, s_last;

  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  int64_t* out = out_tokens + b * (k + 1);
  const int64_t* ids = draft_ids + b * k;
  const double* u = uniforms + b * (k + 1);
  const float* p = target_probs + b * (k + 1) * vocab;
  const float* q = draft_probs ? draft_probs + b * k * vocab : nullptr;
  for (int64_t j = tid; j <= k; j += blockDim.x) out[j] = -1;
  __syncthreads();
  if (tid == 0) {
    int64_t passed = 0;
    int bad = 0;
    for (int64_t j = 0; j < k; ++j) bad |= ids[j] < 0 || ids[j] >= vocab;
    s_bad = bad;
    s_stop = bad ? k : accept_chain(p, q, ids, u, k, vocab, out, &passed);
    s_drafted = (s_stop == k || q) ? -1 : ids[s_stop];
    accepted_num[b] = bad ? 0 : passed;
    emitted_num[b] = bad ? 0 : s_stop;
    if (bad)
      for (int64_t j = 0; j <= k; ++j) out[j] = -1;
  }
  __syncthreads();
  if (s_bad) return;
  const int64_t s = s_stop;
  const float* ps = p + s * vocab;
  const float* qs = (s == k || !q) ? nullptr : q + s * vocab;
  int64_t drafted = s_drafted;
  for (int pass = 0; pass < 2; ++pass) {  // pass 1 only when the residual sums to zero
    double local = 0.0;
    long long last = -1;
    for (int64_t i = tid; i < vocab; i += kThreads) {
      const double r = residual(ps, qs, drafted, i);
      local += r;
      if (r > 0.0) last = i;
    }
    const double total = Reduce(tmp.reduce).Sum(local);
    __syncthreads();
    const long long last_all = ReduceIdx(tmp.reduce_idx).Reduce(last, MaxOp());
    if (tid == 0) {
      s_total = total;
      s_last = last_all;
      s_plain = !(total > 0.0);
    }
    __syncthreads();
    if (!s_plain) break;
    qs = nullptr;
    drafted = -1;
  }
  const double target = u[k] * s_total;
  if (tid == 0) {
    s_running = 0.0;
    s_found = LLONG_MAX;
  }
  __syncthreads();
  for (int64_t base = 0; base < vocab; base += kThreads) {
    const int64_t i = base + tid;
    const double r = i < vocab ? residual(ps, qs, drafted, i) : 0.0;
    double incl, chunk;
    Scan(tmp.scan).InclusiveSum(r, incl, chunk);
    const double before = s_running;
    if (i < vocab && before + incl > target && before + incl - r <= target) atomicMin(&s_found, i);
    __syncthreads();
    if (tid == 0) s_running = before + chunk;
    __syncthreads();
    const bool done = s_found != LLONG_MAX;
    __syncthreads();  // all have read s_found and s_running before the next chunk
    if (done) break;
  }
  if (tid == 0) out[s] = s_found != LLONG_MAX ? s_found : s_last;
}

}  // namespace

int chain_speculative_sampling_cuda(const float* draft_probs, const int64_t* draft_ids,
                                    const float* target_probs, const double* uniforms, int64_t* out_tokens,
                                    int64_t* accepted_num, int64_t* emitted_num, int64_t batch, int64_t k,
                                    int64_t vocab, void* stream) {
  if (batch == 0) return 0;
  chain_sampling_kernel<<<static_cast<unsigned>(batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      draft_probs, draft_ids, target_probs, uniforms, out_tokens, accepted_num, emitted_num, k, vocab);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sonarspec
