// Batch planner: request queues, admission, one page table shared by every model of the
// engine (target and draft index the same page ids), page allocation and release,
// preemption by recompute, and optionally a prefix cache (prefix_cache.h; the planner's
// side in planner_prefix.cpp) that keeps sequences' full pages for later requests with the
// same first tokens. Every public method is thread safe (one lock); schedule_async plans on
// the planner's own worker thread (planner_async.cpp), so a caller can overlap planning
// with other work and wait for the plan only when it needs it. Plain C++, no bindings.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "sonarspec/prefix_cache.h"

namespace sonarspec {

struct PlannerConfig {
  int32_t num_pages = 0;
  int32_t page_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 2048;
  bool enable_prefix_caching = false;
};

// One sequence's share of a step: tokens [start, start + num_query_tokens) are run.
struct ScheduledSeq {
  int64_t seq_id;
  int32_t start;
  int32_t num_query_tokens;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<int64_t> preempted;  // lost their KV; will be re-prefilled from token 0
  // sequences admitted with their first tokens' KV found in the prefix cache: (seq_id,
  // tokens); their first scheduled token follows them
  std::vector<std::pair<int64_t, int32_t>> cached;
};

class Planner;

// The result of schedule_async: wait() returns the plan, or rethrows the planner's
// exception. A plan the worker has not started yet is planned by the waiting thread
// itself, so waiting never costs more than planning (no thread hand-off latency).
class PlanHandle {
 public:
  StepPlan wait();
  bool ready();

 private:
  friend class Planner;
  void set(StepPlan plan, std::exception_ptr error);
  Planner* owner_ = nullptr;
  int32_t lookahead_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  StepPlan plan_;
  std::exception_ptr error_;
};

class Planner {
 public:
  explicit Planner(const PlannerConfig& config);
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Registers a request with num_tokens known tokens (the prompt). With prefix caching,
  // `tokens` (the prompt's ids, or empty) are matched against the cache when it is admitted.
  // Throws std::invalid_argument when the id is taken or the request can never fit.
  void add_request(int64_t seq_id, int32_t num_tokens, const std::vector<int32_t>& tokens = {});
  // Records num_new more known tokens (sampled) for a sequence; throws std::invalid_argument
  // for a negative count or one that would take it past max_model_len.
  void append_tokens(int64_t seq_id, int32_t num_new);
  // Rolls a sequence back to `length` tokens; KV slots past it are reused later.
  void truncate(int64_t seq_id, int32_t length);
  // Marks the first num_computed tokens' KV as valid (after verifying draft tokens
  // written into lookahead slots). Needs num_computed <= num_tokens and reserved slots.
  void commit(int64_t seq_id, int32_t num_computed);
  // With prefix caching: caches a running sequence's full pages among the first num_valid
  // positions of `tokens` (its ids; KV valid there in every model and never written again),
  // each while the token after it is known, so requests admitted meanwhile find them. Stops
  // at a page whose tokens another page already holds (it stays the sequence's own).
  void cache_prefix(int64_t seq_id, const std::vector<int32_t>& tokens, int32_t num_valid);
  // Releases a finished or aborted sequence and all its pages. With prefix caching, its
  // full pages among the first num_valid positions of `tokens` (the sequence's ids; KV valid
  // there in every model) are cached, each while the token after it is known.
  void finish(int64_t seq_id, const std::vector<int32_t>& tokens = {}, int32_t num_valid = 0);

  // Decides the next step. Sequences that will be fully computed after the step get
  // `lookahead` extra reserved slots (draft tokens). Advances num_computed. With prefix
  // caching, a waiting sequence whose next prompt page a running sequence is computing is
  // passed over until that page is cached (at most kMaxDeferrals plans in a row in which
  // the cache gave it nothing more).
  StepPlan schedule(int32_t lookahead);
  // The same on the planner's worker thread; steps planned this way run in call order.
  std::shared_ptr<PlanHandle> schedule_async(int32_t lookahead);
  // Computes the oldest queued plan; false when none is queued.
  bool run_next_queued();

  std::vector<int32_t> page_table(int64_t seq_id) const;
  int32_t num_computed(int64_t seq_id) const;
  int32_t num_tokens(int64_t seq_id) const;
  bool has(int64_t seq_id) const;
  // Empties the prefix cache of the pages no sequence holds (they become free); pages
  // running sequences hold stay cached until released. Returns how many were freed.
  int32_t reset_prefix_cache();
  // Pages a sequence can get: free ones and cached ones no sequence holds.
  int32_t num_free_pages() const;
  int32_t num_cached_pages() const;
  int32_t num_waiting() const;
  int32_t num_running() const;
  const PlannerConfig& config() const { return config_; }

 private:
  struct Seq {
    int32_t num_tokens = 0;
    int32_t num_computed = 0;
    bool running = false;
    std::vector<int32_t> pages;
    std::vector<int32_t> prompt;  // matched against the prefix cache at admission
    // a hash per cacheable page of the prompt, chained over the pages before it: where a
    // running sequence has the same one, waiting for its pages beats computing them again
    std::vector<uint64_t> page_hashes;
    int32_t deferrals = 0;  // admissions put off so since the cache last gave it more (at most kMaxDeferrals)
    int32_t deferred_with = 0;  // tokens it found in the cache when last put off
  };
  static constexpr int32_t kMaxDeferrals = 4;
  Seq& get(int64_t seq_id);
  const Seq& get(int64_t seq_id) const;
  int32_t pages_for(int32_t num_slots) const;
  int32_t lookahead_room(int32_t num_slots, int32_t lookahead) const;
  bool grow(Seq& seq, int32_t num_slots);
  void release(Seq& seq, const std::vector<int32_t>& tokens = {}, int32_t num_valid = 0);
  void offer_pages(Seq& seq, const std::vector<int32_t>& tokens, int32_t num_valid, bool past_duplicates);
  int32_t match_prefix(Seq& seq);
  void unmatch(Seq& seq);
  bool worth_waiting(const Seq& seq) const;
  void set_running(Seq& seq, bool running);
  void preempt(int64_t seq_id);
  void remove_from_queues(int64_t seq_id);
  StepPlan schedule_locked(int32_t lookahead);
  void worker_loop();

  PlannerConfig config_;
  mutable std::mutex mu_;  // guards all planner state below
  // worker thread for schedule_async and its queue (guarded by task_mu_); exec_mu_ is
  // held from taking a plan off the queue until it is computed (lock order: exec_mu_,
  // task_mu_, mu_)
  std::mutex exec_mu_;
  std::mutex task_mu_;
  std::condition_variable task_cv_;
  std::deque<std::shared_ptr<PlanHandle>> tasks_;
  bool stopping_ = false;
  std::thread worker_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // admission order: the last one is preempted first
  std::vector<int32_t> free_pages_;
  std::unique_ptr<PrefixCache> cache_;  // null without prefix caching
  std::unordered_multiset<uint64_t> running_hashes_;  // page_hashes of the running sequences
};

}  // namespace sonarspec
