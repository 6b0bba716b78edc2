// Peak multiply-add throughput of the CPU's dot-product instructions, with every register
// independent (no memory operands): the ceiling of a compute-bound GEMM. The block formats'
// kernels multiply with VPDPBUSD (64 int8 multiply-adds per 512-bit instruction), the bfloat16
// kernel with VDPBF16PS (32), so a verified row's products take at least (multiply-adds per
// token) / (the rate below x threads) - the time the weight stream has to hide for that row
// to cost nothing extra.
//   ./build/native/bench_dot_peak [--threads N] [--json PATH] [--quick]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"

namespace {

constexpr int kChains = 10;   // independent accumulators (DOT_CHAINS): more than latency x throughput

#define DOT_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16"), noinline))

// Each kernel runs `iters` rounds of kChains independent instructions and returns a value
// derived from the accumulators, so that the compiler keeps every instruction; the
// accumulators are ten named variables (an array would be kept in memory around the barrier).
#define DOT_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)
#define DOT_KEEP __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), \
                                  "+v"(a7), "+v"(a8), "+v"(a9))

DOT_ATTR float vpdpbusd_loop(long iters) {
#define DOT_INIT(c) __m512i a##c = _mm512_set1_epi32(c);
#define DOT_STEP(c) a##c = _mm512_dpbusd_epi32(a##c, w, x);
#define DOT_SUM(c) s = _mm512_add_epi32(s, a##c);
  DOT_CHAINS(DOT_INIT)
  const __m512i w = _mm512_set1_epi32(0x01010101), x = _mm512_set1_epi32(0x02020202);
  for (long i = 0; i < iters; ++i) {
    DOT_CHAINS(DOT_STEP)
    DOT_KEEP;
  }
  __m512i s = _mm512_setzero_si512();
  DOT_CHAINS(DOT_SUM)
  return static_cast<float>(_mm512_reduce_add_epi32(s));
#undef DOT_INIT
#undef DOT_STEP
#undef DOT_SUM
}

DOT_ATTR float vdpbf16ps_loop(long iters) {
#define DOT_INIT(c) __m512 a##c = _mm512_set1_ps(static_cast<float>(c));
#define DOT_STEP(c) a##c = _mm512_dpbf16_ps(a##c, w, x);
#define DOT_SUM(c) s = _mm512_add_ps(s, a##c);
  DOT_CHAINS(DOT_INIT)
  const __m512bh w = (__m512bh)_mm512_set1_epi16(0x3f80), x = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (long i = 0; i < iters; ++i) {
    DOT_CHAINS(DOT_STEP)
    DOT_KEEP;
  }
  __m512 s = _mm512_setzero_ps();
  DOT_CHAINS(DOT_SUM)
  return _mm512_reduce_add_ps(s);
#undef DOT_INIT
#undef DOT_STEP
#undef DOT_SUM
}

// Instructions per second over `threads` threads, each running fn(iters).
double rate(float (*fn)(long), long iters, int threads) {
  std::vector<std::thread> pool;
  std::vector<float> sink(static_cast<size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink[static_cast<size_t>(t)] = fn(iters); });
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(iters) * kChains * threads / s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sonarspec::bench;
  const Args args = parse_args(argc, argv, "bench_dot_peak");
  const long iters = args.quick ? 2000000 : 50000000;
  struct Kernel { const char* name; const char* feature; bool have; int macs; float (*fn)(long); };
  const Kernel kernels[] = {
      {"vpdpbusd_zmm", "avx512vnni", static_cast<bool>(__builtin_cpu_supports("avx512vnni")), 64, vpdpbusd_loop},
      {"vdpbf16ps_zmm", "avx512bf16", static_cast<bool>(__builtin_cpu_supports("avx512bf16")), 32, vdpbf16ps_loop}};
  std::string json = "{\n \"threads\": " + std::to_string(args.threads) + ",\n \"kernels\": [";
  bool first = true;
  for (const Kernel& k : kernels) {
    if (!k.have) {
      std::printf("%-14s skipped: the CPU lacks %s\n", k.name, k.feature);
      continue;
    }
    rate(k.fn, iters / 10, 1);   // warm-up (clock ramp)
    std::vector<double> one, all;
    for (int r = 0; r < 3; ++r) {
      one.push_back(rate(k.fn, iters, 1));
      all.push_back(rate(k.fn, iters, args.threads));
    }
    std::sort(one.begin(), one.end());
    std::sort(all.begin(), all.end());
    std::printf("%-14s 1 thread %.2f G/s (%.0f G multiply-adds/s); %d threads %.2f G/s (%.0f G multiply-adds/s)\n",
                k.name, one[1] / 1e9, one[1] * k.macs / 1e9, args.threads, all[1] / 1e9, all[1] * k.macs / 1e9);
    char row[256];
    std::snprintf(row, sizeof row,
                  "%s\n  {\"instruction\": \"%s\", \"macs_per_instruction\": %d, \"one_thread_per_s\": %.4g, "
                  "\"all_threads_per_s\": %.4g}", first ? "" : ",", k.name, k.macs, one[1], all[1]);
    json += row;
    first = false;
  }
  json += "\n ]\n}\n";
  return write_file(args.json, json, "bench_dot_peak") ? 0 : 1;
}
