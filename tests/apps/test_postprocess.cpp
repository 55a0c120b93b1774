// segflow postprocess: determined on 3 tiny folds' out-of-fold predictions, its figures
// equal segflow eval's on the label maps `postprocess apply` writes; apply on a crafted map
// removes what each step says; segflow infer applies a plan given with --postprocess or
// found beside the checkpoint; a bad plan is refused naming the file and field.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "job_yaml.hpp"
#include "models/evidence/postprocessing.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace pp_test {

std::string qp(const fs::path& p) { return segflow::testing::shell_quote(p.string()); }

nlohmann::json read_pp(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), p.string());
  return nlohmann::json::parse(in);
}

/// Trains 3 folds of 6 synthetic cases; the run folders, by fold.
std::vector<fs::path> train_pp_folds(const fs::path& dir) {
  segflow::testing::JobYaml job;
  job.name = "ppjob";
  job.root = dir / "data";
  job.synth = "{cases: 6, size: 24, format: nifti, seed: 4}";
  job.val_cases = "";
  job.folds = "3";
  job.epochs = 3;
  job.runs_dir = dir / "runs";
  segflow::testing::write_file(dir / "pp.yaml", job.yaml());
  auto r = segflow::testing::run_segflow("train " + qp(dir / "pp.yaml") + " --fold all --quiet", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(dir / "runs")) runs.push_back(e.path());
  std::sort(runs.begin(), runs.end());
  return runs;
}

/// segflow eval's mean over `classes` of the per-class mean Dice of PRED against the dataset.
double eval_mean_dice(const fs::path& pred, const fs::path& data, const nlohmann::json& classes) {
  std::string list;
  for (const auto& c : classes) list += (list.empty() ? "" : ",") + std::to_string(c.get<int>());
  auto ev = segflow::testing::run_segflow(
      "eval --pred " + qp(pred) + " --gt " + qp(data) + " --json --classes " + list, pred.parent_path());
  REQUIRE_MESSAGE(ev.exit_code == 0, ev.err);
  const auto e = nlohmann::json::parse(ev.out);
  double sum = 0;
  int n = 0;
  for (const auto& [label, m] : e["mean"].items())
    if (m["dice"].is_number()) sum += m["dice"].get<double>(), ++n;
  REQUIRE(n > 0);
  return sum / n;
}

}  // namespace pp_test

using namespace pp_test;

TEST_CASE("postprocess determine's figures equal segflow eval on the applied maps; infer applies the plan" *
          doctest::test_suite("serial")) {
  segflow::testing::TempDir dir("pp_folds");
  const auto runs = train_pp_folds(dir.path());
  REQUIRE(runs.size() == 3);
  const fs::path plan_file = dir.path() / "postprocessing.json";
  auto d = segflow::testing::run_segflow("postprocess determine " + qp(runs[0]) + " " + qp(runs[1]) + " " +
                                             qp(runs[2]) + " --out " + qp(plan_file),
                                         dir.path());
  REQUIRE_MESSAGE(d.exit_code == 0, d.err);
  CHECK(segflow::testing::contains(d.err, "keep_largest foreground: dice"));
  const auto plan = read_pp(plan_file);
  CHECK(plan["cases"] == 6);
  CHECK(plan["metric"] == "dice");
  const auto& steps = plan["steps"];
  const std::size_t nc = plan["classes"].size();
  REQUIRE(nc >= 2);
  REQUIRE(steps.size() == 1 + 2 * nc);  // foreground, then per class largest, then per class small
  CHECK(steps[0]["class"] == "foreground");
  CHECK(steps[nc + 1]["kind"] == "remove_small");
  CHECK(steps[nc + 1]["tried"].size() == 5);
  // Each step starts from where the kept ones left the metric; kept only when it rose.
  double current = plan["before"].get<double>();
  for (const auto& s : steps) {
    CAPTURE(s.dump());
    CHECK(s["before"].get<double>() == doctest::Approx(current).epsilon(1e-12));
    CHECK(s["kept"].get<bool>() == (s["after"].get<double>() > s["before"].get<double>()));
    if (s["kept"].get<bool>()) current = s["after"].get<double>();
  }
  CHECK(plan["after"].get<double>() == doctest::Approx(current).epsilon(1e-12));
  CHECK(plan["dice_after"].get<double>() >= plan["dice_before"].get<double>());

  // The figures are segflow eval's: on the predictions as written, and as applied.
  const fs::path oof = dir.path() / "oof", applied = dir.path() / "applied";
  fs::create_directories(oof);
  for (const auto& run : runs)
    for (const auto& e : fs::directory_iterator(run / "validation"))
      if (e.path().extension() == ".gz") fs::copy_file(e.path(), oof / e.path().filename());
  auto ap = segflow::testing::run_segflow(
      "postprocess apply --plan " + qp(plan_file) + " --input " + qp(oof) + " --output " + qp(applied),
      dir.path());
  REQUIRE_MESSAGE(ap.exit_code == 0, ap.err);
  CHECK(nlohmann::json::parse(ap.out)["written"].size() == 6);
  const fs::path data = dir.path() / "data";
  CHECK(eval_mean_dice(oof, data, plan["classes"]) ==
        doctest::Approx(plan["dice_before"].get<double>()).epsilon(1e-9));
  CHECK(eval_mean_dice(applied, data, plan["classes"]) ==
        doctest::Approx(plan["dice_after"].get<double>()).epsilon(1e-9));

  // segflow infer --postprocess equals infer, then apply; the plan beside the checkpoint is
  // applied without the flag (and --postprocess none turns it off).
  fs::path img;
  for (const auto& e : fs::directory_iterator(data / "imagesTr"))
    img = std::min(img.empty() ? e.path() : img, e.path());
  auto infer = [&](const std::string& extra, const std::string& out) {
    auto r = segflow::testing::run_segflow("infer --checkpoint " + qp(runs[0] / "last.pt") + " --input " +
                                               qp(img) + " --output " + qp(dir.path() / out) +
                                               " --device cpu --quiet " + extra,
                                           dir.path());
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    REQUIRE_OK_AND_ASSIGN(auto i, segflow::pipeline::read_image(dir.path() / out));
    return std::make_pair(i.voxels.to(torch::kLong), r.err);
  };
  const auto plain = infer("", "plain.nii.gz").first;
  const auto with = infer("--postprocess " + qp(plan_file), "with.nii.gz").first;
  REQUIRE_OK_AND_ASSIGN(auto pp, segflow::models::read_postprocessing(plan_file));
  REQUIRE_OK_AND_ASSIGN(auto expect, segflow::models::apply_postprocessing(plain, pp));
  CHECK(torch::equal(with, expect));
  fs::copy_file(plan_file, runs[0] / "postprocessing.json");
  const auto [beside, note] = infer("", "beside.nii.gz");
  CHECK(torch::equal(beside, expect));
  CHECK(segflow::testing::contains(note, "postprocessing.json"));
  CHECK(torch::equal(infer("--postprocess none", "none.nii.gz").first, plain));
}

