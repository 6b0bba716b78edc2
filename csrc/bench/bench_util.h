// Shared by the standalone microbenchmarks: timing, the common command line and the JSON file.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace sonarspec::bench {

// Median over five batches of `reps` calls, microseconds per call.
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

struct Args {
  bool quick = false;
  int threads = 2;
  std::string json;
};

// [--quick] [--json PATH] [--threads N]; exits with a usage line on anything else.
inline Args parse_args(int argc, char** argv, const char* name) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--quick") a.quick = true;
    else if (s == "--json" && i + 1 < argc) a.json = argv[++i];
    else if (s == "--threads" && i + 1 < argc) a.threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--json PATH] [--threads N]\n", name);
      std::exit(2);
    }
  }
  return a;
}

// Writes text to path (nothing when path is empty); false when the file cannot be written.
inline bool write_file(const std::string& path, const std::string& text, const char* name) {
  if (path.empty()) return true;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "%s: cannot write %s\n", name, path.c_str());
    return false;
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return true;
}

}  // namespace sonarspec::bench
