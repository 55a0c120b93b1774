#include "models/nets/recompute.hpp"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

namespace segflow::models {

namespace {

thread_local bool t_recompute = false;

/// What a checkpointed stage needs again in backward.
struct StageRecord : torch::CustomClassHolder {
  torch::nn::Module* module = nullptr;
  std::function<at::Tensor(const at::Tensor&)> stage;
  std::vector<at::Tensor> buffers_before;  ///< the module's buffers before the first run
  at::Tensor cpu_rng;                      ///< generator states before the first run
  at::Tensor cuda_rng;
  c10::Device device{c10::kCPU};
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kFloat;
  std::vector<bool> param_needs_grad;
};

std::vector<at::Tensor> buffers_of(torch::nn::Module& m) { return m.buffers(/*recurse=*/true); }

/// Sets the module's buffers to `values` (same order as buffers_of), in place.
void set_buffers(torch::nn::Module& m, const std::vector<at::Tensor>& values) {
  torch::NoGradGuard ng;
  auto bufs = buffers_of(m);
  for (std::size_t i = 0; i < bufs.size() && i < values.size(); ++i) bufs[i].copy_(values[i]);
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

at::Generator cuda_generator(const c10::Device& d) { return at::globalContext().defaultGenerator(d); }

class RecomputeFn : public torch::autograd::Function<RecomputeFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<StageRecord> rec, const at::Tensor& x,
                                                at::TensorList params) {
    // Gradients are off in a custom function's forward: the stage keeps no activations.
    rec->buffers_before = clones(buffers_of(*rec->module));
    rec->cpu_rng = at::detail::getDefaultCPUGenerator().get_state();
    rec->device = x.device();
    if (x.is_cuda()) rec->cuda_rng = cuda_generator(x.device()).get_state();
    const auto type = x.device().type();
    rec->autocast = at::autocast::is_autocast_available(type) && at::autocast::is_autocast_enabled(type);
    if (rec->autocast) rec->autocast_dtype = at::autocast::get_autocast_dtype(type);
    for (const auto& p : params) rec->param_needs_grad.push_back(p.requires_grad());
    at::Tensor y = rec->stage(x);
    ctx->saved_data["record"] = c10::IValue::make_capsule(rec);
    ctx->save_for_backward({x});
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto rec = c10::static_intrusive_pointer_cast<StageRecord>(ctx->saved_data["record"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0];
    torch::nn::Module& m = *rec->module;
    // The state of the first run: its buffers (normalisation statistics), random numbers and
    // autocast; what the step has now is put back afterwards.
    const std::vector<at::Tensor> buffers_now = clones(buffers_of(m));
    set_buffers(m, rec->buffers_before);
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    const at::Tensor cpu_now = cpu_gen.get_state();
    cpu_gen.set_state(rec->cpu_rng);
    at::Tensor cuda_now;
    if (rec->cuda_rng.defined()) {
      auto g = cuda_generator(rec->device);
      cuda_now = g.get_state();
      g.set_state(rec->cuda_rng);
    }
    const auto type = rec->device.type();
    const bool has_autocast = at::autocast::is_autocast_available(type);
    const bool ac_before = has_autocast && at::autocast::is_autocast_enabled(type);
    const at::ScalarType ac_dtype_before = has_autocast ? at::autocast::get_autocast_dtype(type) : at::kFloat;
    if (has_autocast) {
      at::autocast::set_autocast_enabled(type, rec->autocast);
      if (rec->autocast) at::autocast::set_autocast_dtype(type, rec->autocast_dtype);
    }

    std::vector<at::Tensor> params = m.parameters(/*recurse=*/true);
    torch::autograd::variable_list grads(2 + params.size());
    {
      at::AutoGradMode grad_on(true);
      at::Tensor xr = x.detach().requires_grad_(x.requires_grad());
      at::Tensor y = rec->stage(xr);
      std::vector<at::Tensor> inputs;
      std::vector<std::size_t> slot;  // where each input's gradient goes in `grads`
      if (x.requires_grad()) {
        inputs.push_back(xr);
        slot.push_back(1);
      }
      for (std::size_t i = 0; i < params.size(); ++i)
        if (i < rec->param_needs_grad.size() && rec->param_needs_grad[i]) {
          inputs.push_back(params[i]);
          slot.push_back(2 + i);
        }
      if (!inputs.empty()) {
        auto g = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
        for (std::size_t k = 0; k < g.size(); ++k) grads[slot[k]] = g[k];
      }
    }

    if (has_autocast) {
      at::autocast::set_autocast_enabled(type, ac_before);
      at::autocast::set_autocast_dtype(type, ac_dtype_before);
    }
    cpu_gen.set_state(cpu_now);
    if (cuda_now.defined()) cuda_generator(rec->device).set_state(cuda_now);
    set_buffers(m, buffers_now);
    return grads;
  }
};

}  // namespace

RecomputeScope::RecomputeScope(bool on) : previous_(t_recompute) { t_recompute = on; }
RecomputeScope::~RecomputeScope() { t_recompute = previous_; }
bool RecomputeScope::active() { return t_recompute; }

at::Tensor recompute_stage(torch::nn::Module& module,
                           const std::function<at::Tensor(const at::Tensor&)>& stage, const at::Tensor& x) {
  if (!t_recompute || !at::GradMode::is_enabled()) return stage(x);
  auto rec = c10::make_intrusive<StageRecord>();
  rec->module = &module;
  rec->stage = stage;
  const std::vector<at::Tensor> params = module.parameters(/*recurse=*/true);
  return RecomputeFn::apply(rec, x, at::TensorList(params))[0];
}

}  // namespace segflow::models
