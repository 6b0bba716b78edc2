// Paged attention on CUDA for decoding, verification blocks and draft trees: each query
// token reads its sequence's keys through the block table (no gathered K/V, no mask
// tensor), with the CPU kernel's key lists - a committed prefix [key_begin, key_end), then
// the tree positions tree_begin + j for each bit j of tree_mask.
//
// A block of 4 warps takes one token, the query heads of one KV head (at most kMaxHeads of
// them) and one split of kSplit keys of its key list. A warp takes chunks of 32 keys: each
// lane scores one key against every head (its key row read in 16-byte words, the queries
// from shared memory), the warp updates its online-softmax states (running max, rescaled
// sums), then each lane accumulates its slice of the head dimension over the chunk's value
// rows (coalesced across the warp). The warps' states merge through shared memory in warp
// order; a token with one split writes its output there, longer ones write partial states
// that merge_splits combines in split order. Splits follow the token's own key list, so a
// token's result does not depend on the rest of the step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "convert.cuh"
#include "sonarspec/paged_attention_cuda.h"

namespace sonarspec {
namespace {

constexpr int kWarps = 4, kMaxHeads = 8;
constexpr float kLog2e = 1.4426950408889634f;

// N consecutive elements at p (aligned to their size in bytes where that is 4, 8 or 16) as floats.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* __restrict__ p, float* dst) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    #pragma unroll
    for (int w = 0; w < kBytes / 16; ++w) {
      const uint4 word = __ldg(reinterpret_cast<const uint4*>(p) + w);
      const T* e = reinterpret_cast<const T*>(&word);
      #pragma unroll
      for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) dst[w * (16 / sizeof(T)) + i] = to_float(e[i]);
    }
  } else if constexpr (kBytes % 8 == 0) {
    #pragma unroll
    for (int w = 0; w < kBytes / 8; ++w) {
      const uint2 word = __ldg(reinterpret_cast<const uint2*>(p) + w);
      const T* e = reinterpret_cast<const T*>(&word);
      #pragma unroll
      for (int i = 0; i < 8 / static_cast<int>(sizeof(T)); ++i) dst[w * (8 / sizeof(T)) + i] = to_float(e[i]);
    }
  } else {
    #pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_float(p[i]);
  }
}

// A query token's key list: `prefix` positions from `lo`, then the tree span of `span`
// positions from tree_begin (only those whose bit is set are keys). ok is false for a
// token whose indices leave the block table or the pool (its output is zero).
struct Keys {
  int64_t lo = 0, prefix = 0, tree = 0, span = 0, len = 0;
  uint64_t bits = 0;
  const int64_t* pages = nullptr;
  bool ok = false;
};

__device__ Keys token_keys(int64_t t, const AttentionArgs& a) {
  Keys k;
  const int64_t max_kv = a.max_pages * a.page_size, seq = a.token_seq[t];
  if (seq < 0 || seq >= a.batch_size || a.key_begin[t] < 0 || a.key_end[t] > max_kv) return k;
  k.pages = a.block_table + seq * a.max_pages;
  k.lo = a.key_begin[t];
  k.prefix = a.key_end[t] > k.lo ? a.key_end[t] - k.lo : 0;
  if (a.tree_mask != nullptr) {
    k.bits = static_cast<uint64_t>(a.tree_mask[t]);
    k.tree = a.tree_begin[t];
    k.span = k.bits ? 64 - __clzll(static_cast<long long>(k.bits)) : 0;
    if (k.span > 0 && (k.tree < 0 || k.tree > max_kv - k.span)) return k;   // (no overflow past 2^63)
  }
  k.len = k.prefix + k.span;
  k.ok = k.prefix + __popcll(k.bits) > 0;
  return k;
}

// The pool slot of entry i of the key list, or -1 where it is no key (a tree position
// whose bit is clear) or its page id is outside the pool.
__device__ __forceinline__ int64_t key_slot(const Keys& k, int64_t i, const AttentionArgs& a) {
  int64_t pos = k.lo + i;
  if (i >= k.prefix) {
    const int64_t j = i - k.prefix;
    if (!((k.bits >> j) & 1)) return -1;
    pos = k.tree + j;
  }
  const int64_t page = k.pages[pos / a.page_size];
  return page >= 0 && page < a.num_pages ? page * a.page_size + pos % a.page_size : -2;
}

