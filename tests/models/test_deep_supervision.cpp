// Deep-supervision weights by option (loss.deep_supervision): halving (the default), nnU-Net's
// (1/2^i, the lowest resolution 0, normalised) and none (the full-resolution output alone).
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "models/training/losses.hpp"
#include "test_util.hpp"

using namespace segflow::models;

TEST_CASE("deep supervision weights: halving by default, nnU-Net's with the lowest output 0, or none") {
  const auto halving = DeepSupervisionLoss::weights(4, DeepSupervisionWeights::halving);
  const auto nnunet = DeepSupervisionLoss::weights(4, DeepSupervisionWeights::nnunet);
  const auto none = DeepSupervisionLoss::weights(4, DeepSupervisionWeights::none);
  const std::vector<double> want_halving = {8.0 / 15, 4.0 / 15, 2.0 / 15, 1.0 / 15};
  const std::vector<double> want_nnunet = {8.0 / 14, 4.0 / 14, 2.0 / 14, 0.0};  // nnU-Net v2's trainer
  for (size_t i = 0; i < 4; ++i) {
    CHECK(halving[i] == doctest::Approx(want_halving[i]));
    CHECK(nnunet[i] == doctest::Approx(want_nnunet[i]));
    CHECK(none[i] == (i == 0 ? 1.0 : 0.0));
  }
  // One output: weight 1 whatever the kind (nnU-Net's zero never removes the only output).
  CHECK(DeepSupervisionLoss::weights(1, DeepSupervisionWeights::nnunet) == std::vector<double>{1.0});
  // The boolean form is the same table.
  CHECK(DeepSupervisionLoss::weights(4, true) == nnunet);
  CHECK(DeepSupervisionLoss::weights(4) == halving);
  CHECK(LossOptions{}.deep_supervision == DeepSupervisionWeights::halving);
}

TEST_CASE("the deep supervision loss leaves outputs of weight 0 out and downsamples targets per axis") {
  // The loss of each output is its mean value, so the total is the weighted sum of the means.
  LossFn mean = [](const at::Tensor& out, const at::Tensor&) { return out.mean(); };
  auto target = at::zeros({1, 1, 4, 8, 8}, at::kLong);
  std::vector<at::Tensor> outs = {torch::full({1, 2, 4, 8, 8}, 1.0, torch::requires_grad()),
                                  torch::full({1, 2, 4, 4, 4}, 2.0, torch::requires_grad()),  // anisotropic
                                  torch::full({1, 2, 2, 2, 2}, 4.0, torch::requires_grad())};
  at::Tensor l = DeepSupervisionLoss(mean, DeepSupervisionWeights::nnunet)(outs, target);
  CHECK(l.item<double>() == doctest::Approx(4.0 / 6 * 1 + 2.0 / 6 * 2));
  l.backward();
  CHECK(outs[0].grad().defined());
  CHECK_FALSE(outs[2].grad().defined());  // weight 0: not even scored
  CHECK(DeepSupervisionLoss(mean, DeepSupervisionWeights::none)(outs, target).item<double>() ==
        doctest::Approx(1.0));
  CHECK(DeepSupervisionLoss(mean)(outs, target).item<double>() ==
        doctest::Approx(4.0 / 7 * 1 + 2.0 / 7 * 2 + 1.0 / 7 * 4));
  CHECK(DeepSupervisionLoss::downsample_target(target, {4, 4, 4}).sizes() ==
        at::IntArrayRef({1, 1, 4, 4, 4}));
}

TEST_CASE("loss.deep_supervision reads halving, nnunet or none and refuses anything else") {
  REQUIRE_OK_AND_ASSIGN(auto o,
                        parse_loss_options(nlohmann::json::parse(R"({"deep_supervision": "nnunet"})")));
  CHECK(o.deep_supervision == DeepSupervisionWeights::nnunet);
  nlohmann::json j;
  to_json(j, o);
  CHECK(j["deep_supervision"] == "nnunet");
  REQUIRE_OK_AND_ASSIGN(auto d, parse_loss_options(nlohmann::json::object()));
  CHECK(d.deep_supervision == DeepSupervisionWeights::halving);
  auto bad = parse_loss_options(nlohmann::json::parse(R"({"deep_supervision": "zero_lowest"})"));
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message() ==
        "loss.deep_supervision: expected one of halving, nnunet, none, got \"zero_lowest\"");
}
