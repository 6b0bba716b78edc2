// y = x @ w^T (+ bias) on the GPU with 64-row tiles (CUTLASS tensor-core GEMM, bfloat16
// or float16 operands, float32 accumulation): the token dimension is covered by tiles of
// 64 rows, so a verification pass over up to 64 tokens issues the same GEMM blocks as a
// one-token decode. Framework free; only in builds with CUDA and CUTLASS headers.
#pragma once

#include <cstdint>

#include "sonarspec/kv_store.h"  // DType

namespace sonarspec {

// Returned when the shape or alignment is outside what the kernel supports (k and n
// multiples of 8, 16-byte aligned pointers, a 16-bit dtype): callers fall back.
constexpr int kPaddedGemmUnsupported = -1;

// x: (m, k) row-major; w: (n, k) row-major (the nn.Linear layout); bias: (n,) or null;
// y: (m, n) row-major; all of `dtype`. Returns 0, kPaddedGemmUnsupported, or the
// cudaError_t of the launch.
int padded_gemm_cuda(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                     DType dtype, void* stream);

}  // namespace sonarspec
