// Box-prompted SAM: shapes, gradients, the frozen prompt encoder, clone, SAM's names.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include "model_checks.hpp"
#include "models/nets/sam.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using segflow::testing::check_gradients;
using segflow::testing::max_abs_diff;
using segflow::testing::probe_loss;

namespace {
SamOptions tiny() {
  REQUIRE_OK_AND_ASSIGN(auto o, SamOptions::preset("tiny"));
  return o;
}
at::Tensor boxes_for(int64_t b, int64_t size) {
  auto boxes = torch::tensor({8.0, 10.0, 40.0, 50.0}).repeat({b, 1});
  return boxes * (static_cast<double>(size) / 64.0);
}
}  // namespace

TEST_CASE("tiny SAM maps an image and a box to full-size mask logits and trains the encoder and decoder") {
  torch::manual_seed(0);
  Sam sam(tiny());
  auto image = torch::randn({2, 3, 64, 64});
  auto out = sam->forward_full(image, boxes_for(2, 64));
  CHECK(out.masks.sizes() == at::IntArrayRef({2, 1, 64, 64}));
  CHECK(out.low_res_masks.sizes() == at::IntArrayRef({2, 1, 32, 32}));  // 4 x (64 / patch 8)
  CHECK_FALSE(out.iou_predictions.defined());                           // tiny has no IoU head
  probe_loss(out.masks).backward();
  check_gradients(*sam);
}

TEST_CASE("the SAM prompt encoder is frozen by default, also in a clone") {
  Sam sam(tiny());
  size_t frozen = 0;
  for (const auto& p : sam->prompt_encoder->parameters()) {
    CHECK_FALSE(p.requires_grad());
    ++frozen;
  }
  CHECK(frozen == 4 + 1 + 1 + 3 * 2 + 2 * 2);  // 4 point + not-a-point + no-mask embeddings, mask downscaling
  for (const auto& p : sam->image_encoder->parameters()) CHECK(p.requires_grad());
  auto copy = std::dynamic_pointer_cast<SamImpl>(sam->clone());
  REQUIRE(copy);
  for (const auto& p : copy->prompt_encoder->parameters()) CHECK_FALSE(p.requires_grad());
  for (const auto& p : copy->mask_decoder->parameters()) CHECK(p.requires_grad());
}

TEST_CASE("a cloned SAM gives identical outputs") {
  torch::manual_seed(1);
  Sam sam(tiny());
  auto copy = std::dynamic_pointer_cast<SamImpl>(sam->clone());
  torch::NoGradGuard no_grad;
  auto image = torch::randn({1, 3, 64, 64});
  auto boxes = boxes_for(1, 64);
  CHECK(max_abs_diff(sam->forward(image, boxes), copy->forward(image, boxes)) == 0.0);
  CHECK(max_abs_diff(sam->prompt_encoder->pe_layer->positional_encoding_gaussian_matrix,
                     copy->prompt_encoder->pe_layer->positional_encoding_gaussian_matrix) == 0.0);
}

TEST_CASE("the box moves the predicted mask: different boxes give different logits") {
  torch::manual_seed(2);
  Sam sam(tiny());
  torch::NoGradGuard no_grad;
  auto image = torch::randn({1, 3, 64, 64});
  auto a = sam->forward(image, torch::tensor({{0.0, 0.0, 20.0, 20.0}}));
  auto b = sam->forward(image, torch::tensor({{30.0, 30.0, 60.0, 60.0}}));
  CHECK(max_abs_diff(a, b) > 1e-6);
}

TEST_CASE("tiny SAM learns a box-shaped mask on a CPU in a few steps") {
  torch::manual_seed(3);
  Sam sam(tiny());
  std::vector<at::Tensor> params;
  for (const auto& p : sam->parameters())
    if (p.requires_grad()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3));
  auto image = torch::randn({2, 3, 64, 64}) * 0.1;
  auto target = torch::zeros({2, 1, 64, 64});
  using torch::indexing::Slice;
  target.index_put_({Slice(), Slice(), Slice(16, 48), Slice(16, 48)}, 1.0);
  image.index_put_({Slice(), Slice(), Slice(16, 48), Slice(16, 48)}, 1.0);
  auto boxes = torch::tensor({{16.0, 16.0, 47.0, 47.0}, {16.0, 16.0, 47.0, 47.0}});
  double first = 0, last = 0;
  for (int step = 0; step < 15; ++step) {
    opt.zero_grad();
    auto loss = torch::binary_cross_entropy_with_logits(sam->forward(image, boxes), target);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  CHECK(last < 0.7 * first);
}

