// `segflow infer`'s run-time settings: mixed precision, channels-last, the sliding-window
// overlap and where windows are stitched. Each is compared with the float32 / default run of
// the same trained checkpoint on the same scan, and bad values are refused before anything
// runs.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/inference/inference.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "test_util.hpp"

using namespace segflow;
namespace fs = std::filesystem;

namespace infer_options_test {

/// A 3D UNet trained 6 epochs on 4 synthetic 24^3 cases: its last.pt.
fs::path trained_checkpoint(const fs::path& dir) {
  auto s = testing::run_segflow(
      "synth --cases 4 --size 24 --seed 4 --out " + testing::shell_quote((dir / "data").string()), dir);
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  testing::JobYaml job;
  job.name = "infer-options";
  job.seed = "4";
  job.root = dir / "data";
  job.stages = {testing::kLoadStage, testing::kCtWindowStage, testing::kFgBgStage,
                testing::crop_stage("[16, 16, 16]", 3, 1, 2)};
  job.model = testing::unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch");
  job.optimizer = "{name: adam, lr: 0.02}";
  job.schedule = "";
  job.epochs = 6;
  job.train = "batch_size: 2, device: cpu, val_interval: 0, loader: simple, threads: 1";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.5, sw_batch_size: 4}";
  job.runs_dir = dir / "runs";
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(job.yaml(), "job.yaml"));
  models::TrainObserver quiet;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, quiet));
  return run / "last.pt";
}

/// Probabilities (K, Z, Y, X) and labels of one inference with options `o` (output `name`).
struct Prediction {
  at::Tensor probabilities, labels;
};
Prediction predict(models::InferOptions o, const fs::path& dir, const std::string& name) {
  o.output = dir / (name + ".nii.gz");
  o.save_probabilities = true;
  REQUIRE_OK_AND_ASSIGN(auto r, models::run_inference(o));
  REQUIRE_OK_AND_ASSIGN(auto probs, pipeline::read_image(r.probabilities));
  REQUIRE_OK_AND_ASSIGN(auto labels, pipeline::read_image(o.output));
  return {probs.voxels.to(torch::kFloat32), labels.voxels.to(torch::kLong)};
}

double agreement(const at::Tensor& a, const at::Tensor& b) {
  return a.eq(b).to(torch::kDouble).mean().item<double>();
}

}  // namespace infer_options_test

using namespace infer_options_test;

TEST_CASE("infer: bf16, channels-last, overlap and host stitching against the float32 default") {
  testing::TempDir dir("infer_options");
  const fs::path ckpt = trained_checkpoint(dir.path());
  // A scan larger than the 16^3 window in every axis, each axis its own length.
  torch::manual_seed(11);
  pipeline::Image scan;
  scan.voxels = torch::rand({1, 28, 34, 40}) * 500.0 - 200.0;
  scan.geometry.spacing = {1.0, 1.0, 1.0};
  const fs::path input = dir.path() / "scan.nii.gz";
  REQUIRE_OK(pipeline::write_nifti(input, scan));
  models::InferOptions base{.checkpoint = ckpt, .input = input, .output = {}, .device = "cpu"};

  const Prediction fp32 = predict(base, dir.path(), "fp32");
  // On the CPU the default is float32: "" and "none" give the same numbers.
  models::InferOptions o = base;
  o.amp = "none";
  CHECK(torch::equal(predict(o, dir.path(), "none").probabilities, fp32.probabilities));

  // bf16 autocast: the labels agree on > 99% of voxels, the probabilities within bf16's
  // precision, but are not bit-equal (autocast did run).
  o.amp = "bf16";
  const Prediction bf16 = predict(o, dir.path(), "bf16");
  CHECK(agreement(bf16.labels, fp32.labels) > 0.99);
  const double bf16_diff = (bf16.probabilities - fp32.probabilities).abs().max().item<double>();
  CHECK(bf16_diff < 0.1);
  CHECK(bf16_diff > 0.0);

  // Channels-last weights and inputs: the same function up to float rounding.
  o = base;
  o.channels_last = true;
  const Prediction cl = predict(o, dir.path(), "cl");
  CHECK(torch::allclose(cl.probabilities, fp32.probabilities, 1e-5, 1e-5));

  // Stitching in host memory: the same numbers as stitching on the model's device.
  o = base;
  o.stitch_device = "cpu";
  CHECK(torch::allclose(predict(o, dir.path(), "host").probabilities, fp32.probabilities, 1e-6, 1e-6));

  // The overlap: 0.5 is the run's own validation.overlap, so equal to the default; 0 and
  // 0.75 place other windows and give other numbers.
  o = base;
  o.overlap = 0.5;
  CHECK(torch::equal(predict(o, dir.path(), "ov50").probabilities, fp32.probabilities));
  o.overlap = 0.0;
  const Prediction ov0 = predict(o, dir.path(), "ov0");
  o.overlap = 0.75;
  const Prediction ov75 = predict(o, dir.path(), "ov75");
  CHECK((ov0.probabilities - fp32.probabilities).abs().max().item<double>() > 1e-5);
  CHECK((ov75.probabilities - fp32.probabilities).abs().max().item<double>() > 1e-5);
  CHECK(agreement(ov75.labels, fp32.labels) > 0.95);

  // The CLI takes the same settings and writes the same labels.
  const auto q = [](const fs::path& p) { return testing::shell_quote(p.string()); };
  auto r = testing::run_segflow(
      "infer --checkpoint " + q(ckpt) + " --input " + q(input) + " --output " + q(dir.path() / "cli.nii.gz") +
          " --device cpu --amp none --channels-last on --overlap 0.5 --stitch-device cpu",
      dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  REQUIRE_OK_AND_ASSIGN(auto cli, pipeline::read_image(dir.path() / "cli.nii.gz"));
  CHECK(agreement(cli.voxels.to(torch::kLong), fp32.labels) > 0.999);
}

TEST_CASE(
    "infer refuses a bad --amp, --channels-last, --overlap or --stitch-device before it reads anything") {
  testing::TempDir dir("infer_options_bad");
  // The checkpoint and input do not exist: a refusal must come from the flag, not the files.
  const std::string files = " --checkpoint none.pt --input none.nii.gz --output out.nii.gz --device cpu";
  const struct {
    std::string flag, says;
  } cases[] = {
      {"--overlap 1.0", "--overlap: expected a number in [0, 1), got '1.0'"},
      {"--overlap -0.5", "--overlap: expected a number in [0, 1), got '-0.5'"},
      {"--overlap half", "--overlap: expected a number in [0, 1), got 'half'"},
      {"--channels-last yes", "--channels-last: expected on or off, got 'yes'"},
  };
  for (const auto& c : cases) {
    auto r = testing::run_segflow("infer" + files + " " + c.flag, dir.path());
    CHECK_MESSAGE(r.exit_code != 0, c.flag);
    CHECK_MESSAGE(testing::contains(r.err, c.says), c.flag << ": " << r.err);
    CHECK_FALSE(fs::exists(dir.path() / "out.nii.gz"));
  }
  // Through the API: options checked before the checkpoint is opened.
  models::InferOptions o{.checkpoint = dir.path() / "none.pt",
                         .input = dir.path() / "none.nii.gz",
                         .output = dir.path() / "out.nii.gz",
                         .device = "cpu"};
  o.stitch_device = "cuda:3";
  auto bad = models::run_inference(o);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(
      testing::contains(bad.status().message(), "--stitch-device: expected cpu or the model's device (cpu)"));
  o.stitch_device = "";
  o.amp = "fp8";
  bad = models::run_inference(o);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(testing::contains(bad.status().message(), "fp8"));
}
