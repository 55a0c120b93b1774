#include "models/training/optim.hpp"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

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
  if (impl != "fused" && impl != "reference")
    return invalid_argument("optimizer: impl: expected one of fused, reference, got '" + impl + "'");
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
  p.choice("impl", impl, {"fused", "reference"},
           "fused: one ATen kernel for all parameters; reference: torch::optim, one at a time");
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
  at::Tensor norm = clip_grad_norm_(parameters, max_norm);
  return norm.defined() ? norm.item<double>() : 0.0;
}

at::Tensor grad_norm(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return {};
  torch::NoGradGuard no_grad;
  // Norms in float even for reduced-precision gradients, as torch's clip_grad_norm_ does.
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  return at::linalg_vector_norm(at::stack(norms).to(at::kFloat), 2);
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           const at::Tensor& total_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return {};
  torch::NoGradGuard no_grad;
  at::Tensor total = total_norm.defined() ? total_norm : grad_norm(parameters);
  at::Tensor coef = (total + 1e-6).reciprocal().mul_(max_norm).clamp_max_(1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

// ---------------------------------------------------------------------------- FusedOptimizer

namespace {

std::string shape_text(at::IntArrayRef s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

/// The reference optimizer's per-parameter state, created when missing.
template <class State>
State& param_state(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& states = opt.state();
  auto key = p.unsafeGetTensorImpl();
  auto it = states.find(key);
  if (it == states.end()) it = states.emplace(key, std::make_unique<State>()).first;
  return static_cast<State&>(*it->second);
}

/// Adam's or AdamW's per-parameter state (two unrelated classes with the same fields) as
/// named tensors; zeros when the parameter has not been stepped yet.
template <class State>
void read_adam_state(torch::optim::Optimizer& opt, const at::Tensor& p, const std::string& n,
                     TensorMap& out) {
  auto& states = opt.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) {
    out.emplace("exp_avg_" + n, at::zeros_like(p));
    out.emplace("exp_avg_sq_" + n, at::zeros_like(p));
    out.emplace("step_" + n, at::zeros({}, p.options().dtype(at::kFloat)));
    return;
  }
  auto& s = static_cast<State&>(*it->second);
  out.emplace("exp_avg_" + n, s.exp_avg());
  out.emplace("exp_avg_sq_" + n, s.exp_avg_sq());
  out.emplace("step_" + n, at::full({}, static_cast<double>(s.step()), p.options().dtype(at::kFloat)));
}

template <class State>
void write_adam_state(torch::optim::Optimizer& opt, const at::Tensor& p, const std::string& n,
                      const TensorMap& in) {
  const auto steps = static_cast<std::int64_t>(in.at("step_" + n).item<double>());
  if (steps == 0) {  // torch creates the state at the first step; zeros would change nothing
    opt.state().erase(p.unsafeGetTensorImpl());
    return;
  }
  auto& s = param_state<State>(opt, p);
  s.step(steps);
  s.exp_avg(in.at("exp_avg_" + n).to(p.options()).clone());
  s.exp_avg_sq(in.at("exp_avg_sq_" + n).to(p.options()).clone());
}

/// The state of a torch::optim optimizer of kind `name` over `params`, as named tensors.
TensorMap torch_state(torch::optim::Optimizer& opt, const std::string& name, double momentum,
                      const std::vector<at::Tensor>& params) {
  TensorMap out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string n = std::to_string(i);
    const auto& p = params[i];
    if (name == "sgd") {
      if (momentum <= 0) continue;
      auto& states = opt.state();
      auto it = states.find(p.unsafeGetTensorImpl());
      at::Tensor buf;
      if (it != states.end()) buf = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      out.emplace("momentum_" + n, buf.defined() ? buf : at::zeros_like(p));
    } else if (name == "adam") {
      read_adam_state<torch::optim::AdamParamState>(opt, p, n, out);
    } else {
      read_adam_state<torch::optim::AdamWParamState>(opt, p, n, out);
    }
  }
  return out;
}

}  // namespace

FusedOptimizer::~FusedOptimizer() = default;

Result<std::unique_ptr<FusedOptimizer>> FusedOptimizer::create(const OptimizerOptions& o,
                                                               const std::vector<at::Tensor>& parameters) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  std::unique_ptr<FusedOptimizer> f(new FusedOptimizer());
  f->options_ = o;
  f->lr_ = o.lr;
  for (const auto& p : parameters)
    if (p.requires_grad()) f->params_.push_back(p);
  if (f->params_.empty()) return invalid_argument("optimizer: no parameter requires grad");
  const c10::Device dev = f->params_.front().device();
  for (const auto& p : f->params_) {
    if (p.device() != dev)
      return invalid_argument("optimizer: parameters on " + dev.str() + " and " + p.device().str() +
                              "; expected one device");
    if (!at::isFloatingType(p.scalar_type()))
      return invalid_argument("optimizer: a parameter of type " +
                              std::string(c10::toString(p.scalar_type())) + "; expected floating point");
  }
  if (o.impl == "reference") {
    SEGFLOW_ASSIGN_OR_RETURN(f->reference_, make_optimizer(o, f->params_));
    return f;
  }
  torch::NoGradGuard no_grad;
  for (const auto& p : f->params_) {
    if (o.name == "sgd") {
      if (o.momentum > 0) f->momentum_.push_back(at::zeros_like(p));
    } else {
      f->exp_avg_.push_back(at::zeros_like(p));
      f->exp_avg_sq_.push_back(at::zeros_like(p));
      f->steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
    }
  }
  return f;
}

