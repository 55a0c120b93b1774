// `segflow infer` as users expect it: mirroring TTA, ensembles, saved probabilities, folders
// and datasets, a progress line per case, DICOM SEG with the training's class names. Outputs
// are read back with nibabel and pydicom (tests/tools/infer_check.py).
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/inference/inference.hpp"
#include "models/training/class_names.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/dicom_seg_style.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::run_segflow;
using segflow::testing::TempDir;
namespace fs = std::filesystem;

namespace {

/// A small job on 5 synthetic 24^3 NIfTI cases in `dir` (made on first use). `model`
/// replaces the 3x3x3 UNet; the stage `after_load` goes after load, `after_crop` after the crop.
std::string infer_job(const fs::path& dir, const std::string& model = "", const std::string& after_load = "",
                      const std::string& after_crop = "") {
  testing::JobYaml job;
  job.name = "infer-tiny";
  job.seed = "5";
  job.root = dir / "data";
  job.stages = {testing::kLoadStage};
  if (!after_load.empty()) job.stages.push_back(after_load);
  for (const auto& s :
       {testing::kCtWindowStage, testing::kFgBgStage, testing::crop_stage("[16, 16, 16]", 3, 1, 2)})
    job.stages.push_back(s);
  if (!after_crop.empty()) job.stages.push_back(after_crop);
  job.model = model.empty()
                  ? testing::unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch")
                  : model;
  job.optimizer = "{name: adam, lr: 0.02}";
  job.schedule = "";
  job.epochs = 6;
  job.train = "batch_size: 2, device: cpu, val_interval: 0, loader: simple, threads: 1";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.5, sw_batch_size: 4}";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

models::JobConfig job(const std::string& text) {
  REQUIRE_OK_AND_ASSIGN(auto c, models::parse_job_config(text, "job.yaml"));
  return c;
}

/// Trains the job; its last.pt.
fs::path train(const std::string& text) {
  models::TrainObserver quiet;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(job(text), {}, quiet));
  return run / "last.pt";
}

/// An untrained checkpoint of the job (initial weights), for what only needs a model.
fs::path untrained(const std::string& text, const fs::path& file) {
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(job(text), c10::Device("cpu")));
  REQUIRE_OK(t->save_checkpoint(file));
  return file;
}

at::Tensor read_voxels(const fs::path& p) {
  REQUIRE_OK_AND_ASSIGN(auto img, pipeline::read_image(p));
  return img.voxels;
}

nlohmann::json infer_check(const std::string& args) {
  auto r = testing::run_command(
      testing::shell_quote(testing::python()) + " " +
      testing::shell_quote(testing::source_path("tests/tools/infer_check.py").string()) + " " + args);
  REQUIRE_MESSAGE(r.exit_code == 0, "infer_check.py " << args << ": " << r.out);
  return nlohmann::json::parse(r.out);
}

std::string q(const fs::path& p) { return testing::shell_quote(p.string()); }

}  // namespace

