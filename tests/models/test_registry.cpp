// create_model: every model by name, uniform forward, clone, weights, option errors.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "model_checks.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/weights.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using nlohmann::json;
using segflow::testing::max_abs_diff;

TEST_CASE("create_model builds unet, plain_unet and sam with a uniform forward") {
  torch::manual_seed(0);
  REQUIRE_OK_AND_ASSIGN(auto unet, create_model("unet", json{{"spatial_dims", 2},
                                                             {"channels", {4, 8}},
                                                             {"strides", {2}},
                                                             {"out_channels", 3},
                                                             {"norm", "batch"},
                                                             {"act", "relu"}}));
  CHECK(unet.info().out_channels == 3);
  CHECK(unet.info().size_divisor == 2);
  auto y = unet.predict(torch::randn({2, 1, 8, 8}));
  CHECK(y.sizes() == at::IntArrayRef({2, 3, 8, 8}));

  REQUIRE_OK_AND_ASSIGN(
      auto plain,
      create_model("plain_unet", json{{"n_stages", 3}, {"base_features", 4}, {"out_channels", 2}}));
  CHECK(plain.info().deep_supervision);
  auto outs = plain.forward(torch::randn({1, 1, 8, 8, 8}));
  CHECK(outs.size() == 2);
  CHECK(outs[0].sizes() == at::IntArrayRef({1, 2, 8, 8, 8}));

  REQUIRE_OK_AND_ASSIGN(auto sam, create_model("sam", json{{"preset", "tiny"}}));
  CHECK(sam.info().needs_box);
  CHECK(sam.info().fixed_size == 64);
  auto m = sam.predict(torch::randn({1, 3, 64, 64}), torch::tensor({{4.0, 4.0, 30.0, 30.0}}));
  CHECK(m.sizes() == at::IntArrayRef({1, 1, 64, 64}));
  // Frozen prompt encoder: not among the trainable parameters.
  size_t all = sam.module().parameters().size();
  CHECK(sam.trainable_parameters().size() < all);
  CHECK_THROWS_AS(sam.predict(torch::randn({1, 3, 64, 64})), c10::Error);
}

TEST_CASE("a cloned model handle predicts the same and trains independently") {
  torch::manual_seed(1);
  REQUIRE_OK_AND_ASSIGN(auto h, create_model("unet", json{{"channels", {4, 8}}, {"strides", {2}}}));
  auto copy = h.clone();
  CHECK(copy.module_ptr() != h.module_ptr());
  h.module().eval();
  copy.module().eval();
  auto x = torch::randn({1, 1, 8, 8, 8});
  torch::NoGradGuard no_grad;
  CHECK(max_abs_diff(h.predict(x), copy.predict(x)) == 0.0);
}

TEST_CASE("create_model loads a weights archive given in the options") {
  segflow::testing::TempDir dir("registry");
  const json opts{{"channels", {4, 8}}, {"strides", {2}}};
  REQUIRE_OK_AND_ASSIGN(auto a, create_model("unet", opts));
  REQUIRE_OK(write_tensor_archive(dir / "w.sfta", named_tensors(a.module())));
  json with = opts;
  with["weights"] = (dir / "w.sfta").string();
  REQUIRE_OK_AND_ASSIGN(auto b, create_model("unet", with));
  a.module().eval();
  b.module().eval();
  auto x = torch::randn({1, 1, 8, 8, 8});
  torch::NoGradGuard no_grad;
  CHECK(max_abs_diff(a.predict(x), b.predict(x)) == 0.0);
  json other = with;
  other["channels"] = {4, 16};
  auto mismatch = create_model("unet", other);
  CHECK_FALSE(mismatch.is_ok());
  CHECK(mismatch.status().message().find("shape mismatch") != std::string::npos);
}

TEST_CASE("unknown models, unknown option keys and bad values are errors that list what is known") {
  auto name = create_model("resnet", json::object());
  CHECK(name.status().code() == segflow::ErrorCode::invalid_argument);
  CHECK(name.status().message().find("unet, plain_unet, sam") != std::string::npos);
  auto key = create_model("unet", json{{"chanels", {4, 8}}});
  CHECK(key.status().message().find("unet.chanels: unknown option; expected") != std::string::npos);
  CHECK(key.status().message().find("num_res_units") != std::string::npos);
  auto type = create_model("unet", json{{"channels", "16,32"}});
  CHECK(type.status().message().find("unet.channels: expected a list of integers") != std::string::npos);
  auto norm = create_model("unet", json{{"norm", "group"}});
  CHECK(norm.status().message().find("batch, instance, none") != std::string::npos);
  auto strides = create_model("unet", json{{"channels", {4, 8, 16}}, {"strides", {2}}});
  CHECK(strides.status().message().find("strides") != std::string::npos);
  auto sam3d = create_model("sam", json{{"spatial_dims", 3}});
  CHECK(sam3d.status().message().find("spatial_dims") != std::string::npos);
  auto preset = create_model("sam", json{{"preset", "huge"}});
  CHECK(preset.status().message().find("tiny, small, vit_b") != std::string::npos);
  auto heads = create_model("sam", json{{"num_heads", 3}});
  CHECK(heads.status().message().find("embed_dim") != std::string::npos);
  auto not_object = create_model("unet", json::array());
  CHECK_FALSE(not_object.is_ok());
  auto plain = create_model("plain_unet", json{{"n_stages", 1}});
  CHECK(plain.status().message().find("n_stages") != std::string::npos);
}
