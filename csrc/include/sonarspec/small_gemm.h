// y = x @ w^T (+ bias) for few rows of x: the decode / verification / draft case,
// where a general GEMM library falls back to slow matrix-vector paths. Weights are
// streamed once per call; x rows stay in L1. float32 activations, float32, bfloat16 or
// block-quantized weights. Every output depends only on its own row of x, never on how many rows share
// the call, so a token decoded alone and the same token verified among others agree
// bit for bit.
#pragma once

#include <cstdint>
#include <string>

namespace sonarspec {

// x: (m, k) row-major; w: (n, k) row-major (the nn.Linear layout); bias: (n,) or null;
// y: (m, n) row-major. Work is split over `num_threads` threads along n.
void small_gemm_f32(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                    int64_t k, int num_threads);

// The same with bfloat16 weights (raw uint16_t bits): the activations are rounded to
// bfloat16 (nearest, ties to even) and the bfloat16 products (exact) summed in float32 -
// on AMX tiles where the CPU has them (any number of rows: up to 16 cost one pass over the
// weights), else with VDPBF16PS where it has AVX512_BF16 (twice float32 FMA's
// multiply-adds per instruction), else by widening both in registers. Half the weight
// traffic of float32. One CPU always takes the same of these paths, whatever m is.
void small_gemm_bf16w(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m, int64_t n,
                      int64_t k, int num_threads);

// Whether small_gemm_bf16w runs VDPBF16PS on this CPU (AVX512F/VL/BW and AVX512_BF16),
// unless the environment variable SONARSPEC_NO_BF16_DOT is set to a non-zero value.
bool bf16_dot_available();

// Whether small_gemm_bf16w runs on AMX tiles here (AMX-TILE and AMX-BF16, the tile state
// granted by the kernel), unless SONARSPEC_NO_AMX or SONARSPEC_NO_BF16_DOT is set non-zero.
bool amx_available();

// How a weight matrix is stored: float32, bfloat16 bits, or one of quant_gemm.h's packed
// GGUF block formats. The codes are the Python side's (ops.quantized.FORMAT_CODES).
enum class WeightFormat : int { kF32 = 0, kBF16 = 1, kQ8_0 = 2, kQ4_0 = 3, kQ4_1 = 4, kQ4_K = 5, kQ6_K = 6, kQ5_K = 7,
                               kQ5_0 = 8, kQ5_1 = 9 };

// The GEMM for the weights' format: small_gemm_f32, small_gemm_bf16w or quant_gemm.
void small_gemm_any(const float* x, const void* w, WeightFormat format, const float* bias, float* y, int64_t m,
                    int64_t n, int64_t k, int num_threads);

// How the VDPBF16PS and the VNNI block-format kernels prefetch their weights: "near" (into
// L1: 2 groups of 4 weight rows ahead; 8 blocks, the K-quants 2560 bytes), "far" (into L2: 4
// groups; 32 blocks or 10240 bytes; nothing in a pass of one activation row over a 32-column
// block format) or "none". Chosen once per CPU - far on AMD Zen 4, else near - unless
// SONARSPEC_WEIGHT_PREFETCH names one; set_weight_prefetch switches it (for comparisons; an
// unknown name is std::invalid_argument). The results are the same bits.
const char* weight_prefetch_mode();
void set_weight_prefetch(const std::string& mode);

}  // namespace sonarspec

namespace sonarspec {

// Gated SiLU MLP for few rows, in one call: y = (silu(x @ g^T) * (x @ u^T)) @ down^T where
// gate_up (2 * inter, hidden) stacks g over u and down is (hidden, inter); x (m, hidden),
// y (m, hidden). Same arithmetic as small_gemm, silu_and_mul_cpu, small_gemm in turn.
// Each weight is stored in its own format.
void small_mlp(const float* x, const void* gate_up, WeightFormat gate_up_format, const void* down,
               WeightFormat down_format, float* y, int64_t m, int64_t hidden, int64_t inter, int num_threads);

}  // namespace sonarspec