TEST_CASE("mirroring TTA of a flip-equivariant model equals no TTA, and of a 3x3x3 UNet averages the flips") {
  TempDir dir("infer_tta");
  // 1x1x1 convolutions with stride 1: every voxel is predicted from itself alone, so the
  // model commutes with flips and mirroring must change nothing.
  const fs::path pointwise =
      train(infer_job(dir.path(),
                      "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, "
                      "channels: [4, 8], strides: [1], kernel_size: 1, up_kernel_size: 1, "
                      "num_res_units: 1, norm: batch}"));
  const fs::path input = dir.path() / "data" / "imagesTr" / "case_002_0000.nii.gz";
  auto run = [&](const fs::path& ckpt, models::TtaMode tta, const std::string& name) {
    models::InferOptions o{.checkpoint = ckpt, .input = input, .output = dir.path() / name, .device = "cpu"};
    o.tta = tta;
    o.save_probabilities = true;
    REQUIRE_OK_AND_ASSIGN(auto r, models::run_inference(o));
    return r;
  };
  auto plain = run(pointwise, models::TtaMode::none, "pw.nii.gz");
  auto mirrored = run(pointwise, models::TtaMode::mirror_all, "pw_tta.nii.gz");
  CHECK(mirrored.tta_axes == std::vector<int>{0, 1, 2});
  CHECK(torch::allclose(read_voxels(plain.probabilities), read_voxels(mirrored.probabilities), 1e-5, 1e-6));
  CHECK(torch::equal(read_voxels(plain.output), read_voxels(mirrored.output)));

  // A trained 3x3x3 UNet is not flip-invariant: TTA changes the probabilities, and they are
  // the mean of the 8 flipped predictions (32^3 with 16^3 windows at overlap 0.5: the
  // window layout is its own mirror image, so whole-volume flips equal per-window flips).
  const fs::path unet = train(infer_job(dir.path() / "u"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::load_for_inference(unet, "cpu"));
  torch::manual_seed(1);
  at::Tensor image = torch::rand({1, 32, 32, 32});
  at::Tensor none = models::predict_probabilities(*t, image);
  at::Tensor tta = models::predict_probabilities(*t, image, {0, 1, 2});
  at::Tensor manual = torch::zeros_like(none);
  for (int m = 0; m < 8; ++m) {
    std::vector<std::int64_t> axes;
    for (int d = 0; d < 3; ++d)
      if ((m >> d) & 1) axes.push_back(1 + d);
    manual += axes.empty() ? none : models::predict_probabilities(*t, image.flip(axes)).flip(axes);
  }
  manual /= 8.0;
  CHECK(torch::allclose(tta, manual, 1e-5, 1e-6));
  // The streamed labels (one window depth of class maps held) are the probabilities' argmax.
  CHECK(torch::equal(models::predict_labels(*t, image, {0, 1, 2}), tta.argmax(0, true).to(at::kByte)));
  CHECK(torch::equal(models::predict_labels(*t, image), none.argmax(0, true).to(at::kByte)));
  CHECK((tta - none).abs().max().item<double>() > 1e-3);
  CHECK((tta.sum(0) - 1).abs().max().item<double>() < 1e-5);

  // On a scan through the CLI: a valid label map on the input's grid (nibabel agrees).
  auto r =
      run_segflow("infer --checkpoint " + q(unet) + " --input " + q(input) + " --output " +
                      q(dir.path() / "tta.nii.gz") + " --tta mirror-all --device cpu --save-probabilities",
                  dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto ours = testing::reference_read("nibabel", dir.path() / "tta.nii.gz");
  auto in = testing::reference_read("nibabel", input);
  CHECK(ours["size"] == in["size"]);
  for (int k = 0; k < 3; ++k)
    CHECK(ours["origin"][k].get<double>() == doctest::Approx(in["origin"][k].get<double>()));
  CHECK(ours["min"].get<double>() >= 0);
  CHECK(ours["max"].get<double>() <= 4);
  auto pc = infer_check("probs " + q(dir.path() / "tta_probabilities.nii.gz") + " " +
                        q(dir.path() / "tta.nii.gz") + " " + q(input));
  CHECK(pc["argmax_agreement"].get<double>() == 1.0);  // the label map is the TTA probabilities' argmax
  // Without --save-probabilities the labels are streamed: the same label map.
  auto streamed = run_segflow("infer --checkpoint " + q(unet) + " --input " + q(input) + " --output " +
                                  q(dir.path() / "tta_streamed.nii.gz") + " --tta mirror-all --device cpu",
                              dir.path());
  REQUIRE_MESSAGE(streamed.exit_code == 0, streamed.err);
  CHECK(
      torch::equal(read_voxels(dir.path() / "tta_streamed.nii.gz"), read_voxels(dir.path() / "tta.nii.gz")));
  CHECK(pc["max_sum_error"].get<double>() < 1e-5);
  CHECK(pc["affine_matches_input"] == true);
  auto bad = run_segflow("infer --checkpoint " + q(unet) + " --input " + q(input) + " --output " +
                             q(dir.path() / "x.nii.gz") + " --tta flips",
                         dir.path());
  CHECK(bad.exit_code == 2);
  CHECK(bad.err == "segflow infer: --tta: expected none, mirror or mirror-all, got 'flips'\n");
}

TEST_CASE(
    "an ensemble of one checkpoint twice equals the checkpoint; another family joins as the mean of the "
    "probabilities; other class counts are refused") {
  TempDir dir("infer_ens");
  const fs::path ckpt = train(infer_job(dir.path()));
  const fs::path input = dir.path() / "data" / "imagesTr" / "case_001_0000.nii.gz";
  models::InferOptions o{
      .checkpoint = ckpt, .input = input, .output = dir.path() / "one.nii.gz", .device = "cpu"};
  o.save_probabilities = true;
  REQUIRE_OK_AND_ASSIGN(auto one, models::run_inference(o));
  o.ensemble = {ckpt};
  o.output = dir.path() / "two.nii.gz";
  REQUIRE_OK_AND_ASSIGN(auto two, models::run_inference(o));
  CHECK(torch::equal(read_voxels(one.probabilities), read_voxels(two.probabilities)));
  CHECK(torch::equal(read_voxels(one.output), read_voxels(two.output)));

  // Two different checkpoints: the probabilities are the mean of theirs.
  const fs::path init = untrained(infer_job(dir.path()), dir.path() / "init.pt");
  o.ensemble = {};
  o.checkpoint = init;
  o.output = dir.path() / "init.nii.gz";
  REQUIRE_OK_AND_ASSIGN(auto other, models::run_inference(o));
  o.checkpoint = ckpt;
  o.ensemble = {init};
  o.output = dir.path() / "mix.nii.gz";
  REQUIRE_OK_AND_ASSIGN(auto mix, models::run_inference(o));
  CHECK(torch::allclose(read_voxels(mix.probabilities),
                        (read_voxels(one.probabilities) + read_voxels(other.probabilities)) / 2, 1e-6, 1e-6));

  const fs::path three =
      untrained(infer_job(dir.path(),
                          "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 3, channels: [4, 8], "
                          "strides: [2], num_res_units: 1, norm: batch}"),
                dir.path() / "three.pt");
  const fs::path plain =
      untrained(infer_job(dir.path(),
                          "{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: 5, "
                          "n_stages: 2, base_features: 4, max_features: 8}"),
                dir.path() / "plain.pt");
  auto r3 = run_segflow("infer --checkpoint " + q(ckpt) + " --checkpoint " + q(three) + " --input " +
                            q(input) + " --output " + q(dir.path() / "x.nii.gz"),
                        dir.path());
  CHECK(r3.exit_code == 2);
  CHECK(r3.err == "segflow infer: " + three.string() + ": cannot join an ensemble with " + ckpt.string() +
                      ": 3 classes, expected 5\n");
  CHECK_FALSE(fs::exists(dir.path() / "x.nii.gz"));
  // Another family with the same classes joins (nnU-Net's ensembles of configurations): the
  // probabilities are the mean of the UNet's and the PlainConvUNet's own.
  o.checkpoint = plain;
  o.ensemble = {};
  o.output = dir.path() / "plain.nii.gz";
  REQUIRE_OK_AND_ASSIGN(auto plain_alone, models::run_inference(o));
  o.checkpoint = ckpt;
  o.ensemble = {plain};
  o.output = dir.path() / "families.nii.gz";
  REQUIRE_OK_AND_ASSIGN(auto families, models::run_inference(o));
  CHECK(torch::allclose(read_voxels(families.probabilities),
                        (read_voxels(one.probabilities) + read_voxels(plain_alone.probabilities)) / 2, 1e-6,
                        1e-6));
}

TEST_CASE(
    "saved probabilities sum to 1 per voxel on the input's grid, also when the stages resample (either "
    "grid)") {
  TempDir dir("infer_prob");
  const fs::path ckpt =
      train(infer_job(dir.path(), "", testing::stage("resample", "{spacing: [2.0, 2.0, 3.5]}")));
  const fs::path input = dir.path() / "data" / "imagesTr" / "case_002_0000.nii.gz";  // oblique
  auto r = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(input) + " --output " +
                           q(dir.path() / "seg.nii.gz") + " --save-probabilities --tta mirror-all",
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["probabilities"] == (dir.path() / "seg_probabilities.nii.gz").string());
  auto c = infer_check("probs " + q(dir.path() / "seg_probabilities.nii.gz") + " " +
                       q(dir.path() / "seg.nii.gz") + " " + q(input));
  const auto in = testing::reference_read("nibabel", input);
  CHECK(c["shape"] == nlohmann::json({in["size"][0], in["size"][1], in["size"][2], 5}));
  CHECK(c["dtype"] == "float32");
  CHECK(c["max_sum_error"].get<double>() < 1e-5);
  CHECK(c["min"].get<double>() >= 0.0);
  CHECK(c["affine_matches_input"] == true);
  CHECK(c["affine_matches_labels"] == true);
  // The labels come from the preprocessed grid (nearest back), the probabilities are mapped
  // back linearly: they agree almost everywhere.
  CHECK(c["argmax_agreement"].get<double>() > 0.97);

  // MONAI's grid (resample grid: exact_spacing, the first voxel kept) maps back the same way.
  const fs::path exact = train(infer_job(
      dir.path() / "e", "", testing::stage("resample", "{spacing: [2.0, 2.0, 3.5], grid: exact_spacing}")));
  auto e = run_segflow("infer --checkpoint " + q(exact) + " --input " + q(input) + " --output " +
                           q(dir.path() / "exact.nii.gz") + " --save-probabilities",
                       dir.path());
  REQUIRE_MESSAGE(e.exit_code == 0, e.err);
  auto ce = infer_check("probs " + q(dir.path() / "exact_probabilities.nii.gz") + " " +
                        q(dir.path() / "exact.nii.gz") + " " + q(input));
  CHECK(ce["shape"] == c["shape"]);
  CHECK(ce["max_sum_error"].get<double>() < 1e-5);
  CHECK(ce["affine_matches_input"] == true);
  CHECK(ce["affine_matches_labels"] == true);
  CHECK(ce["argmax_agreement"].get<double>() > 0.97);

  // Without spatial stages the label map is exactly the argmax of the saved probabilities.
  const fs::path same = train(infer_job(dir.path() / "s"));
  auto s = run_segflow("infer --checkpoint " + q(same) + " --input " + q(input) + " --output " +
                           q(dir.path() / "same.nii.gz") + " --save-probabilities",
                       dir.path());
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  auto cs = infer_check("probs " + q(dir.path() / "same_probabilities.nii.gz") + " " +
                        q(dir.path() / "same.nii.gz"));
  CHECK(cs["argmax_agreement"].get<double>() == 1.0);
  CHECK(cs["max_sum_error"].get<double>() < 1e-5);
}

TEST_CASE("folder and dataset inference writes one output per case, named by case id, with a line per case") {
  TempDir dir("infer_folder");
  const fs::path ckpt = train(infer_job(dir.path()));
  // A dataset root: its imagesTr/ cases.
  auto r = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "data") + " --output " +
                           q(dir.path() / "out"),
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["cases"].size() == 5);
  for (int i = 0; i < 5; ++i) {
    const std::string id = "case_00" + std::to_string(i);
    CHECK(j["cases"][i]["case"] == id);
    const fs::path out = dir.path() / "out" / (id + ".nii.gz");
    CHECK(j["cases"][i]["output"] == out.string());
    auto label = testing::reference_read("nibabel", out);
    auto image = testing::reference_read("nibabel", dir.path() / "data" / "imagesTr" / (id + "_0000.nii.gz"));
    CHECK(label["size"] == image["size"]);
    CHECK(r.err.find("infer " + std::to_string(i + 1) + "/5 " + id + ": ") != std::string::npos);
  }
  // stderr is not a terminal here: plain lines, no bar.
  CHECK(r.err.find('\r') == std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 5);

  // A folder of nnU-Net channel files: a case with a gap in its channels is skipped.
  const fs::path scans = dir.path() / "scans";
  fs::create_directories(scans);
  fs::copy_file(dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz", scans / "a_0000.nii.gz");
  fs::copy_file(dir.path() / "data" / "imagesTr" / "case_001_0000.nii.gz", scans / "b_0000.nii.gz");
  fs::copy_file(dir.path() / "data" / "imagesTr" / "case_002_0000.nii.gz", scans / "c_0001.nii.gz");
  testing::write_file(scans / "dataset.json", "{}");
  auto f = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(scans) + " --output " +
                           q(dir.path() / "out2") + " --save-probabilities",
                       dir.path());
  REQUIRE_MESSAGE(f.exit_code == 0, f.err);
  auto jf = nlohmann::json::parse(f.out);
  REQUIRE(jf["cases"].size() == 2);
  CHECK(jf["cases"][0]["case"] == "a");
  CHECK(jf["cases"][1]["case"] == "b");
  CHECK(jf["skipped"].size() == 1);
  CHECK(f.err.find("case c: channel _0000 is missing") != std::string::npos);
  for (const char* n : {"a.nii.gz", "a_probabilities.nii.gz", "b.nii.gz", "b_probabilities.nii.gz"})
    CHECK_MESSAGE(fs::exists(dir.path() / "out2" / n), n);

  // On a terminal (script(1) gives the command a pty) the bar updates in place.
  auto tty = testing::run_command("script -qec " +
                                  testing::shell_quote(testing::shell_quote(testing::segflow_bin()) +
                                                       " infer --checkpoint " + q(ckpt) + " --input " +
                                                       q(dir.path() / "data") + " --output " +
                                                       q(dir.path() / "out3") + " >/dev/null") +
                                  " /dev/null");
  REQUIRE_MESSAGE(tty.exit_code == 0, tty.out);
  CHECK(tty.out.find("\r\033[K[") != std::string::npos);
  CHECK(tty.out.find("5/5 done case_004") != std::string::npos);

  // An output that is a file cannot take several cases.
  testing::write_file(dir.path() / "file.nii.gz", "x");
  auto bad = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "data") +
                             " --output " + q(dir.path() / "file.nii.gz"),
                         dir.path());
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--output: expected a folder for the 5 cases of") != std::string::npos);
}

