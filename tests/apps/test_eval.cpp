// `segflow eval`, run as a user runs it: numbers against MONAI 1.4 on label maps written by
// nibabel (tests/tools/monai_metrics.py), a prediction on another grid, folders matched by
// case id, DICOM SEG input, CSV output and bad input.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "test_util.hpp"

using namespace segflow::testing;
namespace fs = std::filesystem;

namespace {

nlohmann::json monai_metrics(const std::string& args) {
  auto r = run_command(shell_quote(python()) + " " +
                       shell_quote(source_path("tests/tools/monai_metrics.py").string()) + " " + args);
  REQUIRE_MESSAGE(r.exit_code == 0, "monai_metrics.py " << args << ": " << r.out);
  return nlohmann::json::parse(r.out);
}

void make_volumes(const fs::path& dir, int seed) {
  monai_metrics("make " + shell_quote(dir.string()) + " --seed " + std::to_string(seed) +
                " --shape 40,36,16 --spacing 0.9,1.2,2.5");
}

/// Checks one class object of `segflow eval --json` against MONAI's figures for it. NaN
/// and infinity are null in our JSON; MONAI prints NaN as null and infinity as "inf".
void check_class(const nlohmann::json& ours, const nlohmann::json& monai) {
  INFO("ours " << ours.dump() << "\nMONAI " << monai.dump());
  for (const char* k : {"dice", "iou", "hd95", "assd", "nsd", "volume_pred_ml", "volume_gt_ml"}) {
    REQUIRE_MESSAGE(ours.contains(k), k);
    const auto& m = monai[k];
    if (m.is_null() || m.is_string()) {
      CHECK_MESSAGE(ours[k].is_null(), k);
    } else {
      REQUIRE_MESSAGE(ours[k].is_number(), k);
      CHECK_MESSAGE(ours[k].get<double>() == doctest::Approx(m.get<double>()).epsilon(1e-5), k);
    }
  }
}

}  // namespace

