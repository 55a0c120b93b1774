// segflow package and infer --model, the chain of issue 30 on tiny data: 3 folds trained,
// segflow cv, postprocess determine, package (from the cv summary, from segflow select's
// file, from the runs); infer --model equals infer with the members' checkpoints and
// --postprocess voxel for voxel (with the determined plan and with a plan that removes
// voxels); the manifest's sha256s equal Python hashlib's; a tampered checkpoint,
// a member with other classes, a missing checkpoint, a plan of other classes and an
// existing output folder are refused naming what is wrong, leaving nothing behind.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "job_yaml.hpp"
#include "models/evidence/postprocessing.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace pkg_test {

using segflow::testing::contains;
using segflow::testing::run_segflow;

std::string qk(const fs::path& p) { return segflow::testing::shell_quote(p.string()); }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), p.string());
  return nlohmann::json::parse(in);
}

/// Trains `fold` ("all" or a number) of a 3-fold job on 6 synthetic cases under DIR/data;
/// `stages_extra`: a stage after load (map_labels), `classes`: its class count.
std::vector<fs::path> train_folds(const fs::path& dir, const std::string& name, const std::string& fold,
                                  int epochs, const std::string& stage_extra = "", int classes = 5) {
  segflow::testing::JobYaml job;
  job.name = name;
  job.root = dir / "data";
  job.synth = "{cases: 6, size: 24, format: nifti, seed: 4}";
  job.val_cases = "";
  job.folds = "3";
  job.epochs = epochs;
  job.train =
      "batch_size: 2, device: cpu, val_interval: 6, checkpoint_interval: 1, loader: simple, threads: 1";
  job.num_classes = std::to_string(classes);
  job.model = segflow::testing::unet3d(
      classes, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch, dropout: 0.1");
  if (!stage_extra.empty()) job.stages.insert(job.stages.begin() + 1, stage_extra);
  job.runs_dir = dir / ("runs-" + name);
  segflow::testing::write_file(dir / (name + ".yaml"), job.yaml());
  auto r = run_segflow("train " + qk(dir / (name + ".yaml")) + " --fold " + fold + " --quiet", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(job.runs_dir)) runs.push_back(e.path());
  std::sort(runs.begin(), runs.end());
  return runs;
}

at::Tensor labels_of(const fs::path& file) {
  auto img = segflow::pipeline::read_image(file);
  REQUIRE_MESSAGE(img.is_ok(), file.string());
  return img->voxels.to(torch::kLong);
}

/// `segflow infer ARGS --input DATA/imagesTr --output DIR/OUT`; the label maps by file name.
std::map<std::string, at::Tensor> infer_all(const fs::path& dir, const std::string& args,
                                            const std::string& out) {
  auto r = run_segflow("infer " + args + " --input " + qk(dir / "data" / "imagesTr") + " --output " +
                           qk(dir / out) + " --device cpu --quiet",
                       dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  std::map<std::string, at::Tensor> maps;
  for (const auto& e : fs::directory_iterator(dir / out))
    maps[e.path().filename().string()] = labels_of(e.path());
  REQUIRE(maps.size() == 6);
  return maps;
}

/// model.json: the members (one per fold), the classes, the cv figures it was packed from,
/// and every file's sha256 as Python's hashlib computes it.
void check_manifest(const fs::path& model, const nlohmann::json& cv, std::size_t members) {
  const auto m = read_json(model / "model.json");
  CHECK(m["format"] == "segflow-model-1");
  REQUIRE(m["members"].size() == members);
  for (std::size_t i = 0; i < members; ++i) CHECK(m["members"][i]["fold"] == static_cast<int>(i));
  REQUIRE(m["classes"].size() == 5);
  CHECK(m["classes"][1]["name"] == cv["classes"]["1"]["name"]);
  CHECK(m["tta"] == "none");
  CHECK(m["checkpoint"] == "last");
  REQUIRE(m["cv"].size() == 1);
  CHECK(m["cv"][0]["mean"]["dice"] == cv["mean"]["dice"]);
  CHECK(m["postprocessing"] == "postprocessing.json");
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(model))
    if (e.is_regular_file() && e.path().filename() != "model.json") {
      const std::string rel = e.path().lexically_relative(model).string();
      REQUIRE_MESSAGE(m["files"].contains(rel), rel);
      const std::string py = segflow::testing::run_python(
          "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
          {e.path().string()});
      CHECK(m["files"][rel].get<std::string>() + "\n" == py);
      ++files;
    }
  CHECK(files == m["files"].size());
  CHECK(files == 2 * members + 1);  // checkpoint and config per member, the plan
}

/// segflow select's file (one configuration here) packs the same members as the cv summary
/// did (DIR/model), with select's verdict and the summary's figures.
void check_selection_package(const fs::path& dir) {
  auto sel = run_segflow(
      "select " + qk(dir / "cv" / "cv_summary.json") + " --out " + qk(dir / "selection.json"), dir);
  REQUIRE_MESSAGE(sel.exit_code == 0, sel.err);
  auto pk_sel = run_segflow(
      "package --selection " + qk(dir / "selection.json") + " --out " + qk(dir / "model_sel"), dir);
  REQUIRE_MESSAGE(pk_sel.exit_code == 0, pk_sel.err);
  const auto ms = read_json(dir / "model_sel" / "model.json");
  const auto mc = read_json(dir / "model" / "model.json");
  REQUIRE(ms["members"].size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(ms["members"][i]["source"] == mc["members"][i]["source"]);
  CHECK(ms["selection"]["winner"]["name"] == read_json(dir / "selection.json")["winner"]["name"]);
  REQUIRE(ms["cv"].size() == 1);
  CHECK(ms["cv"][0]["mean"]["dice"] == mc["cv"][0]["mean"]["dice"]);
}

}  // namespace pkg_test

using namespace pkg_test;

TEST_CASE(
    "segflow package: cv, postprocessing and folds into one folder that infer --model runs as the ensemble" *
    doctest::test_suite("serial")) {
  segflow::testing::TempDir tmp("pkg_chain");
  const fs::path dir = tmp.path();
  const auto runs = train_folds(dir, "pkg", "all", 12);
  REQUIRE(runs.size() == 3);
  std::string run_args, ckpt_args;
  for (const auto& r : runs) run_args += " " + qk(r), ckpt_args += " --checkpoint " + qk(r / "last.pt");
  auto cv = run_segflow("cv" + run_args + " --out " + qk(dir / "cv"), dir);
  REQUIRE_MESSAGE(cv.exit_code == 0, cv.err);
  const fs::path plan = dir / "postprocessing.json";
  auto pp = run_segflow("postprocess determine" + run_args + " --out " + qk(plan), dir);
  REQUIRE_MESSAGE(pp.exit_code == 0, pp.err);
  auto pk = run_segflow("package --out " + qk(dir / "model") + " --cv " + qk(dir / "cv" / "cv_summary.json") +
                            " --postprocessing " + qk(plan),
                        dir);
  REQUIRE_MESSAGE(pk.exit_code == 0, pk.err);
  CHECK(contains(pk.out, "members: 3 (last.pt)"));
  check_manifest(dir / "model", read_json(dir / "cv" / "cv_summary.json"), 3);
  check_selection_package(dir);

  // infer --model equals the members' ensemble with the plan, case by case.
  const auto packaged = infer_all(dir, "--model " + qk(dir / "model"), "by_model");
  const auto reference = infer_all(dir, ckpt_args + " --postprocess " + qk(plan), "by_checkpoints");
  for (const auto& [name, labels] : packaged) CHECK_MESSAGE(torch::equal(labels, reference.at(name)), name);

  // A plan that removes voxels (largest component of all foreground, and of class 1): the
  // package applies it, --no-postprocess does not.
  segflow::testing::write_file(dir / "largest.json", R"({"metric": "dice", "classes": [1, 2, 3, 4], "steps": [
      {"kind": "keep_largest", "class": "foreground", "kept": true},
      {"kind": "keep_largest", "class": 1, "kept": true}]})");
  auto pk2 = run_segflow(
      "package" + run_args + " --out " + qk(dir / "model2") + " --postprocessing " + qk(dir / "largest.json"),
      dir);
  REQUIRE_MESSAGE(pk2.exit_code == 0, pk2.err);
  const auto with = infer_all(dir, "--model " + qk(dir / "model2"), "with");
  const auto without = infer_all(dir, "--model " + qk(dir / "model2") + " --no-postprocess", "without");
  const auto plain = infer_all(dir, ckpt_args + " --postprocess none", "plain");
  REQUIRE_OK_AND_ASSIGN(auto largest, segflow::models::read_postprocessing(dir / "largest.json"));
  std::int64_t foreground = 0, removed = 0;
  for (const auto& [name, labels] : plain) {
    REQUIRE_OK_AND_ASSIGN(auto expect, segflow::models::apply_postprocessing(labels, largest));
    CHECK_MESSAGE(torch::equal(with.at(name), expect), name);
    CHECK_MESSAGE(torch::equal(without.at(name), labels), name);
    foreground += labels.gt(0).sum().item<std::int64_t>();
    removed += labels.ne(expect).sum().item<std::int64_t>();
  }
  CHECK(foreground > 0);  // the folds predict something: the comparisons are not of empty maps
  MESSAGE("foreground voxels ", foreground, ", removed by the plan ", removed);

  // Package from the runs alone: the cv figures are computed, the same as segflow cv's.
  const auto m2 = read_json(dir / "model2" / "model.json");
  REQUIRE(m2["cv"].size() == 1);
  CHECK(m2["cv"][0]["mean"]["dice"]["mean"] ==
        read_json(dir / "cv" / "cv_summary.json")["mean"]["dice"]["mean"]);
}

