// Prefix cache: KV pages kept after their sequence is done with them, found again by the
// tokens they hold, so a request that begins with the same tokens (a chat's earlier turns,
// a shared system prompt) reuses them instead of recomputing them.
//
// A cached page is keyed by its parent (the cached page before it in the sequence, or the
// root) and by its page_size tokens plus the token after them: drafters' KV at a page's
// last position can depend on the next token (an MTP head reads (h_i, t_{i+1})). Keys are
// compared token for token, so a hash collision never shares a page. Each cached page
// counts the sequences holding it; at zero it is evictable, least recently released first.
// Not thread safe: the planner calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace sonarspec {

class PrefixCache {
 public:
  PrefixCache(int32_t num_pages, int32_t page_size);

  // The longest run of cached pages covering tokens' first pages, each with a reference
  // taken. A page matches only when the token after it is in `tokens` too.
  std::vector<int32_t> match(const std::vector<int32_t>& tokens);
  // Whether `page` is cached (its KV holds the tokens of its key).
  bool cached(int32_t page) const;
  // The id of a cached page's entry (the parent of the page after it).
  uint64_t entry_id(int32_t page) const;
  // Drops a reference to a cached page; at zero it becomes evictable.
  void release(int32_t page);
  // Caches an uncached page holding tokens[begin, begin + page_size] after `parent` (0: the
  // root), with one reference (its sequence's, to release). Returns the entry id of that key;
  // when another page already holds it, that page's id, and `page` is not cached
  // (*duplicate is set: free it).
  uint64_t insert(int32_t page, uint64_t parent, const std::vector<int32_t>& tokens, std::size_t begin, bool* duplicate);
  // Uncaches the least recently released evictable page and returns it; -1 when none.
  int32_t evict();
  // Uncaches every evictable page; returns them.
  std::vector<int32_t> evict_all();

  // Hashes of tokens' cacheable pages, each chained over the ones before it (a page needs
  // the token after it): equal hashes mean, almost surely, equal keys.
  std::vector<uint64_t> page_hashes(const std::vector<int32_t>& tokens) const;

  int32_t num_evictable() const { return static_cast<int32_t>(lru_.size()); }
  int32_t num_cached() const { return num_cached_; }

 private:
  struct Entry {
    uint64_t id = 0;  // 0: the page is not cached
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // page_size + 1
    int32_t refs = 0;
    std::list<int32_t>::iterator lru;  // valid while refs == 0
  };
  uint64_t key_hash(uint64_t parent, const int32_t* tokens) const;
  int32_t find(uint64_t parent, const int32_t* tokens) const;
  void check_page(int32_t page) const;

  int32_t page_size_;
  int32_t num_cached_ = 0;
  uint64_t next_id_ = 1;
  std::vector<Entry> entries_;  // by page id
  std::unordered_multimap<uint64_t, int32_t> index_;  // key hash -> cached page
  std::list<int32_t> lru_;  // evictable pages, least recently released first
};

}  // namespace sonarspec
