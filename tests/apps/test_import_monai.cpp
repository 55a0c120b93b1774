// MONAI weights in (issue 33 items 2 and 3): `segflow import --from monai` turns a MONAI bundle
// and a bare UNet state dict, both made by MONAI in the venv (tests/tools/monai_import_ref.py),
// into segflow checkpoints whose logits are MONAI's; bad inputs are refused with nothing
// written; and imported weights (MONAI's, nnU-Net's) start fine-tuning runs with another class
// count and another input-channel count.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/interop/nnunet_export.hpp"
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

/// The output of a segflow command: REQUIREs exit code 0 (or non-zero when `fails`).
std::string monai_segflow(const std::string& args, bool fails = false) {
  const std::string cmd = shell_quote(segflow::testing::segflow_bin()) + " " + args + " 2>&1";
  auto r = segflow::testing::run_command(cmd);
  if (fails)
    REQUIRE_MESSAGE(r.exit_code != 0, (cmd + "\n" + r.out));
  else
    REQUIRE_MESSAGE(r.exit_code == 0, (cmd + "\n" + r.out));
  return r.out;
}

/// tests/tools/monai_import_ref.py DIR (MONAI builds, saves and runs the UNets).
void monai_reference(const fs::path& dir) {
  auto r = segflow::testing::run_command(
      shell_quote(segflow::testing::python()) + " " +
      shell_quote(segflow::testing::source_path("tests/tools/monai_import_ref.py").string()) + " " +
      shell_quote(dir.string()) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);  // 3: MONAI missing (scripts/setup.sh installs it)
}

/// (C, x, y, z) <-> (C, z, y, x): MONAI's axis order for a NIfTI and segflow's.
at::Tensor monai_xyz(const at::Tensor& t) { return t.permute({0, 1, 4, 3, 2}).contiguous(); }

/// segflow's eval-mode logits of the imported checkpoint on MONAI's input `io["x"]`, against
/// MONAI's `io["y"]`: returns max |diff| / max |y|.
double monai_parity(const fs::path& checkpoint, const fs::path& io_file, const std::string& what) {
  auto io = models::read_tensor_archive(io_file);
  REQUIRE(io.is_ok());
  auto t = models::load_for_inference(checkpoint, "cpu");
  REQUIRE_MESSAGE(t.is_ok(), t.status().message());
  torch::NoGradGuard no_grad;
  (*t)->model().module().eval();
  const at::Tensor y = io->at("y"), got = monai_xyz((*t)->model().predict(monai_xyz(io->at("x"))));
  REQUIRE(got.sizes() == y.sizes());
  const double diff = (got - y).abs().max().item<double>(), top = y.abs().max().item<double>();
  MESSAGE(what << ": max |logit diff| " << diff << " of max |logit| " << top);
  CHECK(top > 0);
  return diff / top;
}

nlohmann::json last_json_line(const std::string& out) {
  const std::size_t at = out.rfind("\n{");
  return nlohmann::json::parse(at == std::string::npos ? out.substr(out.find('{')) : out.substr(at + 1));
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  segflow::testing::write_file(p, text);
}

const char* kSmallArgs =
    "--spatial-dims 3 --in-channels 1 --out-channels 3 --channels 4,8,16 --strides 2x2x1,2 "
    "--kernel-size 3x3x1 --num-res-units 1";

}  // namespace

