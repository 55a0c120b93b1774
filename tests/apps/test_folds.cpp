// Cross-validation folds (issue 14 item 3): the fold table, `segflow train --fold`, the split
// files each fold's run folder holds, and the errors for folds that cannot be made.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/split.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::shell_quote;
using segflow::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> case_ids(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("case_" + std::to_string(100 + i));
  return ids;
}

/// A one-epoch job on 5 synthetic 24^3 cases, with 3 folds.
std::string fold_job(const fs::path& dir) {
  segflow::testing::JobYaml job;
  job.name = "folds";
  job.seed = "4";
  job.root = dir / "data";
  job.synth = "{cases: 5, size: 24, format: nifti, seed: 2}";
  job.val_cases = "";
  job.folds = "3";
  job.stages = {segflow::testing::kLoadStage, segflow::testing::kCtWindowStage, segflow::testing::kFgBgStage,
                segflow::testing::crop_stage("[16, 16, 16]", 1, 1, 1)};
  job.model = segflow::testing::unet3d(5, "channels: [4, 8], strides: [2], num_res_units: 0, norm: batch");
  job.schedule = "";
  job.epochs = 1;
  job.train = "batch_size: 2, device: cpu, val_interval: 1, loader: simple, threads: 1";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.0, sw_batch_size: 2}";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(segflow::testing::read_file(p)); }

}  // namespace

TEST_CASE("the cross-validation table partitions the cases into near-equal folds, the same for a seed") {
  const auto ids = case_ids(11);
  REQUIRE_OK_AND_ASSIGN(auto table, pipeline::cross_validation_folds(ids, 5, 7));
  REQUIRE(table.size() == 5);
  std::multiset<std::string> all_val;
  std::vector<std::size_t> sizes;
  for (const auto& f : table) {
    sizes.push_back(f.val.size());
    CHECK(f.val.size() + f.train.size() == ids.size());
    CHECK(std::is_sorted(f.val.begin(), f.val.end()));
    for (const auto& v : f.val) {
      CHECK(std::find(f.train.begin(), f.train.end(), v) == f.train.end());
      all_val.insert(v);
    }
  }
  // Every case validates in exactly one fold; 11 = 3 + 2 + 2 + 2 + 2 (the first n % k parts larger).
  CHECK(all_val == std::multiset<std::string>(ids.begin(), ids.end()));
  CHECK(sizes == std::vector<std::size_t>{3, 2, 2, 2, 2});

  // Deterministic: the order the ids come in does not matter, the seed does.
  auto reversed = ids;
  std::reverse(reversed.begin(), reversed.end());
  REQUIRE_OK_AND_ASSIGN(auto again, pipeline::cross_validation_folds(reversed, 5, 7));
  for (std::size_t k = 0; k < 5; ++k) CHECK(again[k].val == table[k].val);
  REQUIRE_OK_AND_ASSIGN(auto other, pipeline::cross_validation_folds(ids, 5, 8));
  bool differs = false;
  for (std::size_t k = 0; k < 5; ++k) differs = differs || other[k].val != table[k].val;
  CHECK(differs);

  CHECK_FALSE(pipeline::cross_validation_folds(ids, 1, 7).is_ok());
  auto too_many = pipeline::cross_validation_folds(case_ids(3), 4, 7);
  REQUIRE_FALSE(too_many.is_ok());
  CHECK(too_many.status().message().find("expected 2 to 3 folds for 3 cases, got 4") != std::string::npos);
}

TEST_CASE("segflow train --fold all trains every fold into its own run folder with nnU-Net's split files") {
  TempDir dir("folds_all");
  const fs::path config = dir / "job.yaml";
  segflow::testing::write_file(config, fold_job(dir.path()));
  auto r = segflow::testing::run_command(shell_quote(segflow::testing::segflow_bin()) + " train " +
                                         shell_quote(config.string()) + " --fold all --quiet 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);

  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(dir / "runs")) runs.push_back(e.path());
  std::sort(runs.begin(), runs.end());
  REQUIRE(runs.size() == 3);
  const std::string stem = runs[0].filename().string();
  REQUIRE(stem.size() > 6);
  std::set<std::string> validated;
  nlohmann::json table;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    CAPTURE(runs[k]);
    // The folds of one config share the name up to "-foldK".
    const std::string name = runs[k].filename().string();
    CHECK(name == stem.substr(0, stem.size() - 1) + std::to_string(k));
    CHECK(fs::exists(runs[k] / "last.pt"));
    auto split = read_json(runs[k] / "split.json");
    auto all = read_json(runs[k] / "splits.json");
    CHECK(split["fold"] == k);
    CHECK(split["folds"] == 3);
    REQUIRE(all.size() == 3);
    if (k == 0) table = all;
    CHECK(all == table);  // every fold writes the same table
    CHECK(split["val"] == all[k]["val"]);
    CHECK(split["train"] == all[k]["train"]);
    CHECK(split["val"].size() + split["train"].size() == 5);
    for (const auto& v : split["val"]) CHECK(validated.insert(v.get<std::string>()).second);
    CHECK(read_json(runs[k] / "config.json")["data"]["fold"] == k);
  }
  CHECK(validated.size() == 5);  // each case validated by exactly one fold

  // The table is the one cross_validation_folds gives for the job's seed.
  std::vector<std::string> ids;
  for (const auto& f : table)
    for (const auto& v : f["val"]) ids.push_back(v.get<std::string>());
  REQUIRE_OK_AND_ASSIGN(auto expect, pipeline::cross_validation_folds(ids, 3, 4));
  for (std::size_t k = 0; k < 3; ++k) CHECK(table[k]["val"].get<std::vector<std::string>>() == expect[k].val);
}

TEST_CASE("a fold outside data.folds, more folds than cases and a bad --fold are errors before training") {
  TempDir dir("folds_bad");
  const fs::path config = dir / "job.yaml";
  segflow::testing::write_file(config, fold_job(dir.path()));
  const std::string train =
      shell_quote(segflow::testing::segflow_bin()) + " train " + shell_quote(config.string()) + " ";
  auto out_of_range = segflow::testing::run_command(train + "--fold 3 2>&1");
  CHECK(out_of_range.exit_code == 2);
  CHECK_MESSAGE(out_of_range.out.find("data.fold: expected -1 (no cross-validation) or a fold in [0, 2]") !=
                    std::string::npos,
                out_of_range.out);
  auto word = segflow::testing::run_command(train + "--fold some 2>&1");
  CHECK(word.exit_code == 2);
  CHECK_MESSAGE(word.out.find("--fold: expected a fold number 0..2 or all, got 'some'") != std::string::npos,
                word.out);
  CHECK_FALSE(fs::exists(dir / "runs"));

  auto too_many = segflow::testing::run_command(train + "--fold 0 --set data.folds=9 2>&1");
  CHECK(too_many.exit_code != 0);
  CHECK_MESSAGE(too_many.out.find("data.folds: expected at most the 5 cases") != std::string::npos,
                too_many.out);
  CHECK_FALSE(fs::exists(dir / "runs"));
}
