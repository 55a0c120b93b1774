// segflow plan against nnU-Net v2's own planner (tests/tools/nnunet_plan.py runs nnunetv2's
// DatasetFingerprintExtractor and ExperimentPlanner on the same files): an isotropic and a
// strongly anisotropic synthetic set and TotalSegmentator's real CT; then what the plan
// folder holds, the measured memory model, bad datasets, and `segflow train DATASET`.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <string>

#include "models/training/job_config.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/stage_registry.hpp"
#include "test_util.hpp"

using namespace segflow;
namespace fs = std::filesystem;
namespace st = segflow::testing;

namespace {

nlohmann::json plan_read_json(const fs::path& p) { return nlohmann::json::parse(st::read_file(p)); }

/// segflow plan DATASET --out OUT with `flags`; its plans.json.
nlohmann::json segflow_plan(const fs::path& dataset, const fs::path& out, const std::string& flags) {
  const auto r =
      st::run_segflow("plan " + st::shell_quote(dataset) + " --out " + st::shell_quote(out) + " " + flags);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return plan_read_json(out / "plans.json");
}

/// nnU-Net's own fingerprint and plans of `dataset` ({"fingerprint", "plans"}).
nlohmann::json nnunet_plan(const fs::path& dataset, const fs::path& scratch, const std::string& flags = "") {
  const fs::path out = scratch / "nnunet.json";
  const auto r = st::run_command(
      st::shell_quote(st::python()) + " " + st::shell_quote(st::source_path("tests/tools/nnunet_plan.py")) +
      " " + st::shell_quote(dataset) + " " + st::shell_quote(out) + " " + flags + " 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return plan_read_json(out);
}

void check_close(const nlohmann::json& a, const nlohmann::json& b, double rel, const std::string& what) {
  INFO(what << ": segflow " << a.dump() << " nnU-Net " << b.dump());
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i].get<double>(), y = b[i].get<double>();
    CHECK(std::abs(x - y) <= rel * std::max(std::abs(y), 1e-9));
  }
}

/// The comparison of issue 29 item 6: target spacing (1e-3 relative), normalisation schemes,
/// CT foreground statistics (1%), and, planned with --memory-model nnunet, the same patch,
/// pooling, kernels (and batch) for 3d_fullres and 2d, and the same set of configurations.
void compare_with_nnunet(const nlohmann::json& ours, const nlohmann::json& ref) {
  const auto& np = ref["plans"];
  CHECK(ours["transpose_forward"] == np["transpose_forward"]);
  const auto& oc = ours["configurations"];
  const auto& nc = np["configurations"];
  for (const char* name : {"2d", "3d_fullres", "3d_lowres"}) {
    INFO(name);
    CHECK(oc.contains(name) == nc.contains(name));
    if (!oc.contains(name) || !nc.contains(name)) continue;
    const auto& a = oc[name];
    const auto& b = nc[name];
    check_close(a["spacing"], b["spacing"], 1e-3, std::string(name) + " spacing");
    CHECK(a["normalization_schemes"] == b["normalization_schemes"]);
    CHECK(a["use_mask_for_norm"] == b["use_mask_for_norm"]);
    CHECK(a["patch_size"] == b["patch_size"]);
    CHECK(a["architecture"]["arch_kwargs"]["strides"] == b["architecture"]["arch_kwargs"]["strides"]);
    CHECK(a["architecture"]["arch_kwargs"]["kernel_sizes"] ==
          b["architecture"]["arch_kwargs"]["kernel_sizes"]);
    // The network: PlainConvUNet, or ResidualEncoderUNet with its blocks per stage.
    CHECK(a["architecture"]["network_class_name"] == b["architecture"]["network_class_name"]);
    for (const char* k :
         {"features_per_stage", "n_conv_per_stage", "n_blocks_per_stage", "n_conv_per_stage_decoder"}) {
      INFO(k);
      CHECK(a["architecture"]["arch_kwargs"].contains(k) == b["architecture"]["arch_kwargs"].contains(k));
      if (b["architecture"]["arch_kwargs"].contains(k))
        CHECK(a["architecture"]["arch_kwargs"][k] == b["architecture"]["arch_kwargs"][k]);
    }
    CHECK(a["batch_size"] == b["batch_size"]);
    CHECK(a["batch_dice"] == b["batch_dice"]);
    check_close(a["median_image_size_in_voxels"], b["median_image_size_in_voxels"], 1e-9,
                std::string(name) + " median");
    // The memory estimate itself: the feature-map voxels of the planned network and patch, as
    // nnU-Net's planner computes them (static_estimate_VRAM_usage).
    if (a["segflow"]["memory_model"] == "nnunet" && ref["estimates"].contains(name))
      check_close(nlohmann::json::array({a["segflow"]["vram_estimate"]}),
                  nlohmann::json::array({ref["estimates"][name]}), 1e-9, std::string(name) + " estimate");
  }
  const auto& fa = ours["foreground_intensity_properties_per_channel"]["0"];
  const auto& fb = ref["fingerprint"]["foreground_intensity_properties_per_channel"]["0"];
  for (const char* k : {"percentile_00_5", "percentile_99_5", "mean", "std", "median", "min", "max"}) {
    INFO(k << ": segflow " << fa[k] << " nnU-Net " << fb[k]);
    CHECK(std::abs(fa[k].get<double>() - fb[k].get<double>()) <= 0.01 * std::abs(fb[k].get<double>()));
  }
}

