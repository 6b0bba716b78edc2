// Binds the native decoder stack (decoder_stack.h) as _C.DecoderStack: built once per
// model and KV cache from raw pointers (ops/decoder_stack.py validates the tensors and
// keeps them alive), then run once per small step.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "sonarspec/decoder_stack.h"
#include "sonarspec/stack_drafting.h"
#include "sonarspec/stack_profile.h"

namespace py = pybind11;

namespace sonarspec {
namespace {

// Pointers of one layer: input_norm, post_norm, qkv (or q), k (0 with a fused qkv), v, qkv_bias, o, gate_up,
// down, k_pool, v_pool.
using LayerPointers = std::array<uintptr_t, 11>;

// WeightFormat codes of one layer's matrices: qkv (or q), k, v, o, gate_up, down.
using LayerFormats = std::array<int, 6>;

// Model-level pointers: cos_table, sin_table, fc, fc_bias, enorm, hnorm, final_norm.
using ModelPointers = std::array<uintptr_t, 7>;

class DecoderStack {
 public:
  DecoderStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t inter,
               int64_t num_slots, float eps, float scale, const std::vector<LayerPointers>& layers,
               const std::vector<LayerFormats>& formats, const ModelPointers& model, int fc_format,
               int64_t max_positions, int kv_dtype) {
    if (hidden <= 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 || inter <= 0 ||
        num_slots <= 0 || num_heads % num_kv_heads || max_positions <= 0 || model[0] == 0 || model[1] == 0) {
      throw std::invalid_argument("DecoderStack: invalid shape");
    }
    if (kv_dtype < 0 || kv_dtype > 2) throw std::invalid_argument("DecoderStack: invalid kv_dtype");
    shape_ = {hidden, num_heads, num_kv_heads, head_dim, inter, num_slots, eps, scale, static_cast<DType>(kv_dtype)};
    if (formats.size() != layers.size()) throw std::invalid_argument("DecoderStack: one format list per layer");
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerPointers& p = layers[l];
      const LayerFormats& f = formats[l];
      if (p[1] == 0 || p[2] == 0 || (p[3] == 0) != (p[4] == 0) || p[6] == 0 || p[7] == 0 || p[8] == 0 || p[9] == 0 ||
          p[10] == 0) {
        throw std::invalid_argument("DecoderStack: a layer is missing a required tensor");
      }
      auto matrix = [](uintptr_t data, int code) { return WeightMatrix{reinterpret_cast<const void*>(data),
                                                                        weight_format_of(code)}; };
      DecoderLayerWeights w;
      w.input_norm = reinterpret_cast<const float*>(p[0]);
      w.post_norm = reinterpret_cast<const float*>(p[1]);
      for (int i = 0; i < 3; ++i) w.qkv[i] = matrix(p[2 + i], f[i]);
      w.qkv_bias = reinterpret_cast<const float*>(p[5]);
      w.o = matrix(p[6], f[3]);
      w.gate_up = matrix(p[7], f[4]);
      w.down = matrix(p[8], f[5]);
      w.k_pool = reinterpret_cast<void*>(p[9]);
      w.v_pool = reinterpret_cast<void*>(p[10]);
      layers_.push_back(w);
    }
    weights_.layers = layers_.data();
    weights_.num_layers = static_cast<int64_t>(layers_.size());
    weights_.cos_table = reinterpret_cast<const float*>(model[0]);
    weights_.sin_table = reinterpret_cast<const float*>(model[1]);
    weights_.max_positions = max_positions;
    weights_.fc = WeightMatrix{reinterpret_cast<const void*>(model[2]), weight_format_of(fc_format)};
    weights_.fc_bias = reinterpret_cast<const float*>(model[3]);
    weights_.enorm = reinterpret_cast<const float*>(model[4]);
    weights_.hnorm = reinterpret_cast<const float*>(model[5]);
    weights_.final_norm = reinterpret_cast<const float*>(model[6]);
  }

  int64_t forward(uintptr_t x, uintptr_t features, int64_t m, uintptr_t positions, uintptr_t slot_mapping,
                  uintptr_t block_table, int64_t batch, int64_t max_pages, int64_t page_size, uintptr_t token_seq,
                  uintptr_t key_begin,
                  uintptr_t key_end, uintptr_t tree_begin, uintptr_t tree_mask, uintptr_t out, int num_threads,
                  uintptr_t capture_layers, int64_t capture_count, uintptr_t capture_out) {
    if (weights_.fc.data != nullptr && features == 0) {
      throw std::invalid_argument("DecoderStack: an MTP head needs features");
    }
    auto i = [](uintptr_t p) { return reinterpret_cast<const int64_t*>(p); };
    StepAttention a;
    a.slot_mapping = i(slot_mapping);
    a.block_table = i(block_table);
    a.batch = batch;
    a.max_pages = max_pages;
    a.page_size = page_size;
    a.token_seq = i(token_seq);
    a.key_begin = i(key_begin);
    a.key_end = i(key_end);
    a.tree_begin = i(tree_begin);
    a.tree_mask = i(tree_mask);
    if (capture_count < 0 || (capture_count > 0 && (capture_layers == 0 || capture_out == 0))) {
      throw std::invalid_argument("DecoderStack: captured layers need their ids and an output");
    }
    LayerCapture capture;
    capture.layers = i(capture_layers);
    capture.count = capture_count;
    capture.out = reinterpret_cast<float*>(capture_out);
    py::gil_scoped_release release;
    return decoder_stack_forward(weights_, shape_, reinterpret_cast<float*>(x),
                                 reinterpret_cast<const float*>(features), m, i(positions), a,
                                 reinterpret_cast<float*>(out), num_threads, capture);
  }

