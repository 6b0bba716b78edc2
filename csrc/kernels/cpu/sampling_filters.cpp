// Top-k and top-p for sampling.cpp's processed distributions: thresholds found from the
// float bits (ordered buckets) and block maxima, with AVX2 where the CPU has it.
#include "sampling_filters.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "vec.h"

namespace sonarspec {
namespace {

// Float bits of a positive value, as an integer, grow with the value: the top bits make
// ordered buckets.
constexpr int kBucketBits = 12;
inline uint32_t bucket_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u >> (31 - kBucketBits);
}

#if defined(__x86_64__)
// nucleus's three passes over the row with AVX2, in the same order and arithmetic: the
// tokens at or above tiny added to their buckets in index order, the boundary bucket's
// tokens gathered in index order, the buckets below it zeroed (bucket tests on the float
// bits, which order non-negative floats).
__attribute__((target("avx2,fma"))) void nucleus_histogram_avx2(float* p, int64_t vocab, float tiny,
                                                                 std::vector<double>& sums) {
  const __m256 t = _mm256_set1_ps(tiny), zero = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= vocab; j += 8) {
    const __m256 x = _mm256_loadu_ps(p + j);
    const __m256 below = _mm256_cmp_ps(x, t, _CMP_LT_OQ);
    _mm256_storeu_ps(p + j, _mm256_blendv_ps(x, zero, below));
    int kept = _mm256_movemask_ps(_mm256_andnot_ps(below, _mm256_cmp_ps(x, zero, _CMP_GT_OQ)));
    for (; kept != 0; kept &= kept - 1) {
      const float v = p[j + __builtin_ctz(kept)];
      sums[bucket_of(v)] += v;
    }
  }
  for (; j < vocab; ++j) {
    if (p[j] < tiny) {
      p[j] = 0.f;
    } else if (p[j] > 0.f) {
      sums[bucket_of(p[j])] += p[j];
    }
  }
}

__attribute__((target("avx2,fma"))) void nucleus_gather_avx2(const float* p, int64_t vocab, int64_t b,
                                                              std::vector<int64_t>& boundary) {
  const __m256i bv = _mm256_set1_epi32(static_cast<int32_t>(b));
  const __m256 zero = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= vocab; j += 8) {
    const __m256 x = _mm256_loadu_ps(p + j);
    const __m256i in = _mm256_cmpeq_epi32(_mm256_srli_epi32(_mm256_castps_si256(x), 31 - kBucketBits), bv);
    int hits = _mm256_movemask_ps(_mm256_and_ps(_mm256_castsi256_ps(in), _mm256_cmp_ps(x, zero, _CMP_GT_OQ)));
    for (; hits != 0; hits &= hits - 1) boundary.push_back(j + __builtin_ctz(hits));
  }
  for (; j < vocab; ++j) {
    if (p[j] > 0.f && static_cast<int64_t>(bucket_of(p[j])) == b) boundary.push_back(j);
  }
}

__attribute__((target("avx2,fma"))) void nucleus_zero_below_avx2(float* p, int64_t vocab, int64_t b) {
  const __m256i bv = _mm256_set1_epi32(static_cast<int32_t>(b));
  int64_t j = 0;
  for (; j + 8 <= vocab; j += 8) {
    const __m256 x = _mm256_loadu_ps(p + j);
    const __m256i below = _mm256_cmpgt_epi32(bv, _mm256_srli_epi32(_mm256_castps_si256(x), 31 - kBucketBits));
    _mm256_storeu_ps(p + j, _mm256_andnot_ps(_mm256_castsi256_ps(below), x));
  }
  for (; j < vocab; ++j) {
    if (p[j] > 0.f && static_cast<int64_t>(bucket_of(p[j])) < b) p[j] = 0.f;
  }
}
#endif

// nucleus's passes, with AVX2 where the CPU has it.
void nucleus_histogram(float* p, int64_t vocab, float tiny, std::vector<double>& sums) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return nucleus_histogram_avx2(p, vocab, tiny, sums);
#endif
  for (int64_t j = 0; j < vocab; ++j) {
    if (p[j] < tiny) {
      p[j] = 0.f;
    } else if (p[j] > 0.f) {
      sums[bucket_of(p[j])] += p[j];
    }
  }
}

void nucleus_gather(const float* p, int64_t vocab, int64_t b, std::vector<int64_t>& boundary) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return nucleus_gather_avx2(p, vocab, b, boundary);
#endif
  for (int64_t j = 0; j < vocab; ++j) {
    if (p[j] > 0.f && static_cast<int64_t>(bucket_of(p[j])) == b) boundary.push_back(j);
  }
}

void nucleus_zero_below(float* p, int64_t vocab, int64_t b) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return nucleus_zero_below_avx2(p, vocab, b);
#endif
  for (int64_t j = 0; j < vocab; ++j) {
    if (p[j] > 0.f && static_cast<int64_t>(bucket_of(p[j])) < b) p[j] = 0.f;
  }
}

