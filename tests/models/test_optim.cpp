// Optimizers, learning-rate schedules and gradient clipping.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "models/optim.hpp"

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
  auto opt = make_optimizer(o, {x});
  REQUIRE(opt.is_ok());
  for (int i = 0; i < steps; ++i) {
    (*opt)->zero_grad();
    auto f = (x - c).pow(2).sum();
    f.backward();
    (*opt)->step();
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
  auto opt = make_optimizer(OptimizerOptions{"sgd"}, {a, frozen});
  REQUIRE(opt.is_ok());
  CHECK((*opt)->param_groups()[0].params().size() == 1);
  CHECK_FALSE(make_optimizer(OptimizerOptions{"sgd"}, {frozen}).is_ok());
  auto bad = make_optimizer(OptimizerOptions{"lamb"}, {a});
  CHECK(bad.status().message().find("sgd, adam, adamw") != std::string::npos);
  OptimizerOptions neg;
  neg.lr = -1;
  CHECK(neg.validate().message().find("lr") != std::string::npos);
  auto parsed = parse_optimizer_options(
      nlohmann::json{{"name", "sgd"}, {"lr", 0.01}, {"momentum", 0.99}, {"nesterov", true}});
  REQUIRE(parsed.is_ok());
  CHECK(parsed->momentum == 0.99);
  CHECK(parsed->nesterov);
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

  auto parsed = parse_schedule_options(nlohmann::json{{"name", "cosine"}, {"warmup_steps", 5}});
  REQUIRE(parsed.is_ok());
  CHECK(parsed->kind == ScheduleKind::cosine);
  CHECK(parsed->warmup_steps == 5);
  CHECK(parse_schedule_options(nlohmann::json{{"name", "step"}})
            .status()
            .message()
            .find("constant, poly, cosine") != std::string::npos);
}

TEST_CASE("the learning rate is set on every group and gradients are clipped by their global norm") {
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  auto opt = make_optimizer(OptimizerOptions{"adamw"}, {a, b});
  REQUIRE(opt.is_ok());
  set_learning_rate(**opt, 0.123);
  for (auto& g : (*opt)->param_groups()) CHECK(g.options().get_lr() == doctest::Approx(0.123));
  (a * 3 + b * 4).sum().backward();
  auto undefined = torch::zeros({1}, torch::requires_grad());
  const double norm = clip_grad_norm({a, b, undefined}, 1.0);
  CHECK(norm == doctest::Approx(5.0));
  CHECK(a.grad().item<double>() == doctest::Approx(0.6).epsilon(1e-4));
  CHECK(b.grad().item<double>() == doctest::Approx(0.8).epsilon(1e-4));
}
