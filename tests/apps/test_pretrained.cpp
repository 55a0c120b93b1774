// Fine-tuning from someone else's weights (issue 33 item 3): model.weights with MONAI or
// nnU-Net names, skip rules, a re-initialised head, input-channel adaptation, and
// train.freeze / unfreeze_epoch. The weights are made by MONAI and dynamic_network_architectures
// in the venv (tests/tools/pretrained_weights.py) and turned into tensor archives by
// scripts/convert_sam_weights.py, as a user would.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/interop/export.hpp"
#include "models/nets/monai_names.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/weights.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::shell_quote;
using segflow::testing::TempDir;
namespace fs = std::filesystem;

namespace {

/// Runs a venv Python script with arguments; REQUIREs a clean exit.
void run_python(const std::string& script, const std::string& args) {
  auto r = segflow::testing::run_command(shell_quote(segflow::testing::python()) + " " +
                                         shell_quote(segflow::testing::source_path(script).string()) + " " +
                                         args + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);  // 3: a reference package is missing (scripts/setup.sh)
}

/// pretrained_weights.py WHICH DIR, then convert_sam_weights.py DIR/PT DIR/SFTA (names kept).
fs::path make_weights(const std::string& which, const fs::path& dir, const std::string& pt) {
  run_python("tests/tools/pretrained_weights.py", which + " " + shell_quote(dir.string()));
  const fs::path sfta = dir / (fs::path(pt).stem().string() + ".sfta");
  run_python("scripts/convert_sam_weights.py",
             shell_quote((dir / pt).string()) + " " + shell_quote(sfta.string()));
  return sfta;
}

/// Records the epoch losses.
struct LossLog : models::TrainObserver {
  std::vector<double> losses;
  void on_epoch_end(const models::EpochInfo& info) override { losses.push_back(info.loss); }
};

testing::JobYaml finetune_job(const fs::path& dir, const std::string& model, int epochs,
                              const std::string& train) {
  testing::JobYaml job;
  job.name = "finetune";
  job.seed = "4";
  job.root = dir / "data";
  job.synth = "{cases: 4, size: 32, format: nifti, seed: 5}";
  job.stages = {testing::kLoadStage, testing::kCtWindowStage, testing::kFgBgStage,
                testing::crop_stage("[32, 32, 32]", 1, 1, 1)};
  job.model = model;
  job.optimizer = "{name: adamw, lr: 0.001}";
  job.epochs = epochs;
  job.train = "batch_size: 2, device: cpu, val_interval: 0, loader: simple, threads: 1" + train;
  job.validation = "{roi_size: [32, 32, 32], overlap: 0.0, sw_batch_size: 1, save_predictions: false}";
  job.runs_dir = dir / "runs";
  return job;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("MONAI's spleen UNet weights fine-tune on 5 classes with the head re-initialised") {
  TempDir dir("pretrained_monai");
  const fs::path sfta = make_weights("monai", dir.path(), "spleen_unet.pt");
  const std::string model =
      "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, channels: [16, 32, 64, 128, 256], "
      "strides: [2, 2, 2, 2], num_res_units: 2, norm: batch, weights: {path: " +
      sfta.string() + ", reinit_head: true}}";
  REQUIRE_OK_AND_ASSIGN(auto cfg,
                        models::parse_job_config(finetune_job(dir.path(), model, 3, "").yaml(), "job.yaml"));
  CHECK(cfg.resolved["model"]["weights"]["reinit_head"] == true);

  // The loaded tensors are MONAI's, under segflow's names; the head keeps its fresh init.
  REQUIRE_OK_AND_ASSIGN(auto monai, models::read_tensor_archive(sfta));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  std::size_t equal = 0, head = 0;
  for (const auto& [name, tensor] : models::named_tensors(t->model().module())) {
    CAPTURE(name);
    REQUIRE_OK_AND_ASSIGN(std::string m, models::monai_unet_name(name, 4, 2));
    const at::Tensor& ref = monai.at("model." + m);
    if (name.rfind("up.0.", 0) == 0) {
      ++head;
      if (ref.sizes() == tensor.sizes() && ref.numel() > 1) CHECK_FALSE(at::equal(ref, tensor));
      continue;
    }
    CHECK(at::equal(ref, tensor));
    ++equal;
  }
  MESSAGE("spleen UNet: " << equal << " tensors equal to MONAI's, " << head
                          << " head tensors re-initialised");
  CHECK(equal + head == monai.size());
  CHECK(head > 0);

  LossLog losses;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, losses));
  REQUIRE(losses.losses.size() == 3);
  MESSAGE("fine-tuning losses by epoch: " << losses.losses[0] << ", " << losses.losses[1] << ", "
                                          << losses.losses[2]);
  for (double l : losses.losses) CHECK(std::isfinite(l));
  CHECK(losses.losses.back() < losses.losses.front());
  auto report = nlohmann::json::parse(segflow::testing::read_file(run / "weights_report.json"));
  CHECK(report["names"] == "monai");
  CHECK(report["counts"]["loaded"].get<std::size_t>() == equal);
  CHECK(report["counts"]["reinitialised"].get<std::size_t>() == head);
  CHECK(report["counts"]["skipped"] == 0);
  CHECK(report["counts"]["unused"] == 0);
}

