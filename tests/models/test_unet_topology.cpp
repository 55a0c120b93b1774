// Per-axis topologies (issue 29 item 2): strides and kernel sizes per stage and per axis for
// plain_unet (nnU-Net's PlainConvUNet) and unet (MONAI's UNet), written (x, y, z) in configs
// and reversed into tensor order (Z, Y, X) inside; the divisibility rule per axis at config
// time; export, checkpoints and a short training run of an anisotropic network.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "job_yaml.hpp"
#include "model_checks.hpp"
#include "models/interop/export.hpp"
#include "models/nets/plain_unet.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/unet.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/staged_source.hpp"
#include "test_util.hpp"
#include "train_helpers.hpp"

using namespace segflow;
using namespace segflow::models;
using segflow::testing::check_gradients;
using segflow::testing::max_abs_diff;
using segflow::testing::probe_loss;
using segflow::testing::TempDir;

namespace {

/// nnU-Net's kind of plan for thick-slice CT, 4 stages: no pooling along z at first, 1-voxel
/// kernels along z in stage 0.
PlainConvUNetOptions topo_thick_slice_plain() {
  PlainConvUNetOptions o;
  o.n_stages = 4;
  o.base_features = 4;
  o.max_features = 16;
  o.num_classes = 3;
  o.strides = {{1, 1, 1}, {2, 2, 1}, {2, 2, 2}, {2, 2, 2}};
  o.kernel_sizes = {{3, 3, 1}, {3, 3, 3}, 3, 3};
  return o;
}

/// A job (x, y, z sizes) of an anisotropic plain_unet with nnU-Net's deep-supervision weights.
testing::JobYaml topo_job() {
  testing::JobYaml job;
  job.name = "aniso";
  job.seed = "5";
  job.stages = {"load"};
  job.model =
      "{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: 3, n_stages: 3, base_features: 4, "
      "max_features: 16, strides: [[1, 1, 1], [2, 2, 1], [2, 2, 2]], kernel_sizes: [[3, 3, 1], 3, 3]}";
  job.loss = "{name: dice_ce, to_onehot_y: true, softmax: true, deep_supervision: nnunet}";
  job.optimizer = "{name: adam, lr: 0.01}";
  job.epochs = 4;
  job.train = "batch_size: 2, device: cpu, threads: 2";
  job.validation = "{roi_size: [16, 16, 8], overlap: 0.25, sw_batch_size: 2}";
  return job;
}

JobConfig topo_parse(const testing::JobYaml& job, const std::vector<std::string>& set = {}) {
  REQUIRE_OK_AND_ASSIGN(auto c, parse_job_config(job.yaml(), "job.yaml", set));
  return c;
}

/// The error of parsing and then validating `job` with `set` applied.
std::string topo_error(const testing::JobYaml& job, const std::vector<std::string>& set) {
  auto c = parse_job_config(job.yaml(), "job.yaml", set);
  if (!c.is_ok()) return c.status().message();
  auto st = validate_job_config(*c, pipeline::builtin_registry());
  return st.is_ok() ? std::string("(no error)") : st.message();
}

std::vector<int64_t> weight_shape(const ConvNdImpl& conv) { return conv.weight.sizes().vec(); }

}  // namespace

