// The IoU-prediction loss (LiteMedSAM's iou_loss_weight): its values, and training a tiny SAM
// with its IoU head through the trainer.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>

#include "models/training/losses.hpp"
#include "train_helpers.hpp"

using namespace segflow;
using namespace segflow::testing::train;

TEST_CASE(
    "iou_prediction_loss is the MSE between the predicted IoU and the true IoU of the thresholded mask") {
  // Sample 0: prediction covers 4 pixels, target 2 of them plus 2 more -> IoU 2 / 6.
  // Sample 1: both empty -> IoU 1. Sample 2: disjoint -> IoU 0.
  auto logits = torch::full({3, 1, 4, 4}, -3.0);
  auto target = torch::zeros({3, 1, 4, 4});
  using torch::indexing::Slice;
  logits.index_put_({0, 0, 0, Slice(0, 4)}, 2.0);
  target.index_put_({0, 0, 0, Slice(2, 4)}, 1.0);
  target.index_put_({0, 0, 1, Slice(0, 2)}, 1.0);
  logits.index_put_({2, 0, 3, 3}, 1.0);
  target.index_put_({2, 0, 0, 0}, 1.0);
  auto pred = torch::tensor({{0.5}, {0.25}, {0.1}}).requires_grad_(true);
  auto loss = models::iou_prediction_loss(logits, pred, target);
  const double expected =
      (std::pow(0.5 - 2.0 / 6.0, 2) + std::pow(0.25 - 1.0, 2) + std::pow(0.1 - 0.0, 2)) / 3.0;
  CHECK(loss.item<double>() == doctest::Approx(expected).epsilon(1e-6));
  loss.backward();
  CHECK(pred.grad()[1][0].item<double>() == doctest::Approx(2.0 * (0.25 - 1.0) / 3.0).epsilon(1e-6));
  CHECK_THROWS_AS(models::iou_prediction_loss(logits, torch::zeros({3}), target), c10::Error);
}

TEST_CASE(
    "two training steps of a tiny SAM with its IoU head and loss.iou_weight: finite, reported, the IoU term "
    "added") {
  const std::string model =
      "{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, spatial_dims: 2, in_channels: "
      "3, "
      "out_channels: 1, iou_head: true, num_multimask_outputs: 3}";
  auto with =
      job(model, "{name: dice_bce, sigmoid: true, to_onehot_y: false, squared_pred: true, iou_weight: 1.0}",
          "none", "{name: adamw, lr: 0.001, weight_decay: 0.01}");
  auto without = job(model, "{name: dice_bce, sigmoid: true, to_onehot_y: false, squared_pred: true}", "none",
                     "{name: adamw, lr: 0.001, weight_decay: 0.01}");
  CHECK(with.loss.iou_weight == 1.0);
  REQUIRE_OK_AND_ASSIGN(auto a, Trainer::create(with, c10::Device(c10::kCPU)));
  REQUIRE_OK_AND_ASSIGN(auto b, Trainer::create(without, c10::Device(c10::kCPU)));
  const auto batch = sam_batch(32);
  const auto la = train_steps(*a, batch, 2);
  const auto lb = train_steps(*b, batch, 2);
  REQUIRE(la.size() == 2);
  REQUIRE(lb.size() == 2);
  MESSAGE("losses with the IoU term: " << la[0] << ", " << la[1] << "; without: " << lb[0] << ", " << lb[1]);
  for (double l : la) CHECK(std::isfinite(l));
  // Same seed, same weights at step 1: the difference is the (positive) IoU term.
  CHECK(la[0] > lb[0]);
  CHECK(la[0] - lb[0] < 1.0);  // an MSE of numbers in [0, 1] is at most 1 (weight 1)
  // The IoU head learned: its first layer moved.
  auto head = [](Trainer& t) {
    return t.model()
        .module()
        .named_parameters()["mask_decoder.iou_prediction_head.layers.0.weight"]
        .detach()
        .clone();
  };
  REQUIRE_OK_AND_ASSIGN(auto c, Trainer::create(with, c10::Device(c10::kCPU)));
  const auto before = head(*c);
  train_steps(*c, batch, 2);
  CHECK((head(*c) - before).abs().max().item<double>() > 0);
}

TEST_CASE("loss.iou_weight needs a model with an IoU head, and a non-negative weight") {
  auto cfg =
      job("{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, spatial_dims: 2, "
          "in_channels: 3, out_channels: 1}",
          "{name: dice_bce, sigmoid: true, to_onehot_y: false, iou_weight: 0.5}", "none");
  auto t = Trainer::create(cfg, c10::Device(c10::kCPU));
  REQUIRE_FALSE(t.is_ok());
  CHECK(t.status().message().find("loss.iou_weight") != std::string::npos);
  auto bad = models::parse_loss_options(nlohmann::json::parse(R"({"name": "dice_bce", "iou_weight": -1})"));
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("iou_weight") != std::string::npos);
}
