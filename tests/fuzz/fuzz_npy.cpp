// Fuzz harness: a .npy file (magic, version, header dict, data) as a tensor and as an image.
#include <ATen/ATen.h>

#include "fuzz_target.hpp"
#include "pipeline/io/npy.hpp"

SEGFLOW_FUZZ_TARGET(npy) {
  const auto file = write_input("input.npy", data, size);
  auto tensor = pipeline::read_npy(file);
  if (tensor.is_ok()) {
    invariant(tensor->defined() && tensor->is_contiguous(),
              "read_npy returned an undefined or strided tensor");
    (void)tensor->to(at::kDouble).sum().item<double>();
  }
  auto image = pipeline::read_npy_image(file);
  if (image.is_ok()) check_image(*image);
  return 0;
}
