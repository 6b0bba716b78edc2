// 16-bit KV conversions; see kv_convert.h. bfloat16 with integer shifts (the same rounding
// as the GEMMs' activations), float16 with F16C where the CPU has it, else bit by bit.
#include "kv_convert.h"

#include <cstring>

#include "bf16_dot.h"   // round_rows_to_bf16
#include "vec.h"        // bf16_to_float

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sonarspec {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);                       // inf, NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);               // normal
  } else if (man == 0) {
    u = sign;                                                    // zero
  } else {                                                       // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

namespace {

uint16_t float_to_half(float f) {   // nearest, ties to even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;                  // rounds past 65504: inf
  if (a < 0x38800000u) {                                         // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;                           // below half the smallest subnormal
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);           // 14..24
    const uint32_t q = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    return sign | static_cast<uint16_t>(q + (rem > half || (rem == half && (q & 1u))));
  }
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);              // round the 13 dropped bits
  return sign | static_cast<uint16_t>((r - 0x38000000u) >> 13);
}

#if defined(__x86_64__)
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return yes;
}

__attribute__((target("avx2,f16c"))) void widen_half_f16c(const uint16_t* src, float* dst, int64_t d) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < d; ++i) dst[i] = half_to_float(src[i]);
}

__attribute__((target("avx2,f16c"))) void narrow_half_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

__attribute__((target("avx2"))) void widen_bf16_avx2(const uint16_t* src, float* dst, int64_t d) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
  for (; i < d; ++i) dst[i] = bf16_to_float(src[i]);
}
#endif

void widen_row(const uint16_t* src, DType dtype, float* dst, int64_t d) {
#if defined(__x86_64__)
  if (dtype == DType::kFloat16 && has_f16c()) return widen_half_f16c(src, dst, d);
  if (dtype == DType::kBFloat16 && cpu_has_avx2()) return widen_bf16_avx2(src, dst, d);
#endif
  for (int64_t i = 0; i < d; ++i) dst[i] = dtype == DType::kFloat16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
}

}  // namespace

void kv_widen_rows(const void* pool, DType dtype, const int64_t* slots, int n, int64_t row, int64_t off, int64_t d,
                   float* dst) {
  for (int c = 0; c < n; ++c) {
    if (dtype == DType::kFloat32) {
      std::memcpy(dst + c * d, static_cast<const float*>(pool) + slots[c] * row + off, sizeof(float) * d);
    } else {
      widen_row(static_cast<const uint16_t*>(pool) + slots[c] * row + off, dtype, dst + c * d, d);
    }
  }
}

void kv_narrow_row(const float* src, DType dtype, void* dst, int64_t n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else if (dtype == DType::kBFloat16) {
    round_rows_to_bf16(src, static_cast<uint16_t*>(dst), 1, n, n);
  } else {
    uint16_t* out = static_cast<uint16_t*>(dst);
#if defined(__x86_64__)
    if (has_f16c()) return narrow_half_f16c(src, out, n);
#endif
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(src[i]);
  }
}

}  // namespace sonarspec
