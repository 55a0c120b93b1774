#pragma once
// Optimizers (SGD, Adam, AdamW) from a small options struct, learning-rate schedules
// (constant, poly, cosine; linear warmup) as a plain function of the step, gradient
// clipping by global norm, and the mixed-precision loss scaler.
//
// The training step never reads the device (models/training/trainer.hpp): FusedOptimizer runs one
// ATen fused kernel over all parameters (_fused_sgd_, _fused_adam_, _fused_adamw_; CPU and
// CUDA kernels) and skips the update on the device when the step's found-inf flag is set;
// GradScaler keeps the loss scale, its growth tracker and that flag as device tensors and
// updates them with _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_;
// clip_grad_norm_ leaves the norm on the device.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/weights.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::models {

struct OptimizerOptions {
  std::string name = "adamw";                  ///< sgd | adam | adamw
  double lr = 1e-3;                            ///< base learning rate, > 0
  double momentum = 0.9;                       ///< sgd only, in [0, 1) (nnU-Net uses 0.99)
  bool nesterov = false;                       ///< sgd only; needs momentum > 0
  double weight_decay = 0.0;                   ///< >= 0; L2 for sgd/adam, decoupled for adamw
  std::array<double, 2> betas = {0.9, 0.999};  ///< adam/adamw, each in [0, 1)
  double eps = 1e-8;                           ///< adam/adamw, > 0
  /// fused: ATen's fused kernel for all parameters at once, the step skipped on the device
  /// when found_inf is set; reference: torch::optim, one parameter at a time, found_inf
  /// read on the host (the baseline the fused path is tested and benchmarked against).
  std::string impl = "fused";

  Status validate() const;
  /// Reads a job config's `optimizer` section (pipeline/options.hpp), then validate().
  void bind(pipeline::OptionParser& p);
};
/// Every option, defaults included (what a run folder's config.json holds).
void to_json(nlohmann::json& j, const OptimizerOptions& options);

/// Builds the optimizer over the parameters that require grad. invalid_argument for a bad
/// name (listing sgd, adam, adamw) or value, or when no parameter requires grad.
Result<std::unique_ptr<torch::optim::Optimizer>> make_optimizer(const OptimizerOptions& options,
                                                                const std::vector<at::Tensor>& parameters);

/// {"name", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps", "impl"}; unknown
/// keys and bad values are errors naming `where` and the key ("optimizer.lrr: unknown
/// option; expected name, lr, ...").
Result<OptimizerOptions> parse_optimizer_options(const nlohmann::json& j,
                                                 const std::string& where = "optimizer");

enum class ScheduleKind { constant, poly, cosine };

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::poly;
  int64_t warmup_steps = 0;    ///< linear warmup: lr = base (step + 1) / warmup_steps
  double poly_exponent = 0.9;  ///< poly: base (1 - progress)^exponent (nnU-Net)
  double min_lr = 0.0;         ///< floor reached at the end of poly and cosine, >= 0

  Status validate() const;
  /// Reads a `schedule` section; "name" sets kind (pipeline/options.hpp).
  void bind(pipeline::OptionParser& p);
};
/// Every option, defaults included; kind as "name".
void to_json(nlohmann::json& j, const ScheduleOptions& options);

/// {"name": "constant"|"poly"|"cosine" (default poly), "warmup_steps", "poly_exponent",
/// "min_lr"}; errors name `where` and the key.
Result<ScheduleOptions> parse_schedule_options(const nlohmann::json& j,
                                               const std::string& where = "schedule");

/// Learning rate as a function of the step. After warmup, progress p = (step - warmup) /
/// (total - warmup) in [0, 1]: constant base; poly min + (base - min)(1 - p)^exponent;
/// cosine min + (base - min)(1 + cos(pi p)) / 2.
class LrSchedule {
 public:
  LrSchedule(ScheduleOptions options, double base_lr);
  /// Step counts from 0; total_steps is the number of steps of the whole run.
  double lr_at(int64_t step, int64_t total_steps) const;
  const ScheduleOptions& options() const { return options_; }
  double base_lr() const { return base_lr_; }

 private:
  ScheduleOptions options_;
  double base_lr_;
};

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// Scales gradients so their global L2 norm is at most max_norm; returns the norm before
/// clipping (may be inf/NaN: callers may skip the step then). Undefined grads are ignored.
/// Reads the norm on the host: for tests and tools, not the training step.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

/// The same without a host read: foreach norms, one scale factor min(1, max_norm / (norm +
/// 1e-6)) applied to every gradient on their device. Returns the total norm as a 0-d float
/// tensor on that device (undefined when no parameter has a gradient). A non-finite norm
/// makes the factor 0 or NaN: callers skip such steps through GradScaler::found_inf().
/// `total_norm`, when defined, is the gradients' global L2 norm already computed (as
/// GradScaler::unscale_ returns it) and is used instead of computing it again.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           const at::Tensor& total_norm = {});

/// The gradients' global L2 norm as a 0-d float tensor on their device (foreach norms, no
/// host read); undefined when no parameter has a gradient.
at::Tensor grad_norm(const std::vector<at::Tensor>& parameters);

