// train.early_stopping end to end: a run whose validation Dice cannot improve stops after
// `patience` validations without improvement, with the reason in metrics.jsonl and the
// checkpoint; a run that keeps a large patience trains every epoch; the count survives a
// resume; bad settings are refused naming the key.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::TempDir;
namespace fs = std::filesystem;

// A named namespace, test cases included: the unity build compiles this file with others.
namespace early_stopping_test {

/// The tiny job with one step per epoch, validation every epoch, and `early_stopping` in
/// `train`. SGD at lr 1e-30 leaves every weight as it was (instance norm: no running
/// statistics either), so the validation Dice is the same at every validation.
std::string job(const fs::path& dir, const std::string& early_stopping, int epochs, bool learns = false) {
  testing::JobYaml j;
  j.root = dir / "data";
  j.runs_dir = dir / "runs";
  j.epochs = epochs;
  j.model = testing::unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: instance");
  if (!learns) j.optimizer = "{name: sgd, lr: 1.0e-30}";
  j.train =
      "batch_size: 2, device: cpu, val_interval: 1, checkpoint_interval: 1, loader: simple, threads: 1, "
      "steps_per_epoch: 1";
  if (!early_stopping.empty()) j.train += ", early_stopping: " + early_stopping;
  return j.yaml();
}

models::JobConfig config(const std::string& yaml, const std::vector<std::string>& ov = {}) {
  REQUIRE_OK_AND_ASSIGN(auto c, models::parse_job_config(yaml, "job.yaml", ov));
  return c;
}

/// The message of a config that must be refused.
std::string refusal(const std::string& yaml) {
  auto r = models::parse_job_config(yaml, "job.yaml");
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

class Recorder : public models::TrainObserver {
 public:
  std::vector<models::ValidationInfo> validations;
  std::vector<models::EpochInfo> epochs;
  std::vector<models::EarlyStopInfo> stops;
  void on_validation(const models::ValidationInfo& v) override { validations.push_back(v); }
  void on_epoch_end(const models::EpochInfo& e) override { epochs.push_back(e); }
  void on_early_stop(const models::EarlyStopInfo& i) override { stops.push_back(i); }
};

std::vector<nlohmann::json> early_stop_records(const fs::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "early_stop") out.push_back(j);
  }
  return out;
}

nlohmann::json meta_of(const fs::path& checkpoint) {
  REQUIRE_OK_AND_ASSIGN(auto meta, models::read_checkpoint_meta(checkpoint));
  return meta;
}

TEST_CASE("early stopping with patience 2 ends a run whose Dice cannot improve after its third validation") {
  TempDir dir("early_stop");
  Recorder q;
  const fs::path run_dir = dir / "run";
  REQUIRE_OK(actors::run_training(config(job(dir.path(), "{patience: 2}", 10)), {.run_dir = run_dir}, q));
  CHECK(q.validations.size() == 3);
  CHECK(q.epochs.size() == 3);  // of 10
  REQUIRE(q.stops.size() == 1);
  CHECK_FALSE(q.stops[0].earlier);
  const auto records = early_stop_records(run_dir);
  REQUIRE(records.size() == 1);
  const auto& r = records[0];
  CHECK(r["epoch"] == 2);
  CHECK(r["metric"] == "val/dice_mean");
  CHECK(r["mode"] == "max");
  CHECK(r["best"].get<double>() == doctest::Approx(q.validations[0].mean_dice));
  CHECK(r["best_epoch"] == 0);
  CHECK(r["patience"] == 2);
  CHECK(r["validations_without_improvement"] == 2);
  CHECK(r["reason"].get<std::string>().find("val/dice_mean did not improve") != std::string::npos);
  REQUIRE(fs::exists(run_dir / "last.pt"));
  const auto meta = meta_of(run_dir / "last.pt");
  CHECK(meta["epoch"] == 3);
  CHECK(meta["early_stop"]["validations_without_improvement"] == 2);
  CHECK(meta["early_stop"]["best_epoch"] == 0);
}

TEST_CASE("a run with a large patience trains every epoch and records no early stop") {
  TempDir dir("early_stop_off");
  Recorder q;
  const fs::path run_dir = dir / "run";
  REQUIRE_OK(actors::run_training(config(job(dir.path(), "{patience: 100, min_delta: 0.001}", 3, true)),
                                  {.run_dir = run_dir}, q));
  CHECK(q.epochs.size() == 3);
  CHECK(q.validations.size() == 3);
  CHECK(q.stops.empty());
  CHECK(early_stop_records(run_dir).empty());
  CHECK(meta_of(run_dir / "last.pt")["epoch"] == 3);
}

