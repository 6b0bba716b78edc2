// GEMMs over GGUF block-quantized weights; see sonarspec/quant_gemm.h. The activations are
// quantized here once per call; the column kernels are quant_gemm_vnni.cpp (AVX-512 VNNI),
// quant_gemm_avx2.cpp (AVX-VNNI or AVX2) and the portable loops below, which compute the same
// values bit for bit.
#include "sonarspec/quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant_kernels.h"
#include "quant_unpack.h"
#include "split_columns.h"

namespace sonarspec {
namespace {

// The column kernels, in order of preference; see quant_kernel() in quant_gemm.h.
enum class Kernel { kPortable, kAvx2, kAvxVnni, kVnni };

Kernel kernel_here() {
  static const Kernel k = [] {
    Kernel best = Kernel::kPortable;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      best = Kernel::kAvx2;
      const bool vnni_256 = __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
      if (__builtin_cpu_supports("avxvnni") || vnni_256) best = Kernel::kAvxVnni;
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && vnni_256) {
        best = Kernel::kVnni;
      }
    }
#endif
    const char* cap = std::getenv("SONARSPEC_QUANT_KERNEL");
    if (cap != nullptr && std::strcmp(cap, "portable") == 0) return Kernel::kPortable;
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0) return std::min(best, Kernel::kAvx2);
    if (cap != nullptr && std::strcmp(cap, "avxvnni") == 0) return std::min(best, Kernel::kAvxVnni);
    return best;
  }();
  return k;
}

// Per-thread storage of one call's quantized activations.
struct RowBuffers {
  std::vector<int8_t> q;
  std::vector<float> d, ds;
  std::vector<int32_t> s, s16;
};

QuantizedRows quantize_rows(const float* x, int64_t m, int64_t k, RowBuffers& buf) {
  const int64_t kb = k / 32;
  buf.q.resize(static_cast<size_t>(m * k));
  buf.d.resize(static_cast<size_t>(m * kb));
  buf.ds.resize(static_cast<size_t>(m * kb));
  buf.s.resize(static_cast<size_t>(m * kb));
  buf.s16.resize(static_cast<size_t>(2 * m * kb));
  const Kernel kernel = kernel_here();
  const auto quantize = kernel == Kernel::kVnni                                 ? quantize_blocks_vnni
                        : kernel == Kernel::kAvx2 || kernel == Kernel::kAvxVnni ? quantize_blocks_avx2
                                                  : quantize_blocks_scalar;
  quantize(x, m * kb, buf.q.data(), buf.d.data(), buf.s.data(), buf.s16.data(), buf.ds.data());
  QuantizedRows r;
  r.q = buf.q.data();
  r.d = buf.d.data();
  r.s = buf.s.data();
  r.s16 = buf.s16.data();
  r.ds = buf.ds.data();
  r.k = k;
  r.kb = kb;
  return r;
}

}  // namespace

void quantize_blocks_scalar(const float* x, int64_t num_blocks, int8_t* q, float* d, int32_t* s, int32_t* s16,
                            float* ds) {
  for (int64_t i = 0; i < num_blocks; ++i) {
    const float* src = x + i * 32;
    float amax = 0.f;
    bool nan = false;
    for (int t = 0; t < 32; ++t) {
      amax = std::max(amax, std::fabs(src[t]));
      nan |= std::isnan(src[t]);
    }
    if (nan) amax = NAN;   // a NaN input makes its block's outputs NaN
    const float di = amax / 127.f;
    const float inv = di != 0.f ? 1.f / di : 0.f;
    int32_t half[2] = {0, 0};
    for (int t = 0; t < 32; ++t) {
      const float v = std::nearbyint(src[t] * inv);
      const int32_t iv = std::isnan(v) ? 0 : static_cast<int32_t>(std::min(127.f, std::max(-127.f, v)));
      q[i * 32 + t] = static_cast<int8_t>(iv);
      half[t / 16] += iv;
    }
    const int32_t sum = half[0] + half[1];
    d[i] = di;
    s[i] = sum;
    s16[2 * i] = half[0];
    s16[2 * i + 1] = half[1];
    ds[i] = di * static_cast<float>(sum);
  }
}