TEST_CASE(
    "segflow package and infer --model refuse tampered files, mismatched members and plans of other classes" *
    doctest::test_suite("serial")) {
  segflow::testing::TempDir tmp("pkg_refuse");
  const fs::path dir = tmp.path();
  const auto runs = train_folds(dir, "five", "all", 1);
  const auto three =
      train_folds(dir, "three", "0", 1, segflow::testing::stage("map_labels", "{keep: [1, 2]}"), 3);
  REQUIRE(runs.size() == 3);
  REQUIRE(three.size() == 1);
  auto package = [&](const std::string& args, const std::string& out) {
    return run_segflow("package " + args + " --out " + qk(dir / out), dir);
  };
  // Members of other classes: the run and the field are named; nothing is written.
  auto r = package(qk(runs[0]) + " " + qk(three[0]), "mixed");
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(contains(r.err, three[0].string() + ": cannot be packaged with " + runs[0].string() +
                                    ": classes: 3 (labels 0..2), expected 5"),
                r.err);
  // A plan of other classes.
  segflow::testing::write_file(dir / "other.json", R"({"metric": "dice", "classes": [1, 7], "steps": [
      {"kind": "keep_largest", "class": 7, "kept": true}]})");
  r = package(qk(runs[0]) + " --postprocessing " + qk(dir / "other.json"), "other");
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(contains(r.err, "other.json: classes[1]: class 7 is not a class of the model (labels 1..4)"),
                r.err);
  // A missing checkpoint.
  fs::rename(runs[2] / "last.pt", dir / "moved.pt");
  r = package(qk(runs[0]) + " " + qk(runs[2]), "missing");
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(contains(r.err, (runs[2] / "last.pt").string() + ": no such checkpoint"), r.err);
  fs::rename(dir / "moved.pt", runs[2] / "last.pt");
  for (const char* out : {"mixed", "other", "missing"}) CHECK_MESSAGE(!fs::exists(dir / out), out);
  for (const auto& e : fs::directory_iterator(dir))
    CHECK_MESSAGE(!contains(e.path().string(), ".partial"), e.path().string());

  // A good package; an existing folder is not overwritten.
  REQUIRE(package(qk(runs[0]) + " " + qk(runs[1]), "model").exit_code == 0);
  r = package(qk(runs[2]), "model");
  CHECK(r.exit_code != 0);
  CHECK(contains(r.err, "already exists"));
  CHECK(read_json(dir / "model" / "model.json")["members"].size() == 2);

  // One changed byte in a member's checkpoint: infer --model names the file and writes nothing.
  fs::copy(dir / "model", dir / "tampered", fs::copy_options::recursive);
  const auto m = read_json(dir / "model" / "model.json");
  const fs::path victim = dir / "tampered" / m["members"][1]["checkpoint"].get<std::string>();
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    f.put('\x5a');
  }
  fs::path img;
  for (const auto& e : fs::directory_iterator(dir / "data" / "imagesTr"))
    img = std::min(img.empty() ? e.path() : img, e.path());
  auto inf = run_segflow("infer --model " + qk(dir / "tampered") + " --input " + qk(img) + " --output " +
                             qk(dir / "t.nii.gz") + " --device cpu",
                         dir);
  CHECK(inf.exit_code != 0);
  CHECK_MESSAGE(contains(inf.err, victim.string() + ": sha256"), inf.err);
  CHECK(contains(inf.err, "differs from model.json's"));
  CHECK(!fs::exists(dir / "t.nii.gz"));
  inf = run_segflow("infer --model " + qk(dir / "model") + " --checkpoint " + qk(runs[0] / "last.pt") +
                        " --input " + qk(img) + " --output " + qk(dir / "t.nii.gz"),
                    dir);
  CHECK(inf.exit_code == 2);
  CHECK(contains(inf.err, "--checkpoint: not with --model"));
  inf = run_segflow("infer --model " + qk(dir / "nowhere") + " --input " + qk(img) + " --output " +
                        qk(dir / "t.nii.gz") + " --device cpu",
                    dir);
  CHECK(inf.exit_code != 0);
  CHECK(contains(inf.err, "nowhere: --model: no such model folder"));
}
