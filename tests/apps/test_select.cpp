// segflow select: two tiny configurations (2 folds each, validation.save_probabilities)
// pooled by segflow cv and compared. A single configuration's row is its cv summary's mean
// and interval; the ensemble's row equals averaging the saved probability files with
// nibabel, taking the argmax and scoring with segflow eval; bad input is refused naming the
// summaries, and nothing is written then.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "job_yaml.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace select_test {

std::string qs(const fs::path& p) { return segflow::testing::shell_quote(p.string()); }

nlohmann::json read_select_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), p.string());
  return nlohmann::json::parse(in);
}

/// Trains both folds of a tiny configuration on the shared data and pools them with
/// segflow cv; the cv_summary.json.
fs::path train_and_pool(const fs::path& dir, const std::string& name, const std::string& model, int epochs) {
  segflow::testing::JobYaml job;
  job.name = name;
  job.root = dir / "data";
  job.synth = "{cases: 4, size: 24, format: nifti, seed: 4}";
  job.val_cases = "";
  job.folds = "2";
  job.epochs = epochs;
  job.model = model;
  job.runs_dir = dir / "runs";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.25, sw_batch_size: 2, save_probabilities: true}";
  segflow::testing::write_file(dir / (name + ".yaml"), job.yaml());
  auto r = segflow::testing::run_segflow("train " + qs(dir / (name + ".yaml")) + " --fold all --quiet", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  std::string runs;
  for (const auto& e : fs::directory_iterator(dir / "runs"))
    if (e.path().filename().string().rfind(name + "-", 0) == 0) runs += " " + qs(e.path());
  auto cv = segflow::testing::run_segflow("cv" + runs + " --out " + qs(dir / ("cv-" + name)), dir);
  REQUIRE_MESSAGE(cv.exit_code == 0, cv.err);
  return dir / ("cv-" + name) / "cv_summary.json";
}

/// nibabel: per case the members' probability files summed (float32), argmax, written as
/// OUT/<case>.nii.gz with the first file's affine.
const char* kAverageProbabilities = R"(
import json, sys, os
import nibabel as nib, numpy as np
out = sys.argv[1]
summaries = [json.load(open(p)) for p in sys.argv[2:]]
os.makedirs(out, exist_ok=True)
for case in summaries[0]['cases']:
    cid = case['case']
    total, first = None, None
    for s in summaries:
        run = [c['run'] for c in s['cases'] if c['case'] == cid][0]
        img = nib.load(os.path.join(run, 'validation', cid + '_probabilities.nii.gz'))
        p = np.asarray(img.dataobj, dtype=np.float32)
        lab = nib.load(os.path.join(run, 'validation', cid + '.nii.gz'))
        assert p.shape[:3] == lab.shape[:3], (p.shape, lab.shape)
        assert abs(p.sum(axis=3) - 1).max() < 1e-4
        total = p if total is None else total + p
        if first is None:
            first = img
    nib.save(nib.Nifti1Image(np.argmax(total, axis=3).astype(np.uint8), first.affine),
             os.path.join(out, cid + '.nii.gz'))
)";

/// segflow eval's per-case mean Dice over the classes in either map (as cv counts them).
std::map<std::string, double> eval_case_means(const fs::path& pred, const fs::path& gt, const fs::path& dir) {
  auto ev = segflow::testing::run_segflow("eval --pred " + qs(pred) + " --gt " + qs(gt) + " --json", dir);
  REQUIRE_MESSAGE(ev.exit_code == 0, ev.err);
  std::map<std::string, double> out;
  const auto report = nlohmann::json::parse(ev.out);
  for (const auto& c : report["cases"]) {
    double sum = 0;
    int n = 0;
    for (const auto& [label, s] : c["classes"].items()) {
      if (s["volume_pred_ml"] == 0.0 && s["volume_gt_ml"] == 0.0) continue;
      sum += s["dice"].get<double>();
      ++n;
    }
    out[c["case"].get<std::string>()] = n ? sum / n : NAN;
  }
  return out;
}

