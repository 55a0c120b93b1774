#include "actors/detail/device_stream.hpp"

#include <torch/torch.h>

#include <optional>

#if SEGFLOW_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace segflow::actors::detail {

struct DeviceStream::Impl {
#if SEGFLOW_WITH_CUDA
  explicit Impl(c10::cuda::CUDAStream s) : stream(s) {}
  c10::cuda::CUDAStream stream;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  int depth = 0;
#endif
};

DeviceStream::DeviceStream(const c10::Device& device) {
#if SEGFLOW_WITH_CUDA
  if (device.is_cuda() && torch::cuda::is_available()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    impl_ = std::make_unique<Impl>(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index));
  }
#else
  (void)device;
#endif
}

DeviceStream::~DeviceStream() = default;

bool DeviceStream::active() const { return impl_ != nullptr; }

void DeviceStream::enter() {
#if SEGFLOW_WITH_CUDA
  if (impl_ && impl_->depth++ == 0) impl_->guard.emplace(impl_->stream);
#endif
}

void DeviceStream::leave() {
#if SEGFLOW_WITH_CUDA
  if (impl_ && --impl_->depth == 0) impl_->guard.reset();
#endif
}

void DeviceStream::synchronize() {
#if SEGFLOW_WITH_CUDA
  if (impl_) impl_->stream.synchronize();
#endif
}

std::function<void()> DeviceStream::ready_fence() {
#if SEGFLOW_WITH_CUDA
  if (!impl_) return {};
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(impl_->stream);
  const c10::DeviceIndex index = impl_->stream.device_index();
  return [event, index] { event->block(c10::cuda::getCurrentCUDAStream(index)); };
#else
  return {};
#endif
}

void DeviceStream::hand_over(const at::Tensor& t) {
#if SEGFLOW_WITH_CUDA
  if (impl_ && t.defined() && t.is_cuda())
    t.record_stream(c10::cuda::getDefaultCUDAStream(t.device().index()).unwrap());
#else
  (void)t;
#endif
}

}  // namespace segflow::actors::detail