TEST_CASE("segflow import --from monai: a bundle and a bare state dict give MONAI's logits") {
  TempDir dir("import_monai");
  monai_reference(dir.path());
  // The spleen bundle: network_def, preprocessing and inferer from configs/inference.json.
  auto j = last_json_line(monai_segflow("import --from monai " + shell_quote(dir / "bundle") + " --out " +
                                        shell_quote(dir / "spleen")));
  CHECK(j["preprocessing"] == "bundle");
  CHECK(j["tensors"] == 148);
  CHECK(j["network"]["channels"] == nlohmann::json::array({16, 32, 64, 128, 256}));
  for (const char* f : {"job.yaml", "model.pt", "weights.sfta", "import.json"})
    CHECK(fs::exists(dir / "spleen" / f));
  const std::string yaml = segflow::testing::read_file(dir / "spleen" / "job.yaml");
  for (const char* s :
       {"{name: reorient, options: {axcodes: RAS}}",
        "{name: resample, options: {spacing: [1.5,1.5,2.0], grid: exact_spacing, mode: trilinear}}",
        "{name: scale_intensity_range, options: {a_min: -57, a_max: 164, b_min: 0, b_max: 1, clip: true}}",
        "validation: {roi_size: [96,96,96], overlap: 0.5, sw_batch_size: 4"})
    CHECK_MESSAGE(segflow::testing::contains(yaml, s), (std::string(s) + "\n" + yaml));
  CHECK(monai_parity(dir / "spleen" / "model.pt", dir / "bundle_io.sfta", "spleen bundle, 48 x 32 x 64") <=
        1e-4);

  // A bare state dict: per-axis strides and kernels, MONAI's default (non-affine) instance norm.
  j = last_json_line(monai_segflow("import --from monai " + shell_quote(dir / "small.pt") + " --out " +
                                   shell_quote(dir / "small") + " " + kSmallArgs));
  CHECK(j["preprocessing"] == "default");
  CHECK(j["tensors"] == 26);
  CHECK_MESSAGE(segflow::testing::contains(j["notes"].dump(), "not affine"), j.dump());
  CHECK(monai_parity(dir / "small" / "model.pt", dir / "small_io.sfta", "bare UNet, (2,2,1) strides") <=
        1e-4);

  // Round trip: segflow's export --to pytorch as a bundle, imported with layout segflow, is
  // the same network.
  monai_segflow("export --checkpoint " + shell_quote(dir / "small" / "model.pt") + " --to pytorch " +
                shell_quote(dir / "rt.pt"));
  const auto spec = nlohmann::json::parse(segflow::testing::read_file(dir / "rt.json"));
  nlohmann::json net = spec["args"];
  net["_target_"] = spec["target"];
  write_text(dir / "rt" / "configs" / "inference.json", nlohmann::json{{"network_def", net}}.dump());
  fs::create_directories(dir / "rt" / "models");
  fs::copy_file(dir / "rt.pt", dir / "rt" / "models" / "model.pt");
  j = last_json_line(monai_segflow("import --from monai " + shell_quote(dir / "rt") +
                                   " --layout segflow --out " + shell_quote(dir / "back")));
  CHECK(j["preprocessing"] == "default");
  CHECK(monai_parity(dir / "back" / "model.pt", dir / "small_io.sfta", "export -> import, layout segflow") <=
        1e-4);
  CHECK_FALSE(segflow::testing::has_temporaries(dir.path()));
}

TEST_CASE("segflow import --from monai refuses what does not fit, writing nothing") {
  TempDir dir("import_monai_bad");
  monai_reference(dir.path());
  const fs::path out = dir / "out";
  auto refused = [&](const std::string& source, const std::string& args, const std::string& expect) {
    const std::string msg = monai_segflow(
        "import --from monai " + shell_quote(source) + " --out " + shell_quote(out) + " " + args, true);
    CHECK_MESSAGE(segflow::testing::contains(msg, expect), msg);
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(segflow::testing::has_temporaries(dir.path()));
  };
  // Arguments whose network does not fit the tensors: each named with both shapes.
  refused(
      (dir / "small.pt").string(),
      "--spatial-dims 3 --in-channels 1 --out-channels 3 --channels 4,8,32 --strides 2x2x1,2 --kernel-size "
      "3x3x1 --num-res-units 1",
      "model.1.submodule.1.submodule.conv.unit0.conv.weight has shape [16, 8, 3, 3, 1], the network expects "
      "[32, 8, 3, 3, 1]");
  refused((dir / "small.pt").string(), kSmallArgs + std::string(" --norm batch"),
          "tensors the network needs are missing: model.0.conv.unit0.adn.N.weight");
  refused((dir / "small.pt").string(), "--channels 4,8", "spatial_dims: missing");
  write_text(dir / "junk.pt", "not a zip archive");
  refused((dir / "junk.pt").string(), kSmallArgs, "junk.pt: not a torch.save zip archive");
  // Bundles: no network_def, another network, a bundle reference, no weights.
  write_text(dir / "nodef" / "configs" / "inference.json", R"({"inferer": {}})");
  refused((dir / "nodef").string(), "", "inference.json: network_def: missing");
  write_text(dir / "segres" / "configs" / "inference.yaml",
             "network_def: {_target_: SegResNet, spatial_dims: 3, in_channels: 1, out_channels: 2}\n");
  refused((dir / "segres").string(), "",
          "network_def._target_: expected monai.networks.nets.UNet (segflow's unet), got 'SegResNet'");
  write_text(
      dir / "ref" / "configs" / "inference.json",
      R"({"network_def": {"_target_": "UNet", "spatial_dims": 3, "in_channels": "@n", "out_channels": 2,
                 "channels": [4, 8], "strides": [2]}})");
  refused((dir / "ref").string(), "", "network_def.in_channels: '@n' is a bundle reference");
  write_text(dir / "noweights" / "configs" / "inference.json",
             segflow::testing::read_file(dir / "bundle" / "configs" / "inference.json"));
  refused((dir / "noweights").string(), "", "models/model.pt: missing");
  refused((dir / "bundle").string(), "--channels 4,8", "for a bare MODEL.pt only");
  // A transform without an exact segflow stage: imported with the default preprocessing, said so.
  auto cfg =
      nlohmann::json::parse(segflow::testing::read_file(dir / "bundle" / "configs" / "inference.json"));
  cfg["preprocessing"]["transforms"].push_back({{"_target_", "NormalizeIntensityd"}, {"keys", "image"}});
  write_text(dir / "norm" / "configs" / "inference.json", cfg.dump());
  fs::create_directories(dir / "norm" / "models");
  fs::copy_file(dir / "bundle" / "models" / "model.pt", dir / "norm" / "models" / "model.pt");
  auto j = last_json_line(
      monai_segflow("import --from monai " + shell_quote(dir / "norm") + " --out " + shell_quote(out)));
  CHECK(j["preprocessing"] == "default");
  CHECK_MESSAGE(
      segflow::testing::contains(j["notes"].dump(), "NormalizeIntensityd has no exact segflow stage"),
      j.dump());
}

