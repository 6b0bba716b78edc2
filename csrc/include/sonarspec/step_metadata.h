// Per-step attention metadata for paged KV caches, built once per step and shared by all
// layers: where each new token's K/V goes, which cached slots each sequence reads, and
// which keys each query may see (causal ranges, sliding windows, draft-tree ancestor bit
// masks; a dense mask only for the SDPA path). Framework free; buffers are reused across
// steps.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace sonarspec {

constexpr int32_t kTreeMaxNodes = 64;  // one 64-bit ancestor mask per tree query

// One sequence of the packed step: queries at positions [start, start + num_query) of its
// page table. A tree row's queries see the prefix [0, tree_begin) plus the positions
// tree_begin + j for the bits j of their tree_bits entry, at RoPE positions tree_positions.
struct MetadataRow {
  int32_t start = 0;
  int32_t num_query = 0;
  const int32_t* pages = nullptr;
  int32_t num_pages = 0;
  bool tree = false;
  int32_t tree_begin = 0;
  const int64_t* tree_bits = nullptr;
  const int64_t* tree_positions = nullptr;
};

struct StepMetadata {
  int64_t batch = 0, q_max = 0, kv_max = 0, num_tokens = 0;
  bool uniform_queries = false;  // every sequence has q_max queries
  bool uniform_decode = false;   // one query each, equal lengths, no window, no tree
  bool has_tree = false;
  bool has_mask = false;
  int64_t max_pages = 0;          // pages covering the longest sequence
  std::vector<int64_t> positions, slot_mapping, output_index, token_seq, key_begin, key_end, tree_begin, tree_mask;
  std::vector<int64_t> block_table;  // (batch, max_pages) page ids covering each sequence, padded with 0
  std::vector<int64_t> query_index;  // (batch, q_max), padded with 0
  // FlashInfer's plan() layout: qo_indptr, kv_indptr (batch + 1), kv_indices (page ids,
  // concatenated), kv_last_page_len (batch)
  std::vector<int64_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  std::vector<uint8_t> mask;         // (batch, q_max, kv_max) when has_mask
};

// Fills `out`. sliding_window <= 0 means none. The dense mask is built when `want_mask`
// and the step is not a uniform decode (or has trees). Throws std::invalid_argument for
// rows whose page table is too short or whose tree block exceeds kTreeMaxNodes.
void build_step_metadata(const std::vector<MetadataRow>& rows, int32_t page_size, int32_t sliding_window,
                         bool want_mask, StepMetadata& out);

}  // namespace sonarspec