void FusedOptimizer::set_lr(double lr) {
  lr_ = lr;
  if (reference_) set_learning_rate(*reference_, lr);
}

void FusedOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

void FusedOptimizer::step(const at::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  if (reference_)
    step_reference(found_inf);
  else
    step_fused(found_inf);
}

void FusedOptimizer::step_reference(const at::Tensor& found_inf) {
  if (found_inf.defined() && found_inf.item<float>() != 0.0f) return;  // the host read fused avoids
  reference_->step();
}

void FusedOptimizer::step_fused(const at::Tensor& found_inf) {
  const auto& o = options_;
  std::vector<at::Tensor> ps, gs, m, v, st;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    // The kernels walk parameter, gradient and state as flat memory: same strides or wrong
    // updates (a channels-last weight may get a contiguous gradient, or the reverse).
    if (g.strides() != p.strides()) {
      at::Tensor same = at::empty_like(p);
      same.copy_(g);
      p.mutable_grad() = same;
      g = same;
    }
    ps.push_back(p);
    gs.push_back(g);
    if (o.name == "sgd") {
      if (o.momentum > 0) {
        TORCH_CHECK(momentum_[i].strides() == p.strides(), "optimizer: momentum buffer ", i,
                    " has other strides than its parameter");
        m.push_back(momentum_[i]);
      }
    } else {
      TORCH_CHECK(exp_avg_[i].strides() == p.strides() && exp_avg_sq_[i].strides() == p.strides(),
                  "optimizer: moment buffers of parameter ", i, " have other strides than the parameter");
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
      st.push_back(steps_[i]);
    }
  }
  if (ps.empty()) return;
  const std::optional<at::Tensor> inf =
      found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
  if (o.name == "sgd") {
    at::_fused_sgd_(ps, gs, m, o.weight_decay, o.momentum, lr_, /*dampening=*/0.0, o.nesterov,
                    /*maximize=*/false, /*is_first_step=*/false, /*grad_scale=*/std::nullopt, inf);
    return;
  }
  at::_foreach_add_(st, 1.0);
  if (o.name == "adam")
    at::_fused_adam_(ps, gs, m, v, {}, st, lr_, o.betas[0], o.betas[1], o.weight_decay, o.eps,
                     /*amsgrad=*/false, /*maximize=*/false, std::nullopt, inf);
  else
    at::_fused_adamw_(ps, gs, m, v, {}, st, lr_, o.betas[0], o.betas[1], o.weight_decay, o.eps,
                      /*amsgrad=*/false, /*maximize=*/false, std::nullopt, inf);
  // A skipped step does not count (torch.optim's fused Adam does the same).
  if (inf) at::_foreach_sub_(st, std::vector<at::Tensor>(st.size(), *inf));
}

TensorMap FusedOptimizer::state() const {
  const auto& o = options_;
  if (reference_) return torch_state(*reference_, o.name, o.momentum, params_);
  TensorMap out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string n = std::to_string(i);
    if (o.name == "sgd") {
      if (o.momentum > 0) out.emplace("momentum_" + n, momentum_[i]);
    } else {
      out.emplace("exp_avg_" + n, exp_avg_[i]);
      out.emplace("exp_avg_sq_" + n, exp_avg_sq_[i]);
      out.emplace("step_" + n, steps_[i]);
    }
  }
  return out;
}

