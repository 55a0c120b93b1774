// The actors suite's CUDA case for the augmenter's side stream (run by scripts/gpu-check.sh;
// skipped with a message without a GPU, failed when SEGFLOW_REQUIRE_CUDA is set).
// actors/detail/device_stream.cpp compiles the stream in only when the CUDA headers are found
// (__has_include); without them every member is a silent no-op. This case makes that visible:
// on a GPU the stream must be active and must really become the current stream.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>

#include "actors/detail/device_stream.hpp"
#include "test_util.hpp"

using segflow::actors::detail::DeviceStream;
using segflow::actors::detail::StreamScope;

TEST_CASE("CUDA: DeviceStream(cuda:0) is active and is the current stream inside its scope") {
  if (!segflow::testing::cuda_or_skip()) return;
  const c10::Device gpu(c10::kCUDA, 0);
  DeviceStream side(gpu);
  REQUIRE_MESSAGE(side.active(),
                  "the side stream is compiled out: actors/detail/device_stream.cpp found no CUDA headers");
  const auto default_stream = c10::cuda::getDefaultCUDAStream(0);
  CHECK(c10::cuda::getCurrentCUDAStream(0) == default_stream);
  at::Tensor x;
  {
    StreamScope scope(side);
    CHECK(c10::cuda::getCurrentCUDAStream(0) != default_stream);
    x = at::arange(1024, at::TensorOptions().device(gpu).dtype(at::kFloat)) * 2;
    c10::cuda::getCurrentCUDAStream(0).synchronize();
  }
  CHECK(c10::cuda::getCurrentCUDAStream(0) == default_stream);  // the scope restored it
  CHECK(x.sum().item<double>() == doctest::Approx(1023.0 * 1024.0));
  CHECK_FALSE(DeviceStream(c10::Device(c10::kCPU)).active());
}
