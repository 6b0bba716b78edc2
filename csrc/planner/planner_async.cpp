// Planning ahead: schedule_async queues a plan for the planner's worker thread, and a
// caller waiting for a plan the worker has not started computes it itself, in call order.
#include <exception>
#include <memory>
#include <mutex>

#include "sonarspec/planner.h"

namespace sonarspec {

StepPlan PlanHandle::wait() {
  // Plans are queued in call order: earlier ones the worker has not started run here
  // first, so the planner sees the same sequence of steps either way.
  if (owner_) {
    while (!ready() && owner_->run_next_queued()) {
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
  return plan_;
}

bool PlanHandle::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void PlanHandle::set(StepPlan plan, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan_ = std::move(plan);
    error_ = error;
    done_ = true;
  }
  cv_.notify_all();
}

Planner::~Planner() {
  {
    std::lock_guard<std::mutex> lock(task_mu_);
    stopping_ = true;
  }
  task_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<PlanHandle> Planner::schedule_async(int32_t lookahead) {
  auto handle = std::make_shared<PlanHandle>();
  handle->owner_ = this;
  handle->lookahead_ = lookahead;
  {
    std::lock_guard<std::mutex> lock(task_mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    tasks_.push_back(handle);
  }
  task_cv_.notify_one();
  return handle;
}

// Taking a plan off the queue and computing it happen under one lock, so a plan taken
// later (by the worker or by a waiter) is never computed before an earlier one.
bool Planner::run_next_queued() {
  std::lock_guard<std::mutex> exec(exec_mu_);
  std::shared_ptr<PlanHandle> task;
  {
    std::lock_guard<std::mutex> lock(task_mu_);
    if (tasks_.empty()) return false;
    task = std::move(tasks_.front());
    tasks_.pop_front();
  }
  try {
    task->set(schedule(task->lookahead_), nullptr);
  } catch (...) {
    task->set(StepPlan{}, std::current_exception());
  }
  return true;
}

void Planner::worker_loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(task_mu_);
      task_cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, nothing left
    }
    run_next_queued();
  }
}

}  // namespace sonarspec
