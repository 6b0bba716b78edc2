// Drafting with a decoder stack (a draft model, or an MTP head): the token embedding before
// the stack and the lm_head after it, natively, so a drafter's forward over a few tokens
// is one call. The same kernels as the per-op path (small_gemm for the lm_head, embedding_rows
// for the embedding), so the same logits and tokens.
#pragma once

#include <cstdint>

#include "sonarspec/decoder_stack.h"

namespace sonarspec {

// A drafter's embedding and lm_head, and where its sequences' KV lives.
struct StackIO {
  const void* embed = nullptr;  // (>= lm_rows, hidden) in embed_format (embedding.h)
  WeightFormat embed_format = WeightFormat::kF32;
  const void* lm_head = nullptr;  // (lm_rows, hidden)
  WeightFormat lm_head_format = WeightFormat::kF32;
  int64_t lm_rows = 0;
  int64_t embed_rows = 0;  // rows of embed: input tokens must lie below (>= lm_rows for chains)
  // The token of each lm_head row (lm_rows entries) when the lm_head holds only some rows
  // of the vocabulary (a draft vocabulary); null: row r is token r. Chains embed and
  // return tokens, so they map the row they pick through it.
  const int64_t* row_tokens = nullptr;
  const int64_t* block_table = nullptr;  // (batch, max_pages): row b holds sequence b's pages
  int64_t batch = 0, max_pages = 0, page_size = 0;
  int64_t window = 0;  // sliding window (0: none): keys [max(0, p + 1 - window), p + 1)
};

// Rows of tokens: row b holds lens[b] tokens (packed in `tokens`, (sum lens,)) at positions
// starts[b], starts[b] + 1, ...; features (sum lens, hidden) for MTP heads, else null.
// Runs the stack over all of them and writes the logits of each row's last token to
// out_logits (batch, lm_rows) and its stack output to out_features (batch, hidden) - with
// all_tokens, of every token: (sum lens, lm_rows) and (sum lens, hidden), in packed order
// (a target's decode and verification rows). With out_top, also the top token of each
// logits row among its first top_vocab logits (top_token: lm_head row ids, in [0, lm_rows)).
// Throws std::out_of_range for a token or position outside the tables.
void stack_rows_forward(const DecoderStackWeights& weights, const DecoderShape& shape, const StackIO& io,
                        const int64_t* tokens, const float* features, const int64_t* starts, const int64_t* lens,
                        int64_t batch, float* out_logits, float* out_features, int num_threads,
                        bool all_tokens = false, int64_t* out_top = nullptr, int64_t top_vocab = 0);

// Drawing chain tokens from the drafter's distribution instead of taking its top token:
// per sequence b, temperature[b] > 0 draws from processed_probs_cpu of the first `vocab`
// logits (top_k[b], top_p[b]) by inverse CDF with uniforms[b * steps + round] (the chain
// sampler's draw), and writes that distribution to probs (batch, steps, vocab);
// temperature[b] <= 0 takes the top token and writes its one-hot row.
struct ChainSampling {
  const float* temperature = nullptr;  // (batch,)
  const int64_t* top_k = nullptr;
  const float* top_p = nullptr;
  const double* uniforms = nullptr;    // (batch, steps)
  float* probs = nullptr;              // (batch, steps, vocab)
};

// Chain drafting: `steps` rounds of one token per sequence at positions[b] + round (input
// tokens[b] in round 0, then each round's token; an MTP head's features are features[b] in
// round 0, then its own outputs). Without `sampling` (null) the token is the first maximum
// among the first `vocab` logits, as torch.argmax (the row picked or drawn mapped through
// io.row_tokens when set; probs then stay per lm_head row). out_tokens: (batch, steps).
// With `stop`, greedy chains also score their drafts and may stop early (ChainStop).
struct ChainStop {
  // out_probs (batch, rounds): token_probability of each drafted token under the round's
  // logits (the first `vocab`); a round not run: token -1, probability 0.
  float* out_probs = nullptr;
  // The rounds stop once every sequence's draft is less likely than this: the product of
  // prior[b] (null: 1) and its tokens' probabilities so far below stop_below (0: never).
  float stop_below = 0.f;
  const float* prior = nullptr;
};
// A request's penalties on the drafter's logits (its repetition / frequency / presence
// penalty and logit bias, from its tokens before the step - not the chain's own drafts):
// for each sequence b with active[b] != 0, logit j of the first `vocab` becomes
// l * (l > 0 ? factors[b][0][j] : factors[b][1][j]) + factors[b][2][j] before its token is
// taken, drawn or scored. factors: (batch, 3, vocab).
struct DraftPenalties {
  const uint8_t* active = nullptr;  // (batch,)
  const float* factors = nullptr;
  // Sequence b's logits l (the first vocab) as penalized: l itself where b has none, else
  // scratch (vocab floats) filled with them.
  const float* apply(const float* l, int64_t b, int64_t vocab, float* scratch) const;
};

void stack_chain(const DecoderStackWeights& weights, const DecoderShape& shape, const StackIO& io, int64_t vocab,
                 const int64_t* tokens, const float* features, const int64_t* positions, int64_t batch, int64_t steps,
                 const ChainSampling* sampling, int64_t* out_tokens, int num_threads, const ChainStop* stop = nullptr,
                 const DraftPenalties* penalties = nullptr);

// A drafter's refill and its next chain in one call: stack_rows_forward over the rows
// (features as there: an MTP head's target features, else null; out_logits (batch,
// lm_rows) and out_features (batch, hidden) after each row's last token), then per row the
// top token among the first `vocab` logits (through io.row_tokens) and `steps` greedy chain rounds from it at
// position starts[b] + lens[b] (an MTP head starting from out_features[b]). out_tokens:
// (batch, 1 + steps). The same results as the two calls in turn with the top token taken
// in between; `stop` (its out_probs (batch, 1 + steps), prior unused) scores the first
// token too and counts it in each draft's probability. With `sampling` (its uniforms
// (batch, 1 + steps), probs (batch, 1 + steps, vocab); no `stop`) the first token and the
// chain's are drawn as stack_chain draws them, the first with uniforms[b * (1 + steps)].
// `penalties` change the logits every token is taken from (out_logits stay the drafter's).
void stack_refill_chain(const DecoderStackWeights& weights, const DecoderShape& shape, const StackIO& io,
                        int64_t vocab, const int64_t* tokens, const float* features, const int64_t* starts,
                        const int64_t* lens, int64_t batch, int64_t steps, float* out_logits, float* out_features,
                        int64_t* out_tokens, int num_threads, const ChainStop* stop = nullptr,
                        const ChainSampling* sampling = nullptr, const DraftPenalties* penalties = nullptr);

}  // namespace sonarspec
