// Synchronous batch planner: request queues, admission, one page table shared by
// every model of the engine (target and draft index the same page ids), page
// allocation and release, and preemption by recompute. Plain C++, no bindings.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace sonarspec {

struct PlannerConfig {
  int32_t num_pages = 0;
  int32_t page_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 2048;
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
};

class Planner {
 public:
  explicit Planner(const PlannerConfig& config);

  // Registers a request with num_tokens known tokens (the prompt). Throws
  // std::invalid_argument when the id is taken or the request can never fit.
  void add_request(int64_t seq_id, int32_t num_tokens);
  // Records num_new more known tokens (sampled) for a sequence.
  void append_tokens(int64_t seq_id, int32_t num_new);
  // Rolls a sequence back to `length` tokens; KV slots past it are reused later.
  void truncate(int64_t seq_id, int32_t length);
  // Marks the first num_computed tokens' KV as valid (after verifying draft tokens
  // written into lookahead slots). Needs num_computed <= num_tokens and reserved slots.
  void commit(int64_t seq_id, int32_t num_computed);
  // Releases a finished or aborted sequence and all its pages.
  void finish(int64_t seq_id);

  // Decides the next step. Sequences that will be fully computed after the step get
  // `lookahead` extra reserved slots (draft tokens). Advances num_computed.
  StepPlan schedule(int32_t lookahead);

  std::vector<int32_t> page_table(int64_t seq_id) const;
  int32_t num_computed(int64_t seq_id) const;
  int32_t num_tokens(int64_t seq_id) const;
  bool has(int64_t seq_id) const { return seqs_.count(seq_id) != 0; }
  int32_t num_free_pages() const { return static_cast<int32_t>(free_pages_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  const PlannerConfig& config() const { return config_; }

 private:
  struct Seq {
    int32_t num_tokens = 0;
    int32_t num_computed = 0;
    bool running = false;
    std::vector<int32_t> pages;
  };
  Seq& get(int64_t seq_id);
  const Seq& get(int64_t seq_id) const;
  int32_t pages_for(int32_t num_slots) const;
  bool grow(Seq& seq, int32_t num_slots);
  void release(Seq& seq);
  void preempt(int64_t seq_id);
  void remove_from_queues(int64_t seq_id);

  PlannerConfig config_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // admission order: the last one is preempted first
  std::vector<int32_t> free_pages_;
};

}  // namespace sonarspec