fs::path synth(const fs::path& out, const std::string& flags) {
  const auto r = st::run_segflow("synth --out " + st::shell_quote(out) + " " + flags);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return out;
}

/// TotalSegmentator's real CT as an nnU-Net raw dataset: the small NIfTI volume with its
/// 117-class map, and the Siemens DICOM series with its label (stored with a flipped row
/// axis; load_case puts it on the series grid), written as NIfTI by segflow.
fs::path real_ct_dataset(const fs::path& root) {
  const fs::path ts = st::testdata_path("totalsegmentator");
  fs::create_directories(root / "imagesTr");
  fs::create_directories(root / "labelsTr");
  fs::copy_file(ts / "example_ct_sm.nii.gz", root / "imagesTr" / "ts_000_0000.nii.gz");
  fs::copy_file(ts / "example_seg.nii.gz", root / "labelsTr" / "ts_000.nii.gz");
  pipeline::CaseEntry e{"ts_001", {ts / "example_ct_dicom"}, ts / "example_seg_dicom.nii.gz"};
  REQUIRE_OK_AND_ASSIGN(auto lc, pipeline::load_case(e));
  pipeline::Image img = lc.image;
  img.voxels = img.voxels.to(torch::kInt16);
  REQUIRE_OK(pipeline::write_nifti(root / "imagesTr" / "ts_001_0000.nii.gz", img));
  REQUIRE_OK(pipeline::write_nifti(root / "labelsTr" / "ts_001.nii.gz", *lc.label));
  nlohmann::json labels = {{"background", 0}};
  for (int v = 1; v <= 117; ++v) labels["class_" + std::to_string(v)] = v;
  const nlohmann::json dj = {
      {"channel_names", {{"0", "CT"}}}, {"labels", labels}, {"numTraining", 2}, {"file_ending", ".nii.gz"}};
  st::write_file(root / "dataset.json", dj.dump(2));
  return root;
}

}  // namespace

TEST_CASE(
    "segflow plan --memory-model nnunet plans an isotropic synthetic set as nnU-Net's own planner does") {
  st::TempDir dir("plan_iso");
  const fs::path ds = synth(dir / "ds", "--cases 6 --size 32 --spacing 1,1,1 --seed 4");
  const auto ours = segflow_plan(ds, dir / "plan", "--memory-model nnunet --device cpu");
  compare_with_nnunet(ours, nnunet_plan(ds, dir.path()));
  CHECK(ours["configurations"]["3d_fullres"]["spacing"] == nlohmann::json({1.0, 1.0, 1.0}));
}