/// An optimizer whose step does not read the device. SGD (momentum, Nesterov, L2 weight
/// decay), Adam (L2) and AdamW (decoupled decay) as torch.optim defines them, with state
/// allocated up front (zeros, the parameters' memory format):
///  - impl fused: one _fused_sgd_/_fused_adam_/_fused_adamw_ call for all parameters with a
///    gradient. SGD runs with zero-initialised momentum and is_first_step=false, which for
///    dampening 0 equals torch's buf = grad on the first step and needs no host-side "first
///    step" flag (a skipped first step cannot leave uninitialised buffers behind). Adam's
///    step counts are 0-d float tensors on the device, incremented before the kernel and
///    decremented again by found_inf after it (what torch.optim does with fused=True).
///    Gradients whose strides differ from their parameter's (e.g. a channels-last weight
///    with a contiguous gradient) are copied to the parameter's layout first: the fused
///    kernels index parameter, gradient and state as flat memory.
///  - impl reference: torch::optim::SGD/Adam/AdamW (one parameter at a time); found_inf is
///    read on the host. The state maps both ways, so checkpoints do not depend on the impl.
/// Not thread-safe; one per trainer.
class FusedOptimizer {
 public:
  /// Over the parameters that require grad (all on one device, floating point).
  /// invalid_argument for bad options, no trainable parameter, or mixed devices.
  static Result<std::unique_ptr<FusedOptimizer>> create(const OptimizerOptions& options,
                                                        const std::vector<at::Tensor>& parameters);
  ~FusedOptimizer();

  /// One update of every parameter that has a gradient, from unscaled gradients.
  /// `found_inf`: a 0-d float tensor on the parameters' device, or undefined; a
  /// non-zero value makes the step change nothing (parameters, momentum, moments, step).
  void step(const at::Tensor& found_inf = {});
  /// Drops the gradients (set to none, as torch's zero_grad(set_to_none=true)).
  void zero_grad();
  void set_lr(double lr);
  double lr() const { return lr_; }
  const OptimizerOptions& options() const { return options_; }
  /// The parameters it updates, in order.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  bool fused() const { return options_.impl == "fused"; }

  /// The state as named tensors on the parameters' device: "momentum_<i>" (sgd with
  /// momentum > 0), "exp_avg_<i>", "exp_avg_sq_<i>", "step_<i>" (adam/adamw; the step a
  /// 0-d float count), i the parameter's position.
  TensorMap state() const;
  /// Copies a state from state() (on any device) into this optimizer's tensors on the
  /// parameters' device. invalid_argument naming the key for a missing or mis-shaped entry;
  /// nothing is changed then.
  Status load_state(const TensorMap& state);
  /// Reads the state of a torch::optim optimizer of the same kind over the same parameters
  /// (checkpoints written before FusedOptimizer existed; tensors on any device).
  Status load_torch_state(torch::optim::Optimizer& optimizer);

 private:
  FusedOptimizer() = default;
  void step_fused(const at::Tensor& found_inf);
  void step_reference(const at::Tensor& found_inf);
  OptimizerOptions options_;
  double lr_ = 1e-3;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> momentum_, exp_avg_, exp_avg_sq_;
  std::vector<at::Tensor> steps_;  ///< adam/adamw step counts, 0-d float on the device
  std::unique_ptr<torch::optim::Optimizer> reference_;
};

/// GradScaler settings (torch.amp.GradScaler's defaults).
struct GradScalerOptions {
  bool enabled = true;                  ///< false: S stays 1 (bf16, fp32); the check still runs
  double init_scale = 65536.0;          ///< S at the start, > 0 (2^16, as torch)
  double growth_factor = 2.0;           ///< > 1
  double backoff_factor = 0.5;          ///< in (0, 1)
  std::int64_t growth_interval = 2000;  ///< finite steps between growths, >= 1
};

/// Dynamic loss scaling for fp16 (torch.amp.GradScaler's rules) and the non-finite check
/// every precision needs. Everything lives on the device and nothing is read on the host:
///  - scale(loss) = loss x S (enabled) or loss; backward of that gives S-scaled gradients;
///  - unscale_(params), enabled: one _amp_foreach_non_finite_check_and_unscale_ per dtype:
///    grads x 1/S in place, and found_inf() = 1 when any gradient holds an inf or NaN.
///    Disabled (bf16, fp32: nothing to unscale): found_inf() = 1 when the gradients' global
///    L2 norm is not finite (any inf or NaN makes it so, as does a sum of squares past
///    float32's range), one read-only foreach pass whose norm unscale_ returns for the clip
///    to reuse; this is how bf16 and fp32 steps with non-finite gradients are caught. A
///    second call in the same step does nothing (and returns an undefined tensor);
///  - update(): _amp_update_scale_ (enabled): S x backoff_factor and the growth tracker
///    reset when found_inf, else the tracker + 1 and S x growth_factor once it reaches
///    growth_interval; adds found_inf to skipped_steps(); clears found_inf for the next step.
/// A step is skipped by giving found_inf() to FusedOptimizer::step. Not thread-safe.
class GradScaler {
 public:
  GradScaler(GradScalerOptions options, const c10::Device& device);

  at::Tensor scale(const at::Tensor& loss) const;
  at::Tensor unscale_(const std::vector<at::Tensor>& parameters);
  void update();

  /// 0-d float tensors on the device.
  const at::Tensor& found_inf() const { return found_inf_; }
  const at::Tensor& scale_tensor() const { return scale_; }
  /// Steps whose gradients were not finite since construction (or load), 0-d float.
  const at::Tensor& skipped_steps() const { return skipped_; }
  const GradScalerOptions& options() const { return options_; }
  const c10::Device& device() const { return device_; }

  /// Host reads, for checkpoints and tests (each one a device sync).
  double scale_value() const;
  std::int64_t growth_tracker_value() const;
  std::int64_t skipped_value() const;
  /// Sets the state (from a checkpoint) on this scaler's device.
  void load(double scale, std::int64_t growth_tracker, std::int64_t skipped);

 private:
  GradScalerOptions options_;
  c10::Device device_;
  at::Tensor scale_, growth_tracker_, found_inf_, skipped_;
  bool unscaled_ = false;
};

}  // namespace segflow::models
