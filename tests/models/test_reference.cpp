// Numerical agreement with the reference implementations (segment_anything's SAM modules,
// MONAI's UNet, nnU-Net's PlainConvUNet from dynamic_network_architectures) on the same random
// weights, isotropic and with per-axis (anisotropic) strides and kernels.
// tests/models/reference/make_reference.py makes the weights and outputs; it needs those packages, which the
// project venv does not ship: point SEGFLOW_REFERENCE_PYTHONPATH at a folder holding them (e.g. pip install
// --target DIR
// --no-deps monai segment-anything). Without them the cases skip with a message.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "model_checks.hpp"
#include "models/nets/plain_unet.hpp"
#include "models/nets/sam.hpp"
#include "models/nets/unet.hpp"
#include "models/nets/weights.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using segflow::testing::TempDir;

namespace {

// Runs make_reference.py (the reference packages come with scripts/setup.sh).
bool make_reference(const std::string& which, const TempDir& dir) {
  using segflow::testing::shell_quote;
  std::string env;
  if (const char* p = std::getenv("SEGFLOW_REFERENCE_PYTHONPATH")) env = "PYTHONPATH=" + shell_quote(p) + " ";
  auto r = segflow::testing::run_command(
      env + shell_quote(segflow::testing::python()) + " " +
      shell_quote(segflow::testing::source_path("tests/models/reference/make_reference.py").string()) + " " +
      which + " " + shell_quote(dir.path().string()) + " 2>&1");
  // scripts/setup.sh installs MONAI and segment_anything: a missing package is a failure.
  REQUIRE_MESSAGE(r.exit_code != 3, "the reference package for " << which << " is not installed (" << r.out
                                                                 << "); run scripts/setup.sh");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return true;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  auto d = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
  return d / (b.to(torch::kDouble).abs().max().item<double>() + 1e-12);
}

/// The test-size SAM of make_reference.py (sam, sam_prompts) with the weights it wrote to `dir`.
Sam reference_sam(const TempDir& dir) {
  auto o = *SamOptions::preset("tiny");
  o.image_encoder.use_rel_pos = true;
  o.image_encoder.window_size = 3;
  o.image_encoder.global_attn_indexes = {1};
  o.mask_decoder.num_multimask_outputs = 3;
  o.mask_decoder.iou_head = true;
  o.mask_decoder.iou_head_hidden_dim = 64;
  Sam sam(o);
  REQUIRE_OK_AND_ASSIGN(auto weights, read_tensor_archive(dir / "sam_weights.sfta"));
  REQUIRE_OK(load_into(*sam, weights, /*strict=*/true));  // identity name map
  return sam;
}

}  // namespace

TEST_CASE("our SAM reproduces segment_anything's encoder, prompt encoder and decoder on the same weights") {
  TempDir dir("ref_sam");
  if (!make_reference("sam", dir)) return;
  Sam sam = reference_sam(dir);
  auto io = *read_tensor_archive(dir / "sam_io.sfta");
  sam->eval();
  torch::NoGradGuard no_grad;
  CHECK(rel_diff(sam->image_encoder->forward(io["image"]), io["embedding"]) < 1e-4);
  auto out = sam->forward_full(io["image"], io["box"]);
  CHECK(rel_diff(out.low_res_masks, io["low_res"]) < 1e-4);
  CHECK(rel_diff(out.masks, io["masks"]) < 1e-4);
  CHECK(rel_diff(out.iou_predictions, io["iou"]) < 1e-4);
}