TEST_CASE(
    "the early-stopping count is in the checkpoint: a resumed run stops where an uninterrupted one does") {
  TempDir dir("early_stop_resume");
  const std::string yaml = job(dir.path(), "{patience: 2}", 10);
  Recorder full;
  REQUIRE_OK(actors::run_training(config(yaml), {.run_dir = dir / "full"}, full));
  REQUIRE(full.stops.size() == 1);
  // Interrupted after 2 epochs (as a crash would leave it): one validation without improvement.
  const fs::path split = dir / "split";
  Recorder first;
  REQUIRE_OK(actors::run_training(config(yaml, {"train.epochs=2"}), {.run_dir = split}, first));
  CHECK(first.stops.empty());
  const auto meta = meta_of(split / "last.pt");
  CHECK(meta["epoch"] == 2);
  CHECK(meta["early_stop"]["validations_without_improvement"] == 1);
  CHECK(meta["early_stop"]["best_epoch"] == 0);
  Recorder resumed;
  REQUIRE_OK(actors::run_training(config(yaml), {.resume = split / "last.pt", .run_dir = split}, resumed));
  REQUIRE(resumed.epochs.size() == 1);
  CHECK(resumed.epochs[0].epoch == 2);
  REQUIRE(resumed.stops.size() == 1);
  CHECK(resumed.stops[0].epoch == full.stops[0].epoch);
  CHECK(resumed.stops[0].best_epoch == full.stops[0].best_epoch);
  // Resumed once more with the same patience (more epochs would not matter): nothing to train.
  Recorder again;
  REQUIRE_OK(actors::run_training(config(yaml, {"train.epochs=20"}),
                                  {.resume = split / "last.pt", .run_dir = split}, again));
  CHECK(again.epochs.empty());
  REQUIRE(again.stops.size() == 1);
  CHECK(again.stops[0].earlier);
  CHECK(early_stop_records(split).size() == 1);
  // A larger patience trains on until it is reached too.
  Recorder patient;
  REQUIRE_OK(actors::run_training(config(yaml, {"train.early_stopping.patience=3"}),
                                  {.resume = split / "last.pt", .run_dir = split}, patient));
  REQUIRE(patient.epochs.size() == 1);
  CHECK(patient.epochs[0].epoch == 3);
  REQUIRE(patient.stops.size() == 1);
  CHECK(patient.stops[0].validations_without_improvement == 3);
  CHECK(early_stop_records(split).size() == 2);
}

TEST_CASE("segflow train ends with the reason when early stopping ended the run") {
  TempDir dir("early_stop_cli");
  {
    std::ofstream f(dir / "job.yaml");
    f << job(dir.path(), "{patience: 1}", 10);
  }
  const auto r = testing::run_segflow("train " + testing::shell_quote((dir / "job.yaml").string()) +
                                      " --quiet --run-dir " + testing::shell_quote((dir / "run").string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  CHECK(r.out.find("stopped early after epoch 2 of 10: val/dice_mean did not improve") != std::string::npos);
  // Again on the stopped run: nothing to train, and the output says why.
  const auto again = testing::run_segflow("train " + testing::shell_quote((dir / "job.yaml").string()) +
                                          " --quiet --resume-last --run-dir " +
                                          testing::shell_quote((dir / "run").string()));
  REQUIRE_MESSAGE(again.exit_code == 0, again.out);
  CHECK(again.out.find("nothing to train: the run had stopped early after epoch 2") != std::string::npos);
}

TEST_CASE("bad train.early_stopping settings are refused naming the key") {
  const fs::path root = "/nonexistent";
  auto with = [&](const std::string& es, const std::string& val_interval = "1") {
    testing::JobYaml j;
    j.root = root;
    j.train = "device: cpu, val_interval: " + val_interval + ", early_stopping: " + es;
    return j.yaml();
  };
  CHECK(refusal(with("{min_delta: 0.01}")).find("train.early_stopping.patience: expected an integer >= 1") !=
        std::string::npos);
  CHECK(refusal(with("{patience: 0}")).find("train.early_stopping.patience") != std::string::npos);
  const std::string metric = refusal(with("{patience: 2, metric: val/loss}"));
  CHECK(metric.find("train.early_stopping.metric") != std::string::npos);
  CHECK(metric.find("val/dice_mean") != std::string::npos);
  CHECK(refusal(with("{patience: 2, min_delta: -0.1}")).find("train.early_stopping.min_delta") !=
        std::string::npos);
  CHECK(refusal(with("{patience: 2, mode: biggest}")).find("train.early_stopping.mode") != std::string::npos);
  CHECK(refusal(with("{patience: 2, patiense: 3}")).find("train.early_stopping.patiense") !=
        std::string::npos);
  const std::string never = refusal(with("{patience: 2}", "0"));
  CHECK(never.find("train.early_stopping") != std::string::npos);
  CHECK(never.find("val_interval") != std::string::npos);
}

TEST_CASE("early stopping is off unless configured, and absent it leaves the resolved config as it was") {
  testing::JobYaml j;
  j.root = "/nonexistent";
  REQUIRE_OK_AND_ASSIGN(auto off, models::parse_job_config(j.yaml(), "job.yaml"));
  CHECK_FALSE(off.train.early_stopping.has_value());
  CHECK_FALSE(off.resolved["train"].contains("early_stopping"));
  j.train += ", early_stopping: {patience: 4}";
  REQUIRE_OK_AND_ASSIGN(auto on, models::parse_job_config(j.yaml(), "job.yaml"));
  REQUIRE(on.train.early_stopping.has_value());
  CHECK(on.train.early_stopping->patience == 4);
  CHECK(on.resolved["train"]["early_stopping"] ==
        nlohmann::json{{"metric", "val/dice_mean"}, {"patience", 4}, {"min_delta", 0.0}, {"mode", "max"}});
  // The resolved config (a checkpoint's) reads back the same.
  REQUIRE_OK_AND_ASSIGN(auto back, models::job_config_from_json(on.resolved, "ckpt"));
  CHECK(back.train.early_stopping->patience == 4);
  CHECK(models::run_name(back) == models::run_name(on));
}

}  // namespace early_stopping_test