  // io: embed, embed_format, lm_head, lm_head_format, lm_rows, block_table, max_pages, page_size, window, embed_rows,
  // row_tokens (0: none; else int64 token ids, one per lm_head row), their count.
  using IOArgs = std::tuple<uintptr_t, int, uintptr_t, int, int64_t, uintptr_t, int64_t, int64_t, int64_t, int64_t,
                            uintptr_t, int64_t>;

  // A greedy chain's scores and early stop (ChainStop): (out_probs, stop_below, prior)
  // pointers and threshold; out_probs 0: none.
  using StopArgs = std::tuple<uintptr_t, float, uintptr_t>;
  static const ChainStop* make_stop(const StopArgs& a, ChainStop& stop) {
    if (std::get<0>(a) == 0) return nullptr;
    stop.out_probs = reinterpret_cast<float*>(std::get<0>(a));
    stop.stop_below = std::get<1>(a);
    stop.prior = reinterpret_cast<const float*>(std::get<2>(a));
    return &stop;
  }

  // sampling: (temperature, top_k, top_p, uniforms, probs) pointers, or all 0 for top tokens.
  static const ChainSampling* make_sampling(const std::array<uintptr_t, 5>& sampling, ChainSampling& cs) {
    if (sampling[0] == 0) return nullptr;
    cs.temperature = reinterpret_cast<const float*>(sampling[0]);
    cs.top_k = reinterpret_cast<const int64_t*>(sampling[1]);
    cs.top_p = reinterpret_cast<const float*>(sampling[2]);
    cs.uniforms = reinterpret_cast<const double*>(sampling[3]);
    cs.probs = reinterpret_cast<float*>(sampling[4]);
    return &cs;
  }

  // penalties: (active, factors) pointers, or both 0 for none.
  static const DraftPenalties* make_penalties(const std::array<uintptr_t, 2>& a, DraftPenalties& dp) {
    if (a[0] == 0) return nullptr;
    dp.active = reinterpret_cast<const uint8_t*>(a[0]);
    dp.factors = reinterpret_cast<const float*>(a[1]);
    return &dp;
  }

  void chain(const IOArgs& io_args, int64_t vocab, uintptr_t tokens, uintptr_t features, uintptr_t positions,
             int64_t batch, int64_t steps, const std::array<uintptr_t, 5>& sampling, uintptr_t out_tokens,
             int num_threads, const StopArgs& stop_args, const std::array<uintptr_t, 2>& penalty_args) {
    const StackIO io = make_io(io_args, features, batch);
    if (vocab <= 0 || vocab > io.lm_rows || steps < 0) throw std::invalid_argument("DecoderStack: invalid vocab/steps");
    auto i = [](uintptr_t p) { return reinterpret_cast<const int64_t*>(p); };
    ChainSampling cs;
    const ChainSampling* sampled = make_sampling(sampling, cs);
    ChainStop stop;
    const ChainStop* st = make_stop(stop_args, stop);
    if (sampled != nullptr && st != nullptr)
      throw std::invalid_argument("DecoderStack: sampled chains do not stop early");
    DraftPenalties dp;
    const DraftPenalties* pen = make_penalties(penalty_args, dp);
    py::gil_scoped_release release;
    stack_chain(weights_, shape_, io, vocab, i(tokens), reinterpret_cast<const float*>(features), i(positions), batch,
                steps, sampled, reinterpret_cast<int64_t*>(out_tokens), num_threads, st, pen);
  }

  void rows_forward(const IOArgs& io_args, uintptr_t tokens, uintptr_t features, uintptr_t starts, uintptr_t lens,
                    int64_t batch, uintptr_t out_logits, uintptr_t out_features, int num_threads, bool all_tokens,
                    uintptr_t out_top, int64_t top_vocab) {
    const StackIO io = make_io(io_args, features, batch);
    auto i = [](uintptr_t p) { return reinterpret_cast<const int64_t*>(p); };
    py::gil_scoped_release release;
    stack_rows_forward(weights_, shape_, io, i(tokens), reinterpret_cast<const float*>(features), i(starts), i(lens),
                       batch, reinterpret_cast<float*>(out_logits), reinterpret_cast<float*>(out_features),
                       num_threads, all_tokens, reinterpret_cast<int64_t*>(out_top), top_vocab);
  }

