// Processed sampling distributions; see sampling.h. Rows run in parallel.
#include "sonarspec/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sampling_filters.h"
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

#if defined(__x86_64__)
// The maximum of logits / temperature, as the scalar loop below computes it (the same
// divisions; max(x, m) keeps m for a NaN x as std::max(m, x) does); the quotients are
// stored in p unless p is null.
__attribute__((target("avx2,fma"))) float scale_max_avx2(const float* logits, float* p, int64_t vocab,
                                                         float temperature) {
  const __m256 t = _mm256_set1_ps(temperature);
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= vocab; j += 8) {
    const __m256 x = _mm256_div_ps(_mm256_loadu_ps(logits + j), t);
    if (p != nullptr) _mm256_storeu_ps(p + j, x);
    mv = _mm256_max_ps(x, mv);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  float mx = -INFINITY;
  for (float v : lanes) mx = std::max(mx, v);
  for (; j < vocab; ++j) {
    const float x = logits[j] / temperature;
    if (p != nullptr) p[j] = x;
    mx = std::max(mx, x);
  }
  return mx;
}

// p = exp(src / divisor - mx); returns the sum of the results in double precision, added
// in the order sum_as_double adds them.
__attribute__((target("avx2,fma"))) double exp_shifted_sum_avx2(const float* src, float divisor, float* p,
                                                                 int64_t vocab, float mx) {
  const __m256 m = _mm256_set1_ps(mx), d = _mm256_set1_ps(divisor);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 8 <= vocab; j += 8) {
    const __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(src + j), d), m));
    _mm256_storeu_ps(p + j, e);
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (int64_t t = j; t < vocab; ++t) p[t] = src[t] / divisor - mx;
  exp_inplace(p + j, static_cast<int>(vocab - j));
  for (; j < vocab; ++j) s += p[j];
  return s;
}
#endif

float scale_max(const float* logits, float* p, int64_t vocab, float temperature) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return scale_max_avx2(logits, p, vocab, temperature);
#endif
  float mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) {
    const float x = logits[j] / temperature;
    if (p != nullptr) p[j] = x;
    mx = std::max(mx, x);
  }
  return mx;
}

double exp_shifted_sum(const float* src, float divisor, float* p, int64_t vocab, float mx) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return exp_shifted_sum_avx2(src, divisor, p, vocab, mx);
#endif
  for (int64_t j = 0; j < vocab; ++j) p[j] = src[j] / divisor - mx;  // <= 0; -inf for removed tokens
  exp_inplace(p, static_cast<int>(vocab));
  return sum_as_double(p, vocab);
}

void one_row(const float* logits, float* p, int64_t vocab, float temperature, int64_t top_k, float top_p) {
  // with top-k the quotients are kept to filter (then divided by 1, exactly); else recomputed
  const bool filter = top_k > 0 && top_k < vocab;
  const float mx = scale_max(logits, filter ? p : nullptr, vocab, temperature);
  if (filter) {  // keep values >= the k-th largest
    const float kth = kth_largest(p, vocab, top_k);
    for (int64_t j = 0; j < vocab; ++j) {
      if (p[j] < kth) p[j] = -INFINITY;
    }
  }
  double total = filter ? exp_shifted_sum(p, 1.f, p, vocab, mx) : exp_shifted_sum(logits, temperature, p, vocab, mx);
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
