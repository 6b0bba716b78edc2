// Standalone microbenchmark of the small-M GEMM (float32 and bfloat16 weights): time per
// call for d x d weights and M rows, and each M's cost relative to M = 1.
//   bench_gemm [--quick] [--json PATH] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sonarspec/small_gemm.h"

namespace {

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

}  // namespace

int main(int argc, char** argv) {
  const sonarspec::bench::Args args = sonarspec::bench::parse_args(argc, argv, "bench_gemm");
  const bool quick = args.quick;
  const int threads = args.threads;
  std::vector<int> dims = quick ? std::vector<int>{1024} : std::vector<int>{1024, 2048};
  std::vector<int> ms = quick ? std::vector<int>{1, 4, 8} : std::vector<int>{1, 2, 3, 4, 5, 6, 8, 16};
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  std::string out = "[";
  for (int d : dims) {
    std::vector<float> w(static_cast<size_t>(d) * d), x(16 * static_cast<size_t>(d)), y(16 * static_cast<size_t>(d));
    for (auto& v : w) v = nd(rng);
    for (auto& v : x) v = nd(rng);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = to_bf16(w[i]);
    double base32 = 0, base16 = 0;
    for (int m : ms) {
      const int reps = quick ? 50 : 200;
      double f32 = sonarspec::bench::median_us([&] { sonarspec::small_gemm_f32(x.data(), w.data(), nullptr, y.data(), m, d, d, threads); }, reps);
      double b16 = sonarspec::bench::median_us([&] { sonarspec::small_gemm_bf16w(x.data(), wb.data(), nullptr, y.data(), m, d, d, threads); }, reps);
      if (m == 1) { base32 = f32; base16 = b16; }
      std::printf("d %5d M %2d: float32 weights %8.1f us (%.2fx M=1)   bfloat16 weights %8.1f us (%.2fx M=1)\n", d, m,
                  f32, f32 / base32, b16, b16 / base16);
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s{\"d\": %d, \"m\": %d, \"threads\": %d, \"f32_us\": %.2f, \"bf16w_us\": %.2f}",
                    out.size() > 1 ? ", " : "", d, m, threads, f32, b16);
      out += buf;
    }
  }
  out += "]\n";
  return sonarspec::bench::write_file(args.json, out, "bench_gemm") ? 0 : 1;
}