TEST_CASE("segflow plan --memory-model nnunet plans a 0.7 x 0.7 x 5 mm set as nnU-Net's own planner does") {
  st::TempDir dir("plan_aniso");
  const fs::path ds =
      synth(dir / "ds", "--cases 8 --size 64 --spacing 0.7,0.7,5 --spacing-jitter 0.3 --seed 5");
  const auto ours = segflow_plan(ds, dir / "plan", "--memory-model nnunet --device cpu");
  compare_with_nnunet(ours, nnunet_plan(ds, dir.path()));
  // The anisotropy rule decided: z is the 10th percentile of the slice spacings, not their
  // median; pooling starts in-plane with 1 x 3 x 3 kernels.
  const auto fp = plan_read_json(dir / "plan" / "fingerprint.json");
  std::vector<double> z;
  for (const auto& s : fp["spacings"]) z.push_back(s[0].get<double>());
  std::sort(z.begin(), z.end());
  const auto& full = ours["configurations"]["3d_fullres"];
  CHECK(full["spacing"][0].get<double>() < 0.5 * (z[3] + z[4]) - 1e-6);
  CHECK(full["architecture"]["arch_kwargs"]["strides"][1] == nlohmann::json({1, 2, 2}));
  CHECK(full["architecture"]["arch_kwargs"]["kernel_sizes"][0] == nlohmann::json({1, 3, 3}));
  // segflow's YAML has them in (x, y, z) order.
  const std::string yaml = st::read_file(dir / "plan" / "3d_fullres.yaml");
  CHECK(st::contains(yaml, "strides: [[1, 1, 1], [2, 2, 1], [2, 2, 1]"));
  CHECK(st::contains(yaml, "kernel_sizes: [[3, 3, 1]"));
}

TEST_CASE(
    "segflow plan --memory-model nnunet finds nnU-Net's 3d_lowres spacing and patch for a 0.5 GB target") {
  st::TempDir dir("plan_lowres");
  const fs::path ds = synth(dir / "ds", "--cases 2 --size 112 --spacing 1,1,1 --seed 12");
  const auto ours = segflow_plan(ds, dir / "plan", "--memory-model nnunet --device cpu --memory-gb 0.5");
  REQUIRE(ours["configurations"].contains("3d_lowres"));
  compare_with_nnunet(ours, nnunet_plan(ds, dir.path(), "--gpu-memory-gb 0.5"));
  CHECK(fs::exists(dir / "plan" / "3d_lowres.yaml"));
}

TEST_CASE(
    "segflow plan --memory-model nnunet plans TotalSegmentator's real CT as nnU-Net's own planner does") {
  st::TempDir dir("plan_real_ct");
  const fs::path ds = real_ct_dataset(dir / "ds");
  const auto ours = segflow_plan(ds, dir / "plan", "--memory-model nnunet --device cpu");
  compare_with_nnunet(ours, nnunet_plan(ds, dir.path()));
  CHECK(ours["configurations"]["3d_fullres"]["normalization_schemes"] == nlohmann::json({"CTNormalization"}));
}

