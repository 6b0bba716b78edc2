// Embedding rows from float32, bfloat16 or packed block-format tables (sonarspec/embedding.h).
// Built with -ffp-contract=off: each product and sum rounds on its own, as gguf's numpy does.
#include "sonarspec/embedding.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "quant_unpack.h"
#include "vec.h"   // bf16_to_float

namespace sonarspec {
namespace {

// Row `lane` of the 16-row group at `group` (hidden / 32 blocks) as floats.
void block_row_values(const uint8_t* group, WeightFormat f, int64_t lane, int64_t hidden, float* out) {
  const int64_t bb = quant_block_bytes(f);
  for (int64_t b = 0; b < hidden / 32; ++b) {
    const uint8_t* blk = group + b * bb;
    int32_t q[32];
    unpack_block(blk, f, lane, q);
    const float d = lane_scale(blk, lane), m = has_min(f) ? lane_min(blk, lane) : 0.f;
    for (int t = 0; t < 32; ++t) {
      const float v = d * static_cast<float>(q[t]);
      out[32 * b + t] = has_min(f) ? v + m : v;
    }
  }
}

// The same for a K-quant group (hidden / 256 super-blocks).
void k_quant_row_values(const uint8_t* group, WeightFormat f, int64_t lane, int64_t hidden, float* out) {
  const int64_t bb = quant_block_bytes(f);
  const int cols = k_sub_columns(f);
  for (int64_t sb = 0; sb < hidden / 256; ++sb) {
    const uint8_t* blk = group + sb * bb;
    const float d = lane_scale(blk, lane), dmin = f != WeightFormat::kQ6_K ? lane_min(blk, lane) : 0.f;
    for (int sub = 0; sub < 256 / cols; ++sub) {
      int32_t q[32], sc, mn;
      unpack_k_sub(blk, f, lane, sub, q, &sc, &mn);
      const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(mn);
      float* dst = out + 256 * sb + cols * sub;
      for (int t = 0; t < cols; ++t) dst[t] = scale * static_cast<float>(q[t]) - offset;
    }
  }
}

void check_shape(WeightFormat format, int64_t rows, int64_t hidden) {
  if (rows < 1 || hidden < 1 || (is_quantized(format) && hidden % block_columns(format) != 0)) {
    throw std::invalid_argument("embedding: a (" + std::to_string(rows) + ", " + std::to_string(hidden) +
                                ") table cannot be held in this weight format");
  }
}

void check_token(int64_t rows, int64_t token) {
  if (token < 0 || token >= rows) {
    throw std::out_of_range("token " + std::to_string(token) + " out of range [0, " + std::to_string(rows) + ")");
  }
}

void row_unchecked(const void* table, WeightFormat format, int64_t hidden, int64_t token, float* out) {
  switch (format) {
    case WeightFormat::kF32:
      std::memcpy(out, static_cast<const float*>(table) + token * hidden, sizeof(float) * hidden);
      return;
    case WeightFormat::kBF16: {
      const uint16_t* e = static_cast<const uint16_t*>(table) + token * hidden;
      for (int64_t j = 0; j < hidden; ++j) out[j] = bf16_to_float(e[j]);
      return;
    }
    default: {
      const uint8_t* group = static_cast<const uint8_t*>(table) +
                              (token / 16) * (hidden / block_columns(format)) * quant_block_bytes(format);
      (is_k_quant(format) ? k_quant_row_values : block_row_values)(group, format, token % 16, hidden, out);
    }
  }
}

}  // namespace

void embedding_row(const void* table, WeightFormat format, int64_t rows, int64_t hidden, int64_t token, float* out) {
  check_shape(format, rows, hidden);
  check_token(rows, token);
  row_unchecked(table, format, hidden, token, out);
}

void embedding_rows(const void* table, WeightFormat format, int64_t rows, int64_t hidden, const int64_t* tokens,
                    int64_t m, float* out) {
  check_shape(format, rows, hidden);
  for (int64_t i = 0; i < m; ++i) check_token(rows, tokens[i]);
  for (int64_t i = 0; i < m; ++i) row_unchecked(table, format, hidden, tokens[i], out + i * hidden);
}

}  // namespace sonarspec
