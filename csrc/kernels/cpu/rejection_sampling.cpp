// One request per task: the acceptance test reads two probabilities per draft; only the
// stopping position is read in full, twice (residual sum, then the inverse-CDF scan).
#include "sonarspec/rejection_sampling.h"

#include <algorithm>
#include <atomic>

#include "sonarspec/thread_pool.h"

namespace sonarspec {
namespace {

// Residual mass of token i at the stopping position: max(p - q, 0), with q a point mass
// on `drafted` when there is no draft row (q == nullptr, drafted >= 0), or p itself.
inline double residual(const float* p, const float* q, int64_t drafted, int64_t i) {
  const double pi = p[i];
  if (q) return std::max(pi - static_cast<double>(q[i]), 0.0);
  return i == drafted ? 0.0 : pi;
}

int64_t sample_row(const float* p, const float* q, int64_t drafted, int64_t vocab, double u) {
  double total = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    const double r = residual(p, q, drafted, i);
    total += r;
    if (r > 0.0) last = i;
  }
  if (!(total > 0.0)) {  // p == q up to rounding: the residual is undefined, draw from p
    q = nullptr;
    drafted = -1;
    total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      total += p[i];
      if (p[i] > 0.f) last = i;
    }
  }
  const double target = u * total;
  double cum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    cum += residual(p, q, drafted, i);
    if (cum > target) return i;
  }
  return last;  // rounding left the scan short of the target
}

}  // namespace

int64_t chain_speculative_sampling_cpu(const float* draft_probs, const int64_t* draft_ids,
                                       const float* target_probs, const double* uniforms,
                                       int64_t* out_tokens, int64_t* accepted_num, int64_t* emitted_num,
                                       int64_t batch, int64_t k, int64_t vocab, int num_threads) {
  std::atomic<int64_t> bad{0};
  auto row = [&](int64_t b) {
    int64_t* out = out_tokens + b * (k + 1);
    std::fill(out, out + k + 1, -1);
    accepted_num[b] = emitted_num[b] = 0;
    const int64_t* ids = draft_ids + b * k;
    for (int64_t j = 0; j < k; ++j)
      if (ids[j] < 0 || ids[j] >= vocab) { bad.fetch_add(1); return; }
    const double* u = uniforms + b * (k + 1);
    const float* p = target_probs + b * (k + 1) * vocab;
    const float* q = draft_probs ? draft_probs + b * k * vocab : nullptr;
    int64_t stop = -1, passed = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t x = ids[j];
      const double px = p[j * vocab + x], qx = q ? static_cast<double>(q[j * vocab + x]) : 1.0;
      const bool ok = u[j] * qx < px;
      passed += ok;
      if (stop < 0) {
        if (ok) out[j] = x; else stop = j;
      }
    }
    const int64_t s = stop < 0 ? k : stop;
    const float* qs = (stop < 0 || !q) ? nullptr : q + s * vocab;
    const int64_t drafted = (stop < 0 || q) ? -1 : ids[s];
    out[s] = sample_row(p + s * vocab, qs, drafted, vocab, u[k]);
    accepted_num[b] = passed;
    emitted_num[b] = s;
  };
  const int threads = batch * (k + 2) * vocab >= (1 << 18) ? std::max(1, num_threads) : 1;
  if (threads == 1 || batch == 1) {
    for (int64_t b = 0; b < batch; ++b) row(b);
  } else {
    const int tasks = static_cast<int>(std::min<int64_t>(batch, 4 * threads));
    ThreadPool::global().run(tasks, threads, [&](int t) {
      for (int64_t b = t; b < batch; b += tasks) row(b);
    });
  }
  return bad.load();
}

}  // namespace sonarspec
