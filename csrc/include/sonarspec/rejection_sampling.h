// Chain rejection sampling for speculative decoding (FlashInfer's semantics), with the
// randomness passed in as float64 uniforms so that CPU, CUDA and the torch reference draw
// identically and a caller's generator (or a per-request seed) makes results reproducible.
//
// Per request b, with p_j = target_probs[b, j] and q_j = draft_probs[b, j] (a point mass
// on the drafted token when draft_probs is null):
//   draft j is accepted when uniforms[b, j] * q_j(x_j) < p_j(x_j); accepted_num counts
//   every position that passes, emitted_num is the accepted prefix length;
//   at the first rejection s the token is drawn from r = max(p_s - q_s, 0) (p_s when r
//   sums to zero), after all K from p_K (the bonus), by inverse CDF: the first index
//   whose running float64 sum exceeds uniforms[b, K] * sum(r). Sums are taken in chunks
//   (CPU) or block scans (CUDA); they equal a sequential scan's up to float64 rounding,
//   which can move a draw only when the target falls within rounding of a boundary.
// out_tokens[b] holds the accepted drafts then the drawn token, padded with -1.
// Framework free: raw pointers, row-major contiguous arrays.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SONARSPEC_HOST_DEVICE __host__ __device__
#else
#define SONARSPEC_HOST_DEVICE
#endif

namespace sonarspec {

// The acceptance tests of one request (shared by the CPU and CUDA kernels): p (K + 1, V),
// q (K, V) or null, ids (K,), u (K + 1,). Writes the accepted prefix to out, counts every
// passing position in *passed, and returns the stopping position (first rejection, or K).
SONARSPEC_HOST_DEVICE inline int64_t accept_chain(const float* p, const float* q, const int64_t* ids,
                                                  const double* u, int64_t k, int64_t vocab, int64_t* out,
                                                  int64_t* passed) {
  int64_t stop = -1;
  *passed = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t x = ids[j];
    const double px = p[j * vocab + x], qx = q ? static_cast<double>(q[j * vocab + x]) : 1.0;
    const bool ok = u[j] * qx < px;
    *passed += ok;
    if (stop < 0) {
      if (ok) out[j] = x; else stop = j;
    }
  }
  return stop < 0 ? k : stop;
}

// draft_probs (B, K, V) float or null; draft_ids (B, K) int64; target_probs (B, K + 1, V)
// float; uniforms (B, K + 1) double; out_tokens (B, K + 1), accepted_num (B,),
// emitted_num (B,) int64. Returns the number of requests with an out-of-range draft id
// (those rows are left as all -1 and zero counts).
int64_t chain_speculative_sampling_cpu(const float* draft_probs, const int64_t* draft_ids,
                                       const float* target_probs, const double* uniforms,
                                       int64_t* out_tokens, int64_t* accepted_num, int64_t* emitted_num,
                                       int64_t batch, int64_t k, int64_t vocab, int num_threads);

// The same from the target's logits (B, K + 1, V) float: each request's rows first go
// through processed_probs_cpu with its own temperature[b] (> 0), top_k[b] and top_p[b] -
// the distributions chain_speculative_sampling_cpu is then given, without the caller
// materialising them (a scratch buffer per calling thread).
int64_t chain_sampling_from_logits_cpu(const float* logits, const float* temperature, const int64_t* top_k,
                                       const float* top_p, const float* draft_probs, const int64_t* draft_ids,
                                       const double* uniforms, int64_t* out_tokens, int64_t* accepted_num,
                                       int64_t* emitted_num, int64_t batch, int64_t k, int64_t vocab, int num_threads);

// Same contract on the device; one thread block per request. Returns 0 or the launch's
// cudaError_t. Out-of-range draft ids leave the row as all -1.
int chain_speculative_sampling_cuda(const float* draft_probs, const int64_t* draft_ids,
                                    const float* target_probs, const double* uniforms, int64_t* out_tokens,
                                    int64_t* accepted_num, int64_t* emitted_num, int64_t batch, int64_t k,
                                    int64_t vocab, void* stream);

}  // namespace sonarspec

namespace sonarspec {

// Recursive rejection sampling over draft trees. Per request, N nodes with node 0 the
// root: candidates (B, N) tokens, first_child / next_sibling (B, N) links (-1: none,
// otherwise a later node), target_probs (B, N, V) float, draft_probs (B, N, V) float or
// null (children are distinct tokens chosen deterministically: point masses),
// uniforms (B, N + 1) double. Walking from the root, the t-th child tried (t = 0, 1, ...)
// uses uniforms[b, t]: with w the current unnormalised target row and T its sum, child x
// is accepted when u * q(x) * T < w(x) (point mass: u * T < w(x)); on rejection
// w <- max(w / T - q, 0) (point mass: w(x) <- 0); when no child is accepted the token is
// drawn from w by inverse CDF with uniforms[b, N]. Outputs: out_tokens (B, N) accepted
// tokens then the drawn one, padded -1; accept_index (B, N) the accepted path's nodes
// from the root, padded -1; num_accepted (B,). `work` is (B, V) double scratch.
// Returns the number of requests with invalid links or tokens (left as all -1).
int64_t tree_speculative_sampling_cpu(const int64_t* candidates, const int64_t* first_child,
                                      const int64_t* next_sibling, const float* target_probs,
                                      const float* draft_probs, const double* uniforms, int64_t* out_tokens,
                                      int64_t* accept_index, int64_t* num_accepted, double* work, int64_t batch,
                                      int64_t nodes, int64_t vocab, int num_threads);

int tree_speculative_sampling_cuda(const int64_t* candidates, const int64_t* first_child,
                                   const int64_t* next_sibling, const float* target_probs, const float* draft_probs,
                                   const double* uniforms, int64_t* out_tokens, int64_t* accept_index,
                                   int64_t* num_accepted, double* work, int64_t batch, int64_t nodes, int64_t vocab,
                                   void* stream);

}  // namespace sonarspec
