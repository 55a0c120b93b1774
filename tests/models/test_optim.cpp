// Optimizers, learning-rate schedules and gradient clipping.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "models/training/optim.hpp"
#include "test_util.hpp"

using namespace segflow::models;

namespace {
// Runs `steps` of the optimizer on f(x) = |x - c|^2 from x0 = 0 and returns the final f.
double minimise(const std::string& name, int steps, double lr) {
  auto x = torch::zeros({3}, torch::requires_grad());
  auto c = torch::tensor({1.0, -2.0, 3.0});
  OptimizerOptions o;
  o.name = name;
  o.lr = lr;
  o.weight_decay = name == "adamw" ? 0.01 : 0.0;
  REQUIRE_OK_AND_ASSIGN(auto opt, make_optimizer(o, {x}));
  for (int i = 0; i < steps; ++i) {
    opt->zero_grad();
    auto f = (x - c).pow(2).sum();
    f.backward();
    opt->step();
  }
  return (x - c).pow(2).sum().item<double>();
}
}  // namespace

TEST_CASE("SGD, Adam and AdamW decrease a quadratic") {
  const double start = 1 + 4 + 9;
  CHECK(minimise("sgd", 100, 0.05) < 1e-3 * start);  // momentum 0.9
  CHECK(minimise("adam", 200, 0.1) < 1e-2 * start);
  CHECK(minimise("adamw", 200, 0.1) < 1e-2 * start);
}

TEST_CASE("make_optimizer skips frozen parameters and rejects bad options") {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto frozen = torch::zeros({2});
  REQUIRE_OK_AND_ASSIGN(auto opt, make_optimizer(OptimizerOptions{"sgd"}, {a, frozen}));
  CHECK(opt->param_groups()[0].params().size() == 1);
  CHECK_FALSE(make_optimizer(OptimizerOptions{"sgd"}, {frozen}).is_ok());
  auto bad = make_optimizer(OptimizerOptions{"lamb"}, {a});
  CHECK(bad.status().message().find("sgd, adam, adamw") != std::string::npos);
  OptimizerOptions neg;
  neg.lr = -1;
  CHECK(neg.validate().message().find("lr") != std::string::npos);
  REQUIRE_OK_AND_ASSIGN(auto parsed,
                        parse_optimizer_options(nlohmann::json{
                            {"name", "sgd"}, {"lr", 0.01}, {"momentum", 0.99}, {"nesterov", true}}));
  CHECK(parsed.momentum == 0.99);
  CHECK(parsed.nesterov);
  auto unknown = parse_optimizer_options(nlohmann::json{{"name", "sgd"}, {"learning_rate", 0.01}});
  CHECK(unknown.status().message().find("learning_rate") != std::string::npos);
  auto betas = parse_optimizer_options(nlohmann::json{{"betas", {0.9}}});
  CHECK(betas.status().message().find("betas") != std::string::npos);
}

TEST_CASE("learning-rate schedules give their formula's value at known steps") {
  const double base = 0.01;
  LrSchedule constant({ScheduleKind::constant}, base);
  CHECK(constant.lr_at(0, 100) == base);
  CHECK(constant.lr_at(99, 100) == base);

  LrSchedule poly({ScheduleKind::poly}, base);
  CHECK(poly.lr_at(0, 100) == doctest::Approx(base));
  CHECK(poly.lr_at(50, 100) == doctest::Approx(base * std::pow(0.5, 0.9)));
  CHECK(poly.lr_at(100, 100) == doctest::Approx(0.0));

  LrSchedule cosine({ScheduleKind::cosine, 0, 0.9, 0.001}, base);
  CHECK(cosine.lr_at(0, 100) == doctest::Approx(base));
  CHECK(cosine.lr_at(50, 100) == doctest::Approx(0.001 + (base - 0.001) * 0.5));
  CHECK(cosine.lr_at(100, 100) == doctest::Approx(0.001));

  LrSchedule warm({ScheduleKind::poly, 10}, base);
  CHECK(warm.lr_at(0, 110) == doctest::Approx(base / 10));
  CHECK(warm.lr_at(4, 110) == doctest::Approx(base * 5 / 10));
  CHECK(warm.lr_at(9, 110) == doctest::Approx(base));
  CHECK(warm.lr_at(10, 110) == doctest::Approx(base));
  CHECK(warm.lr_at(60, 110) == doctest::Approx(base * std::pow(0.5, 0.9)));

  REQUIRE_OK_AND_ASSIGN(auto parsed,
                        parse_schedule_options(nlohmann::json{{"name", "cosine"}, {"warmup_steps", 5}}));
  CHECK(parsed.kind == ScheduleKind::cosine);
  CHECK(parsed.warmup_steps == 5);
  CHECK(parse_schedule_options(nlohmann::json{{"name", "step"}})
            .status()
            .message()
            .find("constant, poly, cosine") != std::string::npos);
}

