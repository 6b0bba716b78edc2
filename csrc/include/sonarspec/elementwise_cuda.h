// RMSNorm, SiLU-and-multiply and RoPE on the fused q/k/v rows, on CUDA
// (csrc/kernels/cuda/elementwise.cu): one dtype per call, float32 arithmetic, one
// rounding per output. Framework free: raw device pointers and sizes.
#pragma once

#include <cstdint>

#include "sonarspec/kv_store.h"   // DType

namespace sonarspec {

enum ElementwiseOp : int { kRmsNorm = 0, kSiluAndMul = 1, kRopeQkv = 2 };

struct ElementwiseArgs {
  const void* x;        // rms_norm: (rows, n); silu_and_mul: (rows, 2n); rope_qkv: rows of stride `stride`
  const void* w;        // rms_norm: weight (n,)
  const void* cos;      // rope_qkv: (rows, n / 2)
  const void* sin;
  void* out;            // rms_norm: (rows, n); silu_and_mul: (rows, n); rope_qkv: q (rows, heads, n)
  void* out2;           // rope_qkv: k (rows, kv_heads, n)
  void* out3;           // rope_qkv: v (rows, kv_heads, n)
  int64_t rows, n;      // n: the row width, or rope_qkv's head_dim (even)
  int64_t stride = 0, heads = 0, kv_heads = 0;
  float eps = 0.f;
};

// Returns 0 or the launch's cudaError_t (cudaErrorInvalidValue for bad sizes).
int elementwise_cuda(int op, const ElementwiseArgs& args, DType dtype, void* stream);

}  // namespace sonarspec
