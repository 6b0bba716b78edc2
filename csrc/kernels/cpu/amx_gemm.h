// bfloat16 GEMM columns on Intel AMX tiles (TDPBF16PS): the weights, row-major as
// nn.Linear keeps them, are the tile multiply's left operand loaded straight from memory
// (16 weight rows x 32 k per tile), and the few activation rows are packed once per call
// into the right operand's pair-interleaved layout. So no weight is repacked, a tile
// instruction does 16 x 16 x 32 multiply-adds, and up to 16 activation rows cost one
// pass over the weights like one row. Internal to small_gemm.cpp.
#pragma once

#include <cstdint>

#include "sonarspec/small_gemm.h"   // amx_available

namespace sonarspec {

// Elements of amx_pack_rows' output for m rows of k (padded to 32) columns.
int64_t amx_packed_size(int64_t m, int64_t k);

// Packs rows of bfloat16 activations xb (m, ldx), zero after column k, ldx a multiple of
// 32, into tiles of 16 rows x 32 k: tile (g, kb) holds rows [16 g, 16 g + 16) (zeros past
// m) and columns [32 kb, 32 kb + 32), pairs of columns interleaved per row.
void amx_pack_rows(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, uint16_t* packed);

// y[i, j] = sum_t x[i, t] w[j, t] for rows i in [0, m) and columns j in [n_begin, n_end),
// n_begin a multiple of 16; packed from amx_pack_rows, w (n, k) bfloat16 bits, y (m, n).
// Each output is one chain of tile multiply-adds over k in order: it depends on its own
// activation row and weight row only, never on m, on the other rows or on the column range.
void amx_gemm_cols(const uint16_t* packed, int64_t m, const uint16_t* w, int64_t n, int64_t k, float* y,
                   int64_t n_begin, int64_t n_end);

}  // namespace sonarspec
