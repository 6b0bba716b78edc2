// Splitting a GEMM's output columns over the thread pool. Internal to the CPU GEMMs.
#pragma once

#include <algorithm>
#include <cstdint>

#include "sonarspec/thread_pool.h"

namespace sonarspec {

// Runs cols(n_begin, n_end) over column ranges of an (m, n, k) GEMM with `weight_bytes`
// per weight. A thread per kMinWork multiply-adds at least (waking a worker costs about
// as much as a few thousand of them), tasks of at least 64 KiB of weights, up to four per
// thread, as many as keep the threads evenly loaded (workers claim tasks one by one, so
// the busiest thread runs ceil(tasks / threads) of them); small problems stay on the
// calling thread. Ranges start at multiples of `align` (the kernel's column block), so no
// column's arithmetic depends on the thread count.
template <typename F>
void split_columns(int64_t m, int64_t n, int64_t k, int64_t weight_bytes, int num_threads, F&& cols,
                   int64_t align = 4) {
  constexpr int64_t kMinWork = int64_t{1} << 16;
  int64_t threads = std::max<int64_t>(1, std::min<int64_t>(num_threads, m * n * k / kMinWork));
  if (threads == 1) {
    cols(int64_t{0}, n);
    return;
  }
  const int64_t blocks = (n + align - 1) / align;
  const int64_t min_blocks = std::max<int64_t>(1, ((64 * 1024) / (k * weight_bytes) + align - 1) / align);
  int64_t chunk = blocks, busiest = blocks + 1;
  for (int64_t per_thread = 4; per_thread >= 1; --per_thread) {
    const int64_t c = std::max(min_blocks, (blocks + per_thread * threads - 1) / (per_thread * threads));
    const int64_t tasks = (blocks + c - 1) / c, load = (tasks + threads - 1) / threads * c;
    if (load < busiest) {
      busiest = load;
      chunk = c;
    }
  }
  chunk *= align;
  const int num_tasks = static_cast<int>((n + chunk - 1) / chunk);
  if (num_tasks == 1) {
    cols(int64_t{0}, n);
    return;
  }
  ThreadPool::global().run(num_tasks, static_cast<int>(threads), [&](int t) {
    int64_t b = t * chunk, e = std::min(n, b + chunk);
    cols(b, e);
  });
}

}  // namespace sonarspec
