// Processed sampling distributions; see sampling.h. Rows run in parallel.
#include "sonarspec/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sonarspec/thread_pool.h"
#include "vec.h"

namespace sonarspec {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) double sum_as_double_avx2(const float* p, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm_loadu_ps(p + j)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm_loadu_ps(p + j + 4)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; j < n; ++j) s += p[j];
  return s;
}
#endif

// Sum of n floats in double precision, eight running sums where the CPU has AVX2.
double sum_as_double(const float* p, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return sum_as_double_avx2(p, n);
#endif
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += p[j];
  return s;
}

// Float bits of a positive value, as an integer, grow with the value: the top bits make
// ordered buckets.
constexpr int kBucketBits = 12;
inline uint32_t bucket_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u >> (31 - kBucketBits);
}

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
  for (int64_t j = 0; j < vocab; ++j) {
    if (p[j] < tiny) {
      p[j] = 0.f;
    } else if (p[j] > 0.f) {
      sums[bucket_of(p[j])] += p[j];
    }
  }
  const double target = static_cast<double>(top_p) * total;
  double before = 0;  // mass of the buckets above the boundary one
  int64_t b = static_cast<int64_t>(sums.size()) - 1;
  for (; b > 0 && before + sums[b] < target; --b) before += sums[b];
  boundary.clear();
  for (int64_t j = 0; j < vocab; ++j) {
    if (p[j] > 0.f && static_cast<int64_t>(bucket_of(p[j])) == b) boundary.push_back(j);
  }
  std::sort(boundary.begin(), boundary.end(),
            [&](int64_t x, int64_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
  // keep boundary tokens while the mass before them is below the target (the first always)
  double kept = before;
  size_t n = 0;
  for (; n < boundary.size() && (kept < target || (n == 0 && before == 0)); ++n) kept += p[boundary[n]];
  for (size_t i = n; i < boundary.size(); ++i) p[boundary[i]] = 0.f;
  for (int64_t j = 0; j < vocab; ++j) {
    if (p[j] > 0.f && static_cast<int64_t>(bucket_of(p[j])) < b) p[j] = 0.f;
  }
  return kept;
}

void one_row(const float* logits, float* p, int64_t vocab, float temperature, int64_t top_k, float top_p) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) {
    p[j] = logits[j] / temperature;
    mx = std::max(mx, p[j]);
  }
  if (top_k > 0 && top_k < vocab) {  // keep values >= the k-th largest
    thread_local std::vector<float> tmp;
    tmp.assign(p, p + vocab);
    std::nth_element(tmp.begin(), tmp.begin() + (top_k - 1), tmp.end(), std::greater<float>());
    const float kth = tmp[top_k - 1];
    for (int64_t j = 0; j < vocab; ++j) {
      if (p[j] < kth) p[j] = -INFINITY;
    }
  }
  for (int64_t j = 0; j < vocab; ++j) p[j] -= mx;  // <= 0; -inf for removed tokens
  exp_inplace(p, static_cast<int>(vocab));
  double total = sum_as_double(p, vocab);
  if (top_p < 1.f) total = nucleus(p, vocab, total, top_p);
  const float inv = static_cast<float>(1.0 / total);
  for (int64_t j = 0; j < vocab; ++j) p[j] *= inv;
}

}  // namespace

void processed_probs_cpu(const float* logits, float* probs, int64_t rows, int64_t vocab, float temperature,
                         int64_t top_k, float top_p, int num_threads) {
  parallel_items(rows, rows > 1 ? num_threads : 1, [&](int64_t r) {
    one_row(logits + r * vocab, probs + r * vocab, vocab, temperature, top_k, top_p);
  });
}

namespace {

int64_t top_token_scalar(const float* l, int64_t vocab) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v) {  // first maximum; a NaN wins, as in torch.argmax
    if (l[v] > l[best] || (std::isnan(l[v]) && !std::isnan(l[best]))) best = v;
  }
  return best;
}

#if defined(__x86_64__)
// The same in two vector passes: the maximum (and whether any NaN is there), then the
// first index holding it (or the first NaN).
__attribute__((target("avx2,fma"))) int64_t top_token_avx2(const float* l, int64_t vocab) {
  __m256 mx = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
  int64_t v = 0;
  for (; v + 8 <= vocab; v += 8) {
    const __m256 x = _mm256_loadu_ps(l + v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, x);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float m = lanes[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, lanes[i]);
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t t = v; t < vocab; ++t) {
    nan = nan || std::isnan(l[t]);
    m = std::max(m, l[t]);
  }
  if (nan) {
    for (int64_t t = 0; t < vocab; ++t)
      if (std::isnan(l[t])) return t;
  }
  const __m256 target = _mm256_set1_ps(m);
  for (v = 0; v + 8 <= vocab; v += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + v), target, _CMP_EQ_OQ));
    if (hit) return v + __builtin_ctz(hit);
  }
  for (; v < vocab; ++v)
    if (l[v] == m) return v;
  return 0;   // not reached: m is one of the logits
}

// Adds exp(l[v] - m) for v < 8 * (vocab / 8) into lanes[v % 8]; returns where it stopped.
__attribute__((target("avx2,fma"))) int64_t exp_sum_avx2(const float* l, int64_t vocab, float m, float* lanes) {
  const __m256 mx = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t v = 0;
  for (; v + 8 <= vocab; v += 8) acc = _mm256_add_ps(acc, exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(l + v), mx)));
  _mm256_storeu_ps(lanes, acc);
  return v;
}
#endif

}  // namespace

int64_t top_token(const float* l, int64_t vocab) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return top_token_avx2(l, vocab);
#endif
  return top_token_scalar(l, vocab);
}

float token_probability(const float* l, int64_t vocab, int64_t token) {
  if (vocab <= 0 || token < 0 || token >= vocab) return 0.f;
  float m = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) {
    if (std::isnan(l[v])) return 0.f;
    m = std::max(m, l[v]);
  }
  if (!std::isfinite(m)) return 0.f;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t v = 0;
#if defined(__x86_64__)
  if (cpu_has_avx2()) v = exp_sum_avx2(l, vocab, m, lanes);
#endif
  for (; v < vocab; ++v) lanes[v % 8] += std::exp(l[v] - m);
  float sum = 0.f;
  for (float s : lanes) sum += s;
  return std::exp(l[token] - m) / sum;
}

}  // namespace sonarspec
