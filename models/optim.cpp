#include "models/optim.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

#include "pipeline/options.hpp"

namespace segflow::models {

Status OptimizerOptions::validate() const {
  auto bad = [](const std::string& f, const std::string& e, double v) {
    return invalid_argument("optimizer: " + f + ": expected " + e + ", got " + std::to_string(v));
  };
  if (name != "sgd" && name != "adam" && name != "adamw")
    return invalid_argument("optimizer: name: expected one of sgd, adam, adamw, got '" + name + "'");
  if (!(lr > 0)) return bad("lr", "> 0", lr);
  if (!(momentum >= 0 && momentum < 1)) return bad("momentum", "a number in [0, 1)", momentum);
  if (nesterov && name == "sgd" && momentum == 0) return bad("momentum", "> 0 with nesterov", momentum);
  if (!(weight_decay >= 0)) return bad("weight_decay", ">= 0", weight_decay);
  for (double b : betas)
    if (!(b >= 0 && b < 1)) return bad("betas", "two numbers in [0, 1)", b);
  if (!(eps > 0)) return bad("eps", "> 0", eps);
  return Status::ok();
}

Result<std::unique_ptr<torch::optim::Optimizer>> make_optimizer(const OptimizerOptions& o,
                                                                const std::vector<at::Tensor>& parameters) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  std::vector<at::Tensor> params;
  for (const auto& p : parameters)
    if (p.requires_grad()) params.push_back(p);
  if (params.empty()) return invalid_argument("optimizer: no parameter requires grad");
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.name == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr)
                                                          .momentum(o.momentum)
                                                          .nesterov(o.nesterov)
                                                          .weight_decay(o.weight_decay));
  } else if (o.name == "adam") {
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr)
                                                           .betas({o.betas[0], o.betas[1]})
                                                           .eps(o.eps)
                                                           .weight_decay(o.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.lr)
                                                            .betas({o.betas[0], o.betas[1]})
                                                            .eps(o.eps)
                                                            .weight_decay(o.weight_decay));
  }
  return opt;
}

void OptimizerOptions::bind(pipeline::OptionParser& p) {
  using pipeline::Range;
  p.choice("name", name, {"sgd", "adam", "adamw"}, "SGD, Adam or AdamW (torch.optim's)");
  p.number("lr", lr, Range::positive(), "", "base learning rate (the schedule scales it)");
  p.number("momentum", momentum, Range{0.0, 1.0, false, true}, "", "SGD momentum (nnU-Net: 0.99)");
  p.boolean("nesterov", nesterov, "SGD Nesterov momentum (needs momentum > 0)");
  p.number("weight_decay", weight_decay, Range::non_negative(), "",
           "L2 penalty for sgd and adam, decoupled decay for adamw");
  p.numbers("betas", betas, Range{0.0, 1.0, false, true}, false, "", "Adam's moment decay rates");
  p.number("eps", eps, Range::positive(), "", "Adam's denominator term");
  if (p.ok()) p.check(validate(), "optimizer");
}

void to_json(nlohmann::json& j, const OptimizerOptions& options) { j = pipeline::resolved_options(options); }

Result<OptimizerOptions> parse_optimizer_options(const nlohmann::json& j, const std::string& where) {
  return pipeline::parse_options<OptimizerOptions>(j, where);
}

Status ScheduleOptions::validate() const {
  if (warmup_steps < 0)
    return invalid_argument("schedule: warmup_steps: expected >= 0, got " + std::to_string(warmup_steps));
  if (!(poly_exponent > 0))
    return invalid_argument("schedule: poly_exponent: expected > 0, got " + std::to_string(poly_exponent));
  if (!(min_lr >= 0))
    return invalid_argument("schedule: min_lr: expected >= 0, got " + std::to_string(min_lr));
  return Status::ok();
}

void ScheduleOptions::bind(pipeline::OptionParser& p) {
  using pipeline::Range;
  const char* names[] = {"constant", "poly", "cosine"};
  std::string name = names[static_cast<int>(kind)];
  p.choice("name", name, {"constant", "poly", "cosine"},
           "learning rate after warmup: constant, poly (1 - progress)^exponent, or cosine to min_lr");
  for (int k = 0; k < 3; ++k)
    if (name == names[k]) kind = static_cast<ScheduleKind>(k);
  p.integer("warmup_steps", warmup_steps, Range::non_negative(), "steps",
            "linear warmup: lr = base (step + 1) / warmup_steps");
  p.number("poly_exponent", poly_exponent, Range::positive(), "", "poly: base (1 - progress)^exponent");
  p.number("min_lr", min_lr, Range::non_negative(), "", "floor reached at the end of poly and cosine");
  if (p.ok()) p.check(validate(), "schedule");
}

void to_json(nlohmann::json& j, const ScheduleOptions& options) { j = pipeline::resolved_options(options); }

Result<ScheduleOptions> parse_schedule_options(const nlohmann::json& j, const std::string& where) {
  return pipeline::parse_options<ScheduleOptions>(j, where);
}

LrSchedule::LrSchedule(ScheduleOptions options, double base_lr) : options_(options), base_lr_(base_lr) {}

double LrSchedule::lr_at(int64_t step, int64_t total_steps) const {
  const auto& o = options_;
  if (step < 0) step = 0;
  if (step < o.warmup_steps)
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.kind == ScheduleKind::constant) return base_lr_;
  const int64_t span = std::max<int64_t>(total_steps - o.warmup_steps, 1);
  const double p =
      std::clamp(static_cast<double>(step - o.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  const double lo = std::min(o.min_lr, base_lr_);
  if (o.kind == ScheduleKind::poly) return lo + (base_lr_ - lo) * std::pow(1.0 - p, o.poly_exponent);
  return lo + (base_lr_ - lo) * 0.5 * (1.0 + std::cos(M_PI * p));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> with_grad;
  for (const auto& p : parameters)
    if (p.grad().defined()) with_grad.push_back(p);
  if (with_grad.empty()) return 0.0;
  return torch::nn::utils::clip_grad_norm_(with_grad, max_norm, 2.0, /*error_if_nonfinite=*/false);
}

}  // namespace segflow::models
