// Losses against values computed by hand from the formulas (plain arithmetic in the test).
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "models/training/losses.hpp"
#include "test_util.hpp"

using namespace segflow::models;

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
constexpr double kS = 1e-5;  // MONAI's smooth_nr = smooth_dr default
double dice_term(double inter, double sum_p, double sum_t) {
  return 1.0 - (2.0 * inter + kS) / (sum_p + sum_t + kS);
}
double value(const at::Tensor& t) { return t.item<double>(); }
}  // namespace

// Two classes, two voxels (N=1, C=2, spatial 2): probabilities p0 = [0.9, 0.3], p1 = [0.1, 0.7],
// labels [0, 1].
TEST_CASE("Dice loss on probabilities matches 1 - (2I + s) / (P + T + s) averaged over classes") {
  auto p = torch::tensor({0.9, 0.3, 0.1, 0.7}, torch::kDouble).reshape({1, 2, 2});
  auto labels = torch::tensor({0, 1}, torch::kLong).reshape({1, 1, 2});
  DiceLossOptions o;
  o.act = LossActivation::none;
  const double f0 = dice_term(0.9, 1.2, 1.0), f1 = dice_term(0.7, 0.8, 1.0);
  CHECK(value(dice_loss(p, labels, o)) == doctest::Approx((f0 + f1) / 2).epsilon(1e-12));
  o.include_background = false;
  CHECK(value(dice_loss(p, labels, o)) == doctest::Approx(f1).epsilon(1e-12));
  o.include_background = true;
  o.squared_pred = true;  // denominators sum p^2 + t^2
  const double q0 = dice_term(0.9, 0.81 + 0.09, 1.0), q1 = dice_term(0.7, 0.01 + 0.49, 1.0);
  CHECK(value(dice_loss(p, labels, o)) == doctest::Approx((q0 + q1) / 2).epsilon(1e-12));
  o.squared_pred = false;
  o.jaccard = true;  // 1 - (I + s) / (P + T - I + s) with MONAI's 2 (P + T - I) denominator
  const double j0 = 1.0 - (2 * 0.9 + kS) / (2 * (2.2 - 0.9) + kS),
               j1 = 1.0 - (2 * 0.7 + kS) / (2 * (1.8 - 0.7) + kS);
  CHECK(value(dice_loss(p, labels, o)) == doctest::Approx((j0 + j1) / 2).epsilon(1e-12));
}

TEST_CASE("Dice loss applies softmax or sigmoid to logits first") {
  auto logits = torch::tensor({2.0, -1.0, 0.5, 1.0}, torch::kDouble).reshape({1, 2, 2});
  auto labels = torch::tensor({0, 1}, torch::kLong).reshape({1, 1, 2});
  // softmax over the two channels per voxel
  const double a0 = std::exp(2.0) / (std::exp(2.0) + std::exp(0.5)),
               a1 = std::exp(-1.0) / (std::exp(-1.0) + std::exp(1.0));
  const double f0 = dice_term(a0, a0 + a1, 1.0), f1 = dice_term(1 - a1, (1 - a0) + (1 - a1), 1.0);
  CHECK(value(dice_loss(logits, labels, {})) == doctest::Approx((f0 + f1) / 2).epsilon(1e-12));
  // sigmoid per element, binary float target of the same shape
  auto target = torch::tensor({1.0, 0.0, 0.0, 1.0}, torch::kDouble).reshape({1, 2, 2});
  DiceLossOptions o;
  o.act = LossActivation::sigmoid;
  o.to_onehot_y = false;
  const double s0 = sigmoid(2.0), s1 = sigmoid(-1.0), s2 = sigmoid(0.5), s3 = sigmoid(1.0);
  const double g0 = dice_term(s0, s0 + s1, 1.0), g1 = dice_term(s3, s2 + s3, 1.0);
  CHECK(value(dice_loss(logits, target, o)) == doctest::Approx((g0 + g1) / 2).epsilon(1e-12));
}

