// AMX bfloat16 GEMM columns; see amx_gemm.h. Tile registers: C tiles 0-3 (float32
// accumulators: 16 weight rows x up to 16 activation rows each), weight tiles 4-5 (16
// weight rows x 32 k), activation tiles 6-7 (16 pairs of k x the activation rows).
// Up to 16 rows the activation and C tiles are exactly m columns wide, so a decode loads
// 64 bytes of activations per k block instead of a 1 KiB tile mostly of zeros; beyond 16
// rows every tile is full and the rows go in groups of 16 (zeros after the last row).
#include "amx_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bf16_dot.h"
#include "vec.h"   // env_flag

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SONARSPEC_AMX 1
#endif

namespace sonarspec {

namespace {

constexpr int64_t kTileRows = 16, kTileK = 32, kTileElems = kTileRows * kTileK;

int64_t k_blocks(int64_t k) { return (k + kTileK - 1) / kTileK; }

// Activation rows per packed group, and the groups: one narrow group up to 16 rows.
int64_t group_rows(int64_t m) { return m <= kTileRows ? m : kTileRows; }
int64_t num_groups(int64_t m) { return (m + kTileRows - 1) / kTileRows; }

}  // namespace

int64_t amx_packed_size(int64_t m, int64_t k) { return num_groups(m) * k_blocks(k) * kTileK * group_rows(m); }

void amx_pack_rows(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, uint16_t* packed) {
  // Group g, k block kb: row r (a pair of k) holds that pair of each activation row.
  const int64_t kb_count = k_blocks(k), gm = group_rows(m), pairs = kb_count * kTileRows;
  std::memset(packed, 0, sizeof(uint16_t) * static_cast<size_t>(amx_packed_size(m, k)));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t g = i / gm;
    uint32_t* out = reinterpret_cast<uint32_t*>(packed) + g * pairs * gm + (i - g * gm);
    const uint16_t* row = xb + i * ldx;
    for (int64_t p = 0; p < pairs; ++p) std::memcpy(out + p * gm, row + 2 * p, sizeof(uint32_t));
  }
}

#if defined(SONARSPEC_AMX)

#define AMX_ATTR __attribute__((target("amx-tile,amx-bf16")))

namespace {

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC's tile intrinsics paste their register numbers into the assembly as written, so
// they take literal numbers only: these switches pick the literal, and fold away once
// inlined with constant arguments.
#define SS_TILE_CASE(T, STMT) \
  case T: STMT; break;
AMX_ATTR __attribute__((always_inline)) inline void tile_zero(int t) {
  switch (t) {
    SS_TILE_CASE(0, _tile_zero(0))
    SS_TILE_CASE(1, _tile_zero(1))
    SS_TILE_CASE(2, _tile_zero(2))
    default: _tile_zero(3); break;
  }
}

AMX_ATTR __attribute__((always_inline)) inline void tile_store(int t, void* p, int64_t stride) {
  switch (t) {
    SS_TILE_CASE(0, _tile_stored(0, p, stride))
    SS_TILE_CASE(1, _tile_stored(1, p, stride))
    SS_TILE_CASE(2, _tile_stored(2, p, stride))
    default: _tile_stored(3, p, stride); break;
  }
}

AMX_ATTR __attribute__((always_inline)) inline void tile_load_activations(int t, const void* p, int64_t stride) {
  if (t == 6) {
    _tile_loadd(6, p, stride);
  } else {
    _tile_loadd(7, p, stride);
  }
}

// C tile c += weight tile 4 or 5 x activation tile 6 or 7.
#define SS_DP_CASE(C, A, B) SS_TILE_CASE(C * 100 + A * 10 + B, _tile_dpbf16ps(C, A, B))
AMX_ATTR __attribute__((always_inline)) inline void tile_dp(int c, int a, int b) {
  switch (c * 100 + a * 10 + b) {
    SS_DP_CASE(0, 4, 6) SS_DP_CASE(0, 4, 7) SS_DP_CASE(0, 5, 6) SS_DP_CASE(0, 5, 7)
    SS_DP_CASE(1, 4, 6) SS_DP_CASE(1, 4, 7) SS_DP_CASE(1, 5, 6) SS_DP_CASE(1, 5, 7)
    SS_DP_CASE(2, 4, 6) SS_DP_CASE(2, 4, 7) SS_DP_CASE(2, 5, 6) SS_DP_CASE(2, 5, 7)
    SS_DP_CASE(3, 4, 6) SS_DP_CASE(3, 4, 7) SS_DP_CASE(3, 5, 6)
    default: _tile_dpbf16ps(3, 5, 7); break;
  }
}
#undef SS_DP_CASE
#undef SS_TILE_CASE

// What one call works on: packed activations (groups of gm rows, tile stride 4 gm bytes
// per pair row) and the output.
struct Problem {
  const uint16_t* packed;
  int64_t m, gm, kb_count;
  float* y;
  int64_t n;

