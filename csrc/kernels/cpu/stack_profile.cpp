// The native decoder stack's phase profile (stack_profile.h).
#include "sonarspec/stack_profile.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace sonarspec {
namespace {

std::atomic<bool> g_on{false};
std::mutex g_mu;
std::map<std::pair<int64_t, int64_t>, StackProfileRow> g_table;   // (layers, rows) -> sums

}  // namespace

const std::array<const char*, kStackPhases>& stack_phase_names() {
  static const std::array<const char*, kStackPhases> names = {
      "norm", "qkv", "rope", "kv_store", "attention", "o_proj", "mlp", "other"};
  return names;
}

void set_stack_profile(bool on) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_table.clear();
  g_on.store(on, std::memory_order_relaxed);
}

bool stack_profile_on() { return g_on.load(std::memory_order_relaxed); }

std::vector<StackProfileRow> take_stack_profile() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<StackProfileRow> rows;
  rows.reserve(g_table.size());
  for (const auto& kv : g_table) rows.push_back(kv.second);
  g_table.clear();
  return rows;
}

StackTimer::StackTimer(int64_t layers, int64_t rows) : on_(stack_profile_on()) {
  if (!on_) return;
  row_.layers = layers;
  row_.rows = rows;
  row_.forwards = 1;
  last_ = std::chrono::steady_clock::now();
}

StackTimer::~StackTimer() {
  if (!on_) return;
  std::lock_guard<std::mutex> lock(g_mu);
  StackProfileRow& sum = g_table[{row_.layers, row_.rows}];
  sum.layers = row_.layers;
  sum.rows = row_.rows;
  sum.forwards += row_.forwards;
  for (int p = 0; p < kStackPhases; ++p) sum.seconds[p] += row_.seconds[p];
}

}  // namespace sonarspec
