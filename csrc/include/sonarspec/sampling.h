// The distribution a sampled request draws from, for rows of logits on the CPU (float32):
// z = logits / temperature; outside the top_k largest (ties with the k-th kept) and outside
// the smallest nucleus of probability mass >= top_p (tokens in descending order, ties by
// lower index, the first token always kept) probabilities are zero; softmax of the rest.
// top_k <= 0 or >= vocab: no top-k; top_p >= 1: no top-p. The nucleus is found without
// sorting the vocabulary: probabilities are bucketed by the top bits of their float
// representation (ordered like the values), the buckets summed from the largest down,
// and only the bucket where the mass reaches top_p is sorted (mass in float64).
// Framework free.
#pragma once

#include <cstdint>

namespace sonarspec {

void processed_probs_cpu(const float* logits, float* probs, int64_t rows, int64_t vocab, float temperature,
                         int64_t top_k, float top_p, int num_threads);

// The index of the largest of vocab logits: the first among equal maxima, a NaN counting
// as the maximum (torch.argmax's semantics).
int64_t top_token(const float* logits, int64_t vocab);

// The softmax probability of logits[token] among the first vocab logits (temperature 1):
// exp(l[token] - max) / sum_v exp(l[v] - max), the sum in float32 over 8 lanes then in
// order; 0 where a logit is NaN or the maximum is not finite. How sure a greedy drafter
// is of its pick (stack_chain's stop_below).
float token_probability(const float* logits, int64_t vocab, int64_t token);

}  // namespace sonarspec