TEST_CASE("our SAM takes points, boxes and masks as segment_anything does: prompt tokens, masks and IoU") {
  TempDir dir("ref_sam_prompts");
  if (!make_reference("sam_prompts", dir)) return;
  Sam sam = reference_sam(dir);
  auto io = *read_tensor_archive(dir / "sam_prompts.sfta");
  sam->eval();
  torch::NoGradGuard no_grad;
  using torch::indexing::Slice;
  const at::Tensor points = io["points"], labels = io["labels"];
  // Each mix segment_anything's own PromptEncoder.forward and MaskDecoder.forward ran on.
  const struct {
    const char* name;
    SamPrompts prompts;
    bool multimask;
    int64_t masks;
  } cases[] = {
      {"points", {.points = points, .labels = labels}, true, 3},  // three clicks, padded: SAM's candidates
      {"points_box",
       {.points = points.index({Slice(), Slice(0, 2)}),
        .labels = labels.index({Slice(), Slice(0, 2)}),
        .boxes = io["box"]},
       false,
       1},
      {"box_mask", {.boxes = io["box"], .masks = io["mask"]}, false, 1},  // a box and the previous mask
      {"points_mask",
       {.points = points.index({Slice(), Slice(0, 1)}),
        .labels = labels.index({Slice(), Slice(0, 1)}),
        .masks = io["mask"]},
       true,
       3},
  };
  for (const auto& c : cases) {
    const std::string name = c.name;
    INFO(name);
    auto [sparse, dense] = sam->prompt_encoder->encode(c.prompts);
    CHECK(rel_diff(sparse, io[name + "/sparse"]) < 1e-5);
    CHECK(rel_diff(dense, io[name + "/dense"]) < 1e-5);
    const SamOutput out = sam->forward_prompts(io["image"], c.prompts, c.multimask);
    CHECK(out.low_res_masks.size(1) == c.masks);
    CHECK(rel_diff(out.low_res_masks, io[name + "/low_res"]) < 1e-4);
    CHECK(rel_diff(out.iou_predictions, io[name + "/iou"]) < 1e-4);
    CHECK(out.masks.sizes() == at::IntArrayRef({1, c.masks, 64, 64}));
  }
  // The box path is the box-only mix: forward_full equals forward_prompts with the box alone.
  const at::Tensor box_only = sam->forward_full(io["image"], io["box"]).low_res_masks;
  CHECK(torch::equal(box_only, sam->forward_prompts(io["image"], {.boxes = io["box"]}).low_res_masks));
  // Prompts of the wrong shape are refused with what was expected.
  CHECK_THROWS_WITH_AS(sam->prompt_encoder->encode({}), doctest::Contains("expected a point, box or mask"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(sam->prompt_encoder->encode({.points = points}),
                       doctest::Contains("with labels (B, N)"), c10::Error);
  CHECK_THROWS_WITH_AS(sam->prompt_encoder->encode({.masks = torch::zeros({1, 1, 16, 16})}),
                       doctest::Contains("expected a mask prompt (B, 1, 32, 32)"), c10::Error);
}

TEST_CASE("our UNet reproduces MONAI's UNet with residual units and batch norm on the same weights") {
  TempDir dir("ref_unet");
  if (!make_reference("unet", dir)) return;
  UNetOptions o;
  o.channels = {4, 8, 16};
  o.strides = {2, 2};
  o.num_res_units = 2;
  o.norm = NormKind::batch;
  UNet net(o);
  REQUIRE_OK_AND_ASSIGN(auto weights, read_tensor_archive(dir / "unet_weights.sfta"));
  REQUIRE_OK(load_into(*net, weights, /*strict=*/true));
  auto io = *read_tensor_archive(dir / "unet_io.sfta");
  torch::NoGradGuard no_grad;
  net->eval();
  CHECK(rel_diff(net->forward(io["x"]), io["y_eval"]) < 1e-4);
  net->train();
  CHECK(rel_diff(net->forward(io["x"]), io["y_train"]) < 1e-4);
}

// Per-axis topologies: segflow's options are (x, y, z), the references' sequences (z, y, x)
// (make_reference.py writes the same topology reversed). Same weights, same outputs.
TEST_CASE("our UNet with per-axis strides and kernels reproduces MONAI's UNet given them in (z, y, x)") {
  TempDir dir("ref_unet_aniso");
  if (!make_reference("unet_aniso", dir)) return;
  UNetOptions o;
  o.out_channels = 3;
  o.channels = {4, 8, 16};
  o.strides = {{2, 2, 1}, {2, 2, 2}};
  o.kernel_size = {3, 3, 1};
  o.up_kernel_size = {3, 3, 1};
  o.num_res_units = 2;
  o.norm = NormKind::instance;
  UNet net(o);
  REQUIRE_OK_AND_ASSIGN(auto weights, read_tensor_archive(dir / "unet_aniso_weights.sfta"));
  REQUIRE_OK(load_into(*net, weights, /*strict=*/true));
  auto io = *read_tensor_archive(dir / "unet_aniso_io.sfta");
  torch::NoGradGuard no_grad;
  net->eval();
  const auto y = net->forward(io["x"]);
  MESSAGE("MONAI UNet, anisotropic: max abs diff " << segflow::testing::max_abs_diff(y, io["y"]) << " of max "
                                                   << io["y"].abs().max().item<double>());
  CHECK(rel_diff(y, io["y"]) < 1e-4);
}

TEST_CASE("our PlainConvUNet with per-axis strides and kernels reproduces nnU-Net's on every output") {
  TempDir dir("ref_plain_unet_aniso");
  if (!make_reference("plain_unet_aniso", dir)) return;
  PlainConvUNetOptions o;
  o.n_stages = 4;
  o.base_features = 4;
  o.max_features = 16;
  o.num_classes = 3;
  o.strides = {{1, 1, 1}, {2, 2, 1}, {2, 2, 2}, {2, 2, 2}};
  o.kernel_sizes = {{3, 3, 1}, 3, 3, 3};
  PlainConvUNet net(o);
  REQUIRE_OK_AND_ASSIGN(auto weights, read_tensor_archive(dir / "plain_unet_aniso_weights.sfta"));
  REQUIRE_OK(load_into(*net, weights, /*strict=*/true));
  auto io = *read_tensor_archive(dir / "plain_unet_aniso_io.sfta");
  torch::NoGradGuard no_grad;
  net->eval();
  const auto ys = net->forward(io["x"]);
  REQUIRE(ys.size() == 3);
  const char* names[] = {"y0", "y1", "y2"};
  for (size_t i = 0; i < ys.size(); ++i) {
    const auto& ref = io[names[i]];
    MESSAGE("nnU-Net PlainConvUNet, anisotropic, output " << i << " " << ref.sizes() << ": max abs diff "
                                                          << segflow::testing::max_abs_diff(ys[i], ref)
                                                          << " of max " << ref.abs().max().item<double>());
    CHECK(rel_diff(ys[i], ref) < 1e-4);
  }
}