  void refill_chain(const IOArgs& io_args, int64_t vocab, uintptr_t tokens, uintptr_t features, uintptr_t starts,
                    uintptr_t lens, int64_t batch, int64_t steps, uintptr_t out_logits, uintptr_t out_features,
                    uintptr_t out_tokens, int num_threads, const StopArgs& stop_args,
                    const std::array<uintptr_t, 5>& sampling, const std::array<uintptr_t, 2>& penalty_args) {
    const StackIO io = make_io(io_args, features, batch);
    auto i = [](uintptr_t p) { return reinterpret_cast<const int64_t*>(p); };
    ChainStop stop;
    const ChainStop* st = make_stop(stop_args, stop);
    ChainSampling cs;
    const ChainSampling* sampled = make_sampling(sampling, cs);
    DraftPenalties dp;
    const DraftPenalties* pen = make_penalties(penalty_args, dp);
    py::gil_scoped_release release;
    stack_refill_chain(weights_, shape_, io, vocab, i(tokens), reinterpret_cast<const float*>(features), i(starts),
                       i(lens), batch, steps, reinterpret_cast<float*>(out_logits),
                       reinterpret_cast<float*>(out_features), reinterpret_cast<int64_t*>(out_tokens), num_threads,
                       st, sampled, pen);
  }

  size_t num_layers() const { return layers_.size(); }

 private:
  StackIO make_io(const IOArgs& a, uintptr_t features, int64_t batch) const {
    if (weights_.fc.data != nullptr && features == 0) {
      throw std::invalid_argument("DecoderStack: an MTP head needs features");
    }
    StackIO io;
    io.embed = reinterpret_cast<const void*>(std::get<0>(a));
    io.embed_format = weight_format_of(std::get<1>(a));
    io.lm_head = reinterpret_cast<const void*>(std::get<2>(a));
    io.lm_head_format = weight_format_of(std::get<3>(a));
    io.lm_rows = std::get<4>(a);
    io.block_table = reinterpret_cast<const int64_t*>(std::get<5>(a));
    io.batch = batch;
    io.max_pages = std::get<6>(a);
    io.page_size = std::get<7>(a);
    io.window = std::get<8>(a);
    io.embed_rows = std::get<9>(a);
    io.row_tokens = reinterpret_cast<const int64_t*>(std::get<10>(a));
    if (io.lm_rows <= 0 || io.embed_rows < io.lm_rows || batch <= 0 || io.page_size <= 0 || io.max_pages <= 0) {
      throw std::invalid_argument("DecoderStack: invalid drafting sizes");
    }
    if (io.row_tokens != nullptr && std::get<11>(a) != io.lm_rows) {   // a picked row indexes it
      throw std::invalid_argument("DecoderStack: row_tokens needs one token per lm_head row");
    }
    return io;
  }

  DecoderShape shape_;
  std::vector<DecoderLayerWeights> layers_;
  DecoderStackWeights weights_;
};

}  // namespace

void bind_decoder_stack(py::module_& m) {
  py::class_<DecoderStack>(m, "DecoderStack",
                           "Llama decoder layers as one native call for small float32 CPU steps (raw pointers).")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float,
                    const std::vector<LayerPointers>&, const std::vector<LayerFormats>&, const ModelPointers&, int,
                    int64_t, int>(),
           py::arg("hidden"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("inter"),
           py::arg("num_slots"), py::arg("eps"), py::arg("scale"), py::arg("layers"), py::arg("formats"),
           py::arg("model"), py::arg("fc_format"), py::arg("max_positions"), py::arg("kv_dtype") = 0)
      .def("forward", &DecoderStack::forward,
           "Runs the stack over x (m, hidden) in place (an MTP head's input projection with features first) and "
           "writes final_norm(x) to out; returns the number of tokens with an out-of-range KV slot.")
      .def("chain", &DecoderStack::chain,
           "Chain drafting: steps rounds of embed, stack, lm_head, then the top token or a draw (stack_drafting.h).")
      .def("rows_forward", &DecoderStack::rows_forward,
           "Embed, stack and lm_head over rows of tokens: logits and outputs at each row's last token (all_tokens: "
           "at every token); with out_top, each logits row's top token among its first top_vocab.")
      .def("refill_chain", &DecoderStack::refill_chain,
           "A drafter's rows_forward, then each row's top token (or a draw) and a chain from it.")
      .def_property_readonly("num_layers", &DecoderStack::num_layers);
  m.def("set_stack_profile", &set_stack_profile, py::arg("on"),
        "Switches the native decoder stacks' phase profile on or off (stack_profile.h); empties it.");
  m.def("take_stack_profile", [] {
    py::list out;
    for (const StackProfileRow& row : take_stack_profile()) {
      py::dict seconds;
      for (int p = 0; p < kStackPhases; ++p) seconds[stack_phase_names()[p]] = row.seconds[p];
      out.append(py::dict(py::arg("layers") = row.layers, py::arg("rows") = row.rows,
                          py::arg("forwards") = row.forwards, py::arg("seconds") = seconds));
    }
    return out;
  }, "The stack phase profile so far, one dict per (layers, rows): forwards and seconds per phase; empties it.");
}

}  // namespace sonarspec
