// Mixed precision on the CPU: autocast really runs (bf16 outputs), every model family trains
// under bf16 autocast with finite gradients and a falling loss, non-finite steps are skipped
// and counted on the device, and the loop reads the device only at log steps.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <cmath>
#include <string>
#include <vector>

#include "model_checks.hpp"
#include "models/nets/layers.hpp"
#include "models/training/job_config.hpp"
#include "models/training/optim.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/staged_source.hpp"
#include "test_util.hpp"
#include "train_helpers.hpp"

using namespace segflow;
using namespace segflow::models;

namespace {

using namespace segflow::testing::train;

/// One forward under bf16 autocast: the output is bfloat16 (autocast ran) and, after a
/// float32 loss, every trainable parameter has a finite, non-zero float32 gradient.
void check_autocast_forward_backward(Trainer& t, const Batch& b) {
  auto& model = t.model();
  at::Tensor image = b.tensors.at("image");
  if (model.info().spatial_dims == 2 && image.dim() == 5) image = image.squeeze(2);
  at::Tensor box = b.tensors.count("box") ? b.tensors.at("box") : at::Tensor();
  std::vector<at::Tensor> outs;
  {
    AutocastGuard ac(t.device(), "bf16");
    outs = model.forward(image, box);
  }
  REQUIRE_FALSE(outs.empty());
  for (const auto& o : outs) CHECK((o.scalar_type() == at::kBFloat16));
  at::Tensor loss = at::zeros({});
  for (std::size_t i = 0; i < outs.size(); ++i)
    loss = loss + segflow::testing::probe_loss(outs[i].to(at::kFloat), 7 + i);
  model.module().zero_grad();
  loss.backward();
  segflow::testing::check_gradients(model.module());
  for (const auto& p : t.parameters())
    if (p.grad().defined()) CHECK((p.grad().scalar_type() == at::kFloat));
  model.module().zero_grad();
}

/// The common check: autocast forward/backward, then `steps` bf16 training steps whose loss
/// falls (mean of the last two below 0.9 x the first) with no step skipped.
void check_trains_under_bf16(const JobConfig& cfg, const Batch& b, std::int64_t steps) {
  REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, c10::Device(c10::kCPU)));
  check_autocast_forward_backward(*t, b);
  EpochInfo ep;
  auto losses = train_steps(*t, b, steps, &ep);
  REQUIRE(losses.size() == static_cast<std::size_t>(steps));
  for (double l : losses) CHECK(std::isfinite(l));
  const double last = (losses[losses.size() - 1] + losses[losses.size() - 2]) / 2;
  INFO("first loss ", losses.front(), ", last two ", losses[losses.size() - 2], " ", losses.back());
  CHECK(last < 0.9 * losses.front());
  CHECK(ep.skipped_steps == 0);
  for (const auto& p : t->parameters()) CHECK(torch::isfinite(p).all().item<bool>());
}

}  // namespace

TEST_CASE(
    "the autocast guard turns bf16 autocast on for the CPU, restores the state and refuses fp16 there") {
  const c10::Device cpu(c10::kCPU);
  REQUIRE_FALSE(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
  auto w = torch::randn({4, 2, 3, 3, 3});
  auto x = torch::randn({1, 2, 5, 5, 5});
  {
    AutocastGuard outer(cpu, "bf16");
    CHECK(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
    CHECK((at::conv3d(x, w).scalar_type() == at::kBFloat16));
    // PReLU is on the CPU list too: its bf16 output meets the next conv's float32 weights,
    // which only works because conv3d (not at::convolution) is an autocast op.
    auto y = at::prelu(at::conv3d(x, w), torch::full({1}, 0.25));
    CHECK((y.scalar_type() == at::kBFloat16));
    CHECK((at::conv3d(y, torch::randn({2, 4, 1, 1, 1})).scalar_type() == at::kBFloat16));
    {
      AutocastGuard inner(cpu, "none");  // "none" leaves the outer guard's state alone
      CHECK(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
    }
  }
  CHECK_FALSE(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
  CHECK((at::conv3d(x, w).scalar_type() == at::kFloat));
  CHECK_THROWS_WITH(AutocastGuard(cpu, "fp16"), doctest::Contains("CUDA"));
  CHECK_THROWS_WITH(AutocastGuard(cpu, "fp8"), doctest::Contains("none, bf16 or fp16"));
}

TEST_CASE("a 3D UNet with PReLU and batch norm (the spleen net's blocks) trains under CPU bf16 autocast") {
  auto cfg = job(
      "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 3, channels: [4, 8, 16], strides: [2, 2], "
      "num_res_units: 2, norm: batch}",
      kDiceCe, "bf16");
  check_trains_under_bf16(cfg, segmentation_batch({16, 16, 16}), 10);
}

TEST_CASE("a 2D UNet trains under CPU bf16 autocast, also with channels-last weights and inputs") {
  for (const char* cl : {"false", "true"}) {
    CAPTURE(cl);
    auto cfg =
        job("{name: unet, spatial_dims: 2, in_channels: 1, out_channels: 3, channels: [8, 16, 32], strides: "
            "[2, 2], "
            "num_res_units: 1, norm: batch}",
            kDiceCe, "bf16");
    cfg.train.channels_last = std::string(cl) == "true";
    check_trains_under_bf16(cfg, segmentation_batch({16, 16}), 10);
  }
}

TEST_CASE("the nnU-Net-like PlainConvUNet with deep supervision trains under CPU bf16 autocast") {
  auto cfg = job(
      "{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: 3, n_stages: 3, base_features: 4, "
      "deep_supervision: true}",
      "{name: dice_ce, to_onehot_y: true, softmax: true, batch: true}", "bf16",
      "{name: sgd, lr: 0.05, momentum: 0.99, nesterov: true}");
  check_trains_under_bf16(cfg, segmentation_batch({16, 16, 16}), 10);
}

TEST_CASE("the box-prompted SAM model trains under CPU bf16 autocast") {
  auto cfg =
      job("{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, spatial_dims: 2, "
          "in_channels: 3, "
          "out_channels: 1}",
          "{name: dice_bce, sigmoid: true, to_onehot_y: false}", "bf16", "{name: adamw, lr: 0.002}");
  check_trains_under_bf16(cfg, sam_batch(32), 10);
}

TEST_CASE(
    "a bf16 step with non-finite gradients is skipped on the device and reported, and training goes on") {
  auto cfg =
      job("{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 3, channels: [4, 8], strides: [2], "
          "num_res_units: 1, norm: batch}",
          kDiceCe, "bf16", "{name: sgd, lr: 0.1, momentum: 0.9}");
  REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, c10::Device(c10::kCPU)));
  Batch good = segmentation_batch({8, 8, 8});
  train_steps(*t, good, 1);  // momentum to protect
  std::vector<at::Tensor> before;
  for (const auto& p : t->parameters()) before.push_back(p.detach().clone());
  const TensorMap state_before = [&] {
    TensorMap m;
    for (const auto& [k, v] : t->optimizer().state()) m.emplace(k, v.clone());
    return m;
  }();
  Batch bad = good;
  bad.tensors["image"] = good.tensors.at("image").clone();
  bad.tensors["image"].view(-1)[5] = std::numeric_limits<float>::infinity();  // NaN gradients follow
  pipeline::StagedBatchSource src({bad}, 1);
  Steps obs;
  REQUIRE_OK_AND_ASSIGN(auto ep, t->train_epoch(src, 1, obs));
  REQUIRE(obs.steps.size() == 1);
  CHECK(obs.steps[0].logged);
  CHECK(obs.steps[0].skipped);
  CHECK(obs.steps[0].skipped_steps == 1);
  CHECK(ep.skipped_steps == 1);
  CHECK(t->state().skipped_steps == 1);
  CHECK(t->state().step == 2);  // a skipped step still counts as a step
  CHECK(obs.steps[0].loss_scale == 1.0);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(t->parameters()[i], before[i]));
  for (const auto& [k, v] : t->optimizer().state()) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    CAPTURE(key);
    CHECK(torch::equal(v, state_before.at(k)));
  }
  // The next finite step trains again.
  EpochInfo next;
  train_steps(*t, good, 1, &next);
  CHECK(next.skipped_steps == 0);
  CHECK(t->state().skipped_steps == 1);
  CHECK_FALSE(torch::equal(t->parameters()[0], before[0]));
}

