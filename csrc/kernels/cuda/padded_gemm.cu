// CUTLASS 2.x tensor-core GEMM (mma.sync, SM80 instructions, compiled for sm_90) with
// 64 x 64 x 32 threadblock tiles: the token dimension m is covered by 64-row tiles, so
// every m up to 64 costs the same blocks. The weight (n, k) row-major is the column-major
// k x n operand B; a bias enters as the C operand with a zero row stride (broadcast over
// rows, beta = 1).
#include <cuda_runtime.h>

#include <cstdint>

#include <cutlass/bfloat16.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm.h>
#include <cutlass/half.h>

#include "sonarspec/padded_gemm.h"

namespace sonarspec {
namespace {

template <typename T>
using Gemm64 = cutlass::gemm::device::Gemm<
    T, cutlass::layout::RowMajor,     // A: x (m, k)
    T, cutlass::layout::ColumnMajor,  // B: w^T (k, n)
    T, cutlass::layout::RowMajor,     // C, D: y (m, n)
    float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<64, 64, 32>,  // threadblock: 64-row tiles
    cutlass::gemm::GemmShape<32, 32, 32>,  // warp (4 warps)
    cutlass::gemm::GemmShape<16, 8, 16>,   // mma.sync instruction
    cutlass::epilogue::thread::LinearCombination<T, 128 / cutlass::sizeof_bits<T>::value, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, 4>;

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
int run(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n, int64_t k,
        cudaStream_t stream) {
  using Gemm = Gemm64<T>;
  if (m <= 0 || n % 8 || k % 8 || !aligned16(x) || !aligned16(w) || !aligned16(bias) || !aligned16(y) ||
      m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    return kPaddedGemmUnsupported;
  }
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const T* c = static_cast<const T*>(bias != nullptr ? bias : y);
  typename Gemm::Arguments args({mi, ni, ki}, {static_cast<const T*>(x), ki}, {static_cast<const T*>(w), ki},
                                {c, bias != nullptr ? 0 : ni}, {static_cast<T*>(y), ni},
                                {1.f, bias != nullptr ? 1.f : 0.f});
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return kPaddedGemmUnsupported;
  if (gemm(args, nullptr, stream) != cutlass::Status::kSuccess) {
    cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? static_cast<int>(err) : static_cast<int>(cudaErrorLaunchFailure);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int padded_gemm_cuda(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                     DType dtype, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kBFloat16: return run<cutlass::bfloat16_t>(x, w, bias, y, m, n, k, s);
    case DType::kFloat16: return run<cutlass::half_t>(x, w, bias, y, m, n, k, s);
    default: return kPaddedGemmUnsupported;
  }
}

}  // namespace sonarspec