TEST_CASE(
    "an anisotropic 3D PlainConvUNet pools per axis, keeps (x, y, z) kernels in tensor order and trains") {
  torch::manual_seed(11);
  PlainConvUNet net(topo_thick_slice_plain());
  CHECK(net->options.size_divisors() == std::vector<int64_t>{8, 8, 4});  // x, y, z
  CHECK(net->options.size_divisor() == 8);
  // (N, C, Z, Y, X): z 8 (divisor 4), y 16, x 24 (divisor 8).
  auto outs = net->forward(torch::randn({2, 1, 8, 16, 24}));
  REQUIRE(outs.size() == 3);
  CHECK(outs[0].sizes() == at::IntArrayRef({2, 3, 8, 16, 24}));
  CHECK(outs[1].sizes() == at::IntArrayRef({2, 3, 8, 8, 12}));  // stage 1 pools x and y only
  CHECK(outs[2].sizes() == at::IntArrayRef({2, 3, 4, 4, 6}));
  (probe_loss(outs[0]) + probe_loss(outs[1], 8) + probe_loss(outs[2], 9)).backward();
  check_gradients(*net);
  // Kernel [3, 3, 1] (x, y, z) is (kz, ky, kx) = (1, 3, 3) in the weight, padded (0, 1, 1).
  auto& enc0 = net->encoder_stages->at<torch::nn::ModuleListImpl>(0).at<ConvBlockImpl>(0);
  CHECK(weight_shape(*enc0.conv) == std::vector<int64_t>{4, 1, 1, 3, 3});
  CHECK(enc0.conv->resolved_padding() == std::vector<int64_t>{0, 1, 1});
  auto& enc1 = net->encoder_stages->at<torch::nn::ModuleListImpl>(1).at<ConvBlockImpl>(0);
  CHECK(enc1.conv->options.stride.expand(3) == std::vector<int64_t>{1, 2, 2});
  // The decoder upsamples by the stride of the stage below and joins the skip of stage s with
  // the kernel of stage s: the last decoder stage has stage 0's (1, 3, 3) kernels.
  CHECK(weight_shape(net->transpconvs->at<ConvNdImpl>(2)) == std::vector<int64_t>{8, 4, 1, 2, 2});
  auto& dec_last = net->decoder_stages->at<torch::nn::ModuleListImpl>(2).at<ConvBlockImpl>(1);
  CHECK(weight_shape(*dec_last.conv) == std::vector<int64_t>{4, 4, 1, 3, 3});
}

TEST_CASE("an anisotropic 2D PlainConvUNet takes (x, y) strides and kernels and trains") {
  torch::manual_seed(12);
  PlainConvUNetOptions o;
  o.spatial_dims = 2;
  o.n_stages = 3;
  o.base_features = 4;
  o.strides = {{1, 1}, {2, 1}, {2, 2}};  // x pooled twice, y once
  o.kernel_sizes = {{3, 1}, 3, 3};
  PlainConvUNet net(o);
  CHECK(o.size_divisors() == std::vector<int64_t>{4, 2});
  auto outs = net->forward(torch::randn({2, 1, 6, 12}));  // (N, C, Y, X)
  REQUIRE(outs.size() == 2);
  CHECK(outs[0].sizes() == at::IntArrayRef({2, 2, 6, 12}));
  CHECK(outs[1].sizes() == at::IntArrayRef({2, 2, 6, 6}));
  (probe_loss(outs[0]) + probe_loss(outs[1], 8)).backward();
  check_gradients(*net);
  auto& enc0 = net->encoder_stages->at<torch::nn::ModuleListImpl>(0).at<ConvBlockImpl>(0);
  CHECK(weight_shape(*enc0.conv) == std::vector<int64_t>{4, 1, 1, 3});  // (ky, kx) = (1, 3)
  // y 7 is not a multiple of 2: the message names the axis and its divisor.
  CHECK_THROWS_WITH_AS(net->forward(torch::randn({1, 1, 7, 12})),
                       doctest::Contains("spatial size on y (7) must be divisible by 2"), c10::Error);
}

