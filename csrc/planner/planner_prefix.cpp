// The planner's side of prefix caching (prefix_cache.h holds the cache itself): pages
// released into the cache or freed, running sequences' full pages offered to it, waiting
// sequences matched against it - or passed over while a running sequence computes the
// page they would find there.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "sonarspec/planner.h"

namespace sonarspec {

// Caches the sequence's own pages that continue an unbroken run of cached pages from its
// first one and hold valid KV (page i: positions below num_valid, and the token after it
// known). A page whose key another page holds stays the sequence's own; with
// past_duplicates the run goes on under that other page, else it ends there.
void Planner::offer_pages(Seq& seq, const std::vector<int32_t>& tokens, int32_t num_valid, bool past_duplicates) {
  uint64_t parent = 0;
  const size_t ps = static_cast<size_t>(config_.page_size);
  for (size_t i = 0; i < seq.pages.size(); ++i) {
    int32_t page = seq.pages[i];
    if (cache_->cached(page)) {
      parent = cache_->entry_id(page);
      continue;
    }
    size_t end = (i + 1) * ps;
    if (end > static_cast<size_t>(std::max(num_valid, 0)) || end >= tokens.size()) return;
    bool duplicate = false;
    parent = cache_->insert(page, parent, tokens, i * ps, &duplicate);
    if (duplicate && !past_duplicates) return;
  }
}

// With prefix caching the sequence's valid pages are offered to the cache first (past
// pages another holds: the sequence gives its own up anyway); then every cached page of
// the sequence loses its reference, the last page first - a prefix's tail is evicted before
// the pages it continues - and the others are freed.
void Planner::release(Seq& seq, const std::vector<int32_t>& tokens, int32_t num_valid) {
  std::vector<int32_t> freed, held;
  if (cache_) offer_pages(seq, tokens, num_valid, true);
  for (int32_t page : seq.pages) (cache_ && cache_->cached(page) ? held : freed).push_back(page);
  for (auto it = held.rbegin(); it != held.rend(); ++it) cache_->release(*it);
  free_pages_.insert(free_pages_.end(), freed.rbegin(), freed.rend());
  seq.pages.clear();
}

void Planner::cache_prefix(int64_t seq_id, const std::vector<int32_t>& tokens, int32_t num_valid) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& seq = get(seq_id);
  if (static_cast<int64_t>(tokens.size()) > seq.num_tokens)
    throw std::invalid_argument("sequence " + std::to_string(seq_id) + " has " + std::to_string(seq.num_tokens) +
                                " tokens: cannot cache " + std::to_string(tokens.size()));
  // never past what the planner has computed (a sequence preempted since its caller's step
  // has nothing left to cache)
  if (cache_) offer_pages(seq, tokens, std::min(num_valid, seq.num_computed), false);
}

// Takes the cached pages matching a waiting sequence's prompt; returns the tokens they hold.
int32_t Planner::match_prefix(Seq& seq) {
  if (!cache_ || !seq.pages.empty() || seq.num_computed != 0) return 0;
  seq.pages = cache_->match(seq.prompt);
  seq.num_computed = static_cast<int32_t>(seq.pages.size()) * config_.page_size;
  return seq.num_computed;
}

// A waiting sequence not admitted after all gives its matched pages back to the cache until
// it is.
void Planner::unmatch(Seq& seq) {
  release(seq);
  seq.num_computed = 0;
}

int32_t Planner::reset_prefix_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!cache_) return 0;
  std::vector<int32_t> pages = cache_->evict_all();
  free_pages_.insert(free_pages_.end(), pages.rbegin(), pages.rend());
  return static_cast<int32_t>(pages.size());
}

bool Planner::worth_waiting(const Seq& seq) const {
  if (!cache_ || seq.deferrals >= kMaxDeferrals) return false;
  size_t next = static_cast<size_t>(seq.num_computed / config_.page_size);  // its first page not found
  return next < seq.page_hashes.size() && running_hashes_.count(seq.page_hashes[next]) != 0;
}

void Planner::set_running(Seq& seq, bool running) {
  if (seq.running == running) return;
  seq.running = running;
  for (uint64_t h : seq.page_hashes) {
    if (running) {
      running_hashes_.insert(h);
    } else if (auto it = running_hashes_.find(h); it != running_hashes_.end()) {
      running_hashes_.erase(it);
    }
  }
}

}  // namespace sonarspec