TEST_CASE("Dice loss with batch reduction sums over samples before the ratio") {
  // N=2, C=1 (sigmoid-free probabilities), spatial 2.
  auto p = torch::tensor({0.5, 0.5, 1.0, 0.0}, torch::kDouble).reshape({2, 1, 2});
  auto t = torch::tensor({1.0, 0.0, 0.0, 0.0}, torch::kDouble).reshape({2, 1, 2});
  DiceLossOptions o;
  o.act = LossActivation::none;
  o.to_onehot_y = false;
  const double per_sample = (dice_term(0.5, 1.0, 1.0) + dice_term(0.0, 1.0, 0.0)) / 2;
  CHECK(value(dice_loss(p, t, o)) == doctest::Approx(per_sample).epsilon(1e-12));
  o.batch = true;
  CHECK(value(dice_loss(p, t, o)) == doctest::Approx(dice_term(0.5, 2.0, 1.0)).epsilon(1e-12));
  o.reduction = LossReduction::none;
  CHECK(dice_loss(p, t, o).sizes() == at::IntArrayRef({1}));
}

TEST_CASE("a class absent from both prediction and target costs nothing and gives no NaN") {
  // Three classes; class 2 has zero probability and no voxel.
  auto p = torch::tensor({1.0, 0.0, 0.0, 1.0, 0.0, 0.0}, torch::kDouble).reshape({1, 3, 2});
  auto labels = torch::tensor({0, 1}, torch::kLong).reshape({1, 1, 2});
  DiceLossOptions o;
  o.act = LossActivation::none;
  o.reduction = LossReduction::none;
  auto f = dice_loss(p, labels, o);
  CHECK(torch::isfinite(f).all().item<bool>());
  CHECK(f[0][2].item<double>() == doctest::Approx(0.0).epsilon(1e-12));
  // With softmax the absent class is finite too, and its gradient as well.
  auto logits = torch::randn({1, 3, 4, 4}, torch::requires_grad());
  auto none = torch::zeros({1, 1, 4, 4}, torch::kLong);
  auto loss = dice_loss(logits, none, {});
  loss.backward();
  CHECK(std::isfinite(loss.item<double>()));
  CHECK(torch::isfinite(logits.grad()).all().item<bool>());
  DiceLossOptions zero;
  zero.smooth_dr = 0;
  CHECK_FALSE(zero.validate().is_ok());
}

TEST_CASE("cross entropy matches -log softmax at the true class, with class weights as torch does") {
  // N=1, C=3, two voxels: logits per voxel (1, 2, 3) and (0, 0, 1); labels 2 and 0.
  auto logits = torch::tensor({1.0, 0.0, 2.0, 0.0, 3.0, 1.0}, torch::kDouble).reshape({1, 3, 2});
  auto labels = torch::tensor({2, 0}, torch::kLong).reshape({1, 1, 2});
  const double z0 = std::exp(1.0) + std::exp(2.0) + std::exp(3.0), z1 = 1 + 1 + std::exp(1.0);
  const double l0 = -std::log(std::exp(3.0) / z0), l1 = -std::log(1.0 / z1);
  CHECK(value(ce_loss(logits, labels)) == doctest::Approx((l0 + l1) / 2).epsilon(1e-12));
  const std::vector<double> w{0.5, 1.0, 2.0};
  CHECK(value(ce_loss(logits, labels, w)) ==
        doctest::Approx((2.0 * l0 + 0.5 * l1) / (2.0 + 0.5)).epsilon(1e-12));
}