TEST_CASE("the learning rate is set on every group and gradients are clipped by their global norm") {
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  REQUIRE_OK_AND_ASSIGN(auto opt, make_optimizer(OptimizerOptions{"adamw"}, {a, b}));
  set_learning_rate(*opt, 0.123);
  for (auto& g : opt->param_groups()) CHECK(g.options().get_lr() == doctest::Approx(0.123));
  (a * 3 + b * 4).sum().backward();
  auto undefined = torch::zeros({1}, torch::requires_grad());
  const double norm = clip_grad_norm({a, b, undefined}, 1.0);
  CHECK(norm == doctest::Approx(5.0));
  CHECK(a.grad().item<double>() == doctest::Approx(0.6).epsilon(1e-4));
  CHECK(b.grad().item<double>() == doctest::Approx(0.8).epsilon(1e-4));
}

// ------------------------------------------------------------------ fused optimizer, scaler

namespace {

struct Case {
  const char* what;
  OptimizerOptions options;
};

std::vector<Case> optimizer_cases() {
  std::vector<Case> cases;
  OptimizerOptions sgd{"sgd", 0.05};
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-3;
  cases.push_back({"sgd momentum 0.9, weight decay", sgd});
  OptimizerOptions nesterov = sgd;
  nesterov.momentum = 0.99;
  nesterov.nesterov = true;
  cases.push_back({"sgd nesterov 0.99", nesterov});
  OptimizerOptions plain{"sgd", 0.1};
  plain.momentum = 0.0;
  cases.push_back({"sgd without momentum", plain});
  OptimizerOptions adam{"adam", 0.01};
  adam.weight_decay = 1e-2;
  cases.push_back({"adam, L2 weight decay", adam});
  OptimizerOptions adamw{"adamw", 0.01};
  adamw.weight_decay = 0.05;
  adamw.betas = {0.8, 0.99};
  cases.push_back({"adamw, decoupled decay, other betas", adamw});
  return cases;
}

/// Three parameters of different shapes (one a 5-D conv weight), same values each call.
std::vector<at::Tensor> make_params(std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> ps;
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 2, 3, 3, 3}, {4}, {7, 5}})
    ps.push_back(at::randn(shape, gen, at::TensorOptions()).set_requires_grad(true));
  return ps;
}

/// Gradient `step` for parameter `i` (the same for every optimizer under test).
at::Tensor grad_for(const at::Tensor& p, int step, std::size_t i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 17 * step + static_cast<int>(i));
  return at::randn(p.sizes(), gen, at::TensorOptions());
}

void set_grads(const std::vector<at::Tensor>& ps, int step) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    at::Tensor g = at::empty_like(ps[i]);  // the parameter's layout
    g.copy_(grad_for(ps[i], step, i));
    ps[i].mutable_grad() = g;
  }
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / (b.abs().max() + 1e-12)).item<double>();
}

}  // namespace

TEST_CASE("fused SGD, Adam and AdamW give torch::optim's parameters and state, step for step") {
  for (const auto& c : optimizer_cases()) {
    CAPTURE(c.what);
    auto pf = make_params(1), pr = make_params(1);
    OptimizerOptions fo = c.options, ro = c.options;
    fo.impl = "fused";
    ro.impl = "reference";
    auto fused = FusedOptimizer::create(fo, pf);
    auto ref = make_optimizer(ro, pr);  // torch::optim itself, not our wrapper
    REQUIRE_OK(fused);
    REQUIRE_OK(ref);
    CHECK((*fused)->fused());
    for (int step = 0; step < 6; ++step) {
      set_grads(pf, step);
      set_grads(pr, step);
      (*fused)->step();
      (*ref)->step();
      for (std::size_t i = 0; i < pf.size(); ++i) {
        CAPTURE(step);
        CAPTURE(i);
        CHECK(max_rel_diff(pf[i], pr[i]) < 1e-6);
      }
    }
    // The optimizer state, read through the same names, agrees too.
    REQUIRE_OK_AND_ASSIGN(auto wrapped, FusedOptimizer::create(ro, pr));
    REQUIRE_OK(wrapped->load_torch_state(**ref));
    const TensorMap a = (*fused)->state(), b = wrapped->state();
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : a) {
      const auto& param = name;  // clang 14 cannot capture a structured binding
      CAPTURE(param);
      REQUIRE(b.count(name));
      CHECK(max_rel_diff(t.to(at::kDouble), b.at(name).to(at::kDouble)) < 1e-6);
    }
  }
}

