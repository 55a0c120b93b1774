// Out-of-fold predictions and `segflow cv`: every fold of `segflow train --fold all` writes
// its validation cases' predictions on their own grids with their scores, and `segflow cv`
// pools the folds with bootstrap intervals. Checked against `segflow infer` and `segflow
// eval` run on the same files, and against the per-case scores themselves.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "job_yaml.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace cv_test {

std::string q(const fs::path& p) { return segflow::testing::shell_quote(p.string()); }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), p.string());
  return nlohmann::json::parse(in);
}

/// A tiny job on 6 synthetic cases in 3 folds; `name` keeps run folders apart.
segflow::testing::JobYaml cv_job(const fs::path& dir, const std::string& name) {
  segflow::testing::JobYaml job;
  job.name = name;
  job.root = dir / "data";
  job.synth = "{cases: 6, size: 24, format: nifti, seed: 4}";
  job.val_cases = "";
  job.folds = "3";
  job.epochs = 4;
  job.runs_dir = dir / "runs";
  return job;
}

/// Trains every fold; the run folders, by fold.
std::vector<fs::path> train_folds(const fs::path& dir, const segflow::testing::JobYaml& job) {
  segflow::testing::write_file(dir / (job.name + ".yaml"), job.yaml());
  auto r =
      segflow::testing::run_segflow("train " + q(dir / (job.name + ".yaml")) + " --fold all --quiet", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(dir / "runs"))
    if (e.path().filename().string().rfind(job.name + "-", 0) == 0) runs.push_back(e.path());
  std::sort(runs.begin(), runs.end());
  return runs;
}