TEST_CASE("DICOM SEG output names, codes and colours its segments from the classes the model carries") {
  TempDir dir("infer_seg");
  const fs::path ckpt = train(infer_job(dir.path()));
  auto s = run_segflow("synth --cases 2 --size 24 --format dicom --seed 9 --out " + q(dir.path() / "dicom"),
                       dir.path());
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  // A folder of DICOM case folders: one SEG per case, named by case id.
  auto r = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom") +
                           " --output " + q(dir.path() / "segs"),
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["cases"].size() == 2);
  const fs::path seg = dir.path() / "segs" / "case_000.dcm";
  CHECK(j["cases"][0]["output"] == seg.string());
  // The training data's dataset.json: liver, spleen, kidney, spine (synth's names).
  const std::vector<std::string> names = {"background", "liver", "spleen", "kidney", "spine"};
  std::string rgb;
  const std::int64_t max_label = j["cases"][0]["labels"].back().get<std::int64_t>();
  REQUIRE(max_label >= 1);
  for (std::int64_t v = 1; v <= max_label; ++v) {
    const auto c = pipeline::default_segment_colour(v);
    rgb += " --rgb " + std::to_string(c[0]) + "," + std::to_string(c[1]) + "," + std::to_string(c[2]);
  }
  auto c = infer_check("seg " + q(seg) + rgb);
  REQUIRE(c["segments"].size() == static_cast<std::size_t>(max_label));
  for (std::int64_t v = 1; v <= max_label; ++v) {
    const auto& sj = c["segments"][v - 1];
    CHECK(sj["number"] == v);
    CHECK(sj["label"] == names[static_cast<std::size_t>(v)]);
    // Coded as pydicom's SNOMED CT dictionary codes the organ (liver 10200004, ...), in the
    // Anatomical Structure category.
    CHECK(sj["type"]["scheme"] == "SCT");
    CHECK(sj["type"]["value"] == sj["type"]["pydicom"]);
    CHECK(sj["type"]["meaning"] != "Tissue");
    CHECK(sj["category"]["meaning"] == "Anatomical Structure");
    CHECK(sj["category"]["value"] == sj["category"]["pydicom"]);
    REQUIRE(sj.contains("lab"));
    for (int k = 0; k < 3; ++k)  // DCMTK's and the script's white points differ in the 4th digit
      CHECK(std::abs(sj["lab"][k].get<double>() - c["expected_lab"][v - 1][k].get<double>()) < 40.0);
  }
  // The labels in the SEG are the labels inferred: segflow eval of the SEG against the NIfTI
  // inference of the same series finds them identical.
  auto n = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom" / "case_000") +
                           " --output " + q(dir.path() / "case_000.nii.gz"),
                       dir.path());
  REQUIRE_MESSAGE(n.exit_code == 0, n.err);
  auto e = run_segflow("eval --pred " + q(seg) + " --gt " + q(dir.path() / "case_000.nii.gz") + " --json",
                       dir.path());
  REQUIRE_MESSAGE(e.exit_code == 0, e.err);
  const nlohmann::json eval = nlohmann::json::parse(e.out);  // held: items() keeps a reference
  REQUIRE(!eval["cases"][0]["classes"].empty());
  for (const auto& [k, v] : eval["cases"][0]["classes"].items()) CHECK(v["dice"] == 1.0);

  // --also-output: one prediction written as a SEG, a NIfTI and an NRRD, each the labels above.
  const fs::path both = dir.path() / "both";
  fs::create_directories(both);
  auto b = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom" / "case_000") +
                           " --output " + q(both / "seg.dcm") + " --also-output " + q(both / "seg.nii.gz") +
                           " --also-output " + q(both / "seg.nrrd"),
                       dir.path());
  REQUIRE_MESSAGE(b.exit_code == 0, b.err);
  const nlohmann::json bj = nlohmann::json::parse(b.out);
  CHECK(bj["output"] == (both / "seg.dcm").string());
  CHECK(bj["also_output"] ==
        nlohmann::json::array({(both / "seg.nii.gz").string(), (both / "seg.nrrd").string()}));
  for (const char* file : {"seg.dcm", "seg.nii.gz", "seg.nrrd"}) {
    auto be = run_segflow(
        "eval --pred " + q(both / file) + " --gt " + q(dir.path() / "case_000.nii.gz") + " --json",
        dir.path());
    REQUIRE_MESSAGE(be.exit_code == 0, be.err);
    const nlohmann::json bev = nlohmann::json::parse(be.out);
    REQUIRE(!bev["cases"][0]["classes"].empty());
    for (const auto& [k, v] : bev["cases"][0]["classes"].items()) CHECK_MESSAGE(v["dice"] == 1.0, file);
  }
  // Refused before anything runs: a folder input, a file segflow does not write, a SEG of a NIfTI.
  auto bf = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom") +
                            " --output " + q(both / "folder") + " --also-output " + q(both / "x.nii.gz"),
                        dir.path());
  CHECK(bf.exit_code != 0);
  CHECK_MESSAGE(bf.err.find("--also-output " + (both / "x.nii.gz").string() + ": names a file of one scan") !=
                    std::string::npos,
                bf.err);
  CHECK_FALSE(fs::exists(both / "folder"));
  auto bt = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom" / "case_000") +
                            " --output " + q(both / "t.dcm") + " --also-output " + q(both / "t.txt"),
                        dir.path());
  CHECK(bt.exit_code != 0);
  CHECK_MESSAGE(bt.err.find((both / "t.txt").string() + ": --also-output: expected") != std::string::npos,
                bt.err);
  CHECK_FALSE(fs::exists(both / "t.dcm"));
  auto bn = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "case_000.nii.gz") +
                            " --output " + q(both / "n.nii.gz") + " --also-output " + q(both / "n.dcm"),
                        dir.path());
  CHECK(bn.exit_code != 0);
  CHECK_MESSAGE(bn.err.find("a DICOM SEG needs a DICOM input") != std::string::npos, bn.err);
  CHECK_FALSE(fs::exists(both / "n.nii.gz"));

  // --class-names overrides; an explicit --format nifti writes NIfTI for DICOM input.
  auto o = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom") +
                           " --output " + q(dir.path() / "named") + " --class-names bg,Liver\\ 1",
                       dir.path());
  REQUIRE_MESSAGE(o.exit_code == 0, o.err);
  const auto named = infer_check("seg " + q(dir.path() / "named" / "case_000.dcm"))["segments"][0];
  CHECK(named["label"] == "Liver 1");
  CHECK(named["type"]["meaning"] == "Tissue");  // a name the code table does not know: the generic code
  CHECK(named["type"]["value"] == named["type"]["pydicom"]);
  auto f = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(dir.path() / "dicom") +
                           " --output " + q(dir.path() / "nii") + " --format nifti",
                       dir.path());
  REQUIRE_MESSAGE(f.exit_code == 0, f.err);
  CHECK(fs::exists(dir.path() / "nii" / "case_001.nii.gz"));

  // The model carries its classes: the checkpoint copied to an empty folder, the training
  // data gone, run from `/`, still names the segments (it never looks for dataset.json).
  fs::create_directories(dir.path() / "moved");
  fs::copy_file(ckpt, dir.path() / "moved" / "model.pt");
  fs::rename(dir.path() / "data", dir.path() / "data_gone");
  auto m = testing::run_command("cd / && " + testing::shell_quote(testing::segflow_bin()) +
                                " infer --checkpoint " + q(dir.path() / "moved" / "model.pt") + " --input " +
                                q(dir.path() / "dicom" / "case_000") + " --output " +
                                q(dir.path() / "moved" / "seg.dcm") + " 2>&1");
  REQUIRE_MESSAGE(m.exit_code == 0, m.out);
  const auto moved = infer_check("seg " + q(dir.path() / "moved" / "seg.dcm"));
  REQUIRE(moved["segments"].size() == static_cast<std::size_t>(max_label));
  for (std::int64_t v = 1; v <= max_label; ++v)
    CHECK(moved["segments"][v - 1]["label"] == names[static_cast<std::size_t>(v)]);
}