TEST_CASE("postprocess apply removes what each kept step says, and refuses a bad plan naming the field") {
  segflow::testing::TempDir dir("pp_apply");
  // Class 1: a 3x3x3 block and a lone voxel; class 2: a 2x2x2 block touching nothing.
  at::Tensor v = torch::zeros({1, 8, 8, 8}, torch::kShort);
  v.index_put_({0, torch::indexing::Slice(0, 3), torch::indexing::Slice(0, 3), torch::indexing::Slice(0, 3)},
               1);
  v.index_put_({0, 7, 7, 7}, 1);
  v.index_put_({0, torch::indexing::Slice(5, 7), torch::indexing::Slice(0, 2), torch::indexing::Slice(5, 7)},
               2);
  segflow::pipeline::Image img;
  img.voxels = v;
  REQUIRE_OK(segflow::pipeline::write_nifti(dir / "in.nii.gz", img));
  auto run = [&](const std::string& steps) {
    segflow::testing::write_file(dir / "plan.json", R"({"metric": "dice", "steps": )" + steps + "}");
    return segflow::testing::run_segflow("postprocess apply --plan " + qp(dir / "plan.json") + " --input " +
                                             qp(dir / "in.nii.gz") + " --output " + qp(dir / "out.nii.gz"),
                                         dir.path());
  };
  auto read_out = [&] {
    auto r = segflow::pipeline::read_image(dir / "out.nii.gz");
    REQUIRE(r.is_ok());
    CHECK((r->voxels.scalar_type() == torch::kShort));
    return r->voxels;
  };
  // Largest of all foreground: the 27-voxel block only.
  REQUIRE(run(R"([{"kind": "keep_largest", "class": "foreground", "kept": true}])").exit_code == 0);
  CHECK(torch::equal(read_out(), torch::where(v.eq(2), torch::zeros_like(v), v).index_put_({0, 7, 7, 7}, 0)));
  // Class 1's largest: class 2 stays; a step not kept does nothing.
  REQUIRE(run(R"([{"kind": "keep_largest", "class": 1, "kept": true},
                  {"kind": "keep_largest", "class": "foreground", "kept": false}])")
              .exit_code == 0);
  CHECK(torch::equal(read_out(), v.clone().index_put_({0, 7, 7, 7}, 0)));
  // Components of class 2 under 9 voxels go; class 1's lone voxel stays.
  REQUIRE(run(R"([{"kind": "remove_small", "class": 2, "min_voxels": 9, "kept": true}])").exit_code == 0);
  CHECK(torch::equal(read_out(), torch::where(v.eq(2), torch::zeros_like(v), v)));

  auto bad = run(R"([{"kind": "grow", "class": 1, "kept": true}])");
  CHECK(bad.exit_code != 0);
  CHECK(segflow::testing::contains(
      bad.err, "plan.json: steps[0].kind: expected keep_largest or remove_small, got 'grow'"));
  auto no_n = run(R"([{"kind": "remove_small", "class": 1, "kept": true}])");
  CHECK(segflow::testing::contains(no_n.err, "steps[0].min_voxels: expected an integer >= 0, got null"));
  auto cls = run(R"([{"kind": "keep_largest", "class": 0, "kept": true}])");
  CHECK(segflow::testing::contains(cls.err, "steps[0].class: expected \"foreground\" or a label > 0, got 0"));
  auto usage = segflow::testing::run_segflow("postprocess frob", dir.path());
  CHECK(usage.exit_code == 2);
  CHECK(segflow::testing::contains(usage.err, "expected determine or apply, got 'frob'"));
  auto no_runs = segflow::testing::run_segflow("postprocess determine " + qp(dir / "nowhere"), dir.path());
  CHECK(no_runs.exit_code != 0);
  CHECK(segflow::testing::contains(no_runs.err, "no out-of-fold predictions"));
}
