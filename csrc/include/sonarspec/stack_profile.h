// Where a native decoder stack's forward spends its time, phase by phase: off unless
// asked for (set_stack_profile), then every decoder_stack_forward adds its phases' wall
// time to a table keyed by (layers, rows) - a target's stack and an MTP head's, decode
// steps and verification blocks, apart. tools/profile_spec.py --stack-phases reads it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace sonarspec {

// The phases of a layer, in order; kOther: the stack's input projection and final norm.
enum class StackPhase : int { kNorm, kQkv, kRope, kKvStore, kAttention, kOutProj, kMlp, kOther, kCount };
constexpr int kStackPhases = static_cast<int>(StackPhase::kCount);

// The phases' names (the keys of take_stack_profile's rows in Python), in StackPhase order.
const std::array<const char*, kStackPhases>& stack_phase_names();

struct StackProfileRow {
  int64_t layers = 0, rows = 0, forwards = 0;
  std::array<double, kStackPhases> seconds{};
};

// Switches the profile on or off; either way the table is emptied.
void set_stack_profile(bool on);
bool stack_profile_on();
// The table so far, in (layers, rows) order; emptied.
std::vector<StackProfileRow> take_stack_profile();

// One forward's phase clock: mark(p) gives phase p the time since the previous mark (or
// since construction); the destructor adds the forward to the table. Reads no clock
// when the profile is off.
class StackTimer {
 public:
  StackTimer(int64_t layers, int64_t rows);
  ~StackTimer();
  StackTimer(const StackTimer&) = delete;
  StackTimer& operator=(const StackTimer&) = delete;
  void mark(StackPhase p) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    row_.seconds[static_cast<int>(p)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  bool on_;
  StackProfileRow row_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace sonarspec