TEST_CASE("segflow eval --json on a pair of files prints one object whose numbers match MONAI") {
  TempDir dir("eval_pair");
  make_volumes(dir.path(), 11);
  auto r = run_segflow("eval --pred " + shell_quote((dir.path() / "pred.nii.gz").string()) + " --gt " +
                           shell_quote((dir.path() / "gt.nii.gz").string()) + " --tolerance-mm 1.7 --json",
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto j = nlohmann::json::parse(r.out);  // exactly one object: parse() refuses trailing text
  REQUIRE(j["cases"].size() == 1);
  CHECK(j["cases"][0]["case"] == "gt");
  CHECK(j["cases"][0]["resampled"] == false);
  const auto& classes = j["cases"][0]["classes"];
  // Every value > 0 of either map: 1-3 in both, 4 predicted only, 5 in the ground truth only.
  CHECK(classes.size() == 5);
  const auto ref = monai_metrics("score " + shell_quote((dir.path() / "pred.nii.gz").string()) + " " +
                                 shell_quote((dir.path() / "gt.nii.gz").string()) +
                                 " --classes 1,2,3,4,5 --tolerance 1.7");
  for (const char* c : {"1", "2", "3", "4", "5"}) check_class(classes[c], ref["classes"][c]);
  CHECK(classes["4"]["dice"] == 0.0);
  CHECK(classes["4"]["volume_gt_ml"] == 0.0);
  CHECK(classes["5"]["volume_pred_ml"] == 0.0);
  // One case: the mean of a class is its value; classes 4 and 5 have no finite HD95.
  CHECK(j["mean"]["1"]["dice"].get<double>() == doctest::Approx(classes["1"]["dice"].get<double>()));
  CHECK(j["mean"]["1"]["cases"] == 1);
  CHECK(j["mean"]["4"]["missed"] == 1);
  CHECK(j["mean"]["4"]["hd95"].is_null());
  CHECK(r.err.find("label 4 is predicted but in no ground truth") != std::string::npos);
}

TEST_CASE("a prediction on another grid is mapped onto the ground truth's grid through patient coordinates") {
  TempDir dir("eval_moved");
  make_volumes(dir.path(), 12);
  const auto gt = shell_quote((dir.path() / "gt.nii.gz").string());
  auto same = run_segflow(
      "eval --pred " + shell_quote((dir.path() / "pred.nii.gz").string()) + " --gt " + gt + " --json",
      dir.path());
  // pred_moved.nii.gz: the same labels on a padded grid with another origin and y reversed.
  auto moved = run_segflow(
      "eval --pred " + shell_quote((dir.path() / "pred_moved.nii.gz").string()) + " --gt " + gt + " --json",
      dir.path());
  REQUIRE_MESSAGE(same.exit_code == 0, same.err);
  REQUIRE_MESSAGE(moved.exit_code == 0, moved.err);
  auto a = nlohmann::json::parse(same.out), b = nlohmann::json::parse(moved.out);
  CHECK(a["cases"][0]["resampled"] == false);
  CHECK(b["cases"][0]["resampled"] == true);
  CHECK(a["cases"][0]["classes"] == b["cases"][0]["classes"]);
  CHECK(a["cases"][0]["classes"]["1"]["dice"].get<double>() > 0.5);
}

TEST_CASE(
    "segflow eval matches folders by case id, reports unmatched cases and writes one CSV row per case and "
    "class") {
  TempDir dir("eval_folders");
  const auto gt = dir.path() / "gt", pred = dir.path() / "pred";
  fs::create_directories(gt / "labelsTr");
  fs::create_directories(pred);
  for (int i = 0; i < 3; ++i) make_volumes(dir.path() / ("v" + std::to_string(i)), 20 + i);
  fs::copy_file(dir.path() / "v0" / "gt.nii.gz", gt / "labelsTr" / "case_a.nii.gz");
  fs::copy_file(dir.path() / "v1" / "gt.nii.gz", gt / "labelsTr" / "case_b.nii.gz");
  fs::copy_file(dir.path() / "v2" / "gt.nii.gz", gt / "labelsTr" / "case_c.nii.gz");
  write_file(
      gt / "dataset.json",
      R"({"name": "t", "labels": {"background": 0, "liver": 1, "spleen": 2, "kidney": 3, "spine": 4, "lesion": 5}})");
  fs::copy_file(dir.path() / "v0" / "pred.nii.gz", pred / "case_a_0000.nii.gz");  // nnU-Net channel suffix
  fs::copy_file(dir.path() / "v1" / "pred_moved.nii.gz", pred / "case_b.nii.gz");
  fs::copy_file(dir.path() / "v2" / "pred.nii.gz", pred / "case_z.nii.gz");  // no ground truth
  const auto csv = dir.path() / "scores.csv";
  auto r = run_segflow("eval --pred " + shell_quote(pred.string()) + " --gt " + shell_quote(gt.string()) +
                           " --classes 1,2,3 --json --csv " + shell_quote(csv.string()),
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["cases"].size() == 2);
  CHECK(j["cases"][0]["case"] == "case_a");
  CHECK(j["cases"][1]["case"] == "case_b");
  CHECK(j["unmatched"]["predictions"] == nlohmann::json({"case_z"}));
  CHECK(j["unmatched"]["ground_truth"] == nlohmann::json({"case_c"}));
  CHECK(r.err.find("case_z has no ground truth") != std::string::npos);
  CHECK(r.err.find("case_c has no prediction") != std::string::npos);
  CHECK(j["cases"][0]["classes"].size() == 3);  // --classes
  CHECK(j["cases"][0]["classes"]["1"]["name"] == "liver");
  CHECK(j["mean"]["2"]["name"] == "spleen");
  CHECK(j["mean"]["1"]["cases"] == 2);
  // case_b's prediction was on another grid; its scores are MONAI's on the original pair.
  const auto ref = monai_metrics("score " + shell_quote((dir.path() / "v1" / "pred.nii.gz").string()) + " " +
                                 shell_quote((dir.path() / "v1" / "gt.nii.gz").string()) +
                                 " --classes 1,2,3 --tolerance 2");
  for (const char* c : {"1", "2", "3"}) check_class(j["cases"][1]["classes"][c], ref["classes"][c]);
  const double mean_dice = (j["cases"][0]["classes"]["1"]["dice"].get<double>() +
                            j["cases"][1]["classes"]["1"]["dice"].get<double>()) /
                           2;
  CHECK(j["mean"]["1"]["dice"].get<double>() == doctest::Approx(mean_dice));

  // The CSV: a header and one row per case and class with the JSON's numbers.
  std::istringstream in(read_file(csv));
  std::string line;
  std::getline(in, line);
  CHECK(line == "case,class,name,dice,iou,hd95,assd,nsd,volume_pred_ml,volume_gt_ml");
  int rows = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
    REQUIRE(f.size() == 10);
    const auto& cj = j["cases"][rows / 3]["classes"][f[1]];
    CHECK(f[0] == j["cases"][rows / 3]["case"].get<std::string>());
    CHECK(f[2] == cj["name"].get<std::string>());
    CHECK(std::stod(f[3]) == doctest::Approx(cj["dice"].get<double>()).epsilon(1e-8));
    CHECK(std::stod(f[5]) == doctest::Approx(cj["hd95"].get<double>()).epsilon(1e-8));
    ++rows;
  }
  CHECK(rows == 6);
}

