// Binds the planner (sync and async scheduling) and the step-metadata builder.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "bindings.h"
#include "sonarspec/planner.h"
#include "sonarspec/step_metadata.h"

namespace py = pybind11;

namespace sonarspec {
namespace {

py::tuple plan_to_python(const StepPlan& plan) {
  py::list seqs;
  for (const auto& s : plan.seqs) seqs.append(py::make_tuple(s.seq_id, s.start, s.num_query_tokens));
  return py::make_tuple(seqs, plan.preempted, plan.cached);
}

template <typename T>
py::array_t<T> to_array(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// x as an int32, or a ValueError naming row `row`'s `field` (pybind's own cast error names
// neither); the message is only built when it is thrown.
int32_t checked_int32(int64_t x, size_t row, const char* field) {
  if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("row " + std::to_string(row) + ": " + field + " must fit in 32 bits, got " +
                                std::to_string(x));
  return static_cast<int32_t>(x);
}

int32_t int32_arg(const py::handle& v, size_t row, const char* field) {
  int64_t x = 0;
  try {
    x = v.cast<int64_t>();
  } catch (const py::cast_error&) {
    throw std::invalid_argument("row " + std::to_string(row) + ": " + field +
                                " must be an integer that fits in 32 bits");
  }
  return checked_int32(x, row, field);
}

py::dict metadata_dict(std::vector<MetadataRow>& meta_rows, int32_t page_size, int32_t sliding_window,
                       bool want_mask);

// Fills the tree fields of meta_rows from trees (None or [None | (begin, bits, positions)]);
// tree_arrays keeps the arrays alive.
void add_trees(std::vector<MetadataRow>& meta_rows, const py::object& trees, std::vector<Int64Array>& tree_arrays) {
  if (trees.is_none()) return;
  const size_t B = meta_rows.size();
  if (py::len(trees) != B) throw std::invalid_argument("trees needs one entry per row");
  tree_arrays.reserve(2 * B);
  for (size_t b = 0; b < B; ++b) {
    MetadataRow& r = meta_rows[b];
    py::object tree = py::sequence(trees)[b];
    if (tree.is_none()) continue;
    py::sequence t = tree;
    r.tree = true;
    r.tree_begin = int32_arg(t[0], b, "tree begin");
    tree_arrays.emplace_back(t[1]);
    tree_arrays.emplace_back(t[2]);
    const auto& bits = tree_arrays[tree_arrays.size() - 2];
    const auto& positions = tree_arrays.back();
    if (bits.size() != r.num_query || positions.size() != r.num_query)
      throw std::invalid_argument("tree bits and positions need one entry per query");
    for (py::ssize_t j = 0; j < positions.size(); ++j)   // RoPE positions
      if (positions.data()[j] < 0 || positions.data()[j] > std::numeric_limits<int32_t>::max())
        throw std::invalid_argument("row " + std::to_string(b) + ": tree positions must be in [0, 2^31), got " +
                                    std::to_string(positions.data()[j]));
    r.tree_bits = bits.data();
    r.tree_positions = positions.data();
  }
}

// rows: [(start, num_query, page_table)], trees: None or [None | (begin, bits, positions)].
py::dict build_metadata(const py::sequence& rows, const py::object& trees, int32_t page_size, int32_t sliding_window,
                        bool want_mask) {
  const size_t B = py::len(rows);
  std::vector<std::vector<int32_t>> tables(B);
  std::vector<MetadataRow> meta_rows(B);
  for (size_t b = 0; b < B; ++b) {
    py::sequence row = rows[b];
    if (py::len(row) != 3)
      throw std::invalid_argument("row " + std::to_string(b) + ": needs (start, num_query, page_table)");
    MetadataRow& r = meta_rows[b];
    r.start = int32_arg(row[0], b, "start");
    r.num_query = int32_arg(row[1], b, "num_query");
    for (const py::handle page : py::sequence(row[2])) {
      tables[b].push_back(int32_arg(page, b, "page id"));
      if (tables[b].back() < 0) throw std::invalid_argument("row " + std::to_string(b) + ": page ids must be >= 0");
    }
    r.pages = tables[b].data();
    r.num_pages = static_cast<int32_t>(tables[b].size());
  }
  std::vector<Int64Array> tree_arrays;
  add_trees(meta_rows, trees, tree_arrays);
  return metadata_dict(meta_rows, page_size, sliding_window, want_mask);
}

// The planner's own page tables: seq_ids, starts, num_query (int64 arrays), trees as above.
py::dict planner_metadata(const Planner& planner, const Int64Array& seq_ids, const Int64Array& starts,
                          const Int64Array& num_query, const py::object& trees, int32_t sliding_window,
                          bool want_mask) {
  const size_t B = seq_ids.size();
  if (starts.size() != static_cast<py::ssize_t>(B) || num_query.size() != static_cast<py::ssize_t>(B))
    throw std::invalid_argument("seq_ids, starts and num_query need the same length");
  std::vector<std::vector<int32_t>> tables(B);
  std::vector<MetadataRow> meta_rows(B);
  for (size_t b = 0; b < B; ++b) {
    tables[b] = planner.page_table(seq_ids.data()[b]);
    meta_rows[b].start = checked_int32(starts.data()[b], b, "start");
    meta_rows[b].num_query = checked_int32(num_query.data()[b], b, "num_query");
    meta_rows[b].pages = tables[b].data();
    meta_rows[b].num_pages = static_cast<int32_t>(tables[b].size());
  }
  std::vector<Int64Array> tree_arrays;
  add_trees(meta_rows, trees, tree_arrays);
  return metadata_dict(meta_rows, planner.config().page_size, sliding_window, want_mask);
}

py::dict metadata_dict(std::vector<MetadataRow>& meta_rows, int32_t page_size, int32_t sliding_window,
                       bool want_mask) {
  StepMetadata m;
  {
    py::gil_scoped_release release;
    build_step_metadata(meta_rows, page_size, sliding_window, want_mask, m);
  }
  const py::ssize_t T = m.num_tokens, Bq = m.batch;
  py::dict out;
  for (auto [name, vec] : {std::pair<const char*, const std::vector<int64_t>*>{"positions", &m.positions},
                           {"slot_mapping", &m.slot_mapping}, {"output_index", &m.output_index},
                           {"token_seq", &m.token_seq}, {"key_begin", &m.key_begin}, {"key_end", &m.key_end},
                           {"tree_begin", &m.tree_begin}, {"tree_mask", &m.tree_mask}})
    out[name] = to_array(*vec, {T});
  out["block_table"] = to_array(m.block_table, {Bq, static_cast<py::ssize_t>(m.max_pages)});
  out["kv_max"] = m.kv_max;
  for (auto [name, vec] : {std::pair<const char*, const std::vector<int64_t>*>{"qo_indptr", &m.qo_indptr},
                           {"kv_indptr", &m.kv_indptr}, {"kv_indices", &m.kv_indices},
                           {"kv_last_page_len", &m.kv_last_page_len}})
    out[name] = to_array(*vec, {static_cast<py::ssize_t>(vec->size())});
  out["query_index"] = to_array(m.query_index, {Bq, static_cast<py::ssize_t>(m.q_max)});
  out["mask"] = m.has_mask ? py::object(to_array(m.mask, {Bq, 1, static_cast<py::ssize_t>(m.q_max),
                                                          static_cast<py::ssize_t>(m.kv_max)}))
                           : py::object(py::none());
  out["uniform_queries"] = m.uniform_queries;
  out["uniform_decode"] = m.uniform_decode;
  out["has_tree"] = m.has_tree;
  return out;
}

}  // namespace

void bind_planner(py::module_& m) {
  py::class_<PlannerConfig>(m, "PlannerConfig")
      .def(py::init<>())
      .def_readwrite("num_pages", &PlannerConfig::num_pages)
      .def_readwrite("page_size", &PlannerConfig::page_size)
      .def_readwrite("max_num_seqs", &PlannerConfig::max_num_seqs)
      .def_readwrite("max_num_batched_tokens", &PlannerConfig::max_num_batched_tokens)
      .def_readwrite("max_model_len", &PlannerConfig::max_model_len)
      .def_readwrite("enable_prefix_caching", &PlannerConfig::enable_prefix_caching);

  py::class_<PlanHandle, std::shared_ptr<PlanHandle>>(m, "PlanHandle")
      .def("wait",
           [](PlanHandle& h) {
             StepPlan plan;
             {
               py::gil_scoped_release release;
               plan = h.wait();
             }
             return plan_to_python(plan);
           },
           "Blocks until the plan is ready: ([(seq_id, start, num_query_tokens)], [preempted], "
           "[(seq_id, tokens found in the prefix cache)]).")
      .def_property_readonly("ready", &PlanHandle::ready);

  py::class_<Planner>(m, "Planner")
      .def(py::init<const PlannerConfig&>())
      .def("add_request", &Planner::add_request, py::arg("seq_id"), py::arg("num_tokens"),
           py::arg("tokens") = std::vector<int32_t>(),
           "Queues a request of num_tokens tokens; with prefix caching, tokens (its ids) are matched "
           "against the cache when it is admitted.")
      .def("append_tokens", &Planner::append_tokens, py::arg("seq_id"), py::arg("num_new"))
      .def("truncate", &Planner::truncate, py::arg("seq_id"), py::arg("length"))
      .def("commit", &Planner::commit, py::arg("seq_id"), py::arg("num_computed"))
      .def("cache_prefix", &Planner::cache_prefix, py::arg("seq_id"), py::arg("tokens"), py::arg("num_valid"),
           "With prefix caching: caches a running sequence's full pages among the first num_valid "
           "positions of tokens (KV valid there in every model).")
      .def("reset_prefix_cache", &Planner::reset_prefix_cache,
           "Frees the prefix cache's pages no sequence holds; returns how many.")
      .def("finish", &Planner::finish, py::arg("seq_id"), py::arg("tokens") = std::vector<int32_t>(),
           py::arg("num_valid") = 0,
           "Releases a sequence; with prefix caching its full pages among the first num_valid "
           "positions of tokens (KV valid there in every model) are cached.")
      .def("schedule", [](Planner& self, int32_t lookahead) { return plan_to_python(self.schedule(lookahead)); },
           py::arg("lookahead") = 0,
           "Plan the next step: ([(seq_id, start, num_query_tokens)], [preempted seq_ids], "
           "[(seq_id, tokens found in the prefix cache)]).")
      .def("schedule_async", &Planner::schedule_async, py::arg("lookahead") = 0, py::keep_alive<0, 1>(),
           "Plan the next step on the planner's worker thread; returns a PlanHandle.")
      .def("page_table", &Planner::page_table, py::arg("seq_id"))
      .def("num_computed", &Planner::num_computed, py::arg("seq_id"))
      .def("num_tokens", &Planner::num_tokens, py::arg("seq_id"))
      .def("has", &Planner::has, py::arg("seq_id"))
      .def_property_readonly("num_free_pages", &Planner::num_free_pages,
                             "Pages a sequence can get: free ones and cached ones no sequence holds.")
      .def_property_readonly("num_cached_pages", &Planner::num_cached_pages)
      .def_property_readonly("num_waiting", &Planner::num_waiting)
      .def_property_readonly("num_running", &Planner::num_running)
      .def_property_readonly("page_size", [](const Planner& p) { return p.config().page_size; })
      .def_property_readonly("max_model_len", [](const Planner& p) { return p.config().max_model_len; })
      .def("build_metadata", &planner_metadata, py::arg("seq_ids"), py::arg("starts"), py::arg("num_query"),
           py::arg("trees"), py::arg("sliding_window"), py::arg("want_mask"),
           "_C.build_metadata over the planner's own page tables (rows given as int64 arrays).");

  m.def("build_metadata", &build_metadata, py::arg("rows"), py::arg("trees"), py::arg("page_size"),
        py::arg("sliding_window"), py::arg("want_mask"),
        "Step attention metadata: rows [(start, num_query, page_table)], trees None or per row "
        "None | (begin, bits, positions); returns a dict of numpy arrays.");
}

}  // namespace sonarspec
