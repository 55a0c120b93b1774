// What a run records about how it trained: the "run" record of metrics.jsonl (device, the
// mixed precision chosen for it by train.amp: auto, threads, the torch version), one per start.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/training/amp.hpp"
#include "models/training/job_config.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> records_of_type(const fs::path& metrics, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == type) out.push_back(j);
  }
  return out;
}

}  // namespace

TEST_CASE("a run with amp auto records the mode it trained in and why, again when it resumes") {
  TempDir dir("run_record");
  segflow::testing::JobYaml job;
  job.root = dir.path() / "data";
  job.epochs = 1;
  job.train += ", amp: auto";
  job.runs_dir = dir.path() / "runs";
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(job.yaml(), "job.yaml"));
  models::TrainObserver none;
  REQUIRE_OK_AND_ASSIGN(fs::path run, actors::run_training(cfg, {}, none));
  REQUIRE_OK_AND_ASSIGN(models::AmpChoice expect, models::resolve_amp("auto", c10::Device(c10::kCPU)));

  auto runs = records_of_type(run / "metrics.jsonl", "run");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0]["device"] == "cpu");
  CHECK(runs[0]["amp_setting"] == "auto");
  CHECK(runs[0]["amp"] == expect.mode);
  CHECK(runs[0]["amp_reason"] == expect.reason);
  CHECK(runs[0]["threads"].get<int>() >= 1);
  CHECK(runs[0]["resumed_from"].is_null());
  CHECK(runs[0]["epoch"] == 0);

  // Two epochs now, resuming from last.pt: a second record, naming the checkpoint.
  REQUIRE_OK_AND_ASSIGN(auto cfg2, models::parse_job_config(job.yaml(), "job.yaml", {"train.epochs=2"}));
  actors::RunOptions resume;
  resume.resume = run / "last.pt";
  REQUIRE_OK_AND_ASSIGN(fs::path again, actors::run_training(cfg2, resume, none));
  CHECK(again == run);
  runs = records_of_type(run / "metrics.jsonl", "run");
  REQUIRE(runs.size() == 2);
  CHECK(runs[1]["resumed_from"] == (run / "last.pt").string());
  CHECK(runs[1]["epoch"] == 1);
  CHECK(records_of_type(run / "metrics.jsonl", "epoch").size() == 2);
}
