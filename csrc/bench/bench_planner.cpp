// Standalone microbenchmark: cost of Planner::schedule for decode batches.
#include <chrono>
#include <cstdio>
#include <vector>

#include "sonarspec/planner.h"

int main() {
  using clock = std::chrono::steady_clock;
  for (int batch : {1, 8, 64, 256}) {
    sonarspec::PlannerConfig cfg;
    cfg.num_pages = 1 << 16;
    cfg.page_size = 16;
    cfg.max_num_seqs = batch;
    cfg.max_num_batched_tokens = 1 << 16;
    cfg.max_model_len = 1 << 14;
    sonarspec::Planner planner(cfg);
    for (int i = 0; i < batch; ++i) planner.add_request(i, 128);
    planner.schedule(0);
    const int steps = 2000;
    auto t0 = clock::now();
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < batch; ++i) planner.append_tokens(i, 1);
      planner.schedule(4);
    }
    double us = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / steps;
    std::printf("batch %4d: %.2f us per schedule (decode, lookahead 4)\n", batch, us);
  }
  return 0;
}
