// The decoder layer's small ops on CUDA, one launch each where torch issues several:
// RMSNorm (one block per row, float32 sums), SiLU-and-multiply, and RoPE on the fused
// q/k/v GEMM output (q and k rotated, q, k and v written as contiguous rows). Every
// element is computed in float32 and rounded once to the tensor's dtype; a row's result
// does not depend on the other rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "convert.cuh"
#include "sonarspec/elementwise_cuda.h"

namespace sonarspec {
namespace {

constexpr int kNormThreads = 256;

// out = weight * round(x * rsqrt(mean(x^2) + eps)), as the reference Llama RMSNorm: the
// normalised row rounded to T, then multiplied by the weight (rounded again).
template <typename T>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                T* __restrict__ out, int64_t n, float eps) {
  const T* xr = x + blockIdx.x * n;
  T* orow = out + blockIdx.x * n;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const float v = to_float(xr[i]);
    sum = fmaf(v, v, sum);
  }
  __shared__ float part[kNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.f;
  #pragma unroll
  for (int i = 0; i < kNormThreads / 32; ++i) total += part[i];   // the same order in every thread
  const float inv = rsqrtf(total / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const float normed = to_float(from_float<T>(to_float(xr[i]) * inv));
    orow[i] = from_float<T>(to_float(w[i]) * normed);
  }
}

// x (rows, 2n) = [gate | up] -> silu(gate) * up (rows, n).
template <typename T>
__global__ void silu_and_mul_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    const float g = to_float(x[r * 2 * n + c]), u = to_float(x[r * 2 * n + n + c]);
    out[i] = from_float<T>(g / (1.f + __expf(-g)) * u);
  }
}

// One block per token: qkv row (row stride `stride`) = [q (heads) | k (kv_heads) | v
// (kv_heads)] x head_dim; cos, sin (tokens, head_dim / 2). Rotate-half RoPE on q and k.
template <typename T>
__global__ void rope_qkv_kernel(const T* __restrict__ qkv, int64_t stride, const T* __restrict__ cos,
                                const T* __restrict__ sin, T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                                int64_t heads, int64_t kv_heads, int64_t d) {
  const int64_t t = blockIdx.x, half = d / 2;
  const T* row = qkv + t * stride;
  const T* c = cos + t * half;
  const T* s = sin + t * half;
  const int64_t rotated = (heads + kv_heads) * half;
  for (int64_t i = threadIdx.x; i < rotated; i += blockDim.x) {
    const int64_t h = i / half, j = i % half;
    const float x1 = to_float(row[h * d + j]), x2 = to_float(row[h * d + half + j]);
    const float cj = to_float(c[j]), sj = to_float(s[j]);
    T* dst = h < heads ? q + (t * heads + h) * d : k + (t * kv_heads + h - heads) * d;
    dst[j] = from_float<T>(x1 * cj - x2 * sj);
    dst[half + j] = from_float<T>(x2 * cj + x1 * sj);
  }
  const T* vrow = row + (heads + kv_heads) * d;
  for (int64_t i = threadIdx.x; i < kv_heads * d; i += blockDim.x) v[t * kv_heads * d + i] = vrow[i];
}

template <typename T>
cudaError_t launch_all(int op, const ElementwiseArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  const unsigned rows = static_cast<unsigned>(a.rows);
  switch (op) {
    case kRmsNorm:
      rms_norm_kernel<T><<<rows, kNormThreads, 0, stream>>>(static_cast<const T*>(a.x), static_cast<const T*>(a.w),
                                                            static_cast<T*>(a.out), a.n, a.eps);
      break;
    case kSiluAndMul: {
      const int64_t total = a.rows * a.n;
      const unsigned blocks = static_cast<unsigned>(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
      silu_and_mul_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const T*>(a.x), static_cast<T*>(a.out), a.rows,
                                                         a.n);
      break;
    }
    case kRopeQkv:
      rope_qkv_kernel<T><<<rows, 128, 0, stream>>>(static_cast<const T*>(a.x), a.stride, static_cast<const T*>(a.cos),
                                                   static_cast<const T*>(a.sin), static_cast<T*>(a.out),
                                                   static_cast<T*>(a.out2), static_cast<T*>(a.out3), a.heads,
                                                   a.kv_heads, a.n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

int elementwise_cuda(int op, const ElementwiseArgs& args, DType dtype, void* stream) {
  const bool bad_rope = op == kRopeQkv && (args.n % 2 != 0 || args.heads < 1 || args.kv_heads < 0 ||
                                           args.stride < (args.heads + 2 * args.kv_heads) * args.n);
  if (args.rows < 0 || args.n < 1 || bad_rope) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32: return static_cast<int>(launch_all<float>(op, args, s));
    case DType::kFloat16: return static_cast<int>(launch_all<__half>(op, args, s));
    case DType::kBFloat16: return static_cast<int>(launch_all<__nv_bfloat16>(op, args, s));
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace sonarspec