__device__ __forceinline__ int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ float warp_max(float x) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Grid (tokens, KV heads x head subgroups, splits); kWarps * 32 threads.
template <typename T, int DPL>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionArgs a) {
  constexpr int D = DPL * 32;
  const int64_t t = blockIdx.x, split = blockIdx.z;
  const int subgroups = static_cast<int>((a.group + kMaxHeads - 1) / kMaxHeads);
  const int64_t kvh = blockIdx.y / subgroups;
  const int64_t h0 = kvh * a.group + (blockIdx.y % subgroups) * kMaxHeads;
  const int heads = static_cast<int>(lmin(kMaxHeads, (kvh + 1) * a.group - h0));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  __shared__ float q_s[kMaxHeads][D];
  __shared__ float m_s[kWarps][kMaxHeads], l_s[kWarps][kMaxHeads];
  __shared__ float acc_s[kWarps][kMaxHeads][D];

  const Keys keys = token_keys(t, a);
  const int64_t splits = keys.ok ? lmax(1, (keys.len + kSplit - 1) / kSplit) : 1;
  if (split >= splits) return;
  // Every page the token reads is checked before any is used: a bad one zeroes the token.
  bool page_ok = true;
  if (keys.ok) {
    const int64_t first = keys.lo / a.page_size, last = keys.prefix ? (keys.lo + keys.prefix - 1) / a.page_size : -1;
    for (int64_t p = first + threadIdx.x; p <= last; p += blockDim.x)
      page_ok &= keys.pages[p] >= 0 && keys.pages[p] < a.num_pages;
    for (int j = threadIdx.x; j < keys.span; j += blockDim.x)
      if ((keys.bits >> j) & 1) {
        const int64_t page = keys.pages[(keys.tree + j) / a.page_size];
        page_ok &= page >= 0 && page < a.num_pages;
      }
  }
  const bool ok = keys.ok && !__syncthreads_or(!page_ok);
  if (split == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    a.splits_used[t] = ok ? splits : 0;
    if (!ok && a.bad_tokens != nullptr) atomicAdd(a.bad_tokens, 1);
  }
  T* out = static_cast<T*>(a.out) + (t * a.num_heads + h0) * D;
  if (!ok) {
    for (int i = threadIdx.x; i < heads * D; i += blockDim.x) out[i] = from_float<T>(0.f);
    return;
  }
  const T* q = static_cast<const T*>(a.q) + (t * a.num_heads + h0) * D;
  const float qscale = a.scale * kLog2e;   // scores in log2 units: exp2 below
  for (int i = threadIdx.x; i < kMaxHeads * D; i += blockDim.x)
    q_s[i / D][i % D] = i / D < heads ? to_float(q[i]) * qscale : 0.f;
  __syncthreads();

  const T* k_pool = static_cast<const T*>(a.k_pool);
  const T* v_pool = static_cast<const T*>(a.v_pool);
  const int64_t row = a.num_kv_heads * D;
  float m[kMaxHeads], l[kMaxHeads], acc[kMaxHeads][DPL];
  #pragma unroll
  for (int g = 0; g < kMaxHeads; ++g) {
    m[g] = -INFINITY, l[g] = 0.f;
    #pragma unroll
    for (int e = 0; e < DPL; ++e) acc[g][e] = 0.f;
  }
  const int64_t begin = split * kSplit, end = lmin(keys.len, begin + kSplit);
  for (int64_t c = begin + warp * 32; c < end; c += kWarps * 32) {
    const int64_t i = c + lane;
    const int64_t slot = i < end ? key_slot(keys, i, a) : -1;
    float s[kMaxHeads];
    #pragma unroll
    for (int g = 0; g < kMaxHeads; ++g) s[g] = 0.f;
    if (slot >= 0) {
      const T* kr = k_pool + slot * row + kvh * D;
      constexpr int kVec = 16 / sizeof(T);
      #pragma unroll 4
      for (int d = 0; d < D; d += kVec) {
        float kv[kVec];
        load_floats<T, kVec>(kr + d, kv);
        #pragma unroll
        for (int g = 0; g < kMaxHeads; ++g) {
          if (g < heads) {
            #pragma unroll
            for (int e = 0; e < kVec; ++e) s[g] = fmaf(q_s[g][d + e], kv[e], s[g]);
          }
        }
      }
    }
    float p[kMaxHeads];
    #pragma unroll
    for (int g = 0; g < kMaxHeads; ++g) {
      p[g] = 0.f;
      if (g >= heads) continue;
      const float cmax = warp_max(slot >= 0 ? s[g] : -INFINITY);
      const float m_new = fmaxf(m[g], cmax);
      if (m_new == -INFINITY) continue;   // no key in this chunk nor before it
      const float rescale = exp2f(m[g] - m_new);   // 0 while m was -inf
      p[g] = slot >= 0 ? exp2f(s[g] - m_new) : 0.f;
      l[g] = l[g] * rescale + p[g];                 // per lane; summed over the warp at the end
      m[g] = m_new;
      #pragma unroll
      for (int e = 0; e < DPL; ++e) acc[g][e] *= rescale;
    }
    const int n = static_cast<int>(lmin(32, end - c));
    for (int j = 0; j < n; ++j) {
      const int64_t sj = __shfl_sync(0xffffffffu, slot, j);
      if (sj < 0) continue;
      float v[DPL];
      load_floats<T, DPL>(v_pool + sj * row + kvh * D + lane * DPL, v);
      #pragma unroll
      for (int g = 0; g < kMaxHeads; ++g) {
        const float pj = __shfl_sync(0xffffffffu, p[g], j);
        if (g < heads) {
          #pragma unroll
          for (int e = 0; e < DPL; ++e) acc[g][e] = fmaf(pj, v[e], acc[g][e]);
        }
      }
    }
  }
  #pragma unroll
  for (int g = 0; g < kMaxHeads; ++g) {
    const float lw = warp_sum(l[g]);
    if (lane == 0) m_s[warp][g] = m[g], l_s[warp][g] = lw;
    #pragma unroll
    for (int e = 0; e < DPL; ++e) acc_s[warp][g][lane * DPL + e] = acc[g][e];
  }
  __syncthreads();
  float* part = a.partial + ((t * a.num_heads + h0) * a.max_splits + split) * (D + 2);
  for (int i = threadIdx.x; i < heads * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float mx = -INFINITY;
    #pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][g]);
    float sum = 0.f, val = 0.f;
    if (mx != -INFINITY) {
      #pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(m_s[w][g] - mx);
        sum += l_s[w][g] * f;
        val += acc_s[w][g][d] * f;
      }
    }
    if (splits == 1) {
      out[g * D + d] = from_float<T>(sum > 0.f ? val / sum : 0.f);
    } else {
      float* ph = part + g * a.max_splits * (D + 2);
      ph[d] = val;
      if (d == 0) ph[D] = mx, ph[D + 1] = sum;
    }
  }
}

