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

#include "sonarspec/small_gemm.h"

namespace {

template <typename F>
double median_us(F&& fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int threads = 2;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else { std::fprintf(stderr, "usage: bench_gemm [--quick] [--json PATH] [--threads N]\n"); return 2; }
  }
  std::vector<int> dims = quick ? std::vector<int>{1024} : std::vector<int>{1024, 2048};
  std::vector<int> ms = quick ? std::vector<int>{1, 4, 8} : std::vector<int>{1, 2, 4, 8, 16};
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
      double f32 = median_us([&] { sonarspec::small_gemm_f32(x.data(), w.data(), nullptr, y.data(), m, d, d, threads); }, reps);
      double b16 = median_us([&] { sonarspec::small_gemm_bf16w(x.data(), wb.data(), nullptr, y.data(), m, d, d, threads); }, reps);
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
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) { std::fprintf(stderr, "bench_gemm: cannot write %s\n", json.c_str()); return 1; }
    std::fputs(out.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