TEST_CASE("the reference impl steps exactly as torch::optim, and both impls keep the parameters' order") {
  OptimizerOptions o{"adamw", 0.02};
  o.impl = "reference";
  auto pa = make_params(3), pb = make_params(3);
  auto ours = FusedOptimizer::create(o, pa);
  auto torch_opt = make_optimizer(o, pb);
  REQUIRE_OK(ours);
  REQUIRE_FALSE((*ours)->fused());
  for (int step = 0; step < 3; ++step) {
    set_grads(pa, step);
    set_grads(pb, step);
    (*ours)->step();
    (*torch_opt)->step();
  }
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
  REQUIRE((*ours)->parameters().size() == pa.size());
  for (std::size_t i = 0; i < pa.size(); ++i)
    CHECK((*ours)->parameters()[i].unsafeGetTensorImpl() == pa[i].unsafeGetTensorImpl());
}

TEST_CASE("a fused step with found_inf set changes no parameter, momentum, moment or step count") {
  for (const auto& c : optimizer_cases()) {
    for (const char* impl : {"fused", "reference"}) {
      CAPTURE(c.what);
      CAPTURE(impl);
      auto ps = make_params(5);
      OptimizerOptions o = c.options;
      o.impl = impl;
      REQUIRE_OK_AND_ASSIGN(auto opt, FusedOptimizer::create(o, ps));
      set_grads(ps, 0);
      opt->step();  // some state to protect
      std::vector<at::Tensor> before;
      for (auto& p : ps) before.push_back(p.detach().clone());
      TensorMap state_before;
      for (const auto& [k, v] : opt->state()) state_before.emplace(k, v.clone());
      set_grads(ps, 1);
      const at::Tensor inf = at::ones({});
      opt->step(inf);
      for (std::size_t i = 0; i < ps.size(); ++i) CHECK(torch::equal(ps[i], before[i]));
      for (const auto& [k, v] : opt->state()) {
        const auto& key = k;  // clang 14 cannot capture a structured binding
        CAPTURE(key);
        CHECK(torch::equal(v, state_before.at(k)));
      }
      opt->step(at::zeros({}));  // and a clear flag steps
      CHECK_FALSE(torch::equal(ps[0], before[0]));
    }
  }
}

TEST_CASE("fused kernels update channels-last weights with contiguous gradients correctly") {
  // The fused kernels walk parameter, gradient and state as flat memory; a gradient in
  // another layout must be brought to the parameter's first (it was silently wrong before).
  for (const char* name : {"sgd", "adamw"}) {
    CAPTURE(name);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
    at::Tensor base = at::randn({4, 3, 2, 3, 5}, gen, at::TensorOptions());
    at::Tensor cl = base.contiguous(at::MemoryFormat::ChannelsLast3d).set_requires_grad(true);
    at::Tensor plain = base.clone().set_requires_grad(true);
    REQUIRE_FALSE(cl.is_contiguous());
    OptimizerOptions o{name, 0.1};
    auto a = FusedOptimizer::create(o, {cl});
    auto b = FusedOptimizer::create(o, {plain});
    REQUIRE_OK(a);
    REQUIRE_OK(b);
    for (int step = 0; step < 3; ++step) {
      at::Tensor g = grad_for(plain, step, 0);  // contiguous
      cl.mutable_grad() = g.clone();
      plain.mutable_grad() = g.clone();
      (*a)->step();
      (*b)->step();
    }
    CHECK(max_rel_diff(cl, plain) < 1e-6);
    CHECK(cl.is_contiguous(at::MemoryFormat::ChannelsLast3d));
  }
}

