// Dice metric: per-class scores, empty classes, accumulation (MONAI DiceMetric semantics).
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>

#include "models/training/metrics.hpp"

using namespace segflow::models;

namespace {
at::Tensor labels(std::initializer_list<int64_t> v) {
  return torch::tensor(std::vector<int64_t>(v), torch::kLong).reshape({1, 1, static_cast<int64_t>(v.size())});
}
}  // namespace

TEST_CASE("per-class Dice is 2|P and T| / (|P| + |T|) for each foreground class") {
  DiceMetricOptions o;
  o.num_classes = 3;
  auto pred = labels({0, 1, 1, 2, 2, 0});
  auto target = labels({0, 1, 2, 2, 2, 1});
  auto d = dice_per_case(pred, target, o);
  REQUIRE(d.sizes() == at::IntArrayRef({1, 2}));
  CHECK(d[0][0].item<double>() == doctest::Approx(2.0 * 1 / (2 + 2)));  // class 1: |P|=2, |T|=2, overlap 1
  CHECK(d[0][1].item<double>() == doctest::Approx(2.0 * 2 / (2 + 3)));  // class 2: |P|=2, |T|=3, overlap 2
  o.include_background = true;
  auto b = dice_per_case(pred, target, o);
  REQUIRE(b.sizes() == at::IntArrayRef({1, 3}));
  CHECK(b[0][0].item<double>() == doctest::Approx(2.0 * 1 / (2 + 1)));
}

TEST_CASE("classes absent from the target are excluded from the mean instead of scoring") {
  DiceMetricOptions o;
  o.num_classes = 4;
  // class 1 perfect, class 2 absent from both, class 3 only predicted.
  auto pred = labels({1, 1, 0, 3});
  auto target = labels({1, 1, 0, 0});
  auto d = dice_per_case(pred, target, o);
  CHECK(d[0][0].item<double>() == doctest::Approx(1.0));
  CHECK(std::isnan(d[0][1].item<double>()));
  CHECK(std::isnan(d[0][2].item<double>()));  // MONAI ignore_empty: target empty -> NaN
  DiceMetric m(o);
  m.update(pred, target);
  CHECK(m.mean() == doctest::Approx(1.0));

  o.empty = EmptyClassPolicy::ignore_both_empty;
  auto e = dice_per_case(pred, target, o);
  CHECK(std::isnan(e[0][1].item<double>()));
  CHECK(e[0][2].item<double>() == 0.0);
  DiceMetric m2(o);
  m2.update(pred, target);
  CHECK(m2.mean() == doctest::Approx(0.5));

  o.empty = EmptyClassPolicy::both_empty_is_one;
  auto f = dice_per_case(pred, target, o);
  CHECK(f[0][1].item<double>() == 1.0);
  CHECK(f[0][2].item<double>() == 0.0);
}

TEST_CASE("the Dice metric accumulates cases over batches and averages per case, then over cases") {
  DiceMetricOptions o;
  o.num_classes = 3;
  DiceMetric m(o);
  // Batch 1: two cases of 4 voxels each.
  auto p1 = torch::tensor({1, 1, 2, 0, 1, 0, 0, 0}, torch::kLong).reshape({2, 4});
  auto t1 = torch::tensor({1, 0, 2, 0, 1, 1, 0, 0}, torch::kLong).reshape({2, 4});
  m.update(p1, t1);
  // Batch 2: one case where class 2 is present and missed, class 1 absent from both.
  m.update(labels({0, 0, 0, 0}), labels({2, 0, 0, 0}));
  REQUIRE(m.cases().size() == 3);
  // case 0: class 1 = 2*1/(2+1), class 2 = 1; case 1: class 1 = 2*1/(1+2), class 2 NaN;
  // case 2: class 1 NaN, class 2 = 0.
  const double c0 = (2.0 / 3 + 1.0) / 2, c1 = 2.0 / 3, c2 = 0.0;
  CHECK(m.mean() == doctest::Approx((c0 + c1 + c2) / 3));
  auto pc = m.per_class();
  REQUIRE(pc.size() == 2);
  CHECK(pc[0] == doctest::Approx(2.0 / 3));
  CHECK(pc[1] == doctest::Approx(0.5));
  CHECK(m.mean_of_classes() == doctest::Approx((2.0 / 3 + 0.5) / 2));
  DiceMetric other(o);
  other.update(labels({1}), labels({1}));
  m.merge(other);
  CHECK(m.cases().size() == 4);
  m.reset();
  CHECK(std::isnan(m.mean()));
}

TEST_CASE("Dice from logits uses the argmax, or a zero threshold for one channel") {
  DiceMetric m(DiceMetricOptions{2});
  auto logits =
      torch::tensor({2.0, -1.0, -3.0, 0.0, 1.0, 4.0}, torch::kFloat).reshape({1, 2, 3});  // argmax 0, 1, 1
  m.update_from_logits(logits, labels({0, 1, 1}));
  CHECK(m.mean() == doctest::Approx(1.0));
  auto binary = labels_from_logits(torch::tensor({-0.5, 0.5}).reshape({1, 1, 2}));
  CHECK(torch::equal(binary, labels({0, 1})));
  CHECK_THROWS_AS(dice_per_case(labels({0, 1}), labels({0, 1, 1}), DiceMetricOptions{2}), c10::Error);
}