TEST_CASE(
    "segflow plan --preset resenc-m|l|xl --memory-model nnunet plans as nnU-Net's residual encoder planners "
    "do") {
  st::TempDir dir("plan_resenc");
  // The isotropic set under every preset (their memory references differ), the thick-slice set
  // and the real CT under ResEnc M, nnU-Net's recommended default.
  const fs::path iso = synth(dir / "iso", "--cases 6 --size 32 --spacing 1,1,1 --seed 4");
  for (const char* preset : {"resenc-m", "resenc-l", "resenc-xl"}) {
    INFO(preset);
    const auto ours = segflow_plan(iso, dir / (std::string("plan_") + preset),
                                   std::string("--memory-model nnunet --device cpu --preset ") + preset);
    compare_with_nnunet(ours, nnunet_plan(iso, dir.path(), std::string("--planner ") + preset));
    CHECK(ours["segflow"]["preset"] == preset);
  }
  const fs::path aniso =
      synth(dir / "aniso", "--cases 8 --size 64 --spacing 0.7,0.7,5 --spacing-jitter 0.3 --seed 5");
  const auto ours =
      segflow_plan(aniso, dir / "plan_aniso", "--memory-model nnunet --device cpu --preset resenc-m");
  compare_with_nnunet(ours, nnunet_plan(aniso, dir.path(), "--planner resenc-m"));
  CHECK(ours["plans_name"] == "nnUNetResEncUNetMPlans");
  const fs::path ct = real_ct_dataset(dir / "ct");
  compare_with_nnunet(
      segflow_plan(ct, dir / "plan_ct", "--memory-model nnunet --device cpu --preset resenc-m"),
      nnunet_plan(ct, dir.path(), "--planner resenc-m"));
  // A memory target small enough that the estimate shrinks the patch and a 3d_lowres is made.
  const fs::path big = synth(dir / "big", "--cases 2 --size 112 --spacing 1,1,1 --seed 12");
  const auto small = segflow_plan(big, dir / "plan_small",
                                  "--memory-model nnunet --device cpu --preset resenc-m --memory-gb 0.5");
  REQUIRE(small["configurations"].contains("3d_lowres"));
  compare_with_nnunet(small, nnunet_plan(big, dir.path(), "--planner resenc-m --gpu-memory-gb 0.5"));

  // The recipe trains nnU-Net's ResidualEncoderUNet: it parses and validates as a job config.
  const std::string yaml = st::read_file(dir / "plan_aniso" / "3d_fullres.yaml");
  CHECK(st::contains(yaml, "name: res_enc_unet"));
  CHECK(st::contains(yaml, "n_blocks_per_stage: [1,3,4"));
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::load_job_config(dir / "plan_aniso" / "3d_fullres.yaml"));
  CHECK(cfg.model.name() == "res_enc_unet");
  CHECK_OK(models::validate_job_config(cfg, pipeline::builtin_registry()));

  // An unknown preset is refused before anything is written.
  const auto r = st::run_segflow("plan " + st::shell_quote(iso) + " --out " + st::shell_quote(dir / "bad") +
                                 " --preset resenc-s");
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(
      st::contains(r.out, "--preset: expected one of default, resenc-m, resenc-l, resenc-xl, got 'resenc-s'"),
      r.out);
  CHECK_FALSE(fs::exists(dir / "bad" / "plans.json"));
}

TEST_CASE("the plan folder holds fingerprint.json, plans.json and one commented YAML per configuration") {
  st::TempDir dir("plan_files");
  const fs::path ds = synth(dir / "ds", "--cases 4 --size 24 --seed 6");
  const auto plans =
      segflow_plan(ds, dir / "plan", "--memory-model nnunet --device cpu --configurations 3d_fullres,2d");
  CHECK(fs::exists(dir / "plan" / "fingerprint.json"));
  CHECK(fs::exists(dir / "plan" / "3d_fullres.yaml"));
  CHECK(fs::exists(dir / "plan" / "2d.yaml"));
  CHECK_FALSE(fs::exists(dir / "plan" / "3d_lowres.yaml"));
  CHECK_FALSE(st::has_temporaries(dir / "plan"));
  const std::string yaml = st::read_file(dir / "plan" / "3d_fullres.yaml");
  for (const char* figure : {"median spacing", "percentiles 0.5 / 99.5", "get_pool_and_conv_props",
                             "target spacing", "250000 steps", "folds: 4"})
    CHECK_MESSAGE(st::contains(yaml, figure), figure);
  const auto& c = plans["configurations"]["3d_fullres"];
  for (const char* k :
       {"spacing", "patch_size", "batch_size", "median_image_size_in_voxels", "pool_op_kernel_sizes",
        "conv_kernel_sizes", "normalization_schemes", "use_mask_for_norm", "architecture"})
    CHECK_MESSAGE(c.contains(k), k);
}

TEST_CASE(
    "the generated YAMLs are runnable job configs: they parse and validate with every stage and the model") {
  st::TempDir dir("plan_validate");
  const fs::path ds = synth(dir / "ds", "--cases 4 --size 24 --seed 7");
  segflow_plan(ds, dir / "plan", "--memory-model nnunet --device cpu --configurations 3d_fullres,2d");
  const pipeline::StageRegistry registry = pipeline::builtin_registry();
  for (const char* y : {"3d_fullres.yaml", "2d.yaml"}) {
    INFO(y);
    REQUIRE_OK_AND_ASSIGN(auto cfg, models::load_job_config(dir / "plan" / y));
    CHECK_OK(models::validate_job_config(cfg, registry));
  }
}

