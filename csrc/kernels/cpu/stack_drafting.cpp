// Drafter forwards and greedy chains around a decoder stack; see stack_drafting.h.
#include "sonarspec/stack_drafting.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "sonarspec/embedding.h"
#include "sonarspec/rejection_sampling.h"
#include "sonarspec/sampling.h"
#include "sonarspec/small_gemm.h"
#include "vec.h"

namespace sonarspec {
namespace {

// p + i, refused where it would pass int64's range.
int64_t offset(int64_t p, int64_t i) {
  int64_t out;
  if (__builtin_add_overflow(p, i, &out)) {
    throw std::out_of_range("position " + std::to_string(p) + " + " + std::to_string(i) + " overflows int64");
  }
  return out;
}

// The inputs of one stack call over `m` tokens: embedding rows and attention metadata
// (token t of row seq[t] at position pos[t]).
struct Step {
  std::vector<float> x;
  std::vector<int64_t> pos, slots, seq, key_begin, key_end;
  StepAttention attn;
  int64_t pool_pages;   // pages of page_size slots in the KV pools

  Step(const StackIO& io, const DecoderShape& s, int64_t m)
      : x(static_cast<size_t>(m * s.hidden)), pos(m), slots(m), seq(m), key_begin(m), key_end(m),
        pool_pages(s.num_slots / io.page_size) {
    attn.slot_mapping = slots.data();
    attn.block_table = io.block_table;
    attn.batch = io.batch;
    attn.max_pages = io.max_pages;
    attn.page_size = io.page_size;
    attn.token_seq = seq.data();
    attn.key_begin = key_begin.data();
    attn.key_end = key_end.data();
  }

  void set(const StackIO& io, int64_t hidden, int64_t t, int64_t row, int64_t p, int64_t token) {
    const int64_t page = p / io.page_size;
    if (p < 0 || page >= io.max_pages) {
      throw std::out_of_range("position " + std::to_string(p) + " is outside the block table");
    }
    const int64_t page_id = io.block_table[row * io.max_pages + page];
    if (page_id < 0 || page_id >= pool_pages) {   // also keeps page_id * page_size in range
      throw std::out_of_range("row " + std::to_string(row) + "'s page " + std::to_string(page_id) + " (position " +
                              std::to_string(p) + ") is not one of the KV pools' " + std::to_string(pool_pages));
    }
    pos[t] = p;
    seq[t] = row;
    slots[t] = page_id * io.page_size + p % io.page_size;
    key_begin[t] = io.window > 0 ? std::max<int64_t>(0, p + 1 - io.window) : 0;
    key_end[t] = p + 1;
    embedding_row(io.embed, io.embed_format, io.embed_rows, hidden, token, x.data() + t * hidden);
  }