// An order-preserving key of a float's bits: a larger float has a larger key.
inline uint32_t order_key(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k-th largest of p[0..n) (1 <= k <= n), the value std::nth_element finds. Here the
// top bits of the keys make ordered buckets (counted in four interleaved histograms, so that
// runs of one bucket do not wait on each other's increments); only the bucket holding the
// k-th largest is selected from.
float kth_largest_histogram(const float* p, int64_t n, int64_t k) {
  constexpr int kKeyBits = 12, kBuckets = 1 << kKeyBits;
  thread_local std::vector<int32_t> counts;
  thread_local std::vector<float> bucket;
  counts.assign(4 * kBuckets, 0);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (int h = 0; h < 4; ++h) ++counts[h * kBuckets + (order_key(p[j + h]) >> (32 - kKeyBits))];
  }
  for (; j < n; ++j) ++counts[order_key(p[j]) >> (32 - kKeyBits)];
  int64_t above = 0;  // values in the buckets above b
  int64_t b = kBuckets - 1;
  auto count = [&](int64_t i) {
    return int64_t{counts[i]} + counts[kBuckets + i] + counts[2 * kBuckets + i] + counts[3 * kBuckets + i];
  };
  for (; b > 0 && above + count(b) < k; --b) above += count(b);
  bucket.clear();
  for (j = 0; j < n; ++j) {
    if (static_cast<int64_t>(order_key(p[j]) >> (32 - kKeyBits)) == b) bucket.push_back(p[j]);
  }
  const int64_t r = std::min<int64_t>(k - above, static_cast<int64_t>(bucket.size())) - 1;
  std::nth_element(bucket.begin(), bucket.begin() + r, bucket.end(), std::greater<float>());
  return bucket[r];
}

#if defined(__x86_64__)
// The k-th largest through block maxima, for k up to the number of 32-value blocks: the
// k-th largest of the maxima, tau, is at most the k-th largest value (k values reach it),
// so the values >= tau hold the k largest and the k-th of them is the answer. false where
// a NaN or too few candidates leave it to the histogram.
__attribute__((target("avx2,fma"))) bool kth_largest_blocks_avx2(const float* p, int64_t n, int64_t k,
                                                                  float* kth) {
  const int64_t blocks = n / 32;
  if (k > blocks) return false;
  thread_local std::vector<float> maxima, candidates;
  maxima.resize(static_cast<size_t>(blocks));
  __m256 unordered = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const float* q = p + 32 * b;
    const __m256 x0 = _mm256_loadu_ps(q), x1 = _mm256_loadu_ps(q + 8);
    const __m256 x2 = _mm256_loadu_ps(q + 16), x3 = _mm256_loadu_ps(q + 24);
    unordered = _mm256_or_ps(unordered, _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(x0, x0, _CMP_UNORD_Q),
                                                                  _mm256_cmp_ps(x1, x1, _CMP_UNORD_Q)),
                                                    _mm256_or_ps(_mm256_cmp_ps(x2, x2, _CMP_UNORD_Q),
                                                                 _mm256_cmp_ps(x3, x3, _CMP_UNORD_Q))));
    const __m256 m = _mm256_max_ps(_mm256_max_ps(x0, x1), _mm256_max_ps(x2, x3));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    maxima[static_cast<size_t>(b)] = _mm_cvtss_f32(h);
  }
  if (_mm256_movemask_ps(unordered) != 0) return false;
  for (int64_t j = 32 * blocks; j < n; ++j) {
    if (std::isnan(p[j])) return false;
  }
  std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<float>());
  const float tau = maxima[static_cast<size_t>(k - 1)];
  const __m256 t = _mm256_set1_ps(tau);
  candidates.clear();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + j), t, _CMP_GE_OQ));
    for (; hits != 0; hits &= hits - 1) candidates.push_back(p[j + __builtin_ctz(hits)]);
  }
  for (; j < n; ++j) {
    if (p[j] >= tau) candidates.push_back(p[j]);
  }
  if (static_cast<int64_t>(candidates.size()) < k) return false;
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(), std::greater<float>());
  *kth = candidates[static_cast<size_t>(k - 1)];
  return true;
}
#endif

}  // namespace

// p: unnormalised probabilities (>= 0) summing to `total`; zeroes every token outside the
// nucleus and returns the kept mass. Buckets of the float bits are walked from the largest
// values down until the mass reaches top_p; only the bucket where it does is sorted.
double nucleus(float* p, int64_t vocab, double total, float top_p) {
  thread_local std::vector<double> sums;
  thread_local std::vector<int64_t> boundary;
  sums.assign(size_t{1} << kBucketBits, 0.0);
  // A token below tiny is outside the nucleus: all tokens not above it weigh less than
  // vocab * tiny = (1 - top_p) * total / 2, so the larger ones already exceed top_p * total
  // (by a margin far beyond rounding). Zeroing them first leaves the buckets the walk below
  // visits, and so the result, unchanged, and spares the histogram most of a flat tail.
  const float tiny = static_cast<float>(0.5 * (1.0 - static_cast<double>(top_p)) * total / static_cast<double>(vocab));
  nucleus_histogram(p, vocab, tiny, sums);
  const double target = static_cast<double>(top_p) * total;
  double before = 0;  // mass of the buckets above the boundary one
  int64_t b = static_cast<int64_t>(sums.size()) - 1;
  for (; b > 0 && before + sums[b] < target; --b) before += sums[b];
  boundary.clear();
  nucleus_gather(p, vocab, b, boundary);
  std::sort(boundary.begin(), boundary.end(),
            [&](int64_t x, int64_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
  // keep boundary tokens while the mass before them is below the target (the first always)
  double kept = before;
  size_t n = 0;
  for (; n < boundary.size() && (kept < target || (n == 0 && before == 0)); ++n) kept += p[boundary[n]];
  for (size_t i = n; i < boundary.size(); ++i) p[boundary[i]] = 0.f;
  nucleus_zero_below(p, vocab, b);
  return kept;
}

float kth_largest(const float* p, int64_t n, int64_t k) {
#if defined(__x86_64__)
  float kth;
  if (cpu_has_avx2() && kth_largest_blocks_avx2(p, n, k, &kth)) return kth;
#endif
  return kth_largest_histogram(p, n, k);
}

}  // namespace sonarspec
