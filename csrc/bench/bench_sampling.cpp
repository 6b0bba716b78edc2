// Standalone microbenchmark of native chain rejection sampling on the CPU: time per call
// versus batch size B, draft length K and vocabulary V (random distributions; drafts are
// mostly rejected early, so each request reads one residual row).
//   bench_sampling [--quick] [--json PATH] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sonarspec/rejection_sampling.h"

namespace {

void normalise_rows(std::vector<float>& probs, int64_t rows, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += probs[r * vocab + i];
    for (int64_t i = 0; i < vocab; ++i) probs[r * vocab + i] = static_cast<float>(probs[r * vocab + i] / s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const sonarspec::bench::Args args = sonarspec::bench::parse_args(argc, argv, "bench_sampling");
  const bool quick = args.quick;
  const int threads = args.threads;
  std::vector<int64_t> batches = quick ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 8, 64, 256};
  std::vector<int64_t> ks = quick ? std::vector<int64_t>{4} : std::vector<int64_t>{1, 4, 7};
  std::vector<int64_t> vocabs = quick ? std::vector<int64_t>{32000} : std::vector<int64_t>{32000, 128256};
  std::mt19937 rng(0);
  std::exponential_distribution<float> ed;
  std::uniform_real_distribution<double> ud;
  std::string out = "{\"results\": [";
  for (int64_t V : vocabs)
    for (int64_t K : ks)
      for (int64_t B : batches) {
        std::vector<float> p(B * (K + 1) * V), q(B * K * V);
        for (auto& v : p) v = ed(rng);
        for (auto& v : q) v = ed(rng);
        normalise_rows(p, B * (K + 1), V);
        normalise_rows(q, B * K, V);
        std::vector<int64_t> ids(B * K), tokens(B * (K + 1)), acc(B), em(B);
        for (auto& v : ids) v = static_cast<int64_t>(rng() % V);
        std::vector<double> u(B * (K + 1));
        for (auto& v : u) v = ud(rng);
        const int reps = quick ? 5 : std::max<int>(3, static_cast<int>(2e6 / (B * V)));
        double us = sonarspec::bench::median_us([&] {
          sonarspec::chain_speculative_sampling_cpu(q.data(), ids.data(), p.data(), u.data(), tokens.data(),
                                                    acc.data(), em.data(), B, K, V, threads);
        }, reps);
        std::printf("B %4lld K %lld V %6lld: %10.1f us  (%.2f GB/s of probabilities read once)\n",
                    static_cast<long long>(B), static_cast<long long>(K), static_cast<long long>(V), us,
                    B * V * 4.0 * 2 / (us * 1e3));
        char buf[200];
        std::snprintf(buf, sizeof buf, "%s{\"batch\": %lld, \"k\": %lld, \"vocab\": %lld, \"threads\": %d, \"us\": %.2f}",
                      out.size() > 13 ? ", " : "", static_cast<long long>(B), static_cast<long long>(K),
                      static_cast<long long>(V), threads, us);
        out += buf;
      }
  out += "]}\n";
  return sonarspec::bench::write_file(args.json, out, "bench_sampling") ? 0 : 1;
}
