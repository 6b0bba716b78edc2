// The filters of a sampled request's distribution (top-k and top-p), for sampling.cpp.
#pragma once

#include <cstdint>

namespace sonarspec {

// The k-th largest of p[0..n) (1 <= k <= n), the value std::nth_element finds.
float kth_largest(const float* p, int64_t n, int64_t k);

// p: unnormalised probabilities (>= 0) summing to `total`; zeroes every token outside the
// nucleus of mass top_p and returns the kept mass.
double nucleus(float* p, int64_t vocab, double total, float top_p);

}  // namespace sonarspec
