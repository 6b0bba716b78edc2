// How the CPU GEMM kernels prefetch their weight streams: chosen once per CPU and switchable
// (weight_prefetch.cpp; sonarspec/small_gemm.h has the public names). Internal to the kernels.
#pragma once

#include <type_traits>

namespace sonarspec {

// kNear: into L1, close ahead (what the kernels were first tuned with); kFar: into L2, further
// ahead (AMD Zen 4, whose weight stream otherwise waits on the dot products); kNone: the
// hardware prefetchers alone. Every mode gives the same results.
enum class Prefetch { kNear, kFar, kNone };

Prefetch weight_prefetch();

// fn(std::integral_constant<Prefetch, P>{}) for the mode in use: how a kernel picks its
// template instantiation.
template <typename Fn>
decltype(auto) with_prefetch(Fn&& fn) {
  switch (weight_prefetch()) {
    case Prefetch::kFar: return fn(std::integral_constant<Prefetch, Prefetch::kFar>{});
    case Prefetch::kNone: return fn(std::integral_constant<Prefetch, Prefetch::kNone>{});
    default: return fn(std::integral_constant<Prefetch, Prefetch::kNear>{});
  }
}

}  // namespace sonarspec
