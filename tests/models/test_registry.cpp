// The network table: every model by name, uniform forward, clone, weights, option errors, and
// what a network without a target's hook gets from that target.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <any>
#include <filesystem>

#include "model_checks.hpp"
#include "models/interop/export.hpp"
#include "models/interop/onnx_export.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/unet.hpp"
#include "models/nets/weights.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using nlohmann::json;
using segflow::testing::max_abs_diff;

TEST_CASE("create_model builds unet, plain_unet, res_enc_unet and sam with a uniform forward") {
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

  // nnU-Net's ResidualEncoderUNet: stem, residual stages (nnU-Net's 1, 3, 4 blocks), the plain
  // decoder; every block's last norm starts at 0 (the block starts as its skip).
  REQUIRE_OK_AND_ASSIGN(
      auto res,
      create_model("res_enc_unet", json{{"n_stages", 3}, {"base_features", 4}, {"out_channels", 3}}));
  CHECK(res.info().name == "res_enc_unet");
  CHECK(res.info().deep_supervision);
  CHECK(res.info().size_divisor == 4);
  auto res_outs = res.forward(torch::randn({2, 1, 8, 12, 16}));
  REQUIRE(res_outs.size() == 2);
  CHECK(res_outs[0].sizes() == at::IntArrayRef({2, 3, 8, 12, 16}));
  CHECK(res_outs[1].sizes() == at::IntArrayRef({2, 3, 4, 6, 8}));
  std::size_t blocks = 0;
  for (const auto& p : res.module().named_parameters()) {
    if (p.key().find(".conv2.norm.weight") == std::string::npos) continue;
    ++blocks;
    CHECK(p.value().abs().max().item<double>() == 0.0);
  }
  CHECK(blocks == 1 + 3 + 4);
  res_outs[0].sum().backward();  // gradients reach the stem through the blocks
  for (const auto& p : res.module().named_parameters())
    if (p.key() == "encoder.stem.convs.0.conv.weight") CHECK(p.value().grad().abs().sum().item<double>() > 0);

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
  CHECK(name.status().message().find("unet, plain_unet, res_enc_unet, sam") != std::string::npos);
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
  auto blocks = create_model("res_enc_unet", json{{"n_stages", 3}, {"n_blocks_per_stage", {1, 2}}});
  CHECK(blocks.status().message().find(
            "n_blocks_per_stage: expected 3 entries (one per stage), got [1, 2]") != std::string::npos);
  auto conv = create_model("res_enc_unet", json{{"n_conv_per_stage", 2}});
  CHECK(conv.status().message().find("res_enc_unet.n_conv_per_stage: unknown option") != std::string::npos);
}

TEST_CASE("every network of the table reads its defaults by name and writes them back unchanged") {
  CHECK(known_models() == std::vector<std::string>{"unet", "plain_unet", "res_enc_unet", "sam"});
  for (const NetworkRow& row : network_table()) {
    INFO(row.name);
    CHECK_FALSE(row.description.empty());
    REQUIRE_OK_AND_ASSIGN(ModelOptions m, parse_model_options(json{{"name", row.name}}, "model"));
    CHECK(m.network == &row);
    CHECK(m.name() == row.name);
    json written;
    to_json(written, m);
    CHECK(written["name"] == row.name);
    REQUIRE_OK_AND_ASSIGN(ModelOptions back, parse_model_options(written, "model"));
    json again;
    to_json(again, back);
    CHECK(again == written);
    REQUIRE_OK_AND_ASSIGN(const NetworkRow* found, find_network(row.name));
    CHECK(found == &row);
  }
  auto unknown = find_network("res_net");
  REQUIRE_FALSE(unknown.is_ok());
  CHECK(unknown.status().message() ==
        "model: unknown name 'res_net'; known models: unet, plain_unet, res_enc_unet, sam");
  auto no_name = parse_model_options(json{{"channels", {4, 8}}}, "configs/job.yaml: model");
  REQUIRE_FALSE(no_name.is_ok());
  CHECK(no_name.status().message().find("configs/job.yaml: model.name: expected a model name (unet, "
                                        "plain_unet, res_enc_unet, sam), got nothing") != std::string::npos);
}

namespace {

/// A network of the test's own: MONAI's UNet under another name, with no export hook and no
/// foreign names (what a newly added network has before its exports are written).
NetworkRow exportless_row() {
  return network_row<UNetOptions>(
      "test_net", "a UNet without exports", +[](segflow::pipeline::OptionParser&, UNetOptions&) {},
      +[](const UNetOptions& o) { return unet_network().build(std::any(o)); },
      +[](const UNetOptions& o) { return o.in_channels; });
}

}  // namespace

TEST_CASE("exporting a network a target cannot write is an unsupported error naming network and target") {
  const NetworkRow row = exportless_row();
  UNetOptions small;
  small.channels = {4, 8};
  small.strides = {2};
  ModelOptions m;
  m.network = &row;
  m.net = small;
  REQUIRE_OK_AND_ASSIGN(ModelHandle net, row.build(m.net));

  auto pytorch = export_model(m, net.module());
  REQUIRE_FALSE(pytorch.is_ok());
  CHECK(pytorch.status().code() == segflow::ErrorCode::unsupported);
  CHECK(pytorch.status().message() ==
        "export --to pytorch: network 'test_net' has no PyTorch export (networks with one: unet, "
        "plain_unet, res_enc_unet, sam)");

  segflow::testing::TempDir dir("exportless");
  const auto out = dir / "net.onnx";
  auto onnx = write_onnx_model(m, net.module(), out, OnnxExportOptions{});
  REQUIRE_FALSE(onnx.is_ok());
  CHECK(onnx.code() == segflow::ErrorCode::unsupported);
  CHECK(onnx.message() ==
        "export --to onnx: network 'test_net' has no ONNX writer (networks it writes: unet, plain_unet, "
        "res_enc_unet, sam)");
  CHECK_FALSE(std::filesystem::exists(out));

  // model.weights: {names: monai} needs the network's MONAI names.
  REQUIRE_OK(write_tensor_archive(dir / "w.sfta", named_tensors(net.module())));
  auto weights = load_pretrained(net.module(), m, (dir / "w.sfta").string(), WeightsOptions{"monai"}, true);
  REQUIRE_FALSE(weights.is_ok());
  CHECK(weights.status().message().find("names: monai: test_net (a UNet without exports) has no monai names; "
                                        "expected one of segflow") != std::string::npos);
}
