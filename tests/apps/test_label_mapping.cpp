// Label mapping in jobs: map_labels targets checked against the model's classes at
// submission, class names resolved from dataset.json and the config, and a short training
// run on TotalSegmentator's real CT (as NRRD, nnU-Net layout) keeping spleen, liver and
// kidneys, whose metrics.jsonl and TensorBoard files name the classes.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/training/class_names.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/io/nrrd.hpp"
#include "test_util.hpp"

using namespace segflow;
using nlohmann::json;
namespace fs = std::filesystem;
namespace st = segflow::testing;

namespace {

// TotalSegmentator v2 "total" class map (totalsegmentator==2.18.0, map_to_binary.py), the
// classes this test keeps: 1 spleen, 2 kidney_right, 3 kidney_left, 5 liver.
const json kTotalLabels = {
    {"background", 0}, {"spleen", 1}, {"kidney_right", 2}, {"kidney_left", 3}, {"liver", 5}};

std::string job_yaml(const fs::path& dir, const std::string& map_options, int out_channels) {
  st::JobYaml job;
  job.name = "organs";
  job.seed = "1";
  job.root = dir / "data";
  job.synth = job.num_classes = "";
  job.stages = {"load", st::stage("map_labels", map_options), st::kCtWindowStage, "fg_bg_indices",
                st::crop_stage("[32, 32, 16]", 3, 1, 2)};
  job.model = st::unet3d(out_channels, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1");
  job.schedule = "";
  job.epochs = 2;
  job.train = "batch_size: 2, device: cpu, val_interval: 1, loader: simple, threads: 2";
  job.validation = "{roi_size: [48, 48, 16], overlap: 0.25}";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

models::JobConfig parse_job(const std::string& yaml) {
  REQUIRE_OK_AND_ASSIGN(auto c, models::parse_job_config(yaml, "job.yaml"));
  return c;
}

/// Three cases in the nnU-Net layout as NRRD: the real CT and its 117-class label map, and
/// the same mirrored in x and in y (other anatomy positions, same grid).
void make_dataset(const fs::path& root) {
  auto ct = pipeline::read_nifti(st::testdata_path("totalsegmentator/example_ct_sm.nii.gz"));
  auto seg = pipeline::read_nifti(st::testdata_path("totalsegmentator/example_seg.nii.gz"));
  REQUIRE_OK(ct);
  REQUIRE_OK(seg);
  fs::create_directories(root / "imagesTr");
  fs::create_directories(root / "labelsTr");
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> cases = {
      {"ts_a", {}}, {"ts_b", {3}}, {"ts_c", {2}}};
  for (const auto& [id, flip] : cases) {
    pipeline::Image i = *ct, l = *seg;
    if (!flip.empty()) {
      i.voxels = i.voxels.flip(flip).contiguous();
      l.voxels = l.voxels.flip(flip).contiguous();
    }
    REQUIRE_OK(pipeline::write_nrrd(root / "imagesTr" / (id + "_0000.nrrd"), i));
    REQUIRE_OK(pipeline::write_nrrd(root / "labelsTr" / (id + ".nrrd"), l));
  }
  st::write_file(
      root / "dataset.json",
      json{{"labels", kTotalLabels}, {"channel_names", {{"0", "CT"}}}, {"file_ending", ".nrrd"}}.dump());
}

class ValidationRecorder : public models::TrainObserver {
 public:
  std::vector<models::ValidationInfo> validations;
  void on_validation(const models::ValidationInfo& v) override { validations.push_back(v); }
};

}  // namespace

TEST_CASE("a map_labels target outside the model's classes is refused, naming the option") {
  st::TempDir dir("map_labels_cfg");
  auto keep = parse_job(job_yaml(dir.path(), "{keep: [1, 5, 2, 3]}", 4));
  CHECK(models::check_label_mapping(keep).message() ==
        "job.yaml: stages[1].options.keep: expected at most 3 labels (targets 1..3 of num_classes 4, from "
        "model.out_channels), got 4 [1, 5, 2, 3]");
  auto mapping = parse_job(job_yaml(dir.path(), "{mapping: {1: 1, 5: 2, 2: 7}}", 4));
  CHECK(models::check_label_mapping(mapping).message() ==
        "job.yaml: stages[1].options.mapping: expected targets in 0..3 (num_classes 4, from "
        "model.out_channels), got 7 (for source 2)");
  auto by_data = parse_job(job_yaml(dir.path(), "{keep: [1, 5, 2]}", 5));
  by_data.data.num_classes = 3;
  CHECK(models::check_label_mapping(by_data).message().find("from data.num_classes), got 3") !=
        std::string::npos);
  CHECK_OK(models::check_label_mapping(parse_job(job_yaml(dir.path(), "{keep: [1, 5, 2, 3]}", 5))));
  // A source written twice in YAML (yaml-cpp keeps both; JSON would keep the last) is refused.
  auto twice = models::parse_job_config(job_yaml(dir.path(), "{mapping: {1: 1, 5: 2, 1: 3}}", 4), "job.yaml");
  CHECK(twice.status().message() ==
        "job.yaml: stages[1].options.mapping.1: duplicate key; expected each key once");
}

TEST_CASE("class names come from map_labels names, else from dataset.json through the mapping") {
  st::TempDir dir("map_labels_names");
  const std::vector<std::string> total = {"background", "spleen", "kidney_right", "kidney_left", "", "liver"};
  auto derived = parse_job(job_yaml(dir.path(), "{keep: [1, 5, 2, 3]}", 5));
  CHECK(models::job_class_names(derived, total) ==
        std::vector<std::string>{"background", "spleen", "liver", "kidney_right", "kidney_left"});
  auto merged = parse_job(job_yaml(dir.path(), "{mapping: {1: 1, 5: 2, 2: 3, 3: 3}}", 4));
  CHECK(models::job_class_names(merged, total) ==
        std::vector<std::string>{"background", "spleen", "liver", "kidney_right+kidney_left"});
  auto named = parse_job(job_yaml(dir.path(), "{keep: [1, 5], names: [bg, Spleen organ, Liver]}", 3));
  CHECK(models::job_class_names(named, total) == std::vector<std::string>{"bg", "Spleen organ", "Liver"});
  CHECK(models::metric_name("Spleen organ") == "Spleen_organ");
  CHECK(models::job_class_names(derived, {}).empty());
}

TEST_CASE(
    "a short run on TotalSegmentator's real CT keeping spleen, liver and kidneys names the classes in its "
    "metrics") {
  st::TempDir dir("map_labels_train");
  make_dataset(dir.path() / "data");
  auto cfg = parse_job(job_yaml(dir.path(), "{keep: [1, 5, 2, 3]}", 5));
  ValidationRecorder q;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, q));
  REQUIRE(q.validations.size() == 2);
  CHECK(q.validations[0].class_names ==
        std::vector<std::string>{"background", "spleen", "liver", "kidney_right", "kidney_left"});
  // metrics.jsonl: Dice keyed by class name, the same numbers as dice_per_class.
  std::ifstream f(run / "metrics.jsonl");
  int validations = 0;
  for (std::string line; std::getline(f, line);) {
    const auto j = json::parse(line);
    if (j["type"] != "validation") continue;
    ++validations;
    const json& named = j["dice_by_class"];
    CHECK(named.size() == 4);
    const char* order[] = {"spleen", "liver", "kidney_right", "kidney_left"};
    for (int k = 0; k < 4; ++k) {
      INFO("class " << order[k]);
      REQUIRE(named.contains(order[k]));
      CHECK(named[order[k]] == j["dice_per_class"][k]);
      CHECK(named[order[k]].is_number());  // every organ is in the held-out case
    }
  }
  CHECK(validations == 2);
  // TensorBoard, read with TensorBoard's own reader: val/dice_spleen beside val/dice_class_1.
  auto tb = st::run_command(st::shell_quote(st::python()) + " " +
                            st::shell_quote(st::source_path("tests/tools/tb_read.py").string()) + " " +
                            st::shell_quote((run / "tb").string()) + " 2>/dev/null");
  REQUIRE_MESSAGE(tb.exit_code == 0, tb.out);
  const auto scalars = json::parse(tb.out);
  for (const char* tag : {"val/dice_spleen", "val/dice_liver", "val/dice_kidney_right",
                          "val/dice_kidney_left", "val/dice_class_1", "val/mean_dice"}) {
    CHECK_MESSAGE(scalars.contains(tag), tag);
  }
  REQUIRE(scalars.contains("val/dice_spleen"));
  CHECK(scalars["val/dice_spleen"].size() == 2);
  CHECK(scalars["val/dice_spleen"][1][1].get<double>() ==
        doctest::Approx(q.validations[1].dice_per_class[0]).epsilon(1e-5));
}
