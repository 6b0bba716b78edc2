// The weight prefetch mode of the CPU GEMMs (weight_prefetch.h).
#include "weight_prefetch.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "sonarspec/small_gemm.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace sonarspec {
namespace {

Prefetch prefetch_named(const std::string& mode) {
  if (mode == "near") return Prefetch::kNear;
  if (mode == "far") return Prefetch::kFar;
  if (mode == "none") return Prefetch::kNone;
  throw std::invalid_argument("weight prefetch: '" + mode + "' is not one of near, far, none");
}

// AMD Zen 4 (family 25 with AVX-512) streams the weights faster prefetching them into L2
// from further ahead (docs/quantization.md and docs/models.md have the measurements).
Prefetch prefetch_here() {
  Prefetch p = Prefetch::kNear;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__builtin_cpu_is("amd") && __get_cpuid(1, &a, &b, &c, &d)) {
    const unsigned family = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
    if (family == 25 && __builtin_cpu_supports("avx512f")) p = Prefetch::kFar;
  }
#endif
  const char* env = std::getenv("SONARSPEC_WEIGHT_PREFETCH");
  return env != nullptr ? prefetch_named(env) : p;
}

std::atomic<int> g_prefetch{-1};   // a Prefetch once chosen

}  // namespace

Prefetch weight_prefetch() {
  int p = g_prefetch.load(std::memory_order_relaxed);
  if (p < 0) {
    p = static_cast<int>(prefetch_here());
    g_prefetch.store(p, std::memory_order_relaxed);
  }
  return static_cast<Prefetch>(p);
}

const char* weight_prefetch_mode() {
  static const char* const names[] = {"near", "far", "none"};
  return names[static_cast<int>(weight_prefetch())];
}

void set_weight_prefetch(const std::string& mode) {
  g_prefetch.store(static_cast<int>(prefetch_named(mode)), std::memory_order_relaxed);
}

}  // namespace sonarspec
