// Shared pieces of the fuzz harnesses (fuzz_target.hpp).
#include <ATen/ATen.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "fuzz_target.hpp"
#include "messages/geometry.hpp"
#include "messages/log.hpp"

namespace segflow::fuzz {

const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("segflow-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::filesystem::path write_input(const std::string& name, const std::uint8_t* data, std::size_t size) {
  auto p = scratch_dir() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  invariant(f.good(), "cannot write the fuzz input to " + p.string());
  return p;
}

void invariant(bool ok, std::string_view what) {
  if (ok) return;
  std::fprintf(stderr, "segflow fuzz: broken promise: %.*s\n", static_cast<int>(what.size()), what.data());
  std::fflush(stderr);
  std::abort();
}

void check_image(const pipeline::Image& image) {
  const at::Tensor& v = image.voxels;
  invariant(v.defined(), "image voxels undefined");
  invariant(v.dim() == 4, "image voxels are not (C, Z, Y, X)");
  invariant(v.numel() > 0, "image has no voxel");
  invariant(v.is_contiguous(), "image voxels not contiguous");
  invariant(v.device().is_cpu(), "image voxels not on the CPU");
  const Geometry& g = image.geometry;
  for (double s : g.spacing) invariant(std::isfinite(s) && s > 0, "spacing not finite and > 0");
  for (double o : g.origin) invariant(std::isfinite(o), "origin not finite");
  invariant(direction_is_orthonormal(g.direction), "direction not orthonormal");
  const Size3 size = image.size();
  invariant(size[0] * size[1] * size[2] * image.channels() == v.numel(), "size() disagrees with the tensor");
  // Touch every voxel (a read past the buffer shows under ASan).
  (void)v.to(at::kDouble).sum().item<double>();
}

}  // namespace segflow::fuzz

#ifdef SEGFLOW_LIBFUZZER
// Once per fuzzing process: no log lines per input (readers warn about odd files, which is
// most of what a fuzzer writes) and one intra-op thread, so executions are cheap.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  segflow::log::set_level(segflow::log::Level::off);
  at::set_num_threads(1);
  return 0;
}
#endif
