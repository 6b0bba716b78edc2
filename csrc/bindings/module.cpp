// Binds the kernels; the planner and step metadata are bound in planner_bindings.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "sonarspec/elementwise.h"
#include "sonarspec/embedding.h"
#include "sonarspec/huge_pages.h"
#include "sonarspec/kv_store.h"
#include "sonarspec/paged_attention.h"
#include "sonarspec/rejection_sampling.h"
#include "sonarspec/sampling.h"
#include "sonarspec/shifted_scatter.h"
#include "sonarspec/small_gemm.h"
#include "sonarspec/quant_gemm.h"
#include "sonarspec/thread_pool.h"
#ifdef SONARSPEC_WITH_CUDA
#include "sonarspec/device.h"
#include "sonarspec/elementwise_cuda.h"
#include "sonarspec/paged_attention_cuda.h"
#endif
#ifdef SONARSPEC_WITH_CUTLASS
#include "sonarspec/padded_gemm.h"
#endif

namespace py = pybind11;
using namespace sonarspec;

#ifndef SONARSPEC_VERSION
#define SONARSPEC_VERSION "0.0.0"
#endif

namespace {

py::dict build_info() {
  py::dict d;
  d["version"] = SONARSPEC_VERSION;
#ifdef SONARSPEC_WITH_CUDA
  d["cuda"] = true;
  d["cuda_arch"] = SONARSPEC_CUDA_ARCH;
#else
  d["cuda"] = false;
  d["cuda_arch"] = py::none();
#endif
#ifdef SONARSPEC_WITH_CUTLASS
  d["cutlass"] = true;
#else
  d["cutlass"] = false;
#endif
  return d;
}

bool cuda_available() {
#ifdef SONARSPEC_WITH_CUDA
  return cuda_device_available();
#else
  return false;
#endif
}

// Pointers arrive as integers (tensor.data_ptr()); ops/ has validated the tensors.
// Runs cpu() without the GIL, or cuda() - a launcher returning a cudaError_t - for CUDA
// tensors, turning a failed launch or a CPU-only build into an exception.
template <typename Cpu, typename Cuda>
int64_t dispatch(const char* name, bool on_cuda, Cpu cpu, Cuda cuda) {
  if (!on_cuda) {
    py::gil_scoped_release release;
    return cpu();
  }
#ifdef SONARSPEC_WITH_CUDA
  int err = cuda();
  if (err != 0) throw std::runtime_error(std::string(name) + " CUDA launch failed: " + cuda_error_string(err));
  return 0;
#else
  (void)cuda;
  throw std::runtime_error(std::string("sonarspec was built without CUDA; ") + name + " got CUDA tensors");
#endif
}

int64_t kv_store(uintptr_t k_src, uintptr_t v_src, uintptr_t k_pool, uintptr_t v_pool,
                 uintptr_t slot_mapping, int64_t num_tokens, int64_t row_bytes, int64_t num_slots,
                 bool on_cuda, uintptr_t stream) {
  auto p = [](uintptr_t x) { return reinterpret_cast<void*>(x); };
  auto slots = reinterpret_cast<const int64_t*>(slot_mapping);
  return dispatch(
      "kv_store", on_cuda,
      [&] { return kv_store_cpu(p(k_src), p(v_src), p(k_pool), p(v_pool), slots, num_tokens, row_bytes, num_slots); },
      [&] {
        return kv_store_cuda(p(k_src), p(v_src), p(k_pool), p(v_pool), slots, num_tokens, row_bytes, num_slots,
                             p(stream));
      });
}

int64_t shifted_scatter(uintptr_t in, uintptr_t out, uintptr_t starts, uintptr_t lens, uintptr_t next,
                        uintptr_t accepted, int64_t num_blocks, int64_t num_tokens, bool on_cuda, uintptr_t stream) {
  auto p = [](uintptr_t x) { return reinterpret_cast<const int64_t*>(x); };
  auto o = reinterpret_cast<int64_t*>(out);
  return dispatch(
      "shifted_scatter", on_cuda,
      [&] { return shifted_scatter_cpu(p(in), o, p(starts), p(lens), p(next), p(accepted), num_blocks, num_tokens); },
      [&] {
        return shifted_scatter_cuda(p(in), o, p(starts), p(lens), p(next), p(accepted), num_blocks, num_tokens,
                                    reinterpret_cast<void*>(stream));
      });
}

int64_t chain_speculative_sampling(uintptr_t draft_probs, uintptr_t draft_ids, uintptr_t target_probs,
                                   uintptr_t uniforms, uintptr_t out_tokens, uintptr_t accepted_num,
                                   uintptr_t emitted_num, int64_t batch, int64_t k, int64_t vocab, bool on_cuda,
                                   uintptr_t stream, int num_threads) {
  auto f = [](uintptr_t x) { return reinterpret_cast<const float*>(x); };
  auto i = [](uintptr_t x) { return reinterpret_cast<const int64_t*>(x); };
  auto o = [](uintptr_t x) { return reinterpret_cast<int64_t*>(x); };
  auto u = reinterpret_cast<const double*>(uniforms);
  return dispatch(
      "chain_speculative_sampling", on_cuda,
      [&] {
        return chain_speculative_sampling_cpu(f(draft_probs), i(draft_ids), f(target_probs), u, o(out_tokens),
                                              o(accepted_num), o(emitted_num), batch, k, vocab, num_threads);
      },
      [&] {
        return chain_speculative_sampling_cuda(f(draft_probs), i(draft_ids), f(target_probs), u, o(out_tokens),
                                               o(accepted_num), o(emitted_num), batch, k, vocab,
                                               reinterpret_cast<void*>(stream));
      });
}

int64_t tree_speculative_sampling(uintptr_t candidates, uintptr_t first_child, uintptr_t next_sibling,
                                  uintptr_t target_probs, uintptr_t draft_probs, uintptr_t uniforms,
                                  uintptr_t out_tokens, uintptr_t accept_index, uintptr_t num_accepted, uintptr_t work,
                                  int64_t batch, int64_t nodes, int64_t vocab, bool on_cuda, uintptr_t stream,
                                  int num_threads) {
  auto f = [](uintptr_t x) { return reinterpret_cast<const float*>(x); };
  auto i = [](uintptr_t x) { return reinterpret_cast<const int64_t*>(x); };
  auto o = [](uintptr_t x) { return reinterpret_cast<int64_t*>(x); };
  auto u = reinterpret_cast<const double*>(uniforms);
  auto wk = reinterpret_cast<double*>(work);
  return dispatch(
      "tree_speculative_sampling", on_cuda,
      [&] {
        return tree_speculative_sampling_cpu(i(candidates), i(first_child), i(next_sibling), f(target_probs),
                                             f(draft_probs), u, o(out_tokens), o(accept_index), o(num_accepted), wk,
                                             batch, nodes, vocab, num_threads);
      },
      [&] {
        return tree_speculative_sampling_cuda(i(candidates), i(first_child), i(next_sibling), f(target_probs),
                                              f(draft_probs), u, o(out_tokens), o(accept_index), o(num_accepted), wk,
                                              batch, nodes, vocab, reinterpret_cast<void*>(stream));
      });
}

int64_t paged_attention(uintptr_t q, uintptr_t k_pool, uintptr_t v_pool, int kv_dtype, uintptr_t block_table,
                        int64_t batch_size, int64_t max_pages, int64_t page_size,
                        uintptr_t token_seq, uintptr_t key_begin, uintptr_t key_end, uintptr_t tree_begin,
                        uintptr_t tree_mask, uintptr_t out,
                        int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                        int64_t num_slots, float scale, int num_threads) {
  if (kv_dtype < 0 || kv_dtype > 2) throw std::invalid_argument("paged_attention: invalid kv_dtype");
  py::gil_scoped_release release;
  auto f = [](uintptr_t x) { return reinterpret_cast<const float*>(x); };
  auto i = [](uintptr_t x) { return reinterpret_cast<const int64_t*>(x); };
  auto v = [](uintptr_t x) { return reinterpret_cast<const void*>(x); };
  return paged_attention_cpu(f(q), v(k_pool), v(v_pool), static_cast<DType>(kv_dtype), i(block_table), batch_size, max_pages, page_size,
                             i(token_seq),
                             i(key_begin), i(key_end), i(tree_begin), i(tree_mask), reinterpret_cast<float*>(out),
                             num_tokens, num_heads, num_kv_heads, head_dim, num_slots, scale, num_threads);
}

// CUDA paged attention (ops/paged_attention.py validated the tensors); raises on a failed
// launch or in builds without CUDA.
void paged_attention_cuda_op(uintptr_t q, uintptr_t k_pool, uintptr_t v_pool, int dtype, uintptr_t out,
                             uintptr_t block_table, uintptr_t token_seq, uintptr_t key_begin, uintptr_t key_end,
                             uintptr_t tree_begin, uintptr_t tree_mask, uintptr_t partial, uintptr_t splits_used,
                             uintptr_t bad_tokens, int64_t batch_size, int64_t max_pages, int64_t page_size,
                             int64_t num_pages, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                             int64_t head_dim, int64_t max_splits, float scale, uintptr_t stream) {
#ifdef SONARSPEC_WITH_CUDA
  if (dtype < 0 || dtype > 2) throw std::invalid_argument("paged_attention_cuda: invalid dtype");
  auto i = [](uintptr_t x) { return reinterpret_cast<const int64_t*>(x); };
  auto v = [](uintptr_t x) { return reinterpret_cast<const void*>(x); };
  AttentionArgs a{v(q), v(k_pool), v(v_pool), reinterpret_cast<void*>(out), i(block_table), i(token_seq),
                  i(key_begin), i(key_end), i(tree_begin), i(tree_mask), reinterpret_cast<float*>(partial),
                  reinterpret_cast<int64_t*>(splits_used), reinterpret_cast<int32_t*>(bad_tokens), batch_size,
                  max_pages, page_size, num_pages, num_tokens, num_heads, num_kv_heads,
                  num_kv_heads > 0 ? num_heads / num_kv_heads : 0, head_dim, max_splits, scale};
  int err = paged_attention_cuda(a, static_cast<DType>(dtype), reinterpret_cast<void*>(stream));
  if (err != 0) throw std::runtime_error(std::string("paged_attention CUDA launch failed: ") + cuda_error_string(err));
#else
  (void)q, (void)k_pool, (void)v_pool, (void)dtype, (void)out, (void)block_table, (void)token_seq, (void)key_begin,
      (void)key_end, (void)tree_begin, (void)tree_mask, (void)partial, (void)splits_used, (void)bad_tokens,
      (void)batch_size, (void)max_pages, (void)page_size, (void)num_pages, (void)num_tokens, (void)num_heads,
      (void)num_kv_heads, (void)head_dim, (void)max_splits, (void)scale, (void)stream;
  throw std::runtime_error("sonarspec was built without CUDA; paged_attention got CUDA tensors");
#endif
}

// RMSNorm, SiLU-and-multiply, RoPE on q/k/v rows on CUDA (ops/elementwise.py validated the
// tensors); raises on a failed launch or in builds without CUDA.
void elementwise_cuda_op(int op, uintptr_t x, uintptr_t w, uintptr_t cos, uintptr_t sin, uintptr_t out,
                         uintptr_t out2, uintptr_t out3, int64_t rows, int64_t n, int64_t stride, int64_t heads,
                         int64_t kv_heads, float eps, int dtype, uintptr_t stream) {
#ifdef SONARSPEC_WITH_CUDA
  if (dtype < 0 || dtype > 2) throw std::invalid_argument("elementwise_cuda: invalid dtype");
  auto c = [](uintptr_t p) { return reinterpret_cast<const void*>(p); };
  auto m = [](uintptr_t p) { return reinterpret_cast<void*>(p); };
  ElementwiseArgs a{c(x), c(w), c(cos), c(sin), m(out), m(out2), m(out3), rows, n, stride, heads, kv_heads, eps};
  int err = elementwise_cuda(op, a, static_cast<DType>(dtype), reinterpret_cast<void*>(stream));
  if (err != 0) throw std::runtime_error(std::string("elementwise CUDA launch failed: ") + cuda_error_string(err));
#else
  (void)op, (void)x, (void)w, (void)cos, (void)sin, (void)out, (void)out2, (void)out3, (void)rows, (void)n,
      (void)stride, (void)heads, (void)kv_heads, (void)eps, (void)dtype, (void)stream;
  throw std::runtime_error("sonarspec was built without CUDA; an elementwise op got CUDA tensors");
#endif
}

void small_gemm(uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y, int64_t m, int64_t n, int64_t k,
                int num_threads, int weight_format) {
  py::gil_scoped_release release;
  small_gemm_any(reinterpret_cast<const float*>(x), reinterpret_cast<const void*>(w),
                 weight_format_of(weight_format), reinterpret_cast<const float*>(bias), reinterpret_cast<float*>(y), m,
                 n, k, num_threads);
}

// Returns 0, or kPaddedGemmUnsupported (-1) for a shape the kernel does not take (the
// caller falls back); raises on a failed launch or in builds without the kernel.
int padded_gemm_cuda_op(uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y, int64_t m, int64_t n, int64_t k,
                        int dtype, uintptr_t stream) {
#ifdef SONARSPEC_WITH_CUTLASS
  auto p = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  int err = padded_gemm_cuda(p(x), p(w), p(bias), p(y), m, n, k, static_cast<DType>(dtype), p(stream));
  if (err > 0) throw std::runtime_error(std::string("padded_gemm CUDA launch failed: ") + cuda_error_string(err));
  return err;
#else
  (void)x, (void)w, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)dtype, (void)stream;
  throw std::runtime_error("sonarspec was built without the CUTLASS GEMM (see tools/fetch_cutlass.sh)");
#endif
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "sonarspec native core: planner and kernels";
  m.def("build_info", &build_info, "How this extension was built: cuda, cuda_arch, version.");
  m.def("cuda_available", &cuda_available, "Whether a CUDA device is usable at run time.");
  m.def("small_mlp", [](uintptr_t x, uintptr_t gate_up, int gate_up_format, uintptr_t down, int down_format,
                        uintptr_t y, int64_t m, int64_t hidden, int64_t inter, int num_threads) {
    const WeightFormat gf = weight_format_of(gate_up_format), df = weight_format_of(down_format);
    py::gil_scoped_release release;
    small_mlp(reinterpret_cast<const float*>(x), reinterpret_cast<const void*>(gate_up), gf,
              reinterpret_cast<const void*>(down), df, reinterpret_cast<float*>(y), m, hidden, inter, num_threads);
  }, "Gated SiLU MLP for few rows: small_gemm, silu_and_mul, small_gemm in one call (raw pointers).");
  m.def("set_worker_spin_us", &sonarspec::ThreadPool::set_spin_us,
        "How long idle CPU kernel workers poll for the next call before sleeping (microseconds).");
  m.def("worker_spin_us", &sonarspec::ThreadPool::spin_us, "The current worker polling time (microseconds).");
  m.def("small_gemm", &small_gemm,
        "y = x @ w^T (+ bias), float32 x, w in a WeightFormat (float32, bfloat16, packed blocks), few rows of x "
        "(raw pointers).");
  m.def("padded_gemm_cuda", &padded_gemm_cuda_op,
        "y = x @ w^T (+ bias) with 64-row CUTLASS tiles, 16-bit CUDA tensors (raw pointers); -1: unsupported shape.");
  m.def("kv_store", &kv_store, "Scatter key/value rows into paged pools (raw pointers).");
  m.def("rms_norm", [](uintptr_t x, uintptr_t w, uintptr_t out, int64_t rows, int64_t n, float eps) {
    rms_norm_cpu(reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(w), reinterpret_cast<float*>(out),
                 rows, n, eps);
  }, "RMSNorm over rows, float32 CPU (raw pointers).");
  m.def("silu_and_mul", [](uintptr_t x, uintptr_t out, int64_t rows, int64_t n) {
    silu_and_mul_cpu(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(out), rows, n);
  }, "silu(gate) * up over [gate | up] rows, float32 CPU (raw pointers).");
  m.def("rope", [](uintptr_t x, uintptr_t cos, uintptr_t sin, uintptr_t out, int64_t rows, int64_t heads, int64_t d) {
    rope_cpu(reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(cos),
             reinterpret_cast<const float*>(sin), reinterpret_cast<float*>(out), rows, heads, d);
  }, "Rotate-half RoPE, float32 CPU (raw pointers).");
  m.def("elementwise_cuda", &elementwise_cuda_op, "RMSNorm (0), SiLU-and-multiply (1), RoPE on q/k/v rows (2) on CUDA.");
  m.def("paged_attention_cuda", &paged_attention_cuda_op, "Paged attention on CUDA (raw device pointers).");
  m.def("paged_attention_cuda_max_splits", [](int64_t max_pages, int64_t page_size) {
#ifdef SONARSPEC_WITH_CUDA
    return paged_attention_cuda_max_splits(max_pages, page_size);
#else
    (void)max_pages, (void)page_size;
    return int64_t{0};
#endif
  }, "Key splits the CUDA attention kernel's work buffer needs for a block table (0 without CUDA).");
  m.def("paged_attention_cuda_supports", [](int64_t head_dim) {
#ifdef SONARSPEC_WITH_CUDA
    return paged_attention_cuda_supports(head_dim);
#else
    (void)head_dim;
    return false;
#endif
  }, "Whether the CUDA attention kernel takes this head size (False without CUDA).");
  m.def("paged_attention", &paged_attention, "Small-query paged attention on the CPU: float32 queries, float32/float16/bfloat16 pools (raw pointers).");
  m.def("processed_probs", [](uintptr_t logits, uintptr_t probs, int64_t rows, int64_t vocab, float temperature,
                              int64_t top_k, float top_p, int num_threads) {
    py::gil_scoped_release release;
    processed_probs_cpu(reinterpret_cast<const float*>(logits), reinterpret_cast<float*>(probs), rows, vocab,
                        temperature, top_k, top_p, num_threads);
  }, "Sampling distribution of logit rows (temperature, top-k, top-p), float32 CPU (raw pointers).");
  m.def("bf16_dot_available", &bf16_dot_available,
        "Whether bfloat16-weight GEMMs use VDPBF16PS here (AVX512_BF16, unless SONARSPEC_NO_BF16_DOT is set).");
  m.def("quant_kernel", &quant_kernel,
        "The column kernel of block-quantized GEMMs here: 'vnni', 'avxvnni', 'avx2' or 'portable' "
        "(SONARSPEC_QUANT_KERNEL caps it).");
  m.def("weight_prefetch", &weight_prefetch_mode,
        "How the VDPBF16PS and VNNI block-format GEMMs prefetch weights here: 'near', 'far' or 'none' (small_gemm.h).");
  m.def("set_weight_prefetch", &set_weight_prefetch, py::arg("mode"),
        "Switches the GEMMs' weight prefetch ('near', 'far', 'none'); the results stay the same bits.");
  m.def("quant_packed_bytes", [](int format, int64_t n, int64_t k) {
    return quant_packed_bytes(weight_format_of(format), n, k);
  }, "Bytes of a packed (n, k) block-quantized matrix (see quant_gemm.h).");
  m.def("embedding_rows", [](uintptr_t table, int format, int64_t rows, int64_t hidden, uintptr_t tokens, int64_t m,
                             uintptr_t out) {
    embedding_rows(reinterpret_cast<const void*>(table), weight_format_of(format), rows, hidden,
                   reinterpret_cast<const int64_t*>(tokens), m, reinterpret_cast<float*>(out));
  }, "Rows of a (rows, hidden) embedding table in any WeightFormat as float32 (embedding.h; raw pointers).");
  m.def("advise_huge_pages", [](uintptr_t ptr, int64_t bytes) {
    return advise_huge_pages(reinterpret_cast<void*>(ptr), bytes);
  }, "madvise(MADV_HUGEPAGE) on the 2 MiB-aligned interior of a range; whether it was taken (huge_pages.h).");
  m.def("amx_available", &amx_available,
        "Whether bfloat16-weight GEMMs run on AMX tiles here (AMX-BF16, unless SONARSPEC_NO_AMX is set).");
  m.def("top_token", [](uintptr_t logits, int64_t vocab) {
    if (vocab < 1) throw std::invalid_argument("top_token: vocab must be >= 1");
    return top_token(reinterpret_cast<const float*>(logits), vocab);
  }, "Index of the largest of vocab float32 logits: first among ties, NaN counting as the largest (raw pointer).");
  m.def("chain_speculative_sampling", &chain_speculative_sampling,
        "Chain rejection sampling with given float64 uniforms, CPU or CUDA (raw pointers).");
  m.def("chain_sampling_from_logits", [](uintptr_t logits, const std::vector<float>& temperature,
                                         const std::vector<int64_t>& top_k, const std::vector<float>& top_p,
                                         uintptr_t draft_probs, const std::vector<int64_t>& draft_ids,
                                         const std::vector<double>& uniforms, int64_t batch, int64_t k, int64_t vocab,
                                         int num_threads) {
    const auto b = static_cast<size_t>(batch);
    if (batch < 0 || k < 0 || vocab < 1 || temperature.size() != b || top_k.size() != b || top_p.size() != b ||
        draft_ids.size() != b * static_cast<size_t>(k) || uniforms.size() != b * static_cast<size_t>(k + 1))
      throw std::invalid_argument("chain_sampling_from_logits: expected batch sampling parameters, batch * k draft "
                                  "ids and batch * (k + 1) uniforms");
    for (size_t r = 0; r < b; ++r) {
      if (!(temperature[r] > 0.f && std::isfinite(temperature[r]) && top_p[r] > 0.f && top_p[r] <= 1.f &&
            top_k[r] >= 0))
        throw std::invalid_argument("chain_sampling_from_logits: invalid sampling parameters (temperature " +
                                    std::to_string(temperature[r]) + ", top_k " + std::to_string(top_k[r]) +
                                    ", top_p " + std::to_string(top_p[r]) + ")");
    }
    for (int64_t id : draft_ids) {
      if (id < 0 || id >= vocab)
        throw std::invalid_argument("chain_sampling_from_logits: draft id " + std::to_string(id) +
                                    " outside [0, " + std::to_string(vocab) + ")");
    }
    std::vector<int64_t> out(b * static_cast<size_t>(k + 1)), accepted(b), emitted(b);
    {
      py::gil_scoped_release release;
      chain_sampling_from_logits_cpu(reinterpret_cast<const float*>(logits), temperature.data(), top_k.data(),
                                     top_p.data(), reinterpret_cast<const float*>(draft_probs), draft_ids.data(),
                                     uniforms.data(), out.data(), accepted.data(), emitted.data(), batch, k, vocab,
                                     num_threads);
    }
    return py::make_tuple(out, emitted);
  }, "Chain rejection sampling from float32 target logits (raw pointer), each request's rows processed natively "
     "with its temperature, top_k and top_p (lists); returns (tokens, batch * (k + 1), padded with -1; emitted).");
  m.def("tree_speculative_sampling", &tree_speculative_sampling,
        "Recursive rejection sampling over draft trees with given float64 uniforms, CPU or CUDA (raw pointers).");
  m.def("shifted_scatter", &shifted_scatter, "Shift token blocks left and scatter the next tokens (raw pointers).");

  bind_planner(m);
  bind_decoder_stack(m);
}