Status FusedOptimizer::load_state(const TensorMap& state) {
  // Check everything before changing anything.
  const TensorMap mine = this->state();
  for (const auto& [name, t] : mine) {
    auto it = state.find(name);
    if (it == state.end() || !it->second.defined())
      return invalid_argument("optimizer state: missing '" + name + "' (" + options_.name + " over " +
                              std::to_string(params_.size()) + " parameters)");
    if (it->second.sizes() != t.sizes())
      return invalid_argument("optimizer state: '" + name + "': expected shape " + shape_text(t.sizes()) +
                              ", got " + shape_text(it->second.sizes()));
  }
  for (const auto& [name, t] : state)
    if (!mine.count(name))
      return invalid_argument("optimizer state: unexpected entry '" + name + "' for " + options_.name +
                              " over " + std::to_string(params_.size()) + " parameters");
  torch::NoGradGuard no_grad;
  if (!reference_) {
    // state() aliases the live tensors: copy_ keeps their device, dtype and strides.
    for (const auto& [name, t] : mine) t.copy_(state.at(name));
    return Status::ok();
  }
  const auto& o = options_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string n = std::to_string(i);
    const auto& p = params_[i];
    if (o.name == "sgd") {
      if (o.momentum <= 0) continue;
      param_state<torch::optim::SGDParamState>(*reference_, p)
          .momentum_buffer(state.at("momentum_" + n).to(p.options()).clone());
    } else if (o.name == "adam") {
      write_adam_state<torch::optim::AdamParamState>(*reference_, p, n, state);
    } else {
      write_adam_state<torch::optim::AdamWParamState>(*reference_, p, n, state);
    }
  }
  return Status::ok();
}

Status FusedOptimizer::load_torch_state(torch::optim::Optimizer& opt) {
  return load_state(torch_state(opt, options_.name, options_.momentum, params_));
}

// -------------------------------------------------------------------------------- GradScaler

GradScaler::GradScaler(GradScalerOptions options, const c10::Device& device)
    : options_(options), device_(device) {
  TORCH_CHECK(options_.init_scale > 0 && options_.growth_factor > 1 && options_.backoff_factor > 0 &&
                  options_.backoff_factor < 1 && options_.growth_interval >= 1,
              "GradScaler: expected init_scale > 0, growth_factor > 1, backoff_factor in (0, 1), "
              "growth_interval >= 1");
  const auto f = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({}, options_.enabled ? options_.init_scale : 1.0, f);
  growth_tracker_ = at::zeros({}, f.dtype(at::kInt));
  found_inf_ = at::zeros({}, f);
  skipped_ = at::zeros({}, f);
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

at::Tensor GradScaler::unscale_(const std::vector<at::Tensor>& parameters) {
  if (unscaled_) return {};
  unscaled_ = true;
  torch::NoGradGuard no_grad;
  if (!options_.enabled) {
    // Nothing to unscale: a read-only norm pass finds inf/NaN (on a CPU ~8x faster than the
    // check-and-multiply kernel, which writes every gradient back) and serves the clip too.
    at::Tensor norm = grad_norm(parameters);
    if (norm.defined()) found_inf_.copy_(at::isfinite(norm).logical_not());
    return norm;
  }
  // 1/S in double, then float (torch's GradScaler does the same).
  const at::Tensor inv = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& p : parameters)
    if (p.grad().defined()) by_dtype[p.grad().scalar_type()].push_back(p.grad());
  for (auto& [dtype, grads] : by_dtype)
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv);
  return {};
}

void GradScaler::update() {
  torch::NoGradGuard no_grad;
  if (options_.enabled)
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
  skipped_.add_(found_inf_);
  found_inf_.zero_();
  unscaled_ = false;
}

double GradScaler::scale_value() const { return scale_.item<double>(); }
std::int64_t GradScaler::growth_tracker_value() const { return growth_tracker_.item<std::int64_t>(); }
std::int64_t GradScaler::skipped_value() const { return static_cast<std::int64_t>(skipped_.item<double>()); }

void GradScaler::load(double scale, std::int64_t growth_tracker, std::int64_t skipped) {
  torch::NoGradGuard no_grad;
  scale_.fill_(options_.enabled ? scale : 1.0);
  growth_tracker_.fill_(growth_tracker);
  skipped_.fill_(static_cast<double>(skipped));
  found_inf_.zero_();
  unscaled_ = false;
}

}  // namespace segflow::models
