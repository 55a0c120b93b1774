// Models out (issue 14 item 4): `segflow export --to pytorch` writes a state dict that loads,
// strictly, into MONAI's UNet or segment_anything's Sam, and the loaded module gives segflow's
// outputs on the same input (tests/tools/export_check.py runs the Python side).
#include <doctest/doctest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/interop/export.hpp"
#include "models/nets/monai_names.hpp"
#include "models/nets/nnunet_names.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/res_enc_unet.hpp"
#include "models/nets/sam.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::shell_quote;
using segflow::testing::TempDir;
namespace fs = std::filesystem;

namespace {

/// A one-epoch job of `model` on 4 synthetic 24^3 cases in `dir`.
std::string export_job(const fs::path& dir, const std::string& model) {
  testing::JobYaml job;
  job.name = "export";
  job.seed = "2";
  job.root = dir / "data";
  job.synth = "{cases: 4, size: 24, format: nifti, seed: 3}";
  job.stages = {testing::kLoadStage, testing::kCtWindowStage, testing::kFgBgStage,
                testing::crop_stage("[16, 16, 16]", 1, 1, 1)};
  job.model = model;
  job.schedule = "";
  job.epochs = 1;
  job.train = "batch_size: 2, device: cpu, val_interval: 1, loader: simple, threads: 1";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.0, sw_batch_size: 2}";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

void save_io(const fs::path& p, const std::map<std::string, at::Tensor>& tensors) {
  const std::vector<char> bytes = models::pytorch_state_dict_bytes(
      std::vector<std::pair<std::string, at::Tensor>>(tensors.begin(), tensors.end()));
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Runs export_check.py; the JSON it printed (REQUIREs a clean run).
nlohmann::json check_in_python(const fs::path& state, const fs::path& io) {
  fs::path spec = state;
  spec.replace_extension(".json");
  auto r = segflow::testing::run_command(
      shell_quote(segflow::testing::python()) + " " +
      shell_quote(segflow::testing::source_path("tests/tools/export_check.py").string()) + " " +
      shell_quote(state.string()) + " " + shell_quote(spec.string()) + " " + shell_quote(io.string()) +
      " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);  // 3: MONAI / segment_anything missing (setup.sh installs them)
  return nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
}

/// Exports the freshly built model of `model_yaml` through the API, and checks it in Python.
void check_untrained(const std::string& name, const std::string& model_yaml, const at::Tensor& x) {
  CAPTURE(name);
  TempDir dir("export_" + name);
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(export_job(dir.path(), model_yaml), "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  auto& module = t->model().module();
  {
    torch::NoGradGuard no_grad;  // running statistics away from 0/1, so that they are checked too
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
    for (auto& b : module.named_buffers())
      if (b.key().find("running_") != std::string::npos)
        b.value().copy_(at::rand(b.value().sizes(), gen) + 0.5);
    // Norm scales and shifts away from their initial 1/0 (a res_enc_unet starts its blocks'
    // last norms at 0, which would hide those blocks' convs from the comparison).
    for (auto& p : module.named_parameters())
      if (p.key().find("norm.") != std::string::npos) p.value().copy_(at::rand(p.value().sizes(), gen) + 0.5);
  }
  REQUIRE_OK_AND_ASSIGN(auto exported, models::export_model(cfg.model, module));
  REQUIRE_OK(models::write_pytorch_export(exported, dir / "net.pt"));
  module.eval();
  torch::NoGradGuard no_grad;
  const at::Tensor y = t->model().predict(x);
  save_io(dir / "io.pt", {{"x", x}, {"y", y}});
  auto j = check_in_python(dir / "net.pt", dir / "io.pt");
  CHECK(j["target"] == exported.target);
  CHECK(j["tensors"].get<std::size_t>() == exported.state_dict.size());
  CHECK(j["max_abs"].get<double>() > 0);
  MESSAGE(name << ": " << j["target"].get<std::string>() << ", max |logit diff| "
               << j["max_abs_diff"].get<double>() << " of max |logit| " << j["max_abs"].get<double>());
  CHECK(j["max_abs_diff"].get<double>() <= 1e-4 * j["max_abs"].get<double>() + 1e-6);
}

}  // namespace

TEST_CASE(
    "segflow export --to pytorch: a trained UNet loads into MONAI's UNet and predicts what segflow does") {
  TempDir dir("export_trained");
  const fs::path config = dir / "job.yaml";
  segflow::testing::write_file(
      config,
      export_job(dir.path(),
                 "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, channels: [4, 8, 16], "
                 "strides: [2, 2], num_res_units: 2, norm: batch}"));
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::load_job_config(config));
  models::TrainObserver quiet;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, quiet));

