#pragma once
// A side CUDA stream for an augmenter, so that its host-to-device copies and random stages
// do not serialise with the trainer's work on the default stream. Compiled in whenever
// LibTorch has CUDA (SEGFLOW_WITH_CUDA, cmake/SegflowDeps.cmake); used only when
// torch::cuda::is_available() at run time. On the CPU every member is a no-op.
//
// A batch made on the side stream is handed over without blocking the augmenter: an event is
// recorded on the side stream after the batch's last kernel, and the consumer's stream waits
// on it (ready_fence(), run on the trainer's thread) before its first kernel on the batch.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
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
  /// Waits on the host until everything queued on the side stream is done.
  void synchronize();
  /// Records an event on the side stream now and returns what makes the *calling thread's*
  /// current stream wait for it (cudaStreamWaitEvent: the host does not block). Empty when
  /// no side stream is in use.
  std::function<void()> ready_fence();
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