TEST_CASE("segflow eval reads DICOM SEG files on their own grid and case folders on the series grid") {
  TempDir dir("eval_seg");
  auto s = run_segflow(
      "synth --cases 1 --size 24 --format dicom --seed 4 --out " + shell_quote(dir.path().string()),
      dir.path());
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  // The SEG alone spans the slices that have frames; the case folder is the series grid.
  auto r = run_segflow("eval --pred " + shell_quote((dir.path() / "case_000" / "seg.dcm").string()) +
                           " --gt " + shell_quote((dir.path() / "case_000").string()) + " --json",
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["cases"].size() == 1);
  CHECK(j["cases"][0]["case"] == "case_000");
  const auto& classes = j["cases"][0]["classes"];
  CHECK(classes.size() == 4);
  for (const char* c : {"1", "2", "3", "4"}) {
    CHECK(classes[c]["dice"] == 1.0);
    CHECK(classes[c]["hd95"] == 0.0);
    CHECK(classes[c]["nsd"] == 1.0);
    CHECK(classes[c]["volume_pred_ml"].get<double>() > 0.0);
  }
}

TEST_CASE(
    "bad input to segflow eval gives one clear error line: missing file, disjoint grids, not a label map") {
  TempDir dir("eval_bad");
  make_volumes(dir.path(), 13);
  const auto gt = (dir.path() / "gt.nii.gz").string();
  auto missing = run_segflow("eval --pred " + shell_quote((dir.path() / "nope.nii.gz").string()) + " --gt " +
                                 shell_quote(gt) + " --json",
                             dir.path());
  CHECK(missing.exit_code == 1);
  CHECK(missing.out.empty());
  CHECK(missing.err ==
        "segflow eval: " + (dir.path() / "nope.nii.gz").string() + ": no such file or folder\n");

  auto far = run_segflow(
      "eval --pred " + shell_quote((dir.path() / "pred_far.nii.gz").string()) + " --gt " + shell_quote(gt),
      dir.path());
  CHECK(far.exit_code != 0);
  CHECK(std::count(far.err.begin(), far.err.end(), '\n') == 1);
  CHECK(far.err.find("pred_far.nii.gz: the prediction's grid (size [40, 36, 16]") != std::string::npos);
  CHECK(far.err.find("does not overlap the ground truth's grid (" + gt + ": size [40, 36, 16]") !=
        std::string::npos);

  auto ct = run_segflow(
      "eval --pred " + shell_quote((dir.path() / "ct.nii.gz").string()) + " --gt " + shell_quote(gt),
      dir.path());
  CHECK(ct.exit_code != 0);
  CHECK(std::count(ct.err.begin(), ct.err.end(), '\n') == 1);
  CHECK(ct.err.find("ct.nii.gz: expected a label map (integer values), got float32 values with fractions") !=
        std::string::npos);

  auto usage = run_segflow("eval --gt " + shell_quote(gt), dir.path());
  CHECK(usage.exit_code == 2);
  CHECK(usage.err == "segflow eval: --pred: required\n");
  auto tol = run_segflow("eval --pred " + shell_quote(gt) + " --gt " + shell_quote(gt) + " --tolerance-mm -1",
                         dir.path());
  CHECK(tol.exit_code == 2);
  CHECK(tol.err.find("--tolerance-mm: expected a number >= 0 (mm), got '-1'") != std::string::npos);
  auto mixed =
      run_segflow("eval --pred " + shell_quote(dir.path().string()) + " --gt " + shell_quote(gt), dir.path());
  CHECK(mixed.exit_code == 2);
  CHECK(mixed.err.find("expected two files or two folders") != std::string::npos);
}