TEST_CASE("optimizer state moves between the fused and reference impls, and a bad state is refused by name") {
  OptimizerOptions fo{"adam", 0.01};
  auto pf = make_params(11), pr = make_params(11);
  REQUIRE_OK_AND_ASSIGN(auto fused, FusedOptimizer::create(fo, pf));
  for (int step = 0; step < 2; ++step) {
    set_grads(pf, step);
    fused->step();
  }
  for (std::size_t i = 0; i < pf.size(); ++i) pr[i].detach().copy_(pf[i].detach());
  OptimizerOptions ro = fo;
  ro.impl = "reference";
  REQUIRE_OK_AND_ASSIGN(auto ref, FusedOptimizer::create(ro, pr));
  REQUIRE_OK(ref->load_state(fused->state()));
  set_grads(pf, 2);
  set_grads(pr, 2);
  fused->step();
  ref->step();
  for (std::size_t i = 0; i < pf.size(); ++i) CHECK(max_rel_diff(pf[i], pr[i]) < 1e-6);

  TensorMap state = fused->state();
  TensorMap missing = state;
  missing.erase("exp_avg_sq_1");
  auto st = fused->load_state(missing);
  CHECK(st.message().find("exp_avg_sq_1") != std::string::npos);
  TensorMap misshaped = state;
  misshaped["exp_avg_2"] = at::zeros({3});
  st = fused->load_state(misshaped);
  CHECK(st.message().find("exp_avg_2") != std::string::npos);
  CHECK(st.message().find("[7, 5]") != std::string::npos);
  TensorMap extra = state;
  extra["momentum_0"] = at::zeros({4});
  CHECK(fused->load_state(extra).message().find("momentum_0") != std::string::npos);
  OptimizerOptions bad = fo;
  bad.impl = "foreach";
  CHECK(bad.validate().message().find("fused, reference") != std::string::npos);
  CHECK(parse_optimizer_options(nlohmann::json{{"impl", "reference"}})->impl == "reference");
}

TEST_CASE("clip_grad_norm_ keeps the norm on the device and clips as the host version does") {
  auto a = make_params(21), b = make_params(21);
  set_grads(a, 0);
  set_grads(b, 0);
  at::Tensor norm = clip_grad_norm_(a, 0.5);
  REQUIRE(norm.defined());
  CHECK(norm.dim() == 0);
  CHECK((norm.device() == a[0].device()));
  const double host = clip_grad_norm(b, 0.5);
  CHECK(norm.item<double>() == doctest::Approx(host).epsilon(1e-6));
  double total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(max_rel_diff(a[i].grad(), b[i].grad()) < 1e-6);
    total += a[i].grad().pow(2).sum().item<double>();
  }
  CHECK(std::sqrt(total) == doctest::Approx(0.5).epsilon(1e-4));
  // A norm under the limit leaves the gradients alone.
  set_grads(a, 1);
  const at::Tensor g0 = a[0].grad().clone();
  clip_grad_norm_(a, 1e6);
  CHECK(max_rel_diff(a[0].grad(), g0) < 1e-6);
}

TEST_CASE("GradScaler scales the loss and unscales finite gradients without finding an overflow") {
  GradScaler scaler({}, c10::Device(c10::kCPU));
  CHECK(scaler.scale_value() == 65536.0);
  auto x = torch::tensor({1.0f, -2.0f}, torch::requires_grad());
  at::Tensor loss = (x * x).sum();
  at::Tensor scaled = scaler.scale(loss);
  CHECK(scaled.item<double>() == doctest::Approx(5.0 * 65536.0));
  scaled.backward();
  CHECK(x.grad()[0].item<double>() == doctest::Approx(2.0 * 65536.0));
  scaler.unscale_({x});
  CHECK(x.grad()[0].item<double>() == doctest::Approx(2.0));
  CHECK(x.grad()[1].item<double>() == doctest::Approx(-4.0));
  scaler.unscale_({x});  // a second call in the same step does nothing
  CHECK(x.grad()[0].item<double>() == doctest::Approx(2.0));
  CHECK(scaler.found_inf().item<double>() == 0.0);
  scaler.update();
  CHECK(scaler.scale_value() == 65536.0);
  CHECK(scaler.growth_tracker_value() == 1);
  CHECK(scaler.skipped_value() == 0);
  CHECK((scaler.scale_tensor().device() == c10::Device(c10::kCPU)));
}