TEST_CASE(
    "an nnU-Net PlainConvUNet's weights load into a 2-channel plain_unet: same logits on repeated input") {
  TempDir dir("pretrained_nnunet");
  const fs::path sfta = make_weights("nnunet", dir.path(), "plain_unet.pt");
  REQUIRE_OK_AND_ASSIGN(auto io, models::read_tensor_archive(dir / "plain_unet_io.sfta"));
  const at::Tensor x = io.at("x"), y = io.at("y");
  nlohmann::json opts{{"spatial_dims", 3},        {"in_channels", 2},
                      {"out_channels", 3},        {"n_stages", 3},
                      {"base_features", 4},       {"max_features", 16},
                      {"n_conv_per_stage", 2},    {"n_conv_per_stage_decoder", 2},
                      {"deep_supervision", false}};
  for (const std::string how : {"repeat", "mean"}) {
    CAPTURE(how);
    opts["weights"] = {{"path", sfta.string()}, {"channels", how}};
    models::WeightsReport report;
    REQUIRE_OK_AND_ASSIGN(auto options, models::parse_model_options(
                                            [&] {
                                              auto j = opts;
                                              j["name"] = "plain_unet";
                                              return j;
                                            }(),
                                            "model"));
    REQUIRE_OK_AND_ASSIGN(auto net, models::create_model(options, &report));
    CHECK(report.names == "nnunet");
    REQUIRE(report.adapted == std::vector<std::string>{"encoder_stages.0.0.conv.weight"});
    CHECK(report.unused.empty());
    net.module().eval();
    torch::NoGradGuard no_grad;
    const at::Tensor got = net.predict(at::cat({x, x}, 1));
    const double diff = max_abs_diff(got, y), scale = y.abs().max().item<double>();
    MESSAGE("PlainConvUNet 1 -> 2 input channels (" << how << "): max |logit diff| " << diff
                                                    << " of max |logit| " << scale);
    CHECK(diff <= 1e-4 * scale);
  }

  // Without an adaptation rule the first conv does not fit: the error names it with both shapes.
  opts["weights"] = {{"path", sfta.string()}};
  opts["name"] = "plain_unet";
  REQUIRE_OK_AND_ASSIGN(auto options, models::parse_model_options(opts, "model"));
  auto bad = models::create_model(options);
  REQUIRE_FALSE(bad.is_ok());
  CHECK_MESSAGE(
      bad.status().message().find("encoder_stages.0.0.conv.weight (model [4, 2, 3, 3, 3], weights [4, "
                                  "1, 3, 3, 3])") != std::string::npos,
      bad.status().message());
  CHECK(bad.status().message().find("plain_unet.sfta") != std::string::npos);
  // Another class count without reinit_head: the segmentation layer is named.
  opts["in_channels"] = 1;
  opts["out_channels"] = 5;
  REQUIRE_OK_AND_ASSIGN(auto five, models::parse_model_options(opts, "model"));
  auto head = models::create_model(five);
  REQUIRE_FALSE(head.is_ok());
  CHECK_MESSAGE(
      head.status().message().find("seg_layers.1.weight (model [5, 4, 1, 1, 1], weights [3, 4, 1, 1, 1])") !=
          std::string::npos,
      head.status().message());
  // ... and a skip rule for it instead of reinit_head loads the rest.
  opts["weights"]["skip"] = {"seg_layers\\..*"};
  REQUIRE_OK_AND_ASSIGN(auto skipped, models::parse_model_options(opts, "model"));
  models::WeightsReport report;
  REQUIRE_OK(models::create_model(skipped, &report).status());
  CHECK(report.skipped == std::vector<std::string>{"seg_layers.0.bias", "seg_layers.0.weight",
                                                   "seg_layers.1.bias", "seg_layers.1.weight"});
}