TEST_CASE("an anisotropic MONAI UNet with residual units and per-axis kernels trains in 3D and 2D") {
  torch::manual_seed(13);
  UNetOptions o;
  o.channels = {4, 8, 16};
  o.strides = {{2, 2, 1}, {2, 2, 2}};
  o.kernel_size = {3, 3, 1};
  o.up_kernel_size = {3, 3, 1};
  o.num_res_units = 2;
  UNet net(o);
  CHECK(o.size_divisors() == std::vector<int64_t>{4, 4, 2});
  auto y = net->forward(torch::randn({2, 1, 6, 12, 16}));
  CHECK(y.sizes() == at::IntArrayRef({2, 2, 6, 12, 16}));
  probe_loss(y).backward();
  check_gradients(*net);
  // MONAI's residual path of a strided unit: the unit's kernel and stride, per axis.
  auto& d0 = net->down->at<ResidualUnitImpl>(0);
  REQUIRE(d0.residual);
  CHECK(weight_shape(*d0.residual) == std::vector<int64_t>{4, 1, 1, 3, 3});
  CHECK(d0.residual->options.stride.expand(3) == std::vector<int64_t>{1, 2, 2});
  // The transposed conv of level 0: output_padding = stride - 1 per axis.
  auto& up0 = net->up->at<UpLayerImpl>(0);
  CHECK(up0.conv->conv->options.output_padding.expand(3) == std::vector<int64_t>{0, 1, 1});
  CHECK_THROWS_WITH_AS(net->forward(torch::randn({1, 1, 3, 12, 16})),
                       doctest::Contains("spatial size on z (3) must be divisible by 2"), c10::Error);

  UNetOptions o2;
  o2.spatial_dims = 2;
  o2.channels = {4, 8};
  o2.strides = {{1, 2}};
  o2.kernel_size = {1, 3};
  UNet net2(o2);
  auto y2 = net2->forward(torch::randn({2, 1, 8, 5}));  // (N, C, Y, X): y pooled, x not
  CHECK(y2.sizes() == at::IntArrayRef({2, 2, 8, 5}));
  probe_loss(y2).backward();
  check_gradients(*net2);
}

TEST_CASE("per-axis options are refused at config time naming the field, the axes and what was got") {
  testing::JobYaml job = topo_job();
  struct Case {
    std::string set, expect;
  };
  const Case cases[] = {
      {"model.strides=[[1, 1, 1], [2, 2, 1], [2, 0, 2]]",
       "job.yaml: model.strides[2]: expected 3 positive integers (x, y, z), got [2, 0, 2]"},
      {"model.strides=[[1, 1, 1], [2, 2], 2]",
       "job.yaml: model.strides[1]: expected an integer or 3 integers (x, y, z), got [2, 2]"},
      {"model.strides=[1, 2, two]",
       "job.yaml: model.strides[2]: expected an integer or 3 integers (x, y, z), got \"two\""},
      {"model.strides=[1, 2]", "job.yaml: model.strides: expected 3 entries (one per stage), got [1, 2]"},
      {"model.strides=[1, 2, 0]", "job.yaml: model.strides[2]: expected a positive integer, got 0"},
      {"model.strides=[1, 2, [4194304, 1, 1]]",
       "job.yaml: model.strides: expected a product of at most 1048576 on x (every input size on that axis "
       "must "
       "be a multiple of it), got [1, 2, [4194304, 1, 1]]"},
      {"model.kernel_sizes=[[3, 2, 1], 3, 3]",
       "job.yaml: model.kernel_sizes[0]: expected 3 odd numbers >= 1 (x, y, z), got [3, 2, 1]"},
      {"model.kernel_sizes=[3, 3]",
       "job.yaml: model.kernel_sizes: expected 3 entries (one per stage), got [3, 3]"},
      {"model.kernel_sizes=3", "job.yaml: model.kernel_sizes: expected a list, each entry an integer or 3"},
      // The divisibility rule per axis, on the validation window and on the training crop.
      {"validation.roi_size=[16, 16, 5]",
       "job.yaml: validation.roi_size: expected a multiple of 2 on z (the product of model.strides on z; per "
       "axis (x, y, z): [4, 4, 2]), got [16, 16, 5]"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.set);
    CHECK(topo_error(job, {c.set}).find(c.expect) != std::string::npos);
  }
  // A z stride of 1 everywhere lifts the rule on z.
  CHECK(topo_error(job, {"validation.roi_size=[16, 16, 5]", "model.strides=[1, [2, 2, 1], [2, 2, 1]]"}) ==
        "(no error)");
  job.stages = {"load", testing::crop_stage("[16, 18, 8]", 1, 1, 1)};
  CHECK(topo_error(job, {}).find("job.yaml: stages[1].options.spatial_size: expected a multiple of 4 on y") !=
        std::string::npos);

  // The MONAI UNet's kernel_size and up_kernel_size per axis; in 2D the axes are (x, y).
  testing::JobYaml unet = topo_job();
  unet.loss = "{name: dice_ce, to_onehot_y: true, softmax: true}";
  unet.model = "{name: unet, spatial_dims: 2, channels: [4, 8], strides: [[2, 1]], kernel_size: [3, 1]}";
  unet.validation = "";
  CHECK(topo_error(unet, {}) == "(no error)");
  CHECK(topo_error(unet, {"model.up_kernel_size=[3, 4]"})
            .find("job.yaml: model.up_kernel_size: expected 2 odd numbers >= 1 (x, y), got [3, 4]") !=
        std::string::npos);
  CHECK(topo_error(unet, {"model.kernel_size=[3, 3, 3]"})
            .find("job.yaml: model.kernel_size: expected an integer or 2 integers (x, y), got [3, 3, 3]") !=
        std::string::npos);
}

