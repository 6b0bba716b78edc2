// One request per task: the acceptance test reads two probabilities per draft; only the
// stopping position is read in full, once (chunk sums), plus one chunk for the final scan.
#include "sonarspec/rejection_sampling.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "sonarspec/sampling.h"
#include "sonarspec/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sonarspec {
namespace {

constexpr int64_t kChunk = 256;

// Residual mass of token i at the stopping position: max(p - q, 0), with q a point mass
// on `drafted` when there is no draft row (q == nullptr, drafted >= 0), or p itself.
inline double residual(const float* p, const float* q, int64_t drafted, int64_t i) {
  const double pi = p[i];
  if (q) return std::max(pi - static_cast<double>(q[i]), 0.0);
  return i == drafted ? 0.0 : pi;
}

double chunk_sum_scalar(const float* p, const float* q, int64_t drafted, int64_t b, int64_t e) {
  double s = 0.0;
  for (int64_t i = b; i < e; ++i) s += residual(p, q, drafted, i);
  return s;
}

#if defined(__x86_64__)
// Sum of the residual over [b, e) in float64, sixteen elements per step in four
// independent accumulators (the scalar loop is bound by the add latency).
__attribute__((target("avx2,fma"))) double chunk_sum_avx2(const float* p, const float* q, int64_t b, int64_t e) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  const __m256d zero = _mm256_setzero_pd();
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    for (int j = 0; j < 4; ++j) {
      __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(p + i + 4 * j));
      if (q) v = _mm256_max_pd(_mm256_sub_pd(v, _mm256_cvtps_pd(_mm_loadu_ps(q + i + 4 * j))), zero);
      acc[j] = _mm256_add_pd(acc[j], v);
    }
  }
  __m256d t = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, t);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + chunk_sum_scalar(p, q, -1, i, e);
}
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

double chunk_sum(const float* p, const float* q, int64_t drafted, int64_t b, int64_t e) {
#if defined(__x86_64__)
  static const bool avx2 = has_avx2();
  if (avx2 && !(drafted >= b && drafted < e)) return chunk_sum_avx2(p, q, b, e);
#endif
  return chunk_sum_scalar(p, q, drafted, b, e);
}

// Inverse CDF over the residual: one pass of chunk sums, then a walk over the chunk sums
// and a sequential scan inside the chunk where the running sum crosses u * total.
int64_t sample_row(const float* p, const float* q, int64_t drafted, int64_t vocab, double u,
                   std::vector<double>& sums) {
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  sums.resize(chunks);
  double total = 0.0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    total = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      sums[c] = chunk_sum(p, q, drafted, c * kChunk, std::min(vocab, (c + 1) * kChunk));
      total += sums[c];
    }
    if (total > 0.0) break;
    q = nullptr;  // p == q up to rounding: the residual is undefined, draw from p
    drafted = -1;
  }
  const double target = u * total;
  double cum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (cum + sums[c] > target) {
      for (int64_t i = c * kChunk, e = std::min(vocab, (c + 1) * kChunk); i < e; ++i) {
        cum += residual(p, q, drafted, i);
        if (cum > target) return i;
      }
      break;  // rounding: the chunk's elements summed short of its chunk sum
    }
    cum += sums[c];
  }
  for (int64_t i = vocab - 1; i >= 0; --i)  // rounding left the scan short: the last token with mass
    if (residual(p, q, drafted, i) > 0.0) return i;
  return vocab - 1;
}

}  // namespace

int64_t chain_speculative_sampling_cpu(const float* draft_probs, const int64_t* draft_ids,
                                       const float* target_probs, const double* uniforms,
                                       int64_t* out_tokens, int64_t* accepted_num, int64_t* emitted_num,
                                       int64_t batch, int64_t k, int64_t vocab, int num_threads) {
  std::atomic<int64_t> bad{0};
  auto row = [&](int64_t b) {
    thread_local std::vector<double> sums;  // chunk sums of the stopping row
    int64_t* out = out_tokens + b * (k + 1);
    std::fill(out, out + k + 1, -1);
    accepted_num[b] = emitted_num[b] = 0;
    const int64_t* ids = draft_ids + b * k;
    for (int64_t j = 0; j < k; ++j)
      if (ids[j] < 0 || ids[j] >= vocab) { bad.fetch_add(1); return; }
    const double* u = uniforms + b * (k + 1);
    const float* p = target_probs + b * (k + 1) * vocab;
    const float* q = draft_probs ? draft_probs + b * k * vocab : nullptr;
    int64_t passed = 0;
    const int64_t s = accept_chain(p, q, ids, u, k, vocab, out, &passed);
    const float* qs = (s == k || !q) ? nullptr : q + s * vocab;
    const int64_t drafted = (s == k || q) ? -1 : ids[s];
    out[s] = sample_row(p + s * vocab, qs, drafted, vocab, u[k], sums);
    accepted_num[b] = passed;
    emitted_num[b] = s;
  };
  const int threads = batch * (k + 2) * vocab >= (1 << 18) ? std::max(1, num_threads) : 1;
  parallel_items(batch, threads, row);
  return bad.load();
}

namespace {
// Scratch of the chains' processed target rows, kept per calling thread between calls up to
// kKeptScratch floats (a batch-1 step's few rows; larger batches allocate per call).
constexpr size_t kKeptScratch = size_t{1} << 21;
}  // namespace

int64_t chain_sampling_from_logits_cpu(const float* logits, const float* temperature, const int64_t* top_k,
                                       const float* top_p, const float* draft_probs, const int64_t* draft_ids,
                                       const double* uniforms, int64_t* out_tokens, int64_t* accepted_num,
                                       int64_t* emitted_num, int64_t batch, int64_t k, int64_t vocab, int num_threads) {
  const int64_t rows = batch * (k + 1);
  const size_t need = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
  thread_local std::vector<float> kept;
  std::vector<float> once;
  std::vector<float>& scratch = need <= kKeptScratch ? kept : once;
  if (scratch.size() < need) scratch.resize(need);
  float* probs = scratch.data();  // the pool's threads write through this pointer, not their own `kept`
  parallel_items(rows, rows > 1 ? num_threads : 1, [&](int64_t r) {
    const int64_t b = r / (k + 1);
    processed_probs_cpu(logits + r * vocab, probs + r * vocab, 1, vocab, temperature[b], top_k[b], top_p[b], 1);
  });
  return chain_speculative_sampling_cpu(draft_probs, draft_ids, probs, uniforms, out_tokens, accepted_num,
                                        emitted_num, batch, k, vocab, num_threads);
}

}  // namespace sonarspec