TEST_CASE("a weighted CE loss keeps its class-weight tensor across steps, devices' dtypes and copies") {
  auto logits = torch::tensor({1.0, 0.0, 2.0, 0.0, 3.0, 1.0}, torch::kDouble).reshape({1, 3, 2});
  auto labels = torch::tensor({2, 0}, torch::kLong).reshape({1, 1, 2});
  const std::vector<double> w{0.5, 1.0, 2.0};
  LossOptions o;
  o.kind = LossKind::ce;
  o.ce_weight = w;
  REQUIRE_OK_AND_ASSIGN(auto loss, make_loss(o));
  const double expected = value(ce_loss(logits, labels, w));
  // The same value on every call, in double and then in float (the cached tensor follows
  // the input's dtype), and from a copy of the loss function.
  CHECK(value(loss(logits, labels)) == doctest::Approx(expected).epsilon(1e-12));
  CHECK(value(loss(logits, labels)) == doctest::Approx(expected).epsilon(1e-12));
  CHECK(value(loss(logits.to(torch::kFloat), labels)) == doctest::Approx(expected).epsilon(1e-6));
  auto copy = loss;
  CHECK(value(copy(logits, labels)) == doctest::Approx(expected).epsilon(1e-12));
  // A weight tensor of the wrong length is refused as the vector form is.
  CHECK_THROWS_AS(ce_loss(logits, labels, torch::ones({2}, torch::kDouble)), c10::Error);
}

TEST_CASE("BCE with logits matches -(t log s + (1 - t) log(1 - s))") {
  auto x = torch::tensor({0.3, -2.0, 1.5}, torch::kDouble).reshape({1, 1, 3});
  auto t = torch::tensor({1.0, 0.0, 0.0}, torch::kDouble).reshape({1, 1, 3});
  const double e = (-std::log(sigmoid(0.3)) - std::log(1 - sigmoid(-2.0)) - std::log(1 - sigmoid(1.5))) / 3;
  CHECK(value(bce_with_logits_loss(x, t)) == doctest::Approx(e).epsilon(1e-12));
}

TEST_CASE("DiceCE is lambda_dice Dice plus lambda_ce cross entropy, and BCE for one channel") {
  auto logits = torch::tensor({1.0, 0.0, 2.0, 0.0, 3.0, 1.0}, torch::kDouble).reshape({1, 3, 2});
  auto labels = torch::tensor({2, 0}, torch::kLong).reshape({1, 1, 2});
  LossOptions o;
  o.kind = LossKind::dice_ce;
  o.lambda_dice = 0.7;
  o.lambda_ce = 0.3;
  REQUIRE_OK_AND_ASSIGN(auto loss, make_loss(o));
  // Dice by hand on the softmax probabilities.
  double p[3][2];
  const double raw[3][2] = {{1.0, 0.0}, {2.0, 0.0}, {3.0, 1.0}};
  for (int v = 0; v < 2; ++v) {
    double z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(raw[c][v]);
    for (int c = 0; c < 3; ++c) p[c][v] = std::exp(raw[c][v]) / z;
  }
  const double t[3][2] = {{0, 1}, {0, 0}, {1, 0}};
  double dice = 0;
  for (int c = 0; c < 3; ++c) {
    dice += dice_term(p[c][0] * t[c][0] + p[c][1] * t[c][1], p[c][0] + p[c][1], t[c][0] + t[c][1]) / 3;
  }
  const double ce = (-std::log(p[2][0]) - std::log(p[0][1])) / 2;
  CHECK(value(loss(logits, labels)) == doctest::Approx(0.7 * dice + 0.3 * ce).epsilon(1e-10));
  // monai.losses.DiceCELoss(to_onehot_y=True, softmax=True, lambda_dice=0.7, lambda_ce=0.3), MONAI 1.6.1
  CHECK(0.7 * dice + 0.3 * ce == doctest::Approx(0.779376613400498).epsilon(1e-9));

  // One channel: sigmoid Dice + BCE (MONAI DiceCELoss uses BCE when C == 1).
  LossOptions b;
  b.kind = LossKind::dice_ce;
  b.dice.act = LossActivation::sigmoid;
  REQUIRE_OK_AND_ASSIGN(auto bin, make_loss(b));
  auto x = torch::tensor({0.3, -2.0}, torch::kDouble).reshape({1, 1, 2});
  auto y = torch::tensor({1.0, 0.0}, torch::kDouble).reshape({1, 1, 2});
  const double d = dice_term(sigmoid(0.3), sigmoid(0.3) + sigmoid(-2.0), 1.0);
  const double bce = (-std::log(sigmoid(0.3)) - std::log(1 - sigmoid(-2.0))) / 2;
  CHECK(value(bin(x, y)) == doctest::Approx(d + bce).epsilon(1e-10));
  LossOptions db = b;
  db.kind = LossKind::dice_bce;
  CHECK(value((*make_loss(db))(x, y)) == doctest::Approx(d + bce).epsilon(1e-10));
}

