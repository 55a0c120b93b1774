// The parts of a training step that issue 17 moved onto the device, old way against new, on
// the spleen recipe's UNet (16-256 channels, 2 residual units, batch norm): the optimizer
// step (torch::optim one parameter at a time vs one fused kernel), the fp16 unscale and
// inf/NaN check (a multiply per gradient and a host-read clip norm vs one
// _amp_foreach_non_finite_check_and_unscale_ and a device-side clip), and the whole
// post-backward sequence of the trainer before and after. Prints JSON lines:
//   {"bench": "step_parts", "name": ..., "device": ..., "config": ..., "step_ms": median,
//    "min_ms": fastest run, "samples_per_s": 0, "tensors": parameter tensors,
//    "params": parameter count}
// usage: segflow_step_bench [--device cpu|cuda:N] [--reps N]
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "models/nets/registry.hpp"
#include "models/training/optim.hpp"

using namespace segflow;
using namespace segflow::models;

namespace {

void sync(const c10::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

/// Wall times of `f` in ms over `reps` runs after 3 warm-up runs, the device drained before
/// and after each run: {median, min} (the minimum is the figure to compare on a shared,
/// noisy machine).
std::pair<double, double> median_ms(const c10::Device& d, int reps, const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    sync(d);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    sync(d);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

}  // namespace

// Longer than a screen: one straight measurement script (parse, build, warm up, time,
// print), read top to bottom; cutting it would scatter the timing window.
int main(int argc, char** argv) {
  std::string device_text = "cpu";
  int reps = 30;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc)
      device_text = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: segflow_step_bench [--device cpu|cuda:N] [--reps N]\n");
      return 2;
    }
  }
  const c10::Device device(device_text);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "segflow_step_bench: --device %s: CUDA is not available\n", device_text.c_str());
    return 1;
  }
  auto model = create_model("unet", nlohmann::json{{"spatial_dims", 3},
                                                   {"in_channels", 1},
                                                   {"out_channels", 5},
                                                   {"channels", {16, 32, 64, 128, 256}},
                                                   {"strides", {2, 2, 2, 2}},
                                                   {"num_res_units", 2},
                                                   {"norm", "batch"}});
  if (!model.is_ok()) {
    std::fprintf(stderr, "segflow_step_bench: %s\n", model.status().message().c_str());
    return 1;
  }
  model->module().to(device);
  std::vector<at::Tensor> params = model->trainable_parameters();
  std::int64_t count = 0;
  for (const auto& p : params) count += p.numel();
  // Fixed gradients, restored before each timed run (the parts below change them in place).
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(torch::randn_like(p) * 1e-3);
  auto set_grads = [&](double scale) {
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) params[i].mutable_grad() = torch::empty_like(params[i]);
      params[i].mutable_grad().copy_(grads[i]).mul_(scale);
    }
  };
  const std::string config = "spleen UNet 16-256, 2 res units";
  auto emit = [&](const std::string& name, std::pair<double, double> ms) {
    nlohmann::json j = {
        {"bench", "step_parts"}, {"name", name},        {"device", device.str()}, {"config", config},
        {"step_ms", ms.first},   {"min_ms", ms.second}, {"samples_per_s", 0},     {"tensors", params.size()},
        {"params", count},       {"reps", reps}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  };

  for (const char* name : {"sgd", "adamw"}) {
    OptimizerOptions o;
    o.name = name;
    o.lr = 1e-4;
    for (const char* impl : {"reference", "fused"}) {
      o.impl = impl;
      auto opt = FusedOptimizer::create(o, params);
      if (!opt.is_ok()) return 1;
      const at::Tensor no_inf = torch::zeros({}, torch::TensorOptions().device(device));
      emit(std::string("optimizer ") + name + " " + impl, median_ms(device, reps, [&] {
             set_grads(1.0);
             (*opt)->step(no_inf);
           }));
    }
  }
  // fp16 unscale + check + clip: the trainer's old sequence and its new one.
  const double scale = 65536.0;
  emit("unscale+clip, old: per-gradient mul_, clip_grad_norm (host read)", median_ms(device, reps, [&] {
         set_grads(scale);
         torch::NoGradGuard ng;
         for (auto& p : params) p.mutable_grad().mul_(1.0 / scale);
         const double norm = torch::nn::utils::clip_grad_norm_(params, 1.0, 2.0, false);
         (void)norm;
       }));
  GradScaler scaler({}, device);
  emit("unscale+clip, new: GradScaler::unscale_, clip_grad_norm_ (device)", median_ms(device, reps, [&] {
         set_grads(scale);
         scaler.unscale_(params);
         clip_grad_norm_(params, 1.0);
         scaler.update();
       }));
  GradScaler check_only({.enabled = false}, device);
  emit("check+clip bf16/fp32, old: clip_grad_norm (host read), no check", median_ms(device, reps, [&] {
         set_grads(1.0);
         const double norm = torch::nn::utils::clip_grad_norm_(params, 1.0, 2.0, false);
         (void)norm;
       }));
  emit("check+clip bf16/fp32, new: one norm for the check and the clip (device)",
       median_ms(device, reps, [&] {
         set_grads(1.0);
         const at::Tensor norm = check_only.unscale_(params);
         clip_grad_norm_(params, 1.0, norm);
         check_only.update();
       }));
  emit("restoring the gradients (part of every line above)",
       median_ms(device, reps, [&] { set_grads(1.0); }));
  // The whole post-backward part of an fp16 SGD step, before and after.
  OptimizerOptions sgd;
  sgd.name = "sgd";
  sgd.lr = 1e-4;
  sgd.impl = "reference";
  auto ref = FusedOptimizer::create(sgd, params);
  sgd.impl = "fused";
  auto fused = FusedOptimizer::create(sgd, params);
  if (!ref.is_ok() || !fused.is_ok()) return 1;
  emit("post-backward fp16 sgd step, old (per parameter, 2 host reads)", median_ms(device, reps, [&] {
         set_grads(scale);
         torch::NoGradGuard ng;
         for (auto& p : params) p.mutable_grad().mul_(1.0 / scale);
         const double norm = torch::nn::utils::clip_grad_norm_(params, 1.0, 2.0, false);
         if (std::isfinite(norm)) (*ref)->step();
       }));
  emit("post-backward fp16 sgd step, new (fused, no host read)", median_ms(device, reps, [&] {
         set_grads(scale);
         scaler.unscale_(params);
         clip_grad_norm_(params, 1.0);
         (*fused)->step(scaler.found_inf());
         scaler.update();
       }));
  return 0;
}