TEST_CASE("the training loop reads the device only every log_every steps and at the end of an epoch") {
  auto cfg =
      job("{name: unet, spatial_dims: 2, in_channels: 1, out_channels: 3, channels: [4, 8], strides: [2], "
          "num_res_units: 1, norm: batch}",
          kDiceCe, "none", "{name: adam, lr: 0.01}", /*log_every=*/4);
  REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, c10::Device(c10::kCPU)));
  pipeline::StagedBatchSource src({segmentation_batch({16, 16})}, 10);
  Steps obs;
  REQUIRE_OK_AND_ASSIGN(auto ep, t->train_epoch(src, 10, obs));
  REQUIRE(obs.steps.size() == 10);
  CHECK(t->host_reads() == 2 + 1);  // steps 4 and 8, and the epoch's end
  for (const auto& s : obs.steps) {
    CAPTURE(s.step);
    CHECK(s.logged == (s.step % 4 == 0));
  }
  CHECK(std::isnan(obs.steps[0].loss));  // nothing read yet
  CHECK(std::isfinite(obs.steps[3].loss));
  CHECK(obs.steps[4].loss == obs.steps[3].loss);  // repeated until the next read
  CHECK(obs.steps[7].loss != obs.steps[3].loss);
  // The epoch mean covers all 10 steps: steps 1-4 and 5-8 logged their window means.
  CHECK(std::isfinite(ep.loss));
  CHECK(ep.loss < obs.steps[3].loss);
}

TEST_CASE("a 3D conv on an input shallower than its kernel gets float32-accurate gradients under CPU bf16") {
  // LibTorch 2.11's CPU bf16 conv3d gives garbage weight gradients (1e30, inf) for inputs of
  // depth 2 with a 3^3 kernel (the bottom of a UNet on 16^3 crops); ConvNd runs those in fp32.
  for (std::int64_t depth : {2, 3, 4}) {
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      CAPTURE(depth);
      CAPTURE(seed);
      torch::manual_seed(seed);
      ConvNd conv(ConvOptions{3, 32, 64, 3});
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
      const at::Tensor x = at::randn({2, 32, depth, 4, 4}, gen, at::TensorOptions());
      const at::Tensor g = at::randn({2, 64, depth, 4, 4}, gen, at::TensorOptions());
      at::Tensor y;
      {
        AutocastGuard ac(c10::Device(c10::kCPU), "bf16");
        y = conv->forward(x);
      }
      y.backward(g.to(y.scalar_type()));
      const at::Tensor w_bf16 = conv->weight.grad().clone();
      conv->weight.mutable_grad() = at::Tensor();
      conv->forward(x).backward(g);
      const at::Tensor w_fp32 = conv->weight.grad();
      CHECK(torch::isfinite(w_bf16).all().item<bool>());
      const double rel = ((w_bf16 - w_fp32).abs().max() / w_fp32.abs().max()).item<double>();
      CHECK(rel < 0.05);  // bf16 rounding of inputs, not garbage
    }
  }
}