  // The stack over the step's tokens; refused where a key it read lay on a page outside
  // the pools (the stack leaves such rows without attention and counts them).
  void forward(const DecoderStackWeights& w, const DecoderShape& s, const float* features, int64_t m, float* out,
               int num_threads) {
    const int64_t bad = decoder_stack_forward(w, s, x.data(), features, m, pos.data(), attn, out, num_threads);
    if (bad != 0) {
      throw std::out_of_range("drafting: " + std::to_string(bad) + " token-layers read keys outside the KV pools "
                              "(block table page ids out of range)");
    }
  }
};

// The token of lm_head row `row`.
int64_t row_token(const StackIO& io, int64_t row) { return io.row_tokens != nullptr ? io.row_tokens[row] : row; }

void lm_head(const StackIO& io, const float* h, float* logits, int64_t rows, int64_t hidden, int num_threads) {
  small_gemm_any(h, io.lm_head, io.lm_head_format, nullptr, logits, rows, io.lm_rows, hidden, num_threads);
}

}  // namespace

void stack_rows_forward(const DecoderStackWeights& w, const DecoderShape& s, const StackIO& io, const int64_t* tokens,
                        const float* features, const int64_t* starts, const int64_t* lens, int64_t batch,
                        float* out_logits, float* out_features, int num_threads, bool all_tokens, int64_t* out_top,
                        int64_t top_vocab) {
  if (out_top != nullptr && (top_vocab < 1 || top_vocab > io.lm_rows)) {
    throw std::out_of_range("top_vocab " + std::to_string(top_vocab) + " is outside [1, " +
                            std::to_string(io.lm_rows) + "] (the lm_head's rows)");
  }
  const int64_t H = s.hidden;
  int64_t m = 0;
  for (int64_t b = 0; b < batch; ++b) m += lens[b];
  Step step(io, s, m);
  for (int64_t b = 0, t = 0; b < batch; ++b) {
    for (int64_t i = 0; i < lens[b]; ++i, ++t) step.set(io, H, t, b, offset(starts[b], i), tokens[t]);
  }
  const int64_t rows = all_tokens ? m : batch;
  if (all_tokens) {
    step.forward(w, s, features, m, out_features, num_threads);
  } else {
    std::vector<float> out(static_cast<size_t>(m * H));
    step.forward(w, s, features, m, out.data(), num_threads);
    for (int64_t b = 0, t = 0; b < batch; ++b) {  // each row's last token
      t += lens[b];
      std::memcpy(out_features + b * H, out.data() + (t - 1) * H, sizeof(float) * H);
    }
  }
  lm_head(io, out_features, out_logits, rows, H, num_threads);
  if (out_top != nullptr) {
    for (int64_t r = 0; r < rows; ++r) out_top[r] = top_token(out_logits + r * io.lm_rows, top_vocab);
  }
}

const float* DraftPenalties::apply(const float* l, int64_t b, int64_t vocab, float* scratch) const {
  if (active == nullptr || active[b] == 0) return l;
  const float* pos = factors + b * 3 * vocab;
  const float* neg = pos + vocab;
  const float* shift = neg + vocab;
  for (int64_t j = 0; j < vocab; ++j) scratch[j] = l[j] * (l[j] > 0.f ? pos[j] : neg[j]) + shift[j];
  return scratch;
}

namespace {
// Sequence b's token from logits l (the first `vocab`): a draw from its processed
// distribution with uniform *u (temperature[b] > 0), else the top token; q gets the
// distribution (one-hot for the top token).
int64_t pick(const float* l, int64_t vocab, const ChainSampling& sampling, int64_t b, float* q, const double* u) {
  if (sampling.temperature[b] > 0.f) {
    processed_probs_cpu(l, q, 1, vocab, sampling.temperature[b], sampling.top_k[b], sampling.top_p[b], 1);
    int64_t drawn, accepted, emitted;
    chain_speculative_sampling_cpu(nullptr, nullptr, q, u, &drawn, &accepted, &emitted, 1, 0, vocab, 1);
    return drawn;
  }
  const int64_t tok = top_token(l, vocab);
  std::fill(q, q + vocab, 0.f);
  q[tok] = 1.f;
  return tok;
}
}  // namespace

void stack_chain(const DecoderStackWeights& w, const DecoderShape& s, const StackIO& io, int64_t vocab,
                 const int64_t* tokens, const float* features, const int64_t* positions, int64_t batch, int64_t steps,
                 const ChainSampling* sampling, int64_t* out_tokens, int num_threads, const ChainStop* stop,
                 const DraftPenalties* penalties) {
  const int64_t H = s.hidden;
  Step step(io, s, batch);
  std::vector<float> feats(static_cast<size_t>(batch * H)), logits(static_cast<size_t>(batch * io.lm_rows));
  std::vector<float> penalized(penalties != nullptr ? vocab : 0);
  std::vector<int64_t> next(tokens, tokens + batch);
  if (features != nullptr) std::memcpy(feats.data(), features, sizeof(float) * batch * H);
  float* probs = stop != nullptr ? stop->out_probs : nullptr;
  std::vector<float> likely(static_cast<size_t>(batch), 1.f);   // each draft's probability so far
  if (stop != nullptr && stop->prior != nullptr) std::copy(stop->prior, stop->prior + batch, likely.begin());
  auto unlikely = [&] {
    if (stop == nullptr || !(stop->stop_below > 0.f)) return false;
    for (float p : likely)
      if (p >= stop->stop_below) return false;
    return true;
  };
  for (int64_t r = 0; r < steps; ++r) {
    if (unlikely()) {   // the rest of the rounds are not run
      for (int64_t b = 0; b < batch; ++b) {
        std::fill(out_tokens + b * steps + r, out_tokens + (b + 1) * steps, int64_t{-1});
        if (probs != nullptr) std::fill(probs + b * steps + r, probs + (b + 1) * steps, 0.f);
      }
      break;
    }
    for (int64_t b = 0; b < batch; ++b) step.set(io, H, b, b, offset(positions[b], r), next[b]);
    // the head reads its features before it writes its outputs over them
    step.forward(w, s, features != nullptr ? feats.data() : nullptr, batch, feats.data(), num_threads);
    lm_head(io, feats.data(), logits.data(), batch, H, num_threads);
    for (int64_t b = 0; b < batch; ++b) {
      const float* l = logits.data() + b * io.lm_rows;
      if (penalties != nullptr) l = penalties->apply(l, b, vocab, penalized.data());
      int64_t tok = sampling == nullptr ? top_token(l, vocab)
          : pick(l, vocab, *sampling, b, sampling->probs + (b * steps + r) * vocab, sampling->uniforms + b * steps + r);
      if (probs != nullptr) {
        probs[b * steps + r] = token_probability(l, vocab, tok);
        likely[b] *= probs[b * steps + r];
      }
      tok = row_token(io, tok);
      next[b] = tok;
      out_tokens[b * steps + r] = tok;
    }
  }
}

void stack_refill_chain(const DecoderStackWeights& w, const DecoderShape& s, const StackIO& io, int64_t vocab,
                        const int64_t* tokens, const float* features, const int64_t* starts, const int64_t* lens,
                        int64_t batch, int64_t steps, float* out_logits, float* out_features, int64_t* out_tokens,
                        int num_threads, const ChainStop* stop, const ChainSampling* sampling,
                        const DraftPenalties* penalties) {
  if (vocab <= 0 || vocab > io.lm_rows || steps < 0) throw std::invalid_argument("refill_chain: invalid vocab/steps");
  if (stop != nullptr && sampling != nullptr) throw std::invalid_argument("refill_chain: sampled chains do not stop");
  stack_rows_forward(w, s, io, tokens, features, starts, lens, batch, out_logits, out_features, num_threads);
  const int64_t width = steps + 1;   // tokens per row: the first, then the chain's
  std::vector<int64_t> first(batch), positions(batch), rest(static_cast<size_t>(batch * steps));
  std::vector<float> first_probs(stop != nullptr ? batch : 0), rest_probs(stop != nullptr ? batch * steps : 0);
  // a sampled chain's uniforms and distributions, rounds 1.. of each row's
  std::vector<double> rest_uniforms(sampling != nullptr ? batch * steps : 0);
  std::vector<float> rest_q(sampling != nullptr ? batch * steps * vocab : 0);
  ChainSampling chain_sampling;
  std::vector<float> penalized(penalties != nullptr ? vocab : 0);
  for (int64_t b = 0; b < batch; ++b) {
    const float* l = out_logits + b * io.lm_rows;
    if (penalties != nullptr) l = penalties->apply(l, b, vocab, penalized.data());
    int64_t row;
    if (sampling != nullptr) {
      const double* u = sampling->uniforms + b * width;
      row = pick(l, vocab, *sampling, b, sampling->probs + b * width * vocab, u);
      std::copy(u + 1, u + width, rest_uniforms.begin() + b * steps);
    } else {
      row = top_token(l, vocab);
    }
    if (stop != nullptr) first_probs[b] = token_probability(l, vocab, row);
    first[b] = row_token(io, row);
    positions[b] = offset(starts[b], lens[b]);
  }
  if (sampling != nullptr) {
    chain_sampling = *sampling;
    chain_sampling.uniforms = rest_uniforms.data();
    chain_sampling.probs = rest_q.data();
  }
  ChainStop chain_stop;
  if (stop != nullptr) {
    chain_stop.out_probs = rest_probs.data();
    chain_stop.stop_below = stop->stop_below;
    chain_stop.prior = first_probs.data();
  }
  stack_chain(w, s, io, vocab, first.data(), features != nullptr ? out_features : nullptr, positions.data(), batch,
              steps, sampling != nullptr ? &chain_sampling : nullptr, rest.data(), num_threads,
              stop != nullptr ? &chain_stop : nullptr, penalties);
  for (int64_t b = 0; b < batch; ++b) {
    out_tokens[b * width] = first[b];
    std::copy(rest.begin() + b * steps, rest.begin() + (b + 1) * steps, out_tokens + b * width + 1);
    if (sampling != nullptr)
      std::copy(rest_q.begin() + b * steps * vocab, rest_q.begin() + (b + 1) * steps * vocab,
                sampling->probs + (b * width + 1) * vocab);
    if (stop != nullptr && stop->out_probs != nullptr) {
      stop->out_probs[b * width] = first_probs[b];
      std::copy(rest_probs.begin() + b * steps, rest_probs.begin() + (b + 1) * steps,
                stop->out_probs + b * width + 1);
    }
  }
}

}  // namespace sonarspec
