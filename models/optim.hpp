#pragma once
// Optimizers (SGD, Adam, AdamW) from a small options struct, learning-rate schedules
// (constant, poly, cosine; linear warmup) as a plain function of the step, and gradient
// clipping by global norm.

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline {
class OptionParser;
}

namespace segflow::models {

struct OptimizerOptions {
  std::string name = "adamw";                  ///< sgd | adam | adamw
  double lr = 1e-3;                            ///< base learning rate, > 0
  double momentum = 0.9;                       ///< sgd only, in [0, 1) (nnU-Net uses 0.99)
  bool nesterov = false;                       ///< sgd only; needs momentum > 0
  double weight_decay = 0.0;                   ///< >= 0; L2 for sgd/adam, decoupled for adamw
  std::array<double, 2> betas = {0.9, 0.999};  ///< adam/adamw, each in [0, 1)
  double eps = 1e-8;                           ///< adam/adamw, > 0

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

/// {"name", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps"}; unknown keys and
/// bad values are errors naming `where` and the key ("optimizer.lrr: unknown option;
/// expected name, lr, ...").
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
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace segflow::models