  const std::string bin = shell_quote(segflow::testing::segflow_bin());
  auto r =
      segflow::testing::run_command(bin + " export --checkpoint " + shell_quote((run / "best.pt").string()) +
                                    " --to pytorch " + shell_quote((dir / "unet.pt").string()) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto printed = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  CHECK(printed["target"] == "monai.networks.nets.UNet");
  auto spec = nlohmann::json::parse(segflow::testing::read_file(dir / "unet.json"));
  CHECK(spec["args"]["channels"] == nlohmann::json::array({4, 8, 16}));
  CHECK(spec["args"]["num_res_units"] == 2);
  CHECK(spec["args"]["norm"] == "batch");
  CHECK_FALSE(segflow::testing::has_temporaries(dir.path()));

  // The same input through segflow's restored model and MONAI's UNet with the exported weights.
  REQUIRE_OK_AND_ASSIGN(auto t, models::load_for_inference(run / "best.pt", "cpu"));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor x = at::rand({2, 1, 16, 24, 20}, gen, at::TensorOptions());
  t->model().module().eval();
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = t->model().predict(x);
  }
  save_io(dir / "io.pt", {{"x", x}, {"y", y}});
  auto j = check_in_python(dir / "unet.pt", dir / "io.pt");
  CHECK(j["shape"] == nlohmann::json::array({2, 5, 16, 24, 20}));
  INFO(j.dump());
  CHECK(j["max_abs_diff"].get<double>() <= 1e-4 * j["max_abs"].get<double>() + 1e-6);
}

TEST_CASE("UNets with plain conv blocks, instance norm, LeakyReLU or in 2D export into MONAI's UNet too") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  check_untrained("plain",
                  "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 3, channels: [4, 8, 16], "
                  "strides: [2, 2], num_res_units: 0, norm: instance, act: leakyrelu}",
                  at::rand({1, 1, 16, 16, 16}, gen, at::TensorOptions()));
  check_untrained("res1",
                  "{name: unet, spatial_dims: 3, in_channels: 2, out_channels: 2, channels: [4, 8], "
                  "strides: [2], num_res_units: 1, norm: instance, act: relu, kernel_size: 5}",
                  at::rand({1, 2, 8, 12, 8}, gen, at::TensorOptions()));
  check_untrained("2d",
                  "{name: unet, spatial_dims: 2, in_channels: 1, out_channels: 4, channels: [4, 8, 16, 32], "
                  "strides: [2, 2, 2], num_res_units: 2, norm: batch}",
                  at::rand({2, 1, 32, 24}, gen, at::TensorOptions()));
}

TEST_CASE(
    "plain_unets export into nnU-Net's PlainConvUNet (dynamic_network_architectures) with the same logits") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  check_untrained("plain_aniso",
                  "{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: 3, n_stages: 3, "
                  "base_features: 4, max_features: 16, strides: [1, [2, 2, 1], 2], "
                  "kernel_sizes: [[3, 3, 1], 3, 3], deep_supervision: true}",
                  at::rand({2, 1, 8, 16, 12}, gen, at::TensorOptions()));
  check_untrained("plain_batch_2d",
                  "{name: plain_unet, spatial_dims: 2, in_channels: 2, out_channels: 4, n_stages: 4, "
                  "base_features: 4, max_features: 16, norm: batch, deep_supervision: false}",
                  at::rand({2, 2, 32, 24}, gen, at::TensorOptions()));
}

TEST_CASE(
    "res_enc_unets export into nnU-Net's ResidualEncoderUNet (dynamic_network_architectures) with the same "
    "logits") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  // Stage 1 pools and projects its skip, stage 2 only pools (features capped at 8), stage 0
  // neither; anisotropic strides and kernels as nnU-Net plans thick slices.
  check_untrained(
      "res_enc_aniso",
      "{name: res_enc_unet, spatial_dims: 3, in_channels: 1, out_channels: 3, n_stages: 4, "
      "base_features: 4, max_features: 8, strides: [1, [2, 2, 1], 2, 2], "
      "kernel_sizes: [[3, 3, 1], 3, 3, 3], n_blocks_per_stage: [1, 2, 2, 1], deep_supervision: true}",
      at::rand({2, 1, 8, 16, 24}, gen, at::TensorOptions()));
  // nnU-Net's blocks per stage (1, 3, 4), batch norm, two decoder convs.
  check_untrained("res_enc_batch_2d",
                  "{name: res_enc_unet, spatial_dims: 2, in_channels: 2, out_channels: 4, n_stages: 3, "
                  "base_features: 4, max_features: 16, norm: batch, n_conv_per_stage_decoder: 2, "
                  "deep_supervision: false}",
                  at::rand({2, 2, 32, 24}, gen, at::TensorOptions()));
  CHECK(models::nnunet_res_enc_names("encoder.stem.convs.0.norm.bias") ==
        std::vector<std::string>{"encoder.stem.convs.0.norm.bias", "encoder.stem.convs.0.all_modules.1.bias",
                                 "decoder.encoder.stem.convs.0.norm.bias",
                                 "decoder.encoder.stem.convs.0.all_modules.1.bias"});
  CHECK(models::nnunet_res_enc_names("decoder.seg_layers.1.weight") ==
        std::vector<std::string>{"decoder.seg_layers.1.weight"});
  CHECK(models::nnunet_res_enc_names("decoder.stages.0.convs.0.conv.weight") ==
        std::vector<std::string>{"decoder.stages.0.convs.0.conv.weight",
                                 "decoder.stages.0.convs.0.all_modules.0.weight"});
}

