#include "sonarspec/planner.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sonarspec {

namespace {
std::string id_str(int64_t id) { return std::to_string(id); }
}  // namespace

Planner::Planner(const PlannerConfig& config) : config_(config) {
  if (config.num_pages <= 0) throw std::invalid_argument("num_pages must be positive");
  if (config.page_size <= 0) throw std::invalid_argument("page_size must be positive");
  if (config.max_num_seqs <= 0) throw std::invalid_argument("max_num_seqs must be positive");
  if (config.max_num_batched_tokens <= 0)
    throw std::invalid_argument("max_num_batched_tokens must be positive");
  free_pages_.reserve(config.num_pages);
  // Stack of free pages: page 0 is handed out first.
  for (int32_t p = config.num_pages - 1; p >= 0; --p) free_pages_.push_back(p);
  if (config.enable_prefix_caching) cache_ = std::make_unique<PrefixCache>(config.num_pages, config.page_size);
}

Planner::Seq& Planner::get(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence id " + id_str(seq_id));
  return it->second;
}

const Planner::Seq& Planner::get(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence id " + id_str(seq_id));
  return it->second;
}

int32_t Planner::pages_for(int32_t num_slots) const {
  return (num_slots + config_.page_size - 1) / config_.page_size;
}

// Lookahead slots reserved past a sequence's num_slots: never beyond max_model_len, where
// the engine drafts no further (so a sequence at the end of the context still fits).
int32_t Planner::lookahead_room(int32_t num_slots, int32_t lookahead) const {
  return std::max(0, std::min(lookahead, config_.max_model_len - num_slots));
}

void Planner::add_request(int64_t seq_id, int32_t num_tokens, const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seqs_.count(seq_id)) throw std::invalid_argument("sequence id " + id_str(seq_id) + " is already in use");
  if (num_tokens <= 0) throw std::invalid_argument("a request needs at least one token");
  if (num_tokens > config_.max_model_len)
    throw std::invalid_argument("request has " + std::to_string(num_tokens) +
                                " tokens, more than max_model_len " + std::to_string(config_.max_model_len));
  if (pages_for(num_tokens + 1) > config_.num_pages)
    throw std::invalid_argument("request needs " + std::to_string(pages_for(num_tokens + 1)) +
                                " KV pages but the pool has only " + std::to_string(config_.num_pages));
  if (!tokens.empty() && static_cast<int32_t>(tokens.size()) != num_tokens)
    throw std::invalid_argument("request has " + std::to_string(num_tokens) + " tokens but " +
                                std::to_string(tokens.size()) + " token ids were given");
  Seq seq;
  seq.num_tokens = num_tokens;
  if (cache_) {
    seq.prompt = tokens;
    seq.page_hashes = cache_->page_hashes(tokens);
  }
  seqs_.emplace(seq_id, std::move(seq));
  waiting_.push_back(seq_id);
}

void Planner::append_tokens(int64_t seq_id, int32_t num_new) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& seq = get(seq_id);
  if (num_new < 0 || num_new > config_.max_model_len - seq.num_tokens)
    throw std::invalid_argument("cannot append " + std::to_string(num_new) + " tokens to sequence " + id_str(seq_id) +
                                " of " + std::to_string(seq.num_tokens) + ": max_model_len is " +
                                std::to_string(config_.max_model_len));
  seq.num_tokens += num_new;
}

void Planner::truncate(int64_t seq_id, int32_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& seq = get(seq_id);
  if (length < 0 || length > seq.num_tokens)
    throw std::invalid_argument("cannot truncate sequence " + id_str(seq_id) + " of " +
                                std::to_string(seq.num_tokens) + " tokens to " + std::to_string(length));
  seq.num_tokens = length;
  seq.num_computed = std::min(seq.num_computed, length);
}

void Planner::commit(int64_t seq_id, int32_t num_computed) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& seq = get(seq_id);
  int32_t slots = static_cast<int32_t>(seq.pages.size()) * config_.page_size;
  if (num_computed < 0 || num_computed > seq.num_tokens || num_computed > slots)
    throw std::invalid_argument("cannot commit " + std::to_string(num_computed) + " computed tokens for sequence " +
                                id_str(seq_id) + " (" + std::to_string(seq.num_tokens) + " tokens, " +
                                std::to_string(slots) + " reserved slots)");
  seq.num_computed = num_computed;
}

void Planner::remove_from_queues(int64_t seq_id) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq_id), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq_id), waiting_.end());
}

void Planner::finish(int64_t seq_id, const std::vector<int32_t>& tokens, int32_t num_valid) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& seq = get(seq_id);
  if (num_valid > seq.num_tokens || static_cast<int64_t>(tokens.size()) > seq.num_tokens)
    throw std::invalid_argument("sequence " + id_str(seq_id) + " has " + std::to_string(seq.num_tokens) +
                                " tokens: cannot cache " + std::to_string(tokens.size()) + " tokens with " +
                                std::to_string(num_valid) + " valid");
  release(seq, tokens, num_valid);
  set_running(seq, false);
  remove_from_queues(seq_id);
  seqs_.erase(seq_id);
}

