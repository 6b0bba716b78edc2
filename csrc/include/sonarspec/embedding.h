// Token embedding rows from a table kept in any weight format: float32, bfloat16 (widened
// exactly) or a block format in quant_gemm.h's packed layout, so a quantized model's
// embedding stays in its file's blocks (a tied one shares the lm_head's bytes) instead of a
// float32 copy. A block-format row equals gguf's dequantizer bit for bit: d * q (Q8_0,
// Q4_0, Q5_0), d * q + m (Q4_1, Q5_1), (d * sc) * q - dmin * mn (Q4_K, Q5_K) and
// (d * sc) * q (Q6_K), each product and sum rounded to float32 on its own (no fused
// multiply-add).
#pragma once

#include <cstdint>

#include "sonarspec/small_gemm.h"   // WeightFormat

namespace sonarspec {

// Row `token` of a (rows, hidden) table into out (hidden floats); std::out_of_range for a
// token outside [0, rows), std::invalid_argument for a hidden size the format cannot hold.
void embedding_row(const void* table, WeightFormat format, int64_t rows, int64_t hidden, int64_t token, float* out);

// Rows tokens[0..m) into out (m, hidden), every token checked before any row is written.
void embedding_rows(const void* table, WeightFormat format, int64_t rows, int64_t hidden, const int64_t* tokens,
                    int64_t m, float* out);

}  // namespace sonarspec