TEST_CASE("a forced overflow (inf or NaN gradient) skips the step, backs the scale off and resets growth") {
  for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    auto ps = make_params(31);
    OptimizerOptions o{"sgd", 0.1};
    REQUIRE_OK_AND_ASSIGN(auto opt, FusedOptimizer::create(o, ps));
    GradScalerOptions so;
    so.init_scale = 1024.0;
    so.growth_interval = 100;
    GradScaler scaler(so, c10::Device(c10::kCPU));
    // Two good steps, then one with a non-finite value in one gradient.
    for (int step = 0; step < 2; ++step) {
      set_grads(ps, step);
      for (auto& p : ps) p.mutable_grad().mul_(1024.0);
      scaler.unscale_(ps);
      opt->step(scaler.found_inf());
      scaler.update();
    }
    CHECK(scaler.growth_tracker_value() == 2);
    std::vector<at::Tensor> before;
    for (auto& p : ps) before.push_back(p.detach().clone());
    const at::Tensor momentum_before = opt->state().at("momentum_1").clone();
    set_grads(ps, 2);
    ps[1].mutable_grad()[2] = bad;
    scaler.unscale_(ps);
    CHECK(scaler.found_inf().item<double>() == 1.0);
    opt->step(scaler.found_inf());
    scaler.update();
    for (std::size_t i = 0; i < ps.size(); ++i) CHECK(torch::equal(ps[i], before[i]));
    CHECK(torch::equal(opt->state().at("momentum_1"), momentum_before));
    CHECK(scaler.scale_value() == 512.0);  // x backoff 0.5
    CHECK(scaler.growth_tracker_value() == 0);
    CHECK(scaler.skipped_value() == 1);
    CHECK(scaler.found_inf().item<double>() == 0.0);  // cleared for the next step
  }
}

TEST_CASE("the loss scale grows by growth_factor after growth_interval finite steps in a row") {
  GradScalerOptions so;
  so.init_scale = 8.0;
  so.growth_interval = 3;
  so.growth_factor = 4.0;
  GradScaler scaler(so, c10::Device(c10::kCPU));
  auto x = torch::ones({2}, torch::requires_grad());
  std::vector<double> scales;
  for (int step = 0; step < 7; ++step) {
    x.mutable_grad() = torch::ones({2}) * scaler.scale_value();
    scaler.unscale_({x});
    scaler.update();
    scales.push_back(scaler.scale_value());
  }
  CHECK(scales == std::vector<double>{8, 8, 32, 32, 32, 128, 128});
  CHECK(scaler.growth_tracker_value() == 1);
}

TEST_CASE("with scaling disabled (bf16, fp32) the scale stays 1 and non-finite gradients are still skipped") {
  GradScalerOptions so;
  so.enabled = false;
  GradScaler scaler(so, c10::Device(c10::kCPU));
  CHECK(scaler.scale_value() == 1.0);
  auto x = torch::ones({3}, torch::requires_grad());
  at::Tensor loss = x.sum() * 2;
  CHECK(torch::equal(scaler.scale(loss), loss));
  loss.backward();
  // A finite step: nothing found, and the norm comes back for the clip.
  at::Tensor norm = scaler.unscale_({x});
  REQUIRE(norm.defined());
  CHECK(norm.item<double>() == doctest::Approx(std::sqrt(3.0 * 4.0)));
  CHECK(scaler.found_inf().item<double>() == 0.0);
  CHECK_FALSE(scaler.unscale_({x}).defined());  // once per step
  scaler.update();
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    x.mutable_grad()[0] = bad;
    scaler.unscale_({x});
    CHECK(x.grad()[1].item<double>() == 2.0);  // checked, not scaled
    CHECK(scaler.found_inf().item<double>() == 1.0);
    scaler.update();
    CHECK(scaler.found_inf().item<double>() == 0.0);
  }
  CHECK(scaler.scale_value() == 1.0);
  CHECK(scaler.skipped_value() == 2);
  scaler.load(4096.0, 7, 3);  // a scale means nothing without scaling
  CHECK(scaler.scale_value() == 1.0);
  CHECK(scaler.growth_tracker_value() == 7);
  CHECK(scaler.skipped_value() == 3);
}