TEST_CASE("every fold writes its out-of-fold predictions and scores; segflow cv pools them with intervals" *
          doctest::test_suite("serial")) {
  segflow::testing::TempDir dir("cv_folds");
  const auto runs = train_folds(dir.path(), cv_job(dir.path(), "cvjob"));
  REQUIRE(runs.size() == 3);

  // Each fold: validation/ holds one prediction per validation case of its split, on the
  // case's own grid, and summary.json scores them.
  std::set<std::string> ids;
  std::map<std::string, nlohmann::json> case_scores;
  for (const auto& run : runs) {
    CAPTURE(run);
    REQUIRE(fs::exists(run / "validation" / "summary.json"));
    CHECK_FALSE(fs::exists(run / "validation.partial"));
    const auto summary = read_json(run / "validation" / "summary.json");
    CHECK(summary["checkpoint"] == "last.pt");
    CHECK(summary["predict_failed"].empty());
    REQUIRE(summary["cases"].size() == 2);
    for (const auto& c : summary["cases"]) {
      const std::string id = c["case"];
      CHECK(ids.insert(id).second);
      case_scores[id] = c["classes"];
      const fs::path pred = run / "validation" / (id + ".nii.gz");
      REQUIRE(fs::exists(pred));
      REQUIRE_OK_AND_ASSIGN(auto p, segflow::pipeline::read_image(pred));
      REQUIRE_OK_AND_ASSIGN(auto g, segflow::pipeline::read_image(c["gt"].get<std::string>()));
      CHECK(p.size() == g.size());  // the original 24^3 grid, not the resampled one
    }
  }
  CHECK(ids.size() == 6);  // the folds' validation cases partition the dataset

  // One case through the CLI: segflow infer with the fold's last.pt writes the same label
  // map, and segflow eval gives the same Dice.
  {
    const auto& run = runs[0];
    const auto summary = read_json(run / "validation" / "summary.json");
    const std::string id = summary["cases"][0]["case"];
    const fs::path image = dir.path() / "data" / "imagesTr" / (id + "_0000.nii.gz");
    REQUIRE(fs::exists(image));
    auto inf = segflow::testing::run_segflow("infer --checkpoint " + q(run / "last.pt") + " --input " +
                                                 q(image) + " --output " + q(dir.path() / "cli.nii.gz") +
                                                 " --device cpu --quiet",
                                             dir.path());
    REQUIRE_MESSAGE(inf.exit_code == 0, inf.err);
    REQUIRE_OK_AND_ASSIGN(auto a, segflow::pipeline::read_image(dir.path() / "cli.nii.gz"));
    REQUIRE_OK_AND_ASSIGN(auto b, segflow::pipeline::read_image(run / "validation" / (id + ".nii.gz")));
    CHECK(torch::equal(a.voxels.to(torch::kLong), b.voxels.to(torch::kLong)));
    auto ev =
        segflow::testing::run_segflow("eval --pred " + q(run / "validation" / (id + ".nii.gz")) + " --gt " +
                                          q(summary["cases"][0]["gt"].get<std::string>()) + " --json",
                                      dir.path());
    REQUIRE_MESSAGE(ev.exit_code == 0, ev.err);
    const auto e = nlohmann::json::parse(ev.out);
    for (const auto& [label, s] : e["cases"][0]["classes"].items())
      if (s["dice"].is_number()) CHECK(s["dice"] == case_scores[id][label]["dice"]);
  }

  // segflow cv: 6 cases, each once; the class mean is the mean of the per-case Dice of the
  // cases that have the class, inside its interval.
  auto r = segflow::testing::run_segflow(
      "cv " + q(runs[0]) + " " + q(runs[1]) + " " + q(runs[2]) + " --json --out " + q(dir.path() / "cv"),
      dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const auto cv = nlohmann::json::parse(r.out);
  REQUIRE(cv["cases"].size() == 6);
  CHECK(cv["folds"] == nlohmann::json::array({0, 1, 2}));
  REQUIRE(cv["classes"].size() >= 1);
  for (const auto& [label, k] : cv["classes"].items()) {
    CAPTURE(label);
    double sum = 0;
    int n = 0;
    for (const auto& [id, classes] : case_scores) {
      if (!classes.contains(label)) continue;
      const auto& s = classes[label];
      if (s["volume_pred_ml"] == 0.0 && s["volume_gt_ml"] == 0.0) continue;
      sum += s["dice"].get<double>();
      ++n;
    }
    REQUIRE(n > 0);
    CHECK(k["dice"]["cases"] == n);
    CHECK(k["dice"]["mean"].get<double>() == doctest::Approx(sum / n).epsilon(1e-9));
    CHECK(k["dice"]["low"].get<double>() <= k["dice"]["mean"].get<double>() + 1e-12);
    CHECK(k["dice"]["high"].get<double>() >= k["dice"]["mean"].get<double>() - 1e-12);
  }
  CHECK(cv["mean"]["dice"]["cases"] == 6);
  CHECK(fs::exists(dir.path() / "cv" / "cv_summary.json"));
  const std::string csv = segflow::testing::read_file(dir.path() / "cv" / "cv_cases.csv");
  CHECK(segflow::testing::contains(csv, "case,fold,class,name,dice,hd95,nsd\n"));
  // The readable table names each class and the mean.
  auto text =
      segflow::testing::run_segflow("cv " + q(runs[0]) + " " + q(runs[1]) + " " + q(runs[2]), dir.path());
  REQUIRE(text.exit_code == 0);
  CHECK(segflow::testing::contains(text.out, "mean over classes"));
  CHECK(segflow::testing::contains(text.out, "95% bootstrap intervals"));

  // Refusals, naming what is wrong.
  auto twice = segflow::testing::run_segflow("cv " + q(runs[0]) + " " + q(runs[0]), dir.path());
  CHECK(twice.exit_code != 0);
  CHECK(segflow::testing::contains(twice.err, "is in the validation of both"));
  fs::rename(runs[2] / "validation", dir.path() / "moved");
  auto missing = segflow::testing::run_segflow("cv " + q(runs[0]) + " " + q(runs[2]), dir.path());
  CHECK(missing.exit_code != 0);
  CHECK(segflow::testing::contains(missing.err, "no out-of-fold predictions"));
  auto bad = segflow::testing::run_segflow("cv " + q(runs[0]) + " --bootstrap 5", dir.path());
  CHECK(bad.exit_code != 0);
  CHECK(segflow::testing::contains(bad.err, "--bootstrap: expected >= 100"));
}

TEST_CASE("cv refuses runs of different datasets; validation.save_predictions false writes no predictions" *
          doctest::test_suite("serial")) {
  segflow::testing::TempDir dir("cv_other");
  auto a = cv_job(dir.path(), "cva");
  a.folds = "2";
  a.epochs = 1;
  a.validation = "{roi_size: [16, 16, 16], overlap: 0.25, sw_batch_size: 2, save_predictions: false}";
  const auto runs_a = train_folds(dir.path(), a);
  REQUIRE(runs_a.size() == 2);
  for (const auto& run : runs_a) CHECK_FALSE(fs::exists(run / "validation"));

  auto b = cv_job(dir.path(), "cvb");
  b.root = dir.path() / "other";
  b.folds = "2";
  b.epochs = 1;
  const auto runs_b = train_folds(dir.path(), b);
  REQUIRE(runs_b.size() == 2);
  auto c = cv_job(dir.path(), "cvc");
  c.folds = "2";
  c.epochs = 1;
  const auto runs_c = train_folds(dir.path(), c);
  REQUIRE(runs_c.size() == 2);
  auto r = segflow::testing::run_segflow("cv " + q(runs_b[0]) + " " + q(runs_c[1]), dir.path());
  CHECK(r.exit_code != 0);
  CHECK(segflow::testing::contains(r.err, "runs of different datasets"));
  CHECK(segflow::testing::contains(r.err, (dir.path() / "other").string()));
}

}  // namespace cv_test
