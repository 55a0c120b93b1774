// Connected components of a mask read from a .npy file (bench/cc_bench.py writes it):
// one JSON line with the best of --repeat wall times of pipeline::label_components.
// usage: segflow_cc_bench MASK.npy [--connectivity 26] [--repeat 3]
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "pipeline/connected_components.hpp"
#include "pipeline/io/image_io.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: segflow_cc_bench MASK.npy [--connectivity 26] [--repeat 3]\n");
    return 2;
  }
  int connectivity = 26, repeat = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--connectivity") connectivity = std::atoi(argv[i + 1]);
    if (k == "--repeat") repeat = std::atoi(argv[i + 1]);
  }
  auto img = segflow::pipeline::read_image(argv[1]);
  if (!img.is_ok()) {
    std::fprintf(stderr, "segflow_cc_bench: %s\n", img.status().message().c_str());
    return 1;
  }
  at::Tensor mask = img->voxels;
  while (mask.dim() > 3) mask = mask[0];
  mask = mask.to(at::kBool).contiguous();
  double best = 1e30;
  std::int64_t count = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto c = segflow::pipeline::label_components(mask, connectivity);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!c.is_ok()) {
      std::fprintf(stderr, "segflow_cc_bench: %s\n", c.status().message().c_str());
      return 1;
    }
    count = c->count();
    best = std::min(best, s);
  }
  std::printf("{\"seconds\": %.6f, \"components\": %lld}\n", best, static_cast<long long>(count));
  return 0;
}