TEST_CASE("--tta mirror averages over flips of the axes the training flipped, mirror-all over every axis") {
  TempDir dir("infer_tta_axes");
  // The training flips x and z (rand_flip), never y; a second job never flips, a third has
  // a rand_flip that never fires (prob 0).
  const fs::path xz = untrained(
      infer_job(dir.path(), "", "", testing::stage("rand_flip", "{prob: 0.5, spatial_axis: [2, 0]}")),
      dir.path() / "xz.pt");
  const fs::path plain = untrained(infer_job(dir.path()), dir.path() / "plain.pt");
  const fs::path never =
      untrained(infer_job(dir.path(), "", "", testing::stage("rand_flip", "{prob: 0.0, spatial_axis: [1]}")),
                dir.path() / "never.pt");
  // A scan of 24 x 32 x 40 (z, y, x) voxels: every axis its own length, so that a flip of the
  // wrong axis cannot give the same numbers.
  torch::manual_seed(3);
  pipeline::Image scan;
  scan.voxels = torch::rand({1, 24, 32, 40}) * 500.0 - 200.0;
  scan.geometry.spacing = {1.0, 1.5, 2.0};
  scan.geometry.origin = {-10.0, 20.0, 5.0};
  const fs::path input = dir.path() / "scan.nii.gz";
  REQUIRE_OK(pipeline::write_nifti(input, scan));

  models::InferOptions o{
      .checkpoint = xz, .input = input, .output = dir.path() / "m.nii.gz", .device = "cpu"};
  o.tta = models::TtaMode::mirror;
  o.save_probabilities = true;
  REQUIRE_OK_AND_ASSIGN(auto mirrored, models::run_inference(o));
  CHECK(mirrored.tta_axes == std::vector<int>{0, 2});
  o.tta = models::TtaMode::mirror_all;
  o.output = dir.path() / "all.nii.gz";
  REQUIRE_OK_AND_ASSIGN(auto all, models::run_inference(o));
  CHECK(all.tta_axes == std::vector<int>{0, 1, 2});

  // The saved probabilities are the mean of the predictions of the scan flipped along x
  // (tensor dim 3) and z (dim 1), each flipped back: the job's stages (intensity scaling
  // only, no resampling) applied by hand.
  REQUIRE_OK_AND_ASSIGN(auto t, models::load_for_inference(xz, "cpu"));
  const at::Tensor pre = ((scan.voxels + 200.0) / 500.0).clamp(0.0, 1.0);
  at::Tensor manual = torch::zeros({5, 24, 32, 40});
  for (const std::vector<std::int64_t>& dims :
       {std::vector<std::int64_t>{}, std::vector<std::int64_t>{3}, std::vector<std::int64_t>{1},
        std::vector<std::int64_t>{1, 3}})
    manual += dims.empty() ? models::predict_probabilities(*t, pre)
                           : models::predict_probabilities(*t, pre.flip(dims)).flip(dims);
  manual /= 4.0;
  const at::Tensor saved = read_voxels(mirrored.probabilities).to(torch::kFloat32);
  REQUIRE((saved.sizes() == manual.sizes()));
  CHECK(torch::allclose(saved, manual, 1e-4, 1e-5));
  CHECK(torch::allclose(models::predict_probabilities(*t, pre, {0, 2}), manual, 1e-5, 1e-6));
  // Mirroring y as well, or nothing, gives other numbers (the model is not flip-invariant).
  const at::Tensor saved_all = read_voxels(all.probabilities).to(torch::kFloat32);
  CHECK((saved_all - saved).abs().max().item<double>() > 1e-4);
  CHECK((models::predict_probabilities(*t, pre) - saved).abs().max().item<double>() > 1e-4);

  // Through the CLI: the axes mirrored, by name, in the JSON line.
  const auto axes = [&](const fs::path& ckpt, const std::string& tta) {
    auto r = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(input) + " --output " +
                             q(dir.path() / ("cli_" + tta + ".nii.gz")) + " --tta " + tta + " --device cpu",
                         dir.path());
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return nlohmann::json::parse(r.out)["tta_axes"];
  };
  CHECK(axes(xz, "mirror") == nlohmann::json::array({"x", "z"}));
  CHECK(axes(xz, "mirror-all") == nlohmann::json::array({"x", "y", "z"}));
  CHECK(axes(xz, "none") == nlohmann::json::array());
  CHECK(axes(plain, "mirror") == nlohmann::json::array());
  CHECK(axes(never, "mirror") == nlohmann::json::array());
}