TEST_CASE("focal loss matches (1 - p_t)^gamma times BCE, sigmoid and softmax forms") {
  auto x = torch::tensor({0.3, -2.0, 1.5, 0.0}, torch::kDouble).reshape({1, 2, 2});
  auto t = torch::tensor({1.0, 0.0, 0.0, 1.0}, torch::kDouble).reshape({1, 2, 2});
  FocalLossOptions o;
  o.gamma = 2.0;
  double e = 0;
  const double xs[4] = {0.3, -2.0, 1.5, 0.0}, ts[4] = {1, 0, 0, 1};
  for (int i = 0; i < 4; ++i) {
    const double p = sigmoid(xs[i]), pt = ts[i] > 0 ? p : 1 - p;
    e += -std::pow(1 - pt, 2.0) * std::log(pt) / 4;
  }
  CHECK(value(focal_loss(x, t, o)) == doctest::Approx(e).epsilon(1e-10));
  o.alpha = 0.25;
  double ea = 0;
  for (int i = 0; i < 4; ++i) {
    const double p = sigmoid(xs[i]), pt = ts[i] > 0 ? p : 1 - p, a = ts[i] > 0 ? 0.25 : 0.75;
    ea += -a * std::pow(1 - pt, 2.0) * std::log(pt) / 4;
  }
  CHECK(value(focal_loss(x, t, o)) == doctest::Approx(ea).epsilon(1e-10));
  // softmax: voxel 0 logits (0.3, 1.5) true class 0; voxel 1 logits (-2, 0) true class 1.
  FocalLossOptions s;
  s.use_softmax = true;
  const double p00 = std::exp(0.3) / (std::exp(0.3) + std::exp(1.5)),
               p11 = std::exp(0.0) / (std::exp(-2.0) + 1.0);
  const double es = (-std::pow(1 - p00, 2.0) * std::log(p00) - std::pow(1 - p11, 2.0) * std::log(p11)) / 4;
  CHECK(value(focal_loss(x, t, s)) == doctest::Approx(es).epsilon(1e-10));
  // monai.losses.FocalLoss(gamma=2) / (alpha=0.25) / (use_softmax=True), MONAI 1.6.1, which
  // evaluates the focal term in float32.
  CHECK(e == doctest::Approx(0.35318896174430847).epsilon(1e-6));
  CHECK(ea == doctest::Approx(0.23068171739578247).epsilon(1e-6));
  CHECK(es == doctest::Approx(0.21651563048362732).epsilon(1e-6));
  // DiceFocal = lambda_dice Dice + lambda_focal focal; as MONAI, the focal term is the
  // sigmoid one even with a softmax Dice, unless focal_softmax.
  LossOptions df;
  df.kind = LossKind::dice_focal;
  df.dice.to_onehot_y = false;
  df.lambda_focal = 2.0;
  DiceLossOptions dice_only;
  dice_only.to_onehot_y = false;
  const double d = value(dice_loss(x, t, dice_only));
  CHECK(value((*make_loss(df))(x, t)) == doctest::Approx(d + 2.0 * e).epsilon(1e-10));
  // monai.losses.DiceFocalLoss(softmax=True, lambda_focal=2.0), MONAI 1.6.1
  CHECK(value((*make_loss(df))(x, t)) == doctest::Approx(1.2025364885728804).epsilon(1e-6));
  df.focal_softmax = true;
  CHECK(value((*make_loss(df))(x, t)) == doctest::Approx(d + 2.0 * es).epsilon(1e-10));
}

