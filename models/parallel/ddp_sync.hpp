#pragma once
// Data-parallel gradient synchronisation with DDP's own machinery: a c10d::Reducer over the
// trainer's parameters, on a Collective's process group (Gloo or NCCL).
//
// - Buckets: parameters are grouped (c10d::compute_bucket_assignment_by_size, a small first
//   bucket of first_bucket_cap_mb, then bucket_cap_mb each, in reverse parameter order as
//   DDP does, since gradients arrive roughly last layer first). During backward the
//   reducer's autograd hooks copy each gradient into its bucket, divided by the world size,
//   and start the bucket's all-reduce (sum) as soon as the bucket is full, so communication
//   overlaps the rest of backward. The end of backward waits for all buckets and writes the
//   averaged gradients back into param.grad(). After the first synchronised step the
//   buckets are rebuilt once in the order gradients actually arrived (DDP's
//   rebuild_buckets).
// - Accumulation: before_backward(loss, sync=false) does nothing, so the reducer's hooks
//   stay idle and gradients add up locally (DDP's no_sync); the last micro-batch
//   (sync=true) reduces the accumulated sums. after_backward(synced=false) (the epoch ended
//   mid-accumulation, nothing reduced yet) does one bucketed allreduce-average of the
//   gradients instead.
// - Start: parameters and buffers are broadcast from rank 0 on construction, after checking
//   that every rank has the same parameter shapes (c10d::verify_params_across_processes).
// - Batch norm: no SyncBatchNorm. In training each rank normalises with its own batch's
//   statistics (as DDP without SyncBatchNorm; with per-device batch b the statistics are
//   over b samples, not b x world). The running statistics (buffers) are rank 0's: they
//   are broadcast at the start and again after every step's backward (DDP's
//   broadcast_buffers=true, which does it before each forward; here it cannot go between
//   forward and backward, whose batch-norm backward reads the saved statistics), so every
//   rank validates and checkpoints the same model.
//   segflow's UNets use instance norm by default, which has no buffers and no cross-sample
//   statistics, so none of this matters for them.
// - Unused parameters: every trainable parameter must get a gradient on every step
//   (find_unused_parameters=false, DDP's default); a model that skips some is an error
//   from the reducer on the next step.
//
// Threads: one DdpGradientSync per rank, called from that rank's training thread only.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "messages/status.hpp"
#include "models/fwd.hpp"
#include "models/training/trainer.hpp"

namespace c10d {
class Reducer;
}
namespace torch::nn {
class Module;
}

namespace segflow::models::parallel {

struct DdpOptions {
  double bucket_cap_mb = 25.0;       ///< bucket size in MiB (DDP's bucket_cap_mb), > 0
  double first_bucket_cap_mb = 1.0;  ///< the first bucket, small so communication starts early, > 0
  bool broadcast_buffers = true;     ///< rank 0's buffers to all after each step's backward
};

class DdpGradientSync final : public GradientSync {
 public:
  /// Synchronises `params` (leaf tensors that require grad, the optimizer's list) of
  /// `module` over `collective`. Broadcasts the module's parameters and buffers from rank 0.
  /// Collective: every rank calls it at the same point.
  static Result<std::shared_ptr<DdpGradientSync>> create(torch::nn::Module& module,
                                                         std::vector<at::Tensor> params,
                                                         std::shared_ptr<Collective> collective,
                                                         DdpOptions options = {});
  /// The same for a trainer's model and parameters (attach it with set_gradient_sync).
  static Result<std::shared_ptr<DdpGradientSync>> create(Trainer& trainer,
                                                         std::shared_ptr<Collective> collective,
                                                         DdpOptions options = {});
  ~DdpGradientSync() override;

  bool all_have(bool have_batch) override;
  bool any(bool flag) override;
  void before_backward(const at::Tensor& loss, bool sync) override;
  void after_backward(bool synced) override;

  /// Buckets of the initial assignment (before the one rebuild).
  std::size_t num_buckets() const { return num_buckets_; }
  /// Synchronised steps (reducer all-reduces) and fallback all-reduces (synced=false) so far.
  std::int64_t reduced_steps() const { return reduced_steps_; }
  std::int64_t fallback_steps() const { return fallback_steps_; }
  const Collective& collective() const { return *collective_; }

 private:
  DdpGradientSync() = default;
  std::shared_ptr<Collective> collective_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> buffers_;
  DdpOptions options_;
  std::unique_ptr<c10d::Reducer> reducer_;
  std::size_t num_buckets_ = 0;
  std::int64_t reduced_steps_ = 0;
  std::int64_t fallback_steps_ = 0;
};

}  // namespace segflow::models::parallel