TEST_CASE("the measured memory model runs trial steps and keeps the step within --max-step-s on a CPU") {
  st::TempDir dir("plan_measured");
  const fs::path ds = synth(dir / "ds", "--cases 3 --size 24 --spacing 1.5,1.5,1.5 --seed 8");
  const auto plans =
      segflow_plan(ds, dir / "plan", "--device cpu --configurations 3d_fullres --max-step-s 5");
  const auto& s = plans["configurations"]["3d_fullres"]["segflow"];
  CHECK(s["memory_model"] == "measured");
  REQUIRE(!s["trials"].empty());
  bool chosen = false;
  for (const auto& t : s["trials"]) {
    CHECK(t["step_s"].get<double>() > 0);
    if (t["patch_size"] == plans["configurations"]["3d_fullres"]["patch_size"] && t["fits"].get<bool>()) {
      chosen = true;
      CHECK(t["step_s"].get<double>() <= 5.0);
    }
  }
  CHECK(chosen);
  CHECK(s.contains("nnunet_patch_size"));
}

TEST_CASE("segflow plan refuses a dataset without labels or with a lying numTraining, writing nothing") {
  st::TempDir dir("plan_bad");
  const fs::path ds = synth(dir / "ds", "--cases 2 --size 16");
  fs::rename(ds / "labelsTr", dir / "labels_away");
  auto r = st::run_segflow("plan " + st::shell_quote(ds) + " --out " + st::shell_quote(dir / "plan") +
                               " --memory-model nnunet --device cpu",
                           dir.path());
  CHECK(r.exit_code != 0);
  CHECK(st::contains(r.err, "labels: expected a label map per case"));
  CHECK_FALSE(fs::exists(dir / "plan"));
  fs::rename(dir / "labels_away", ds / "labelsTr");
  auto dj = plan_read_json(ds / "dataset.json");
  dj["numTraining"] = 3;
  st::write_file(ds / "dataset.json", dj.dump());
  r = st::run_segflow("plan " + st::shell_quote(ds) + " --out " + st::shell_quote(dir / "plan") +
                          " --memory-model nnunet --device cpu",
                      dir.path());
  CHECK(r.exit_code != 0);
  CHECK(st::contains(r.err, "dataset.json: numTraining: expected 2"));
  CHECK_FALSE(fs::exists(dir / "plan"));
  r = st::run_segflow("plan " + st::shell_quote(ds) + " --memory-model guess", dir.path());
  CHECK(r.exit_code == 2);
  CHECK(st::contains(r.err, "--memory-model: expected nnunet or measured, got 'guess'"));
}

TEST_SUITE("serial") {
  TEST_CASE(
      "segflow train DATASET plans, trains with the plan in its run folder, and reuses a current plan") {
    st::TempDir dir("plan_train");
    const fs::path ds = synth(dir / "ds", "--cases 5 --size 24 --seed 9");
    const std::string args = "train " + st::shell_quote(ds) +
                             " --configuration 3d_fullres --memory-model nnunet --device cpu --quiet"
                             " --set train.epochs=1 --set train.steps_per_epoch=2 --set train.val_interval=0"
                             " --set train.batch_size=1 --set output.runs_dir=" +
                             st::shell_quote(dir / "runs");
    auto r = st::run_segflow(args, dir.path());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(st::contains(r.err, "planning"));
    const fs::path plans = ds / ".segflow-plans";
    CHECK(fs::exists(plans / "3d_fullres.yaml"));
    const std::string run = r.out.substr(r.out.find("run folder: ") + 12);
    const fs::path run_dir = run.substr(0, run.find('\n'));
    CHECK(fs::exists(run_dir / "plan" / "3d_fullres.yaml"));
    CHECK(fs::exists(run_dir / "plan" / "plans.json"));
    r = st::run_segflow(args, dir.path());
    REQUIRE(r.exit_code == 0);
    CHECK(st::contains(r.err, "reusing the plan"));
    // A changed case makes the plan stale: planned again.
    st::write_file(ds / "labelsTr" / "case_000.nii.gz", st::read_file(ds / "labelsTr" / "case_000.nii.gz"));
    fs::last_write_time(ds / "labelsTr" / "case_000.nii.gz", fs::file_time_type::clock::now());
    r = st::run_segflow(args, dir.path());
    REQUIRE(r.exit_code == 0);
    CHECK(st::contains(r.err, "planning"));
  }
}