TEST_CASE("deep supervision weights are 1/2^i normalised and targets are downsampled nearest-exact") {
  auto w = DeepSupervisionLoss::weights(3);
  REQUIRE(w.size() == 3);
  CHECK(w[0] == doctest::Approx(4.0 / 7));
  CHECK(w[1] == doctest::Approx(2.0 / 7));
  CHECK(w[2] == doctest::Approx(1.0 / 7));
  auto z = DeepSupervisionLoss::weights(3, /*zero_lowest=*/true);
  CHECK(z[0] == doctest::Approx(2.0 / 3));
  CHECK(z[2] == 0.0);
  auto labels = torch::arange(16, torch::kLong).reshape({1, 1, 4, 4});
  auto half = DeepSupervisionLoss::downsample_target(labels, {2, 2});
  CHECK((half.scalar_type() == torch::kLong));
  CHECK(torch::equal(half, torch::tensor({5, 7, 13, 15}, torch::kLong).reshape({1, 1, 2, 2})));
  // A loss that is the mean of (output - target): weighted sum of the per-scale means.
  DeepSupervisionLoss ds(
      [](const at::Tensor& x, const at::Tensor& t) { return (x - t.to(x.scalar_type())).mean(); });
  auto o0 = torch::full({1, 1, 4, 4}, 20.0), o1 = torch::full({1, 1, 2, 2}, 10.0);
  const double m0 = 20.0 - 7.5, m1 = 10.0 - (5 + 7 + 13 + 15) / 4.0;
  CHECK(value(ds({o0, o1}, labels)) == doctest::Approx(2.0 / 3 * m0 + 1.0 / 3 * m1));
}

TEST_CASE("loss options parse from JSON and unknown keys or names are errors") {
  REQUIRE_OK_AND_ASSIGN(auto o, parse_loss_options(nlohmann::json{
                                    {"name", "dice_ce"}, {"include_background", false}, {"lambda_ce", 0.5}}));
  CHECK(o.kind == LossKind::dice_ce);
  CHECK(o.dice.act == LossActivation::softmax);
  CHECK_FALSE(o.dice.include_background);
  CHECK(o.lambda_ce == 0.5);
  REQUIRE_OK_AND_ASSIGN(auto s, parse_loss_options(nlohmann::json{{"name", "dice_bce"}}));
  CHECK(s.dice.act == LossActivation::sigmoid);
  REQUIRE_OK_AND_ASSIGN(auto sig, parse_loss_options(nlohmann::json{{"name", "dice"}, {"sigmoid", true}}));
  CHECK(sig.dice.act == LossActivation::sigmoid);
  auto unknown = parse_loss_options(nlohmann::json{{"name", "dice"}, {"smoth_nr", 1}});
  CHECK_FALSE(unknown.is_ok());
  CHECK(unknown.status().message().find("smoth_nr") != std::string::npos);
  CHECK(unknown.status().message().find("smooth_nr") != std::string::npos);
  auto name = parse_loss_options(nlohmann::json{{"name", "tversky"}});
  CHECK(name.status().message().find("dice_focal") != std::string::npos);
  auto both = parse_loss_options(nlohmann::json{{"softmax", true}, {"sigmoid", true}});
  CHECK_FALSE(both.is_ok());
  auto type = parse_loss_options(nlohmann::json{{"gamma", "two"}});
  CHECK(type.status().message().find("loss.gamma: expected a non-negative number, got \"two\"") !=
        std::string::npos);
  // Softmax over one channel is refused instead of silently ignored.
  CHECK_THROWS_AS(dice_loss(torch::randn({1, 1, 4}), torch::zeros({1, 1, 4})), c10::Error);
}
