// Standalone microbenchmark of planning one decode step: Planner::schedule (admission,
// page growth with lookahead slots) plus the step's attention metadata
// (build_step_metadata, native key ranges and the SDPA mask), for 1 to 1024 sequences
// and several context lengths.
//   bench_planner [--quick] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sonarspec/planner.h"
#include "sonarspec/step_metadata.h"

namespace {

struct Result {
  int num_seqs, context;
  double schedule_us, metadata_us, plan_us;
};

Result run(int num_seqs, int context, int steps) {
  using clock = std::chrono::steady_clock;
  sonarspec::PlannerConfig cfg;
  cfg.page_size = 16;
  cfg.max_num_seqs = num_seqs;
  cfg.max_num_batched_tokens = 1 << 20;
  cfg.max_model_len = context + steps + 64;
  cfg.num_pages = num_seqs * ((cfg.max_model_len + 15) / 16 + 2);
  sonarspec::Planner planner(cfg);
  for (int i = 0; i < num_seqs; ++i) planner.add_request(i, context);
  planner.schedule(4);  // prefill
  std::vector<std::vector<int32_t>> tables(num_seqs);
  std::vector<sonarspec::MetadataRow> rows(num_seqs);
  sonarspec::StepMetadata meta;
  std::vector<double> sched, build;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < num_seqs; ++i) planner.append_tokens(i, 1);
    auto t0 = clock::now();
    sonarspec::StepPlan plan = planner.schedule(4);
    auto t1 = clock::now();
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      tables[i] = planner.page_table(plan.seqs[i].seq_id);
      rows[i].start = plan.seqs[i].start;
      rows[i].num_query = plan.seqs[i].num_query_tokens;
      rows[i].pages = tables[i].data();
      rows[i].num_pages = static_cast<int32_t>(tables[i].size());
    }
    sonarspec::build_step_metadata(rows, cfg.page_size, 0, false, meta);
    auto t2 = clock::now();
    sched.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    build.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double a = median(sched), b = median(build);
  return {num_seqs, context, a, b, a + b};
}

}  // namespace

int main(int argc, char** argv) {
  const sonarspec::bench::Args args = sonarspec::bench::parse_args(argc, argv, "bench_planner");
  const bool quick = args.quick;
  const std::vector<int> seqs = {1, 8, 64, 256, 1024};
  const std::vector<int> contexts = quick ? std::vector<int>{512} : std::vector<int>{128, 512, 2048};
  const int steps = quick ? 50 : 200;
  std::string out = "{\"results\": [";
  for (int ctx : contexts)
    for (int n : seqs) {
      Result r = run(n, ctx, steps);
      std::printf("seqs %5d context %5d: schedule %8.2f us  metadata %8.2f us  plan %8.2f us\n", r.num_seqs,
                  r.context, r.schedule_us, r.metadata_us, r.plan_us);
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "%s{\"num_seqs\": %d, \"context\": %d, \"schedule_us\": %.2f, \"metadata_us\": %.2f, "
                    "\"plan_us\": %.2f}",
                    out.size() > 13 ? ", " : "", r.num_seqs, r.context, r.schedule_us, r.metadata_us, r.plan_us);
      out += buf;
    }
  out += "]}\n";
  return sonarspec::bench::write_file(args.json, out, "bench_planner") ? 0 : 1;
}