  const uint16_t* activations(int64_t g, int64_t kb) const {
    return packed + (g * kb_count + kb) * kTileK * gm;
  }
};

// NB blocks of 16 weight rows (block b at w + b * 16 lda, row stride lda) against G groups
// of activation rows from group g0, one pass over k into C tiles b * G + g (NB * G <= 4).
// Successive activation tiles alternate between tiles 6 and 7, so a load can start while
// the previous tile's multiply-adds run. (Measured on a 2-core Sapphire Rapids-class VM,
// decoding SmolLM2: two weight blocks per unit beat one (16 rows stream too few lines at
// once) and four (64 concurrent row streams); software prefetching of the next unit
// and streaming tile loads did not help.)
template <int G, int NB>
AMX_ATTR void unit(const Problem& p, const uint16_t* w, int64_t lda, int64_t n0, int64_t g0) {
  static_assert(G * NB <= 4 && NB <= 2, "four C tiles, two weight tiles");
  for (int c = 0; c < G * NB; ++c) tile_zero(c);
  const int64_t stride = lda * 2, act_stride = 4 * p.gm;
  for (int64_t kb = 0; kb < p.kb_count; ++kb) {
    _tile_loadd(4, w + kb * kTileK, stride);
    if constexpr (NB == 2) _tile_loadd(5, w + kTileRows * lda + kb * kTileK, stride);
    for (int g = 0; g < G; ++g) {
      const int act = 6 + ((kb + g) & 1);
      tile_load_activations(act, p.activations(g0 + g, kb), act_stride);
      for (int b = 0; b < NB; ++b) tile_dp(b * G + g, 4 + b, act);
    }
  }
  alignas(64) float buf[4][kTileRows * kTileRows];   // buf[c][j * gm + i]: weight row j, activation row i
  for (int c = 0; c < G * NB; ++c) tile_store(c, buf[c], act_stride);
  for (int b = 0; b < NB; ++b) {
    const int64_t cols = std::min<int64_t>(kTileRows, p.n - (n0 + b * kTileRows));
    for (int g = 0; g < G; ++g) {
      const int64_t row0 = (g0 + g) * p.gm, rows = std::min<int64_t>(p.gm, p.m - row0);
      for (int64_t i = 0; i < rows; ++i) {
        float* out = p.y + (row0 + i) * p.n + n0 + b * kTileRows;
        for (int64_t j = 0; j < cols; ++j) out[j] = buf[b * G + g][j * p.gm + i];
      }
    }
  }
}

// NB weight blocks against every activation group, four C tiles per pass.
template <int NB>
AMX_ATTR void unit_all_groups(const Problem& p, const uint16_t* w, int64_t lda, int64_t n0) {
  const int64_t groups = num_groups(p.m);
  constexpr int64_t max_g = 4 / NB;
  for (int64_t g0 = 0; g0 < groups; g0 += max_g) {
    switch (std::min(max_g, groups - g0)) {
      case 1: unit<1, NB>(p, w, lda, n0, g0); break;
      case 2: unit<2, NB>(p, w, lda, n0, g0); break;
      case 3: if constexpr (NB == 1) unit<3, 1>(p, w, lda, n0, g0); break;
      default: if constexpr (NB == 1) unit<4, 1>(p, w, lda, n0, g0); break;
    }
  }
}

}  // namespace

bool amx_available() {
  static const bool yes = [] {
    if (!bf16_dot_available() || env_flag("SONARSPEC_NO_AMX")) return false;
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return yes;
}

AMX_ATTR void amx_gemm_cols(const uint16_t* packed, int64_t m, const uint16_t* w, int64_t n, int64_t k, float* y,
                            int64_t n_begin, int64_t n_end) {
  const Problem p{packed, m, group_rows(m), k_blocks(k), y, n};
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kTileRows;
    cfg.colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? 64 : 4 * p.gm);
  }
  _tile_loadconfig(&cfg);
  const int64_t kp = p.kb_count * kTileK;
  const bool direct = k % kTileK == 0;   // else each block is copied, zero-padded, into scratch
  thread_local std::vector<uint16_t> scratch;
  for (int64_t n0 = n_begin; n0 < n_end;) {
    const int64_t left = n_end - n0;
    if (direct && left >= 2 * kTileRows) {
      unit_all_groups<2>(p, w + n0 * k, k, n0);
      n0 += 2 * kTileRows;
    } else if (direct && left >= kTileRows) {
      unit_all_groups<1>(p, w + n0 * k, k, n0);
      n0 += kTileRows;
    } else {
      const int64_t rows = std::min<int64_t>(kTileRows, left);
      scratch.assign(static_cast<size_t>(kTileRows * kp), 0);
      for (int64_t j = 0; j < rows; ++j) std::memcpy(scratch.data() + j * kp, w + (n0 + j) * k, sizeof(uint16_t) * k);
      unit_all_groups<1>(p, scratch.data(), kp, n0);
      n0 += rows;
    }
  }
  _tile_release();
}

#else

bool amx_available() { return false; }

void amx_gemm_cols(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t, int64_t) {}

#endif

}  // namespace sonarspec