namespace {

/// Epoch losses and validations of a run.
struct ImportedRunLog : models::TrainObserver {
  std::vector<double> losses;
  std::vector<models::ValidationInfo> validations;
  void on_epoch_end(const models::EpochInfo& info) override { losses.push_back(info.loss); }
  void on_validation(const models::ValidationInfo& info) override { validations.push_back(info); }
};

/// A fine-tuning job on synthetic 5-class CT under `data` (`synth` empty: the folder exists).
testing::JobYaml imported_weights_job(const fs::path& dir, const std::string& model, int epochs,
                                      const std::string& synth) {
  testing::JobYaml job;
  job.name = "imported";
  job.seed = "4";
  job.root = dir / "data";
  job.synth = synth;
  job.stages = {testing::kLoadStage, testing::kCtWindowStage, testing::kFgBgStage,
                testing::crop_stage("[32, 32, 32]", 1, 1, 4)};
  job.model = model;
  job.optimizer = "{name: adamw, lr: 0.01}";
  job.epochs = epochs;
  job.train =
      "batch_size: 2, device: cpu, val_interval: " + std::to_string(epochs) + ", loader: simple, threads: 1";
  job.validation = "{roi_size: [32, 32, 32], overlap: 0.0, sw_batch_size: 1, save_predictions: false}";
  job.runs_dir = dir / "runs";
  return job;
}

}  // namespace

TEST_CASE("MONAI weights imported by segflow fine-tune on 5 classes with the head re-initialised") {
  TempDir dir("import_monai_finetune");
  monai_reference(dir.path());
  monai_segflow("import --from monai " + shell_quote(dir / "bundle") + " --out " +
                shell_quote(dir / "spleen"));
  const fs::path sfta = dir / "spleen" / "weights.sfta";
  REQUIRE_OK_AND_ASSIGN(auto imported, models::read_tensor_archive(sfta));
  std::size_t head = 0;
  for (const auto& [name, t] : imported) head += name.rfind("up.0.", 0) == 0;
  const std::string model =
      "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, channels: [16, 32, 64, 128, 256], "
      "strides: [2, 2, 2, 2], num_res_units: 2, norm: batch, weights: {path: " +
      sfta.string() + ", reinit_head: true}}";
  const int epochs = 12;
  REQUIRE_OK_AND_ASSIGN(
      auto cfg, models::parse_job_config(imported_weights_job(dir.path(), model, epochs,
                                                              "{cases: 4, size: 32, format: nifti, seed: 5}")
                                             .yaml(),
                                         "job.yaml"));
  ImportedRunLog log;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, log));
  REQUIRE(log.losses.size() == static_cast<std::size_t>(epochs));
  REQUIRE(log.validations.size() == 1);
  MESSAGE("fine-tuning imported MONAI weights, losses " << log.losses.front() << " -> " << log.losses.back()
                                                        << ", validation mean Dice "
                                                        << log.validations.back().mean_dice);
  CHECK(log.losses.back() < log.losses.front());
  // A uniform random guess over 5 classes scores 2pq / (p + q) <= 1/3 per class (q = 1/5,
  // class fraction p <= 1); a constant class at most 1/4 averaged over the 4 structures.
  CHECK(log.validations.back().mean_dice > 1.0 / 3.0);
  auto report = nlohmann::json::parse(segflow::testing::read_file(run / "weights_report.json"));
  CHECK(report["names"] == "segflow");
  CHECK(report["counts"]["loaded"].get<std::size_t>() == imported.size() - head);
  CHECK(report["counts"]["reinitialised"].get<std::size_t>() == head);
  CHECK(head > 0);
  CHECK(report["counts"]["unused"] == 0);
}