TEST_CASE("per-axis options resolve as written, isotropic ones as before, and read back the same") {
  REQUIRE_OK_AND_ASSIGN(auto iso, parse_model_options(nlohmann::json::parse(
                                      R"({"name": "unet", "channels": [4, 8, 16], "strides": [2, 2]})")));
  nlohmann::json j;
  to_json(j, iso);
  CHECK(j["strides"] == nlohmann::json::parse("[2, 2]"));
  CHECK(j["kernel_size"] == 3);
  REQUIRE_OK_AND_ASSIGN(auto aniso,
                        parse_model_options(nlohmann::json::parse(
                            R"({"name": "plain_unet", "n_stages": 3, "strides": [1, [2, 2, 1], 2.0],
                                            "kernel_sizes": [[3, 3, 1], 3, [3, 3, 3]]})")));
  to_json(j, aniso);
  CHECK(j["strides"] == nlohmann::json::parse("[1, [2, 2, 1], 2]"));
  CHECK(j["kernel_sizes"] == nlohmann::json::parse("[[3, 3, 1], 3, [3, 3, 3]]"));
  REQUIRE_OK_AND_ASSIGN(auto back, parse_model_options(j));
  const auto& a = aniso.get<PlainConvUNetOptions>();
  const auto& b = back.get<PlainConvUNetOptions>();
  CHECK(b.strides == a.strides);
  CHECK(b.kernel_sizes == a.kernel_sizes);
  CHECK(b.strides[1].xyz() == std::vector<int64_t>{2, 2, 1});
  REQUIRE_OK_AND_ASSIGN(auto model, create_model(back));
  CHECK(model.info().size_divisors == std::vector<int64_t>{4, 4, 2});
  CHECK(model.info().size_divisor == 4);
}

TEST_CASE("an anisotropic MONAI UNet exports with (z, y, x) sequences and MONAI predicts what segflow does") {
  TempDir dir("export_aniso");
  REQUIRE_OK_AND_ASSIGN(
      auto m, parse_model_options(nlohmann::json::parse(
                  R"({"name": "unet", "out_channels": 3, "channels": [4, 8, 16], "strides": [[2, 2, 1], 2],
                      "kernel_size": [3, 3, 1], "up_kernel_size": [3, 1, 3], "num_res_units": 1,
                      "norm": "instance"})")));
  torch::manual_seed(14);
  REQUIRE_OK_AND_ASSIGN(auto model, create_model(m));
  REQUIRE_OK_AND_ASSIGN(auto exported, export_model(m, model.module()));
  CHECK(exported.spec["args"]["strides"] == nlohmann::json::parse("[[1, 2, 2], 2]"));
  CHECK(exported.spec["args"]["kernel_size"] == nlohmann::json::parse("[1, 3, 3]"));
  CHECK(exported.spec["args"]["up_kernel_size"] == nlohmann::json::parse("[3, 1, 3]"));
  REQUIRE_OK(write_pytorch_export(exported, dir / "net.pt"));
  model.module().eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(15);
  const at::Tensor x = at::randn({2, 1, 6, 8, 12}, gen, at::TensorOptions());
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = model.predict(x);
  }
  const std::vector<char> io = pytorch_state_dict_bytes({{"x", x}, {"y", y}});
  std::ofstream(dir / "io.pt", std::ios::binary).write(io.data(), static_cast<std::streamsize>(io.size()));
  using segflow::testing::shell_quote;
  auto r = segflow::testing::run_command(
      shell_quote(segflow::testing::python()) + " " +
      shell_quote(segflow::testing::source_path("tests/tools/export_check.py").string()) + " " +
      shell_quote((dir / "net.pt").string()) + " " + shell_quote((dir / "net.json").string()) + " " +
      shell_quote((dir / "io.pt").string()) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  INFO(j.dump());
  CHECK(j["max_abs"].get<double>() > 0);
  CHECK(j["max_abs_diff"].get<double>() <= 1e-4 * j["max_abs"].get<double>() + 1e-6);
}

TEST_CASE("an anisotropic plain_unet trains a few epochs with nnU-Net's weights, validates and round-trips") {
  TempDir dir("aniso_train");
  const JobConfig cfg = topo_parse(topo_job());
  REQUIRE_OK(validate_job_config(cfg, pipeline::builtin_registry()));
  CHECK(cfg.loss.deep_supervision == DeepSupervisionWeights::nnunet);
  REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, c10::Device(c10::kCPU)));
  CHECK(t->model().info().size_divisors == std::vector<int64_t>{4, 4, 2});
  const Batch b = testing::train::segmentation_batch({16, 16, 16});
  std::vector<double> epoch_losses;
  for (int e = 0; e < 4; ++e) {
    EpochInfo info;
    testing::train::train_steps(*t, b, 6, &info);
    epoch_losses.push_back(info.loss);
  }
  INFO("epoch losses: " << epoch_losses[0] << " " << epoch_losses[1] << " " << epoch_losses[2] << " "
                        << epoch_losses[3]);
  CHECK(std::isfinite(epoch_losses.back()));
  CHECK(epoch_losses.back() < 0.7 * epoch_losses.front());

  // Validation: sliding windows of (x, y, z) = (16, 16, 8) over a 20 x 20 x 12 volume.
  Sample s;
  s.id = "v";
  s.tensors["label"] = at::zeros({1, 12, 20, 20}, at::kLong);
  s.tensors["label"].index_put_(
      {0, at::indexing::Slice(2, 8), at::indexing::Slice(3, 10), at::indexing::Slice(4, 12)}, 1);
  s.tensors["image"] = s.tensors["label"].to(at::kFloat) * 0.5;
  REQUIRE_OK_AND_ASSIGN(auto v, t->validate({s}));
  CHECK(std::isfinite(v.mean_dice));

  // The checkpoint's config holds the per-axis topology: the model restores and predicts the same.
  REQUIRE_OK(t->save_checkpoint(dir / "last.pt"));
  REQUIRE_OK_AND_ASSIGN(auto back, load_for_inference(dir / "last.pt", "cpu"));
  const auto& o = back->config().model.get<PlainConvUNetOptions>();
  CHECK(o.strides == std::vector<AxisSizes>{{1, 1, 1}, {2, 2, 1}, {2, 2, 2}});
  CHECK(o.kernel_sizes[0].xyz() == std::vector<int64_t>{3, 3, 1});
  CHECK(back->config().loss.deep_supervision == DeepSupervisionWeights::nnunet);
  t->model().module().eval();
  back->model().module().eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = b.tensors.at("image").to(at::kFloat);
  CHECK(max_abs_diff(t->model().predict(x), back->model().predict(x)) == 0.0);
}