TEST_CASE("train.freeze keeps the matched parameters unchanged until train.unfreeze_epoch") {
  TempDir dir("pretrained_freeze");
  const std::string model =
      "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, channels: [4, 8, 16], strides: [2, 2], "
      "num_res_units: 1, norm: instance}";
  auto job = finetune_job(dir.path(), model, 1, ", freeze: ['down\\.0\\..*'], unfreeze_epoch: 1");
  job.stages.back() = testing::crop_stage("[16, 16, 16]", 1, 1, 1);
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.0, sw_batch_size: 1, save_predictions: false}";
  REQUIRE_OK_AND_ASSIGN(auto one, models::parse_job_config(job.yaml(), "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto fresh, models::Trainer::create(one, c10::Device(c10::kCPU)));
  const models::TensorMap init = models::named_tensors(fresh->model().module());
  auto changed = [&](const fs::path& run) {
    auto t = models::load_for_inference(run / "last.pt", "cpu");
    REQUIRE(t.is_ok());
    std::map<std::string, bool> out;
    for (const auto& [name, tensor] : models::named_tensors((*t)->model().module()))
      out[name] = !at::equal(tensor, init.at(name));
    return out;
  };
  models::TrainObserver quiet;
  REQUIRE_OK_AND_ASSIGN(auto run1, actors::run_training(one, {}, quiet));
  auto report = nlohmann::json::parse(segflow::testing::read_file(run1 / "weights_report.json"));
  CHECK(report["counts"]["frozen"].get<std::size_t>() > 0);
  CHECK(report["unfreeze_epoch"] == 1);
  std::size_t frozen = 0;
  for (const auto& [name, moved] : changed(run1)) {
    CAPTURE(name);
    const bool is_frozen = name.rfind("down.0.", 0) == 0;
    frozen += is_frozen;
    if (is_frozen)
      CHECK_FALSE(moved);  // epoch 0: frozen
    else if (name.find("weight") != std::string::npos)
      CHECK(moved);
  }
  CHECK(frozen == report["counts"]["frozen"].get<std::size_t>());

  job.epochs = 2;  // epoch 1 trains them too
  REQUIRE_OK_AND_ASSIGN(auto two, models::parse_job_config(job.yaml(), "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto run2, actors::run_training(two, {}, quiet));
  for (const auto& [name, moved] : changed(run2))
    if (name.rfind("down.0.", 0) == 0 && name.find("weight") != std::string::npos) CHECK_MESSAGE(moved, name);

  // A rule that matches nothing, a broken regex, and unfreeze_epoch without rules.
  auto none = finetune_job(dir.path(), model, 1, ", freeze: ['encoder\\..*']");
  auto cfg = models::parse_job_config(none.yaml(), "job.yaml");
  REQUIRE(cfg.is_ok());
  auto st = models::Trainer::create(*cfg, c10::Device(c10::kCPU));
  REQUIRE_FALSE(st.is_ok());
  CHECK_MESSAGE(
      st.status().message().find("train.freeze: 'encoder\\..*' matches no parameter") != std::string::npos,
      st.status().message());
  auto lone =
      models::parse_job_config(finetune_job(dir.path(), model, 1, ", unfreeze_epoch: 2").yaml(), "job.yaml");
  REQUIRE_FALSE(lone.is_ok());
  CHECK(lone.status().message().find("train.unfreeze_epoch: expected train.freeze rules") !=
        std::string::npos);
  auto ranks = models::parse_job_config(
      finetune_job(dir.path(), model, 1, ", freeze: ['down\\..*'], devices: [cpu, cpu]").yaml(), "job.yaml");
  REQUIRE_FALSE(ranks.is_ok());
  CHECK_MESSAGE(ranks.status().message().find("train.freeze: expected one device") != std::string::npos,
                ranks.status().message());
  auto regex = models::parse_job_config(
      finetune_job(dir.path(),
                   "{name: unet, channels: [4, 8], strides: [2], weights: {path: w.sfta, skip: ['up.(0']}}",
                   1, "")
          .yaml(),
      "job.yaml");
  REQUIRE_FALSE(regex.is_ok());
  CHECK_MESSAGE(regex.status().message().find(
                    "model.weights.skip: expected regular expressions, got 'up.(0'") != std::string::npos,
                regex.status().message());
}
