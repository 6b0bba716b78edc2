// Tree walk per request on the CPU: the target row of the current node is copied into a
// float64 work row once per visited node; rejections edit it in place.
#include <algorithm>
#include <atomic>

#include "sonarspec/rejection_sampling.h"
#include "sonarspec/thread_pool.h"

namespace sonarspec {
namespace {

bool valid_tree(const int64_t* cand, const int64_t* first, const int64_t* next, int64_t nodes, int64_t vocab) {
  for (int64_t i = 0; i < nodes; ++i) {
    if ((first[i] != -1 && (first[i] <= i || first[i] >= nodes)) ||
        (next[i] != -1 && (next[i] <= i || next[i] >= nodes)))
      return false;
    if (i > 0 && (cand[i] < 0 || cand[i] >= vocab)) return false;
  }
  return true;
}

int64_t draw(const double* w, int64_t vocab, double total, double u) {
  const double target = u * total;
  double cum = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    cum += w[i];
    if (w[i] > 0.0) last = i;
    if (cum > target) return i;
  }
  return last < 0 ? vocab - 1 : last;
}

}  // namespace

int64_t tree_speculative_sampling_cpu(const int64_t* candidates, const int64_t* first_child,
                                      const int64_t* next_sibling, const float* target_probs,
                                      const float* draft_probs, const double* uniforms, int64_t* out_tokens,
                                      int64_t* accept_index, int64_t* num_accepted, double* work, int64_t batch,
                                      int64_t nodes, int64_t vocab, int num_threads) {
  std::atomic<int64_t> bad{0};
  auto row = [&](int64_t b) {
    const int64_t *cand = candidates + b * nodes, *first = first_child + b * nodes, *next = next_sibling + b * nodes;
    int64_t *out = out_tokens + b * nodes, *path = accept_index + b * nodes;
    std::fill(out, out + nodes, -1);
    std::fill(path, path + nodes, -1);
    num_accepted[b] = 0;
    if (!valid_tree(cand, first, next, nodes, vocab)) { bad.fetch_add(1); return; }
    const double* u = uniforms + b * (nodes + 1);
    double* w = work + b * vocab;
    int64_t node = 0, tries = 0, depth = 0;
    path[0] = 0;
    while (true) {
      const float* p = target_probs + (b * nodes + node) * vocab;
      const float* q = draft_probs ? draft_probs + (b * nodes + node) * vocab : nullptr;
      double total = 0.0;
      for (int64_t i = 0; i < vocab; ++i) total += (w[i] = p[i]);
      int64_t child = first[node], accepted = -1;
      while (child != -1 && tries < nodes) {
        const int64_t x = cand[child];
        const double qx = q ? static_cast<double>(q[x]) : 1.0;
        if (u[tries++] * qx * total < w[x]) { accepted = child; break; }
        if (q) {  // w <- max(w / T - q, 0), unless that leaves nothing (p == q up to rounding)
          const double inv = 1.0 / total;
          double t = 0.0;
          for (int64_t i = 0; i < vocab; ++i) t += std::max(w[i] * inv - static_cast<double>(q[i]), 0.0);
          if (t > 0.0) {
            for (int64_t i = 0; i < vocab; ++i) w[i] = std::max(w[i] * inv - static_cast<double>(q[i]), 0.0);
            total = t;
          }
        } else if (total - w[x] > 0.0) {
          total -= w[x];
          w[x] = 0.0;
        }
        child = next[child];
      }
      if (accepted < 0) {
        out[depth] = draw(w, vocab, total, u[nodes]);
        num_accepted[b] = depth;
        return;
      }
      out[depth++] = cand[accepted];
      path[depth] = accepted;
      node = accepted;
    }
  };
  const int threads = batch * vocab >= (1 << 16) ? std::max(1, num_threads) : 1;
  parallel_items(batch, threads, row);
  return bad.load();
}

}  // namespace sonarspec
