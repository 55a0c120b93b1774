// Every shipped job config trains under bf16 autocast on a CPU: its first steps and a
// validation at a tiny size (sizes overridden as a user would with --set), finite losses and
// no skipped step. The spleen recipe (amp: auto as shipped) runs through the segflow binary in
// the precision auto chooses for this CPU.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <set>

#include "actors/jobs/job_runner.hpp"
#include "models/training/amp.hpp"
#include "models/training/job_config.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::TempDir;

namespace {

/// --set overrides that shrink `config` (data, crops, batch, windows) and train 2 bf16 steps on the
/// CPU, then validate once. Stage indices are looked up by name in the shipped file.
std::vector<std::string> tiny_overrides(const std::filesystem::path& config, const std::filesystem::path& dir,
                                        int size, const std::string& crop, const std::string& roi) {
  REQUIRE_OK_AND_ASSIGN(auto shipped, models::load_job_config(config));
  std::vector<std::string> ov = {"data.root=" + (dir / "data").string(),
                                 "data.synth.cases=3",
                                 "data.synth.size=" + std::to_string(size),
                                 "data.val_cases=1",
                                 "train.device=cpu",
                                 "train.amp=bf16",
                                 "train.epochs=1",
                                 "train.batch_size=2",
                                 "train.steps_per_epoch=2",
                                 "train.val_interval=1",
                                 "train.log_every=1",
                                 "train.threads=2",
                                 "train.decode_workers=1",
                                 "output.runs_dir=" + (dir / "runs").string()};
  const auto& stages = shipped.stages.stages;
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (stages[i].name == "rand_crop_pos_neg") {
      ov.push_back("stages." + std::to_string(i) + ".options.spatial_size=" + crop);
      ov.push_back("stages." + std::to_string(i) + ".options.num_samples=2");
    }
  if (!roi.empty()) ov.push_back("validation.roi_size=" + roi);
  return ov;
}

struct Recorder : models::TrainObserver {
  std::vector<models::StepInfo> steps;
  std::vector<models::EpochInfo> epochs;
  std::vector<models::ValidationInfo> validations;
  void on_step(const models::StepInfo& i) override { steps.push_back(i); }
  void on_epoch_end(const models::EpochInfo& i) override { epochs.push_back(i); }
  void on_validation(const models::ValidationInfo& i) override { validations.push_back(i); }
};

void check_trains_bf16(const std::string& name, int size, const std::string& crop, const std::string& roi,
                       const std::vector<std::string>& extra = {}) {
  TempDir dir("amp_" + name);
  const auto config = segflow::testing::source_path("configs/" + name + ".yaml");
  auto overrides = tiny_overrides(config, dir.path(), size, crop, roi);
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::load_job_config(config, overrides));
  REQUIRE(cfg.train.amp == "bf16");
  Recorder rec;
  REQUIRE_OK(actors::run_training(cfg, {}, rec));
  REQUIRE(rec.steps.size() == 2);
  for (const auto& s : rec.steps) {
    CHECK(s.logged);
    CHECK(std::isfinite(s.loss));
    CHECK(s.skipped_steps == 0);
  }
  REQUIRE(rec.epochs.size() == 1);
  CHECK(rec.epochs[0].skipped_steps == 0);
  REQUIRE(rec.validations.size() == 1);  // predicted under autocast too
  CHECK(std::isfinite(rec.validations[0].mean_dice));
}

}  // namespace

TEST_CASE("the shipped spleen recipe (amp: auto) trains its first steps on a CPU through segflow train") {
  TempDir dir("amp_spleen");
  const auto config = segflow::testing::source_path("configs/spleen-ct-unet3d.yaml");
  std::string cmd = segflow::testing::shell_quote(segflow::testing::segflow_bin()) + " train " +
                    segflow::testing::shell_quote(config.string()) + " --run-dir " +
                    segflow::testing::shell_quote((dir / "run").string());
  // 32^3 crops: the net's four stride-2 levels need multiples of 16.
  for (const auto& o : tiny_overrides(config, dir.path(), 32, "[32, 32, 32]", "[32, 32, 32]"))
    if (o.rfind("train.amp=", 0) != 0) cmd += " --set " + segflow::testing::shell_quote(o);  // as shipped
  auto r = segflow::testing::run_command(cmd + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  int steps = 0, epochs = 0, runs = 0;
  REQUIRE_OK_AND_ASSIGN(models::AmpChoice chosen, models::resolve_amp("auto", c10::Device(c10::kCPU)));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "run") {
      ++runs;
      CHECK(j["amp_setting"] == "auto");
      CHECK(j["amp"] == chosen.mode);  // bf16 on a CPU with AMX-BF16, none elsewhere
    } else if (j["type"] == "step") {
      ++steps;
      CHECK(j["loss"].is_number());
      CHECK(j["skipped_steps"] == 0);
    } else if (j["type"] == "epoch") {
      ++epochs;
      CHECK(j["skipped_steps"] == 0);
    }
  }
  CHECK(steps == 2);
  CHECK(epochs == 1);
  CHECK(runs == 1);
  auto resolved = nlohmann::json::parse(segflow::testing::read_file(dir / "run" / "config.json"));
  CHECK(resolved["train"]["amp"] == "auto");
}

TEST_CASE("the shipped quickstart config trains and validates under bf16 autocast on a CPU") {
  check_trains_bf16("quickstart-unet3d", 24, "[16, 16, 16]", "[16, 16, 16]");
}

TEST_CASE("the shipped nnU-Net-like config trains and validates under bf16 autocast on a CPU") {
  check_trains_bf16("nnunet-like-3d", 32, "[16, 16, 16]", "[16, 16, 16]");
}

TEST_CASE("the shipped 2D slice UNet config trains and validates under bf16 autocast on a CPU") {
  check_trains_bf16("unet2d-slices", 32, "[32, 32, 1]", "[32, 32]");
}

TEST_CASE("the shipped box-prompted SAM config trains and validates under bf16 autocast on a CPU") {
  check_trains_bf16("medsam-box2d", 32, "", "");
}

TEST_CASE(
    "the shipped MedSAM ViT-B recipe shrunk to a tiny SAM (32 px, no weights) with the IoU loss trains 2 "
    "steps and "
    "validates under bf16 on a CPU") {
  // Its stages as shipped (medsam_normalize, minmax_slices, remove_small_objects, medsam_box,
  // resize_longest_side) but resizing to 32; loss.iou_weight adds LiteMedSAM's IoU term.
  check_trains_bf16(
      "medsam-vitb", 48, "", "",
      {"model.preset=tiny", "model.img_size=32", "model.patch_size=4", "model.embed_dim=32",
       "model.weights=", "model.iou_head=true", "stages.5.options.size=32", "stages.4.options.num_samples=2",
       "stages.4.options.bbox_shift=2", "stages.3.options.min_size_3d=20", "stages.3.options.min_size_2d=4",
       "loss.iou_weight=1.0"});
}

TEST_CASE("every shipped job config has a bf16 case above") {
  std::set<std::string> shipped;
  for (const auto& e : std::filesystem::directory_iterator(segflow::testing::source_path("configs")))
    if (e.path().extension() == ".yaml" && e.path().stem() != "daemon")
      shipped.insert(e.path().stem().string());
  CHECK(shipped == std::set<std::string>{"medsam-box2d", "medsam-vitb", "nnunet-like-3d", "quickstart-unet3d",
                                         "spleen-ct-unet3d", "unet2d-slices"});
}
