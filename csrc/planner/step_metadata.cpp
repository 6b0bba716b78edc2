#include "sonarspec/step_metadata.h"

#include <algorithm>
#include <string>

namespace sonarspec {

void build_step_metadata(const std::vector<MetadataRow>& rows, int32_t page_size, int32_t sliding_window,
                         bool want_mask, StepMetadata& out) {
  if (page_size <= 0) throw std::invalid_argument("page_size must be positive");
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t q_max = 0, kv_max = 0, T = 0;
  bool uniform_decode = sliding_window <= 0, has_tree = false;
  for (const MetadataRow& r : rows) {
    if (r.start < 0 || r.num_query < 1) throw std::invalid_argument("metadata rows need start >= 0 and >= 1 query");
    const int64_t kv_len = static_cast<int64_t>(r.start) + r.num_query;
    if (static_cast<int64_t>(r.num_pages) * page_size < kv_len)
      throw std::invalid_argument("page table of " + std::to_string(r.num_pages) + " pages cannot hold " +
                                  std::to_string(kv_len) + " positions");
    if (r.tree && (kv_len - r.tree_begin > kTreeMaxNodes || r.tree_begin < 0 || r.tree_begin > r.start))
      throw std::invalid_argument("a tree block holds at most " + std::to_string(kTreeMaxNodes) +
                                  " positions after its begin, got " + std::to_string(kv_len - r.tree_begin));
    q_max = std::max<int64_t>(q_max, r.num_query);
    kv_max = std::max(kv_max, kv_len);
    T += r.num_query;
    has_tree |= r.tree;
    uniform_decode &= r.num_query == 1;
  }
  for (const MetadataRow& r : rows) uniform_decode &= static_cast<int64_t>(r.start) + 1 == kv_max;
  uniform_decode &= !has_tree;
  out.batch = B, out.q_max = q_max, out.kv_max = kv_max, out.num_tokens = T;
  out.has_tree = has_tree;
  out.uniform_decode = uniform_decode && B > 0;
  out.uniform_queries = true;
  for (auto* v : {&out.positions, &out.slot_mapping, &out.output_index, &out.token_seq, &out.key_begin,
                  &out.key_end, &out.tree_begin, &out.tree_mask})
    v->assign(T, 0);
  out.max_pages = (kv_max + page_size - 1) / page_size;
  out.block_table.resize(B * out.max_pages);
  out.query_index.assign(B * q_max, 0);
  out.qo_indptr.resize(B + 1);
  out.kv_indptr.resize(B + 1);
  out.kv_last_page_len.resize(B);
  out.qo_indptr[0] = out.kv_indptr[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kv_len = static_cast<int64_t>(rows[b].start) + rows[b].num_query;
    out.qo_indptr[b + 1] = out.qo_indptr[b] + rows[b].num_query;
    out.kv_indptr[b + 1] = out.kv_indptr[b] + (kv_len + page_size - 1) / page_size;
  }
  out.kv_indices.resize(out.kv_indptr[B]);
  int64_t t = 0;
  for (int64_t b = 0; b < B; ++b) {
    const MetadataRow& r = rows[b];
    out.uniform_queries &= r.num_query == q_max;
    const int64_t kv_len = static_cast<int64_t>(r.start) + r.num_query;
    const int64_t used = out.kv_indptr[b + 1] - out.kv_indptr[b];
    int64_t* table = out.block_table.data() + b * out.max_pages;
    int64_t* indices = out.kv_indices.data() + out.kv_indptr[b];
    for (int64_t i = 0; i < used; ++i) table[i] = indices[i] = r.pages[i];
    std::fill(table + used, table + out.max_pages, 0);
    out.kv_last_page_len[b] = kv_len - (used - 1) * page_size;
    for (int64_t j = 0; j < r.num_query; ++j, ++t) {
      const int64_t p = r.start + j;
      out.slot_mapping[t] = table[p / page_size] * page_size + p % page_size;
      out.query_index[b * q_max + j] = t;
      out.output_index[t] = b * q_max + j;
      out.token_seq[t] = b;
      if (r.tree) {
        out.positions[t] = r.tree_positions[j];
        out.key_end[t] = r.tree_begin;
        out.tree_begin[t] = r.tree_begin;
        out.tree_mask[t] = r.tree_bits[j];
      } else {
        out.positions[t] = p;
        out.key_end[t] = p + 1;
      }
      // sliding window: a query at position q sees prefix keys after q - window
      out.key_begin[t] = sliding_window > 0 ? std::max<int64_t>(0, out.positions[t] + 1 - sliding_window) : 0;
    }
  }
  out.has_mask = want_mask && (!out.uniform_decode || has_tree) && B > 0;
  if (!out.has_mask) {
    out.mask.clear();
    return;
  }
  out.mask.assign(B * q_max * kv_max, 0);
  for (int64_t row = 0; row < B * q_max; ++row) out.mask[row * kv_max] = 1;  // padded rows see one key
  for (int64_t i = 0; i < T; ++i) {
    uint8_t* m = out.mask.data() + out.output_index[i] * kv_max;
    m[0] = 0;
    const int64_t lo = out.key_begin[i], hi = std::min(out.key_end[i], kv_max);
    for (int64_t k = lo; k < hi; ++k) m[k] = 1;
    const uint64_t bits = static_cast<uint64_t>(out.tree_mask[i]);
    for (uint64_t rest = bits; rest; rest &= rest - 1) {
      const int64_t k = out.tree_begin[i] + __builtin_ctzll(rest);
      if (k < kv_max) m[k] = 1;
    }
  }
}

}  // namespace sonarspec