// Grid (tokens, heads), D threads: the partial states of a token's splits, in split order.
template <typename T, int D>
__global__ void merge_splits(AttentionArgs a) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t splits = a.splits_used[t];
  if (splits <= 1) return;   // written by the attention kernel (or a bad token's zeros)
  const float* part = a.partial + (t * a.num_heads + h) * a.max_splits * (D + 2);
  float mx = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, part[s * (D + 2) + D]);
  float sum = 0.f, val = 0.f;
  for (int64_t s = 0; s < splits && mx != -INFINITY; ++s) {
    const float* ps = part + s * (D + 2);
    const float f = exp2f(ps[D] - mx);
    sum += ps[D + 1] * f;
    val += ps[threadIdx.x] * f;
  }
  static_cast<T*>(a.out)[(t * a.num_heads + h) * D + threadIdx.x] = from_float<T>(sum > 0.f ? val / sum : 0.f);
}

template <typename T, int DPL>
cudaError_t launch(const AttentionArgs& a, cudaStream_t stream) {
  const int subgroups = static_cast<int>((a.group + kMaxHeads - 1) / kMaxHeads);
  dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_kv_heads * subgroups),
            static_cast<unsigned>(a.max_splits));
  attention_kernel<T, DPL><<<grid, kWarps * 32, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.max_splits == 1) return err;
  merge_splits<T, DPL * 32><<<dim3(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_heads)),
                              DPL * 32, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dim(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 32: return launch<T, 1>(a, stream);
    case 64: return launch<T, 2>(a, stream);
    case 96: return launch<T, 3>(a, stream);
    case 128: return launch<T, 4>(a, stream);
    case 256: return launch<T, 8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool paged_attention_cuda_supports(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

int64_t paged_attention_cuda_max_splits(int64_t max_pages, int64_t page_size) {
  return (max_pages * page_size + 64 + kSplit - 1) / kSplit;
}

int paged_attention_cuda(const AttentionArgs& args, DType dtype, void* stream) {
  if (args.num_tokens == 0) return 0;
  if (!paged_attention_cuda_supports(args.head_dim) || args.num_kv_heads < 1 || args.group < 1 ||
      args.num_heads != args.group * args.num_kv_heads || args.page_size < 1 || args.max_pages < 0 ||
      args.max_splits < std::max<int64_t>(1, paged_attention_cuda_max_splits(args.max_pages, args.page_size)))
    return static_cast<int>(cudaErrorInvalidValue);   // a token's splits could pass the work buffer
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32: return static_cast<int>(launch_dim<float>(args, s));
    case DType::kFloat16: return static_cast<int>(launch_dim<__half>(args, s));
    case DType::kBFloat16: return static_cast<int>(launch_dim<__nv_bfloat16>(args, s));
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace sonarspec
