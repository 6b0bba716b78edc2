// A small persistent pool for splitting one kernel call over a few threads without
// creating threads per call. Workers spin for new work for a while (spin_us), then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sonarspec {

class ThreadPool {
 public:
  // Runs fn(task) for every task in [0, num_tasks) on the calling thread and up to
  // num_threads - 1 workers, which claim tasks one by one; returns when all are done.
  // Calls from several threads run one after another; a call made from inside a task
  // runs its tasks on that thread. An exception thrown by a task is rethrown here once
  // every task has finished (the first one, if several threw).
  void run(int num_tasks, int num_threads, const std::function<void(int)>& fn);
  ~ThreadPool();
  static ThreadPool& global();
  // How long an idle worker polls for the next call before it sleeps, microseconds.
  static void set_spin_us(int64_t us);
  static int64_t spin_us();

 private:
  void worker(uint64_t seen);
  void ensure(int num_workers);
  void drain();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;   // held for a whole run(): one call at a time
  std::mutex mu_;
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::condition_variable cv_;
  const std::function<void(int)>* fn_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  int num_tasks_ = 0;
  std::atomic<int> next_{0};
  std::atomic<int> done_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
};

// Runs item(i) for every i in [0, n): on the calling thread when threads <= 1 or n <= 1,
// else over the global pool, about four strided tasks per thread.
template <typename F>
void parallel_items(int64_t n, int threads, F&& item) {
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) item(i);
    return;
  }
  const int tasks = static_cast<int>(n < 4 * threads ? n : 4 * threads);
  ThreadPool::global().run(tasks, threads, [&](int t) {
    for (int64_t i = t; i < n; i += tasks) item(i);
  });
}

}  // namespace sonarspec
