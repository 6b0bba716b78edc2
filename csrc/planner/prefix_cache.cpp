#include "sonarspec/prefix_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sonarspec {

PrefixCache::PrefixCache(int32_t num_pages, int32_t page_size) : page_size_(page_size), entries_(num_pages) {
  if (num_pages <= 0 || page_size <= 0) throw std::invalid_argument("prefix cache needs pages of positive size");
}

void PrefixCache::check_page(int32_t page) const {
  if (page < 0 || page >= static_cast<int32_t>(entries_.size()))
    throw std::out_of_range("page " + std::to_string(page) + " is outside the KV pool");
}

uint64_t PrefixCache::key_hash(uint64_t parent, const int32_t* tokens) const {
  // FNV-1a over the parent id and the key's tokens; collisions are resolved by comparison
  uint64_t h = 1469598103934665603ull ^ parent;
  for (int32_t i = 0; i <= page_size_; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<uint64_t> PrefixCache::page_hashes(const std::vector<int32_t>& tokens) const {
  std::vector<uint64_t> hashes;
  uint64_t h = 0;
  for (size_t begin = 0; begin + page_size_ < tokens.size(); begin += page_size_) {
    h = key_hash(h, tokens.data() + begin);
    hashes.push_back(h);
  }
  return hashes;
}

int32_t PrefixCache::find(uint64_t parent, const int32_t* tokens) const {
  auto range = index_.equal_range(key_hash(parent, tokens));
  for (auto it = range.first; it != range.second; ++it) {
    const Entry& e = entries_[it->second];
    if (e.parent == parent && std::equal(e.tokens.begin(), e.tokens.end(), tokens)) return it->second;
  }
  return -1;
}

std::vector<int32_t> PrefixCache::match(const std::vector<int32_t>& tokens) {
  std::vector<int32_t> pages;
  uint64_t parent = 0;
  for (size_t begin = 0; begin + page_size_ < tokens.size(); begin += page_size_) {
    int32_t page = find(parent, tokens.data() + begin);
    if (page < 0) break;
    Entry& e = entries_[page];
    if (e.refs++ == 0) lru_.erase(e.lru);
    pages.push_back(page);
    parent = e.id;
  }
  return pages;
}

bool PrefixCache::cached(int32_t page) const {
  check_page(page);
  return entries_[page].id != 0;
}

uint64_t PrefixCache::entry_id(int32_t page) const {
  check_page(page);
  return entries_[page].id;
}

void PrefixCache::release(int32_t page) {
  check_page(page);
  Entry& e = entries_[page];
  if (e.id == 0 || e.refs <= 0) throw std::logic_error("released page " + std::to_string(page) + " is not held");
  if (--e.refs == 0) e.lru = lru_.insert(lru_.end(), page);
}

uint64_t PrefixCache::insert(int32_t page, uint64_t parent, const std::vector<int32_t>& tokens, size_t begin,
                             bool* duplicate) {
  check_page(page);
  if (begin + page_size_ >= tokens.size()) throw std::invalid_argument("a cached page needs the token after it");
  Entry& e = entries_[page];
  if (e.id != 0) throw std::logic_error("page " + std::to_string(page) + " is cached already");
  int32_t other = find(parent, tokens.data() + begin);
  *duplicate = other >= 0;
  if (other >= 0) return entries_[other].id;
  e.id = next_id_++;
  e.parent = parent;
  e.tokens.assign(tokens.begin() + begin, tokens.begin() + begin + page_size_ + 1);
  e.refs = 1;
  index_.emplace(key_hash(parent, e.tokens.data()), page);
  ++num_cached_;
  return e.id;
}

int32_t PrefixCache::evict() {
  if (lru_.empty()) return -1;
  int32_t page = lru_.front();
  lru_.pop_front();
  Entry& e = entries_[page];
  auto range = index_.equal_range(key_hash(e.parent, e.tokens.data()));
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == page) {
      index_.erase(it);
      break;
    }
  }
  // pages cached after this one can no longer be matched (their parent id is gone for
  // good); they stay evictable and go in their turn
  e = Entry();
  --num_cached_;
  return page;
}

std::vector<int32_t> PrefixCache::evict_all() {
  std::vector<int32_t> pages;
  for (int32_t page = evict(); page >= 0; page = evict()) pages.push_back(page);
  return pages;
}

}  // namespace sonarspec
