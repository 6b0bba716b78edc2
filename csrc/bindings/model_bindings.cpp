// Binds the native decoder stack (decoder_stack.h) as _C.DecoderStack: built once per
// model and KV cache from raw pointers (ops/decoder_stack.py validates the tensors and
// keeps them alive), then run once per small step.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "bindings.h"
#include "sonarspec/decoder_stack.h"

namespace py = pybind11;

namespace sonarspec {
namespace {

// Pointers of one layer: input_norm, post_norm, qkv, qkv_bias, o, gate_up, down, k_pool, v_pool.
using LayerPointers = std::array<uintptr_t, 9>;

class DecoderStack {
 public:
  DecoderStack(int64_t hidden, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t inter,
               int64_t num_slots, float eps, float scale, bool bf16_weights, const std::vector<LayerPointers>& layers) {
    if (hidden <= 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 || inter <= 0 ||
        num_slots <= 0 || num_heads % num_kv_heads) {
      throw std::invalid_argument("DecoderStack: invalid shape");
    }
    shape_ = {hidden, num_heads, num_kv_heads, head_dim, inter, num_slots, eps, scale, bf16_weights};
    for (const LayerPointers& p : layers) {
      if (p[1] == 0 || p[2] == 0 || p[4] == 0 || p[5] == 0 || p[6] == 0 || p[7] == 0 || p[8] == 0) {
        throw std::invalid_argument("DecoderStack: a layer is missing a required tensor");
      }
      DecoderLayerWeights w;
      w.input_norm = reinterpret_cast<const float*>(p[0]);
      w.post_norm = reinterpret_cast<const float*>(p[1]);
      w.qkv = reinterpret_cast<const void*>(p[2]);
      w.qkv_bias = reinterpret_cast<const float*>(p[3]);
      w.o = reinterpret_cast<const void*>(p[4]);
      w.gate_up = reinterpret_cast<const void*>(p[5]);
      w.down = reinterpret_cast<const void*>(p[6]);
      w.k_pool = reinterpret_cast<float*>(p[7]);
      w.v_pool = reinterpret_cast<float*>(p[8]);
      layers_.push_back(w);
    }
  }

  int64_t forward(uintptr_t x, int64_t m, uintptr_t cos, uintptr_t sin, uintptr_t slot_mapping, uintptr_t block_table,
                  int64_t max_pages, int64_t page_size, uintptr_t token_seq, uintptr_t key_begin, uintptr_t key_end,
                  uintptr_t tree_begin, uintptr_t tree_mask, uintptr_t final_norm, uintptr_t out, int num_threads) {
    auto i = [](uintptr_t p) { return reinterpret_cast<const int64_t*>(p); };
    StepAttention a;
    a.slot_mapping = i(slot_mapping);
    a.block_table = i(block_table);
    a.max_pages = max_pages;
    a.page_size = page_size;
    a.token_seq = i(token_seq);
    a.key_begin = i(key_begin);
    a.key_end = i(key_end);
    a.tree_begin = i(tree_begin);
    a.tree_mask = i(tree_mask);
    py::gil_scoped_release release;
    return decoder_stack_forward(layers_.data(), static_cast<int64_t>(layers_.size()), shape_,
                                 reinterpret_cast<float*>(x), m, reinterpret_cast<const float*>(cos),
                                 reinterpret_cast<const float*>(sin), a, reinterpret_cast<const float*>(final_norm),
                                 reinterpret_cast<float*>(out), num_threads);
  }

  size_t num_layers() const { return layers_.size(); }

 private:
  DecoderShape shape_;
  std::vector<DecoderLayerWeights> layers_;
};

}  // namespace

void bind_decoder_stack(py::module_& m) {
  py::class_<DecoderStack>(m, "DecoderStack",
                           "Llama decoder layers as one native call for small float32 CPU steps (raw pointers).")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, bool,
                    const std::vector<LayerPointers>&>(),
           py::arg("hidden"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("inter"),
           py::arg("num_slots"), py::arg("eps"), py::arg("scale"), py::arg("bf16_weights"), py::arg("layers"))
      .def("forward", &DecoderStack::forward,
           "Runs every layer over x (m, hidden) in place and writes final_norm(x) to out; returns the number of "
           "tokens with an out-of-range KV slot.")
      .def_property_readonly("num_layers", &DecoderStack::num_layers);
}

}  // namespace sonarspec