TEST_CASE(
    "DICOM SEG segments are named by the training's classes: dataset.json names through map_labels, and "
    "a DICOM dataset's SEG segment labels") {
  TempDir dir("infer_seg_mapped");
  // The training swaps liver (1) and spleen (2) of synth's dataset.json: class 1 is spleen.
  const fs::path ckpt =
      train(infer_job(dir.path(), "", testing::stage("map_labels", "{mapping: {1: 2, 2: 1, 3: 3, 4: 4}}")));
  auto s = run_segflow("synth --cases 2 --size 24 --format dicom --seed 9 --out " + q(dir.path() / "dicom"),
                       dir.path());
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  const fs::path case_dir = dir.path() / "dicom" / "case_000";
  auto r = run_segflow("infer --checkpoint " + q(ckpt) + " --input " + q(case_dir) + " --output " +
                           q(dir.path() / "mapped.dcm") + " --device cpu",
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const std::int64_t max_label = nlohmann::json::parse(r.out)["labels"].back().get<std::int64_t>();
  REQUIRE(max_label >= 1);
  const std::vector<std::string> mapped = {"background", "spleen", "liver", "kidney", "spine"};
  auto c = infer_check("seg " + q(dir.path() / "mapped.dcm"));
  REQUIRE(c["segments"].size() == static_cast<std::size_t>(max_label));
  for (std::int64_t v = 1; v <= max_label; ++v) {
    CHECK(c["segments"][v - 1]["number"] == v);
    CHECK(c["segments"][v - 1]["label"] == mapped[static_cast<std::size_t>(v)]);
  }

  // A folder of DICOM case folders whose SEGs name their segments (synth's SEGs rewritten
  // with names): those names are the classes of a job on it, carried through map_labels.
  const fs::path root = dir.path() / "dcm" / "data";
  fs::create_directories(root);
  fs::copy(dir.path() / "dicom", root, fs::copy_options::recursive);
  const std::vector<std::string> seg_names = {"", "Liver", "Spleen", "Left Kidney", "Spine"};
  for (const char* id : {"case_000", "case_001"}) {
    const fs::path cd = root / id;
    REQUIRE_OK_AND_ASSIGN(auto img, pipeline::read_dicom(cd));
    REQUIRE_OK_AND_ASSIGN(auto lab, pipeline::read_dicom_seg(cd / "seg.dcm", img));
    REQUIRE_OK_AND_ASSIGN(auto src, pipeline::dicom_source_series(cd));
    std::vector<pipeline::SegmentStyle> styles;
    for (std::size_t v = 0; v < seg_names.size(); ++v)
      styles.push_back({seg_names[v], pipeline::default_segment_colour(static_cast<std::int64_t>(v))});
    REQUIRE_OK(pipeline::write_dicom_seg(cd / "seg.dcm", lab, src, styles));
  }
  // synth's dataset.json beside the case folders comes first; without it, the SEG's names.
  CHECK(models::job_class_names(job(infer_job(dir.path() / "dcm"))) ==
        std::vector<std::string>{"background", "liver", "spleen", "kidney", "spine"});
  REQUIRE(fs::remove(root / "dataset.json"));
  CHECK(models::job_class_names(job(infer_job(dir.path() / "dcm"))) ==
        std::vector<std::string>{"background", "Liver", "Spleen", "Left Kidney", "Spine"});
  const std::string kept =
      infer_job(dir.path() / "dcm", "", testing::stage("map_labels", "{mapping: {1: 3, 3: 1, 2: 2, 4: 4}}"));
  CHECK(models::job_class_names(job(kept)) ==
        std::vector<std::string>{"background", "Left Kidney", "Spleen", "Liver", "Spine"});
  // segflow infer with a checkpoint of that job names the SEG's segments so (its initial
  // weights: only the names are under test here).
  const fs::path init = untrained(kept, dir.path() / "kept.pt");
  auto k = run_segflow("infer --checkpoint " + q(init) + " --input " + q(case_dir) + " --output " +
                           q(dir.path() / "kept.dcm") + " --device cpu",
                       dir.path());
  REQUIRE_MESSAGE(k.exit_code == 0, k.err);
  const std::int64_t kept_max = nlohmann::json::parse(k.out)["labels"].back().get<std::int64_t>();
  auto kc = infer_check("seg " + q(dir.path() / "kept.dcm"));
  REQUIRE(kc["segments"].size() == static_cast<std::size_t>(kept_max));
  const std::vector<std::string> kept_names = {"background", "Left Kidney", "Spleen", "Liver", "Spine"};
  for (std::int64_t v = 1; v <= kept_max; ++v)
    CHECK(kc["segments"][v - 1]["label"] == kept_names[static_cast<std::size_t>(v)]);
}
