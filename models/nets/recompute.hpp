#pragma once
// Activation checkpointing (train.activation_checkpointing): a network stage run through
// recompute_stage() keeps only its input for the backward pass, not the activations inside it;
// backward runs the stage again, with the random state, autocast state and normalisation
// buffers it had the first time, and takes the gradients from that second run. Less memory
// per step (the activations of every stage but their inputs), for one more forward pass of
// those stages. Networks call it on their stages; the trainer turns it on around its training
// forward (RecomputeScope), so validation and inference, which keep no activations, are not
// affected.

#include <torch/torch.h>

#include <functional>

namespace segflow::models {

/// While one lives on a thread, recompute_stage() on that thread checkpoints (when `on`).
class RecomputeScope {
 public:
  explicit RecomputeScope(bool on);
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
  /// Whether recompute_stage() checkpoints on this thread now.
  static bool active();

 private:
  bool previous_;
};

/// `stage(x)`, the stage's parameters and buffers being those of `module`. Checkpointed when a
/// RecomputeScope is active on this thread and gradients are being recorded; else a plain call.
at::Tensor recompute_stage(torch::nn::Module& module,
                           const std::function<at::Tensor(const at::Tensor&)>& stage, const at::Tensor& x);

}  // namespace segflow::models
