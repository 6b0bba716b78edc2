// VDPBF16PS rows (512-bit vectors): each 32-bit lane multiplies a pair of bfloat16 activations by a pair
// of bfloat16 weights (exact products) and adds both to a float32 accumulator - twice the
// multiply-adds per instruction of float32 FMA, and the weights need no widening. Up to
// six rows share each pass over four weight rows (24 accumulators of the 32 registers).
#include "bf16_dot.h"

#include <cstdlib>
#include <cstring>

#include "vec.h"   // env_flag, hsum_avx2
#include "weight_prefetch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sonarspec {

namespace {

uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);   // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void round_rows_scalar(const float* x, uint16_t* xb, int64_t m, int64_t k, int64_t ldx) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; ++t) xb[i * ldx + t] = round_to_bf16(x[i * k + t]);
    std::memset(xb + i * ldx + k, 0, sizeof(uint16_t) * (ldx - k));
  }
}

[[maybe_unused]] bool fallback_forced() { return env_flag("SONARSPEC_NO_BF16_DOT"); }

}  // namespace

#if defined(__x86_64__)
SONARSPEC_INTRINSIC_WARNINGS_OFF
#define BF16_ATTR __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512bf16")))

namespace {

BF16_ATTR inline __m256 fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

BF16_ATTR inline float hsum(__m512 v512) { return hsum_avx2(fold(v512)); }

// Weight rows are prefetched (weight_prefetch.h) two groups of rows ahead into L1 (near) or
// four into L2 (far): without it the rows' loads stall the multiply-adds (on Zen 4, weights
// cycling through 16 MiB: 5 rows x 1536 x 256 in 35 us unprefetched, 20 us two groups ahead;
// from DRAM, a SmolLM2 forward took 0.7-0.8x the near time with far: docs/models.md).
template <Prefetch P, int NR>
BF16_ATTR inline void prefetch_rows(const uint16_t* w, int64_t n0, int64_t j, int64_t k, int64_t kk) {
  if constexpr (P == Prefetch::kNear) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + 2 * NR + j) * k + kk), _MM_HINT_T0);
  } else if constexpr (P == Prefetch::kFar) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (n0 + 4 * NR + j) * k + kk), _MM_HINT_T1);
  }
}

// 32 columns of k (one cache line of each weight row): MR rows of activations (row stride
// ldx) against NR rows of weights.
template <int MR, int NR>
BF16_ATTR inline void step(__m512 (&acc)[MR][NR], const uint16_t* xb, int64_t ldx, const __m512bh* wv) {
  for (int i = 0; i < MR; ++i) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + i * ldx);
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
  }
}

// Rows [m0, m0 + MR) of xb against weight rows [n0, n0 + NR), NR = 4 or 1.
template <int MR, int NR, Prefetch P>
BF16_ATTR void block(const uint16_t* xb, int64_t ldx, const uint16_t* w, float* y, int64_t m0, int64_t n0,
                     int64_t n, int64_t k) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  __m512bh wv[NR];
  int64_t kk = 0;
  for (; kk + 32 <= k; kk += 32) {
    for (int j = 0; j < NR; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + (n0 + j) * k + kk);
      prefetch_rows<P, NR>(w, n0, j, k, kk);
    }
    step<MR, NR>(acc, xb + m0 * ldx + kk, ldx, wv);
  }
  if (kk < k) {   // the last k % 32 weights; xb is zero there
    const __mmask32 mask = static_cast<__mmask32>((1ull << (k - kk)) - 1u);
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (n0 + j) * k + kk);
    step<MR, NR>(acc, xb + m0 * ldx + kk, ldx, wv);
  }
  for (int i = 0; i < MR; ++i) {
    float* out = y + (m0 + i) * n + n0;
    if constexpr (NR == 4) {
      __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(fold(acc[i][0]), fold(acc[i][1])),
                                _mm256_hadd_ps(fold(acc[i][2]), fold(acc[i][3])));
      _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
    } else {
      out[0] = hsum(acc[i][0]);
    }
  }
}

// MR <= 8 rows: up to six in one group, else four and the rest against the same weight
// rows (the second group reads them from L1).
template <int MR, Prefetch P>
BF16_ATTR void pass(const uint16_t* xb, int64_t ldx, const uint16_t* w, float* y, int64_t m0, int64_t n, int64_t k,
                    int64_t n_begin, int64_t n_end) {
  constexpr int HI = MR <= 6 ? MR : 4, LO = MR - HI;
  int64_t j = n_begin;
  for (; j + 4 <= n_end; j += 4) {
    block<HI, 4, P>(xb, ldx, w, y, m0, j, n, k);
    if constexpr (LO > 0) block<LO, 4, P>(xb, ldx, w, y, m0 + HI, j, n, k);
  }
  for (; j < n_end; ++j) {
    block<HI, 1, P>(xb, ldx, w, y, m0, j, n, k);
    if constexpr (LO > 0) block<LO, 1, P>(xb, ldx, w, y, m0 + HI, j, n, k);
  }
}

BF16_ATTR void round_rows_simd(const float* x, uint16_t* xb, int64_t m, int64_t k, int64_t ldx) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * k;
    uint16_t* out = xb + i * ldx;
    int64_t t = 0;
    for (; t + 16 <= k; t += 16) {
      const __m512i u = _mm512_loadu_si512(row + t);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, odd)), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t), _mm512_cvtepi32_epi16(r));
    }
    for (; t < k; ++t) out[t] = round_to_bf16(row[t]);
    std::memset(out + k, 0, sizeof(uint16_t) * (ldx - k));
  }
}

}  // namespace

bool bf16_dot_available() {
  // SONARSPEC_NO_BF16_DOT=1 takes the fallback (tests run it on CPUs that have the instruction).
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !fallback_forced();
  return yes;
}

void bf16_dot_rows(const uint16_t* xb, int64_t ldx, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                   int64_t n_begin, int64_t n_end) {
  with_prefetch([&](auto pf) {
    constexpr Prefetch P = decltype(pf)::value;
    for (int64_t i = 0; i < m; i += 8) {
      switch (m - i < 8 ? m - i : 8) {
        case 1: pass<1, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        case 2: pass<2, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        case 3: pass<3, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        case 4: pass<4, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        case 5: pass<5, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        case 6: pass<6, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        case 7: pass<7, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
        default: pass<8, P>(xb, ldx, w, y, i, n, k, n_begin, n_end); break;
      }
    }
  });
}

void round_rows_to_bf16(const float* x, uint16_t* xb, int64_t m, int64_t k, int64_t ldx) {
  if (bf16_dot_available()) {
    round_rows_simd(x, xb, m, k, ldx);
  } else {
    round_rows_scalar(x, xb, m, k, ldx);
  }
}

SONARSPEC_INTRINSIC_WARNINGS_ON
#else

bool bf16_dot_available() { return false; }

void bf16_dot_rows(const uint16_t*, int64_t, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t, int64_t) {}

void round_rows_to_bf16(const float* x, uint16_t* xb, int64_t m, int64_t k, int64_t ldx) {
  round_rows_scalar(x, xb, m, k, ldx);
}

#endif

}  // namespace sonarspec