TEST_CASE("SAM parameter names mirror segment_anything's state dict keys") {
  REQUIRE_OK_AND_ASSIGN(auto o, SamOptions::preset("small"));
  Sam sam(o);
  auto params = sam->named_parameters();
  auto buffers = sam->named_buffers();
  for (const char* name : {"image_encoder.patch_embed.proj.weight",
                           "image_encoder.pos_embed",
                           "image_encoder.blocks.0.norm1.weight",
                           "image_encoder.blocks.0.attn.qkv.weight",
                           "image_encoder.blocks.0.attn.proj.bias",
                           "image_encoder.blocks.3.mlp.lin1.weight",
                           "image_encoder.neck.0.weight",
                           "image_encoder.neck.1.weight",
                           "image_encoder.neck.3.bias",
                           "prompt_encoder.point_embeddings.3.weight",
                           "prompt_encoder.not_a_point_embed.weight",
                           "prompt_encoder.mask_downscaling.6.weight",
                           "prompt_encoder.no_mask_embed.weight",
                           "mask_decoder.transformer.layers.0.self_attn.q_proj.weight",
                           "mask_decoder.transformer.layers.1.cross_attn_image_to_token.out_proj.bias",
                           "mask_decoder.transformer.final_attn_token_to_image.v_proj.weight",
                           "mask_decoder.transformer.norm_final_attn.weight",
                           "mask_decoder.iou_token.weight",
                           "mask_decoder.mask_tokens.weight",
                           "mask_decoder.output_upscaling.0.weight",
                           "mask_decoder.output_upscaling.3.bias",
                           "mask_decoder.output_hypernetworks_mlps.3.layers.2.weight",
                           "mask_decoder.iou_prediction_head.layers.2.bias"}) {
    INFO(name);
    CHECK(params.contains(name));
  }
  CHECK(buffers.contains("prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"));
  CHECK(params["mask_decoder.mask_tokens.weight"].sizes() == at::IntArrayRef({4, 128}));
  CHECK(params["image_encoder.neck.0.weight"].sizes() == at::IntArrayRef({128, 256, 1, 1}));
}

TEST_CASE("the vit_b preset has SAM ViT-B's parameter count and shapes") {
  REQUIRE_OK_AND_ASSIGN(auto o, SamOptions::preset("vit_b"));
  Sam sam(o);
  int64_t count = 0;
  for (const auto& p : sam->parameters()) count += p.numel();
  // segment_anything sam_model_registry["vit_b"]: 93,735,472 parameters.
  CHECK(count == 93735472);
  auto params = sam->named_parameters();
  CHECK(params["image_encoder.blocks.0.attn.rel_pos_h"].sizes() == at::IntArrayRef({27, 64}));  // window 14
  CHECK(params["image_encoder.blocks.2.attn.rel_pos_h"].sizes() ==
        at::IntArrayRef({127, 64}));  // global, 64 tokens
  CHECK(params["image_encoder.pos_embed"].sizes() == at::IntArrayRef({1, 64, 64, 768}));
}

TEST_CASE("windowed attention with relative positions runs forward and backward") {
  torch::manual_seed(4);
  auto o = tiny();
  o.image_encoder.use_rel_pos = true;
  o.image_encoder.window_size = 3;  // 8 x 8 tokens: padded to 9 x 9, 9 windows
  o.image_encoder.global_attn_indexes = {1};
  Sam sam(o);
  auto out = sam->forward(torch::randn({1, 3, 64, 64}), boxes_for(1, 64));
  CHECK(out.sizes() == at::IntArrayRef({1, 1, 64, 64}));
  probe_loss(out).backward();
  for (auto& p : sam->image_encoder->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(torch::isfinite(p.value().grad()).all().item<bool>());
  }
}

TEST_CASE("SAM rejects unknown presets, inconsistent options and wrong input sizes") {
  auto bad = SamOptions::preset("vit_h");
  CHECK_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("tiny, small, vit_b") != std::string::npos);
  auto o = tiny();
  o.image_encoder.img_size = 60;
  o.resolve();
  CHECK(o.validate().message().find("img_size") != std::string::npos);
  Sam sam(tiny());
  CHECK_THROWS_WITH_AS(sam->forward(torch::randn({1, 3, 32, 32}), boxes_for(1, 32)), doctest::Contains("64"),
                       c10::Error);
  CHECK_THROWS_AS(sam->forward(torch::randn({1, 3, 64, 64}), torch::zeros({1, 3})), c10::Error);
}
