#pragma once
// A side CUDA stream for an augmenter, so that its host-to-device copies and random stages
// do not serialise with the trainer's work on the default stream. Compiled in only when the
// CUDA headers are there; used only when torch::cuda::is_available() at run time. On the
// CPU (or without CUDA) every member is a no-op.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace segflow::actors::detail {

class DeviceStream {
 public:
  /// A stream from LibTorch's pool for `device` (CUDA), else an inert object.
  explicit DeviceStream(const c10::Device& device);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  /// True when a side stream is in use.
  bool active() const;
  /// Makes the side stream current on this thread until leave() (CUDAStreamGuard).
  void enter();
  void leave();
  /// Waits until everything queued on the side stream is done (before a batch is handed
  /// to the trainer, which uses its own stream).
  void synchronize();
  /// Tells the caching allocator that `t` will be used on the device's default stream (the
  /// trainer's), so its memory is not reused by the side stream while that still runs.
  void hand_over(const at::Tensor& t);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// enter() / leave() as a scope.
class StreamScope {
 public:
  explicit StreamScope(DeviceStream& s) : s_(s) { s_.enter(); }
  ~StreamScope() { s_.leave(); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  DeviceStream& s_;
};

}  // namespace segflow::actors::detail