namespace {

// Row i of x against column `lane` of a 16-row group, K-quant super-blocks in order.
float k_quant_row(const QuantizedRows& x, int64_t i, const uint8_t* group, int64_t lane, WeightFormat f) {
  const int64_t bb = quant_block_bytes(f);
  const int cols = k_sub_columns(f);
  float acc = 0.f;
  for (int64_t sb = 0; sb < x.k / 256; ++sb) {
    const uint8_t* blk = group + sb * bb;
    const int8_t* xq = x.q + i * x.k + sb * 256;
    const int64_t b0 = i * x.kb + sb * 8;   // the super-block's first activation block
    const float d = lane_scale(blk, lane), dmin = f != WeightFormat::kQ6_K ? lane_min(blk, lane) : 0.f;
    for (int sub = 0; sub < 256 / cols; ++sub) {
      int32_t q[32], sc, mn, isum = 0;
      unpack_k_sub(blk, f, lane, sub, q, &sc, &mn);
      for (int t = 0; t < cols; ++t) isum += q[t] * xq[cols * sub + t];
      if (f != WeightFormat::kQ6_K) {   // sub-blocks of 32 with a scale and a min
        acc = std::fma(static_cast<float>(isum), (d * static_cast<float>(sc)) * x.d[b0 + sub], acc);
        acc = std::fma(-(dmin * static_cast<float>(mn)), x.ds[b0 + sub], acc);
      } else {   // sub-blocks of 16, two per activation block
        acc = std::fma(static_cast<float>(isum), (d * static_cast<float>(sc)) * x.d[b0 + sub / 2], acc);
      }
    }
  }
  return acc;
}

// The same for the 32-column formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), blocks in order.
float block_row(const QuantizedRows& x, int64_t i, const uint8_t* group, int64_t lane, WeightFormat f) {
  const int64_t bb = quant_block_bytes(f), kb = x.kb;
  float acc = 0.f;
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* blk = group + b * bb;
    const int8_t* xq = x.q + i * x.k + b * 32;
    int32_t q[32], isum = 0;
    unpack_block(blk, f, lane, q);
    for (int t = 0; t < 32; ++t) isum += q[t] * xq[t];
    acc = std::fma(static_cast<float>(isum), lane_scale(blk, lane) * x.d[i * kb + b], acc);
    if (has_min(f)) acc = std::fma(lane_min(blk, lane), x.ds[i * kb + b], acc);
  }
  return acc;
}

}  // namespace

void quant_cols_scalar(const QuantizedRows& x, int64_t m, const uint8_t* w, WeightFormat f, int64_t n, float* y,
                       int64_t n_begin, int64_t n_end) {
  const int64_t group_bytes = x.k / block_columns(f) * quant_block_bytes(f);
  const auto row = is_k_quant(f) ? k_quant_row : block_row;
  for (int64_t j = n_begin; j < n_end; ++j)
    for (int64_t i = 0; i < m; ++i) y[i * n + j] = row(x, i, w + (j / 16) * group_bytes, j % 16, f);
}

int64_t quant_block_columns(WeightFormat format) {
  if (!is_quantized(format)) throw std::invalid_argument("quant_block_columns: not a quantized format");
  return block_columns(format);
}

int64_t quant_packed_bytes(WeightFormat format, int64_t n, int64_t k) {
  const int64_t cols = quant_block_columns(format);
  if (n <= 0 || k <= 0 || k % cols != 0) {
    throw std::invalid_argument("quant_packed_bytes: needs n >= 1 and k a positive multiple of " +
                                std::to_string(cols));
  }
  return (n + 15) / 16 * (k / cols) * quant_block_bytes(format);
}

const char* quant_kernel() {
  switch (kernel_here()) {
    case Kernel::kVnni: return "vnni";
    case Kernel::kAvxVnni: return "avxvnni";
    case Kernel::kAvx2: return "avx2";
    default: return "portable";
  }
}

void quant_gemm(const float* x, const uint8_t* w, WeightFormat format, const float* bias, float* y, int64_t m,
                int64_t n, int64_t k, int num_threads) {
  if (!is_quantized(format)) throw std::invalid_argument("quant_gemm: not a quantized weight format");
  if (k <= 0 || k % block_columns(format) != 0) {
    throw std::invalid_argument("quant_gemm: in_features must be a positive multiple of " +
                                std::to_string(block_columns(format)) + ", got " + std::to_string(k));
  }
  if (m <= 0 || n <= 0) return;
  thread_local RowBuffers buf;
  const QuantizedRows rows = quantize_rows(x, m, k, buf);   // the workers read this thread's buffers
  const Kernel kernel = kernel_here();
  split_columns(m, n, k, 1, num_threads, [&](int64_t b, int64_t e) {
    switch (kernel) {
      case Kernel::kVnni: quant_cols_vnni(rows, m, w, format, n, y, b, e); break;
      case Kernel::kAvxVnni: quant_cols_avxvnni(rows, m, w, format, n, y, b, e); break;
      case Kernel::kAvx2: quant_cols_avx2(rows, m, w, format, n, y, b, e); break;
      default: quant_cols_scalar(rows, m, w, format, n, y, b, e); break;
    }
    if (bias)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = b; j < e; ++j) y[i * n + j] += bias[j];
  }, 16);
}

}  // namespace sonarspec