void Planner::preempt(int64_t seq_id) {
  Seq& seq = get(seq_id);
  release(seq);
  seq.num_computed = 0;
  seq.deferrals = seq.deferred_with = 0;
  set_running(seq, false);
  remove_from_queues(seq_id);
  waiting_.push_front(seq_id);
}

bool Planner::grow(Seq& seq, int32_t num_slots) {
  int32_t need = pages_for(num_slots) - static_cast<int32_t>(seq.pages.size());
  if (need <= 0) return true;
  int32_t evictable = cache_ ? cache_->num_evictable() : 0;
  if (need > static_cast<int32_t>(free_pages_.size()) + evictable) return false;
  for (int32_t i = 0; i < need; ++i) {
    if (free_pages_.empty()) {  // the least recently used cached page
      seq.pages.push_back(cache_->evict());
      continue;
    }
    seq.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
  }
  return true;
}

StepPlan Planner::schedule(int32_t lookahead) {
  std::lock_guard<std::mutex> lock(mu_);
  return schedule_locked(lookahead);
}

StepPlan Planner::schedule_locked(int32_t lookahead) {
  if (lookahead < 0) throw std::invalid_argument("lookahead must be non-negative");
  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  // Running sequences first, in admission order; preempt from the back when out of pages.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    int64_t id = running_[i];
    Seq& seq = seqs_.at(id);
    int32_t num_new = std::min(seq.num_tokens - seq.num_computed, budget);
    if (num_new <= 0) { ++i; continue; }
    bool complete = seq.num_computed + num_new == seq.num_tokens;
    int32_t slots = seq.num_computed + num_new + (complete ? lookahead_room(seq.num_computed + num_new, lookahead) : 0);
    bool ok = grow(seq, slots);
    while (!ok && running_.back() != id) {
      int64_t victim = running_.back();
      plan.preempted.push_back(victim);
      preempt(victim);
      ok = grow(seq, slots);
    }
    if (!ok) {  // nothing left to take pages from: this sequence waits
      plan.preempted.push_back(id);
      preempt(id);
      break;
    }
    plan.seqs.push_back({id, seq.num_computed, num_new});
    seq.num_computed += num_new;
    budget -= num_new;
    ++i;
  }
  // Then admit waiting sequences in arrival order while pages and budget last; none
  // after a preemption, so a sequence that just lost its pages is not re-admitted at once.
  if (!plan.preempted.empty()) return plan;
  for (auto it = waiting_.begin();
       it != waiting_.end() && budget > 0 && static_cast<int32_t>(running_.size()) < config_.max_num_seqs;) {
    int64_t id = *it;
    Seq& seq = seqs_.at(id);
    int32_t num_cached = match_prefix(seq);
    if (num_cached > seq.deferred_with) seq.deferrals = 0;  // the pages it waits for are coming
    if (worth_waiting(seq)) {  // a running sequence computes its next page: take it from the cache later
      if (num_cached) unmatch(seq);
      ++seq.deferrals;
      seq.deferred_with = num_cached;
      ++it;
      continue;
    }
    int32_t num_new = std::min(seq.num_tokens - seq.num_computed, budget);
    bool complete = seq.num_computed + num_new == seq.num_tokens;
    int32_t slots = seq.num_computed + num_new + (complete ? lookahead_room(seq.num_computed + num_new, lookahead) : 0);
    if (!grow(seq, slots)) {
      if (num_cached) unmatch(seq);
      break;
    }
    if (num_cached) plan.cached.emplace_back(id, num_cached);
    it = waiting_.erase(it);
    running_.push_back(id);
    set_running(seq, true);
    plan.seqs.push_back({id, seq.num_computed, num_new});
    seq.num_computed += num_new;
    budget -= num_new;
  }
  return plan;
}

std::vector<int32_t> Planner::page_table(int64_t seq_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return get(seq_id).pages;
}
int32_t Planner::num_computed(int64_t seq_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return get(seq_id).num_computed;
}
int32_t Planner::num_tokens(int64_t seq_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return get(seq_id).num_tokens;
}
bool Planner::has(int64_t seq_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return seqs_.count(seq_id) != 0;
}
int32_t Planner::num_free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(free_pages_.size()) + (cache_ ? cache_->num_evictable() : 0);
}
int32_t Planner::num_cached_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_ ? cache_->num_cached() : 0;
}
int32_t Planner::num_waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(waiting_.size());
}
int32_t Planner::num_running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(running_.size());
}

}  // namespace sonarspec