TEST_CASE("a SAM checkpoint exports into segment_anything's Sam with the same image embedding") {
  TempDir dir("export_sam");
  REQUIRE_OK_AND_ASSIGN(
      auto cfg, models::parse_job_config(
                    export_job(dir.path(),
                               "{name: sam, preset: tiny, spatial_dims: 2, in_channels: 3, out_channels: 1}"),
                    "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  REQUIRE_OK_AND_ASSIGN(auto exported, models::export_model(cfg.model, t->model().module()));
  REQUIRE_OK(models::write_pytorch_export(exported, dir / "sam.pt"));
  const auto& sam_opts = cfg.model.get<models::SamModelOptions>().sam;
  const std::int64_t size = sam_opts.image_encoder.img_size;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  const at::Tensor image = at::rand({2, 3, size, size}, gen, at::TensorOptions());
  auto& sam = dynamic_cast<models::SamImpl&>(t->model().module());
  sam.eval();
  const at::Tensor box = torch::tensor({{5.0f, 7.0f, 40.0f, 50.0f}, {20.0f, 3.0f, 60.0f, 33.0f}}) *
                         (static_cast<float>(size) / 64.0f);
  at::Tensor embedding, low_res;
  {
    torch::NoGradGuard no_grad;
    embedding = sam.image_encoder->forward(image);
    low_res = sam.forward_full(image.slice(0, 0, 1), box.slice(0, 0, 1)).low_res_masks;
  }
  save_io(dir / "io.pt", {{"image", image}, {"embedding", embedding}, {"box", box}, {"low_res", low_res}});
  auto j = check_in_python(dir / "sam.pt", dir / "io.pt");
  INFO(j.dump());
  CHECK(j["target"] == "segment_anything.modeling.Sam");
  CHECK(j["max_abs_diff"].get<double>() <= 1e-4 * j["max_abs"].get<double>() + 1e-6);
  CHECK(j["masks_max_abs"].get<double>() > 0);
  CHECK(j["masks_max_abs_diff"].get<double>() <= 1e-4 * j["masks_max_abs"].get<double>() + 1e-6);
  auto spec = nlohmann::json::parse(segflow::testing::read_file(dir / "sam.json"));
  CHECK(spec["mask_decoder"]["iou_head"] == "zeros");  // the tiny preset trains without one
}

TEST_CASE("export refuses a plain_unet without norm, a bad target and a missing checkpoint") {
  TempDir dir("export_bad");
  REQUIRE_OK_AND_ASSIGN(
      auto cfg,
      models::parse_job_config(export_job(dir.path(),
                                          "{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: "
                                          "3, n_stages: 2, base_features: 4, norm: none}"),
                               "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  auto plain = models::export_model(cfg.model, t->model().module());
  REQUIRE_FALSE(plain.is_ok());
  CHECK(plain.status().message().find("plain_unet with norm none") != std::string::npos);
  CHECK(*models::nnunet_plain_names("encoder_stages.1.0.norm.bias") ==
        std::vector<std::string>{"encoder.stages.1.0.convs.0.norm.bias",
                                 "encoder.stages.1.0.convs.0.all_modules.1.bias",
                                 "decoder.encoder.stages.1.0.convs.0.norm.bias",
                                 "decoder.encoder.stages.1.0.convs.0.all_modules.1.bias"});

  CHECK(*models::monai_unet_name("down.0.conv.0.conv.weight", 2, 1) == "0.conv.unit0.conv.weight");
  CHECK(*models::monai_unet_name("down.1.conv.0.norm.weight", 2, 2) ==
        "1.submodule.0.conv.unit0.adn.N.weight");
  CHECK(*models::monai_unet_name("bottom.residual.weight", 2, 2) ==
        "1.submodule.1.submodule.residual.weight");
  CHECK(*models::monai_unet_name("up.0.conv.conv.weight", 2, 0) == "2.conv.weight");
  CHECK_FALSE(models::monai_unet_name("head.weight", 2, 2).is_ok());

  const std::string bin = shell_quote(segflow::testing::segflow_bin());
  auto bad_target = segflow::testing::run_command(bin + " export --checkpoint x.pt --to tflite out.pt 2>&1");
  CHECK(bad_target.exit_code == 2);
  CHECK_MESSAGE(
      bad_target.out.find("--to: expected pytorch, onnx or nnunet, got 'tflite'") != std::string::npos,
      bad_target.out);
  auto missing =
      segflow::testing::run_command(bin + " export --checkpoint " + shell_quote((dir / "nope.pt").string()) +
                                    " --to pytorch " + shell_quote((dir / "o.pt").string()) + " 2>&1");
  CHECK(missing.exit_code != 0);
  CHECK_MESSAGE(missing.out.find("nope.pt") != std::string::npos, missing.out);
  CHECK_FALSE(fs::exists(dir / "o.pt"));
}
