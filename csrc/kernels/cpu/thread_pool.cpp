#include "sonarspec/thread_pool.h"

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define SONARSPEC_PAUSE() _mm_pause()
#else
#define SONARSPEC_PAUSE() std::this_thread::yield()
#endif

namespace sonarspec {

namespace {
// An engine step runs Python between its native calls (up to a few hundred microseconds);
// a worker that fell asleep meanwhile takes tens of microseconds to wake, on every call.
// Past the first 50 us the worker yields between polls, so other threads that want its
// core get it (the engine runs torch's own ops single-threaded inside a step, so torch's
// OpenMP workers are not among them there).
std::atomic<int64_t> g_spin_us{1000};

// Set on pool workers and on a caller while it drains: a run() from inside a task runs inline.
thread_local bool t_in_pool = false;
}  // namespace

void ThreadPool::set_spin_us(int64_t us) { g_spin_us.store(us < 0 ? 0 : us, std::memory_order_relaxed); }
int64_t ThreadPool::spin_us() { return g_spin_us.load(std::memory_order_relaxed); }

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
    uint64_t now = generation_.load();  // before run() publishes the next generation
    workers_.emplace_back([this, now] { worker(now); });
  }
}

void ThreadPool::drain() {
  // Tasks are claimed one at a time, so a worker that is descheduled (other threads,
  // e.g. an OpenMP pool, share the cores) holds up at most the task it has claimed.
  for (int t = next_.fetch_add(1, std::memory_order_acq_rel); t < num_tasks_;
       t = next_.fetch_add(1, std::memory_order_acq_rel)) {
    try {
      (*fn_)(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker(uint64_t seen) {
  t_in_pool = true;
  for (;;) {
    // Poll for spin_us(), yielding the core between polls after the first 50 us, then sleep.
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::microseconds(spin_us());
    const auto yield_from = start + std::chrono::microseconds(50);
    for (int spin = 1; generation_.load(std::memory_order_acquire) == seen; ++spin) {
      SONARSPEC_PAUSE();
      if (spin % 64 == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= until) break;
        if (now >= yield_from) std::this_thread::yield();
      }
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
    }
    {
      // Join under the lock: run() publishes a call's fields under it and waits for
      // active workers first, so a worker never drains half-written fields. Joining a
      // call that is already done is harmless: no task is left to claim.
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      active_.fetch_add(1, std::memory_order_acq_rel);
    }
    drain();
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int num_tasks, int num_threads, const std::function<void(int)>& fn) {
  if (num_threads <= 1 || num_tasks <= 1 || t_in_pool) {
    for (int t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  ensure(num_threads - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Workers that joined an earlier call may still be leaving its drain(); none can
    // join while the lock is held, so the fields below are not read half-written.
    while (active_.load(std::memory_order_acquire) != 0) SONARSPEC_PAUSE();
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_.store(0, std::memory_order_release);
    done_.store(0, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  t_in_pool = true;
  drain();
  t_in_pool = false;
  while (done_.load(std::memory_order_acquire) != num_tasks) SONARSPEC_PAUSE();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace sonarspec