TEST_CASE("an nnU-Net trainer checkpoint imported by segflow fine-tunes a 2-channel plain_unet") {
  TempDir dir("import_nnunet_finetune");
  // An nnU-Net results folder (segflow's export of an untrained plain_unet), its checkpoint
  // then rewritten by nnunetv2's own nnUNetTrainer.save_checkpoint.
  const std::string plain =
      "{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: 5, n_stages: 3, base_features: 4, "
      "deep_supervision: true}";
  auto base = imported_weights_job(dir.path(), plain, 1, "");
  base.stages = {testing::kLoadStage, testing::kResampleStage, testing::kCtWindowStage, testing::kFgBgStage,
                 testing::crop_stage("[16, 16, 16]", 1, 1, 1)};
  base.validation = "{roi_size: [16, 16, 16], overlap: 0.5, mode: constant}";
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(base.yaml(), "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  REQUIRE_OK_AND_ASSIGN(auto results, models::nnunet_results(cfg, {}, t->model().module(), {}));
  REQUIRE_OK(models::write_nnunet_results(results, dir / "results"));
  auto r = segflow::testing::run_command(
      shell_quote(segflow::testing::python()) + " " +
      shell_quote(segflow::testing::source_path("tests/tools/monai_import_ref.py").string()) +
      " nnunet-trainer " + shell_quote(dir / "results" / "fold_0") + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto saved = last_json_line(r.out);
  CHECK(saved["weights_type"] == "OrderedDict");
  CHECK(saved["keys"].dump().find("optimizer_state") != std::string::npos);
  monai_segflow("import --from nnunet " + shell_quote(dir / "results" / "fold_0") + " --out " +
                shell_quote(dir / "imported"));
  const fs::path sfta = dir / "imported" / "weights.sfta";

  // The weights as a 2-channel plain_unet's (channels: repeat): on a repeated input, the
  // 1-channel network's logits.
  nlohmann::json opts{{"name", "plain_unet"},
                      {"spatial_dims", 3},
                      {"in_channels", 2},
                      {"out_channels", 5},
                      {"n_stages", 3},
                      {"base_features", 4},
                      {"deep_supervision", true},
                      {"weights", {{"path", sfta.string()}, {"channels", "repeat"}}}};
  REQUIRE_OK_AND_ASSIGN(auto options, models::parse_model_options(opts, "model"));
  models::WeightsReport report;
  REQUIRE_OK_AND_ASSIGN(auto two, models::create_model(options, &report));
  CHECK(report.adapted == std::vector<std::string>{"encoder_stages.0.0.conv.weight"});
  {  // no gradients here only
    auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
    const at::Tensor x = at::rand({1, 1, 16, 16, 16}, gen, at::TensorOptions());
    torch::NoGradGuard no_grad;
    t->model().module().eval();
    two.module().eval();
    const at::Tensor y = t->model().predict(x);
    const double diff = (two.predict(at::cat({x, x}, 1)) - y).abs().max().item<double>();
    MESSAGE("nnU-Net checkpoint -> import -> 2 channels: max |logit diff| " << diff << " of max |logit| "
                                                                            << y.abs().max().item<double>());
    CHECK(diff <= 1e-4 * y.abs().max().item<double>());
  }

  // Fine-tuning on 2-channel cases (each synthetic CT twice: _0000 and _0001).
  monai_segflow("synth --out " + shell_quote(dir / "data") + " --cases 4 --size 24 --format nifti --seed 5");
  for (const auto& e : fs::directory_iterator(dir / "data" / "imagesTr")) {
    std::string name = e.path().filename().string();
    const auto at = name.find("_0000");
    if (at != std::string::npos)
      fs::copy_file(e.path(), e.path().parent_path() / name.replace(at, 5, "_0001"));
  }
  opts["weights"]["path"] = sfta.string();
  auto job = imported_weights_job(dir.path(), opts.dump(), 2, "");
  job.stages.back() = testing::crop_stage("[16, 16, 16]", 1, 1, 2);
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.0, sw_batch_size: 1, save_predictions: false}";
  REQUIRE_OK_AND_ASSIGN(auto fine, models::parse_job_config(job.yaml(), "job.yaml"));
  ImportedRunLog log;
  auto trained = actors::run_training(fine, {}, log);
  REQUIRE_MESSAGE(trained.is_ok(), trained.status().message());
  const fs::path run = *trained;
  REQUIRE(log.losses.size() == 2);
  for (double l : log.losses) CHECK(std::isfinite(l));
  CHECK(log.losses.back() < log.losses.front());
  auto rep = nlohmann::json::parse(segflow::testing::read_file(run / "weights_report.json"));
  CHECK(rep["counts"]["adapted"] == 1);
  CHECK(rep["counts"]["loaded"].get<std::size_t>() + 1 == models::read_tensor_archive(sfta)->size());
  MESSAGE("2-channel fine-tuning from nnU-Net weights: losses " << log.losses[0] << ", " << log.losses[1]);
}
