#include "sonarspec/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define SONARSPEC_PAUSE() _mm_pause()
#else
#define SONARSPEC_PAUSE() std::this_thread::yield()
#endif

namespace sonarspec {

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ensure(int num_workers) {
  while (static_cast<int>(workers_.size()) < num_workers) {
    int index = static_cast<int>(workers_.size()) + 1;  // task 0 runs on the caller
    uint64_t now = generation_.load();  // before run() publishes the next generation
    workers_.emplace_back([this, index, now] { worker(index, now); });
  }
}

void ThreadPool::worker(int index, uint64_t seen) {
  for (;;) {
    // Spin for a short while (back-to-back kernel calls), then sleep.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen; ++spin)
      SONARSPEC_PAUSE();
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    if (index < num_tasks_.load(std::memory_order_acquire)) {
      (*fn_)(index);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

void ThreadPool::run(int num_tasks, const std::function<void(int)>& fn) {
  if (num_tasks <= 1) {
    if (num_tasks == 1) fn(0);
    return;
  }
  ensure(num_tasks - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_.store(num_tasks, std::memory_order_release);
    pending_.store(num_tasks - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  fn(0);
  while (pending_.load(std::memory_order_acquire) != 0) SONARSPEC_PAUSE();
}

}  // namespace sonarspec