TEST_CASE(
    "select ranks two configurations and their ensemble on the out-of-fold cases; the ensemble equals "
    "averaging the saved probabilities" *
    doctest::test_suite("serial")) {
  segflow::testing::TempDir tmp("select");
  const fs::path dir = tmp.path();
  const fs::path a = train_and_pool(
      dir, "sela", segflow::testing::unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1"), 2);
  const fs::path b = train_and_pool(
      dir, "selb", segflow::testing::unet3d(5, "channels: [8, 16], strides: [2], num_res_units: 0"), 1);
  const auto cv_a = read_select_json(a), cv_b = read_select_json(b);

  auto r =
      segflow::testing::run_segflow("select " + qs(a) + " " + qs(b) + " --out " + qs(dir / "sel.json"), dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(segflow::testing::contains(r.out, "winner: "));
  const auto sel = read_select_json(dir / "sel.json");
  CHECK(sel["metric"] == "dice");
  CHECK(sel["class"] == "mean");
  for (const auto& c : sel["configurations"]) CHECK(fs::path(c["summary"].get<std::string>()).is_absolute());
  REQUIRE(sel["cases"].size() == 4);
  REQUIRE(sel["ranking"].size() == 3);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : sel["ranking"]) rows[row["name"].get<std::string>()] = row;
  REQUIRE(rows.count("sela"));
  REQUIRE(rows.count("selb"));
  REQUIRE(rows.count("sela+selb"));
  // Single configurations: the cv summary's mean Dice and interval (the same resamples).
  for (const auto& [name, cv] : {std::pair{"sela", cv_a}, std::pair{"selb", cv_b}}) {
    CAPTURE(name);
    CHECK(rows[name]["mean"].get<double>() ==
          doctest::Approx(cv["mean"]["dice"]["mean"].get<double>()).epsilon(1e-12));
    CHECK(rows[name]["low"].get<double>() ==
          doctest::Approx(cv["mean"]["dice"]["low"].get<double>()).epsilon(1e-12));
    CHECK(rows[name]["high"].get<double>() ==
          doctest::Approx(cv["mean"]["dice"]["high"].get<double>()).epsilon(1e-12));
  }
  // Ranked best first, the winner is row 1 with its runs' checkpoints.
  for (std::size_t i = 1; i < 3; ++i)
    CHECK(sel["ranking"][i - 1]["mean"].get<double>() >= sel["ranking"][i]["mean"].get<double>());
  const auto& winner = sel["winner"];
  CHECK(winner["name"] == sel["ranking"][0]["name"]);
  CHECK(winner["runs"].size() == 2 * winner["members"].size());
  for (const auto& c : winner["checkpoints"]) CHECK(fs::exists(c.get<std::string>()));
  // The verdict follows from the figures.
  const auto &w = sel["ranking"][0], &u = sel["ranking"][1];
  const auto inside = [](const nlohmann::json& x, const nlohmann::json& i) {
    return x.get<double>() >= i["low"].get<double>() && x.get<double>() <= i["high"].get<double>();
  };
  const bool close = inside(w["mean"], u) || inside(u["mean"], w);
  CHECK(sel["distinguishable"] == !close);
  CHECK(segflow::testing::contains(
      r.out, close ? "not distinguishable at 95%" : "better than the runner-up at 95%"));

  // The ensemble: nibabel averages the probability files, segflow eval scores the argmax.
  segflow::testing::run_python(kAverageProbabilities, {(dir / "ens").string(), a.string(), b.string()});
  const auto mine = eval_case_means(dir / "ens", dir / "data", dir);
  REQUIRE(mine.size() == 4);
  double sum = 0;
  for (const auto& [id, v] : mine) {
    CAPTURE(id);
    CHECK(rows["sela+selb"]["values"][id].get<double>() == doctest::Approx(v).epsilon(1e-12));
    sum += v;
  }
  CHECK(rows["sela+selb"]["mean"].get<double>() == doctest::Approx(sum / 4).epsilon(1e-12));
  CHECK(rows["sela+selb"]["ensemble"] == true);

  // Another metric and one class: lower HD95 ranks first; class 1 rows are cv's class 1.
  auto hd =
      segflow::testing::run_segflow("select " + qs(a) + " " + qs(b) + " --metric hd95 --class 1 --json", dir);
  REQUIRE_MESSAGE(hd.exit_code == 0, hd.err);
  const auto h = nlohmann::json::parse(hd.out);
  CHECK(h["higher_is_better"] == false);
  CHECK(h["class"] == 1);
  for (std::size_t i = 1; i < h["ranking"].size(); ++i)
    if (h["ranking"][i]["mean"].is_number())
      CHECK(h["ranking"][i - 1]["mean"].get<double>() <= h["ranking"][i]["mean"].get<double>());
  for (const auto& row : h["ranking"])
    if (row["name"] == "sela" && cv_a["classes"].contains("1"))
      CHECK(row["mean"] == cv_a["classes"]["1"]["hd95"]["mean"]);

  // Refusals, naming what is wrong; no selection.json written.
  auto bad =
      segflow::testing::run_segflow("select " + qs(a) + " --metric iou --out " + qs(dir / "no.json"), dir);
  CHECK(bad.exit_code == 2);
  CHECK(segflow::testing::contains(bad.err, "--metric: expected dice, hd95 or nsd, got 'iou'"));
  auto fewer = cv_b;
  fewer["cases"].erase(fewer["cases"].begin());
  segflow::testing::write_file(dir / "fewer.json", fewer.dump());
  auto cases = segflow::testing::run_segflow(
      "select " + qs(a) + " " + qs(dir / "fewer.json") + " --out " + qs(dir / "no.json"), dir);
  CHECK(cases.exit_code != 0);
  CHECK(segflow::testing::contains(cases.err, "cover different out-of-fold cases"));
  CHECK(segflow::testing::contains(cases.err, a.string()));
  CHECK(segflow::testing::contains(cases.err, (dir / "fewer.json").string()));
  const fs::path run_b = cv_b["cases"][0]["run"].get<std::string>();
  const std::string id_b = cv_b["cases"][0]["case"];
  const fs::path prob = run_b / "validation" / (id_b + "_probabilities.nii.gz");
  REQUIRE(fs::exists(prob));
  fs::rename(prob, dir / "moved.nii.gz");
  auto missing =
      segflow::testing::run_segflow("select " + qs(a) + " " + qs(b) + " --out " + qs(dir / "no.json"), dir);
  CHECK(missing.exit_code != 0);
  CHECK(segflow::testing::contains(missing.err, b.string()));
  CHECK(segflow::testing::contains(missing.err, "validation.save_probabilities: true"));
  CHECK_FALSE(fs::exists(dir / "no.json"));
  // Single configurations need no probabilities.
  auto singles =
      segflow::testing::run_segflow("select " + qs(a) + " " + qs(b) + " --max-ensemble 1 --json", dir);
  REQUIRE_MESSAGE(singles.exit_code == 0, singles.err);
  const auto s1 = nlohmann::json::parse(singles.out);
  CHECK(s1["ranking"].size() == 2);
  CHECK(s1["configurations"][1]["probabilities"] == false);
}

}  // namespace select_test
