// The apps suite's CUDA case (run by scripts/gpu-check.sh; skipped with a message without a
// GPU, failed when SEGFLOW_REQUIRE_CUDA is set): a job trained end to end on cuda:0 through
// the actor data path (augmentation on the device), validated there, and `segflow infer` on
// CUDA agreeing with `segflow infer` on the CPU from the same checkpoint.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>

#include "actors/jobs/job_runner.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::testing;

namespace {
struct Record : models::TrainObserver {
  std::vector<models::EpochInfo> epochs;
  std::vector<models::ValidationInfo> validations;
  void on_epoch_end(const models::EpochInfo& i) override { epochs.push_back(i); }
  void on_validation(const models::ValidationInfo& i) override { validations.push_back(i); }
};
}  // namespace

TEST_CASE("CUDA: a job trains end to end on cuda:0 and segflow infer on CUDA agrees with the CPU") {
  if (!cuda_or_skip()) return;
  TempDir dir("cuda_e2e");
  REQUIRE_OK_AND_ASSIGN(
      auto cfg, models::load_job_config(
                    source_path("configs/quickstart-unet3d.yaml"),
                    {"data.root=" + (dir / "data").string(), "data.synth.cases=6", "data.synth.size=32",
                     "data.val_cases=1", "train.device=cuda:0", "train.amp=bf16", "train.epochs=3",
                     "train.val_interval=1", "output.runs_dir=" + (dir / "runs").string()}));
  Record rec;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, rec));
  REQUIRE(rec.epochs.size() == 3);
  for (const auto& e : rec.epochs) {
    CHECK(std::isfinite(e.loss));
    CHECK(e.skipped_steps == 0);
  }
  CHECK(rec.epochs.back().loss < rec.epochs.front().loss);
  REQUIRE(rec.validations.size() == 3);
  CHECK(std::isfinite(rec.validations.back().mean_dice));

  const auto input = dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz";
  std::map<std::string, at::Tensor> labels;
  for (const char* device : {"cuda:0", "cpu"}) {
    const auto out = dir.path() / (std::string("seg-") +
                                   (device[0] == 'c' && device[1] == 'u' ? "cuda" : "cpu") + ".nii.gz");
    auto r = run_command(shell_quote(segflow_bin()) + " infer --checkpoint " +
                         shell_quote((run / "last.pt").string()) + " --input " + shell_quote(input.string()) +
                         " --output " + shell_quote(out.string()) + " --device " + device + " 2>&1");
    REQUIRE_MESSAGE(r.exit_code == 0, r.out);
    REQUIRE_OK_AND_ASSIGN(auto img, pipeline::read_image(out));
    labels[device] = img.voxels;
  }
  REQUIRE(labels["cpu"].sizes() == labels["cuda:0"].sizes());
  const double agree = (labels["cpu"] == labels["cuda:0"]).to(at::kDouble).mean().item<double>();
  INFO("label agreement CPU vs CUDA ", agree);
  CHECK(agree > 0.99);  // bf16 autocast on either side: a few boundary voxels may differ
}
