// ONNX out for the box-prompted SAM (issue 33 item 1): `segflow export --to onnx` writes the
// image encoder and the prompt encoder + mask decoder as two graphs the ONNX checker takes and
// onnxruntime runs to segflow's eval-mode embedding, low-resolution masks and IoU predictions
// (windowed attention with relative positions, opsets 13 and 17, fp16 weights), and a manifest
// from which a Python runner (tests/tools/sam_onnx_check.py) reproduces `segflow infer --boxes`.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "job_yaml.hpp"
#include "models/interop/export.hpp"
#include "models/interop/onnx_export.hpp"
#include "models/nets/sam.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

using namespace segflow;
namespace st = segflow::testing;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// The tiny SAM of these tests at img 32 (patch 4: an 8 x 8 embedding grid) with `extra` options.
std::string sam_onnx_tiny(const std::string& extra) {
  return "{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, num_heads: 2, spatial_dims: "
         "2, "
         "in_channels: 3, out_channels: 1" +
         extra + "}";
}

/// A SAM job around `model` (CT window, medsam_box; built here, not trained).
/// `longest_side`: medsam_box at the slice's own size, then resize_longest_side to 32 with
/// padding (LiteMedSAM's recipe) instead of medsam_box's plain resize to 32.
std::string sam_onnx_job(const fs::path& dir, const std::string& model, bool longest_side = false) {
  st::JobYaml job;
  job.name = "sam-onnx";
  job.seed = "5";
  job.root = dir / "data";
  job.synth = "{cases: 2, size: 32, format: nifti, seed: 9}";
  job.num_classes = "2";
  job.stages = {st::kLoadStage, st::kCtWindowStage,
                st::stage("medsam_box", longest_side ? "{image_size: 0, bbox_shift: 2, num_samples: 2}"
                                                     : "{image_size: 32, bbox_shift: 2, num_samples: 2}")};
  if (longest_side) job.stages.push_back(st::stage("resize_longest_side", "{size: 32}"));
  job.model = model;
  job.loss = "{name: dice_bce, sigmoid: true, to_onehot_y: false}";
  job.optimizer = "{name: adamw, lr: 0.001}";
  job.epochs = 1;
  job.train = "batch_size: 4, device: cpu, val_interval: 0, loader: simple, threads: 1";
  job.validation = "";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

/// Runs tests/tools/sam_onnx_check.py with `args`; its last printed JSON value.
json sam_onnx_check(const std::string& args) { return st::python_tool_json("sam_onnx_check.py", args); }

/// A real CT slice (TotalSegmentator's example, the middle one) CT-windowed to [0, 1] and
/// resized to size x size, as three channels: (1, 3, size, size).
at::Tensor sam_onnx_real_slice(int64_t size) {
  REQUIRE_OK_AND_ASSIGN(auto img,
                        pipeline::read_image(st::testdata_path("totalsegmentator/example_ct_sm.nii.gz")));
  at::Tensor s = img.voxels.to(at::kFloat).select(1, img.voxels.size(1) / 2).unsqueeze(0);  // (1, 1, Y, X)
  s = ((s + 200.0) / 500.0).clamp(0.0, 1.0);
  s = torch::nn::functional::interpolate(s, torch::nn::functional::InterpolateFuncOptions()
                                                .size(std::vector<int64_t>{size, size})
                                                .mode(torch::kBilinear)
                                                .align_corners(false));
  return s.repeat({1, 3, 1, 1});
}

std::string sam_onnx_boxes_json(const std::vector<std::array<double, 6>>& boxes) {  // label, slice, x0..y1
  json j = {{"space", "voxel"}, {"boxes", json::array()}};
  for (const auto& b : boxes)
    j["boxes"].push_back({{"label", static_cast<int>(b[0])},
                          {"slice", static_cast<int>(b[1])},
                          {"x0", b[2]},
                          {"y0", b[3]},
                          {"x1", b[4]},
                          {"y1", b[5]}});
  return j.dump();
}

/// Builds the SAM of `model` (seeded; position tables and norms perturbed away from their
/// 0 / 1 initialisation so that they count), runs its eval-mode forward_full on image / boxes,
/// exports it to dir/<name>.onnx and saves the tensors to dir/<name>.io.pt; the
/// "ENC:DEC:IO" argument of sam_onnx_check.py parity.
std::string sam_onnx_export_with_io(const fs::path& dir, const std::string& name, const std::string& model,
                                    const models::OnnxExportOptions& eo, const at::Tensor& image,
                                    const at::Tensor& boxes) {
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(sam_onnx_job(dir, model), "job.yaml"));
  torch::manual_seed(7);
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  auto& sam = dynamic_cast<models::SamImpl&>(t->model().module());
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (auto& p : sam.named_parameters())
    if (p.key().find("rel_pos") != std::string::npos || p.key().find("pos_embed") != std::string::npos ||
        p.key().find("norm") != std::string::npos || p.key().find("neck") != std::string::npos)
      p.value().add_(at::randn(p.value().sizes(), gen) * 0.3);
  sam.eval();
  const models::SamOutput y = sam.forward_full(image, boxes);
  std::vector<std::pair<std::string, at::Tensor>> io = {{"image", image},
                                                        {"boxes", boxes},
                                                        {"image_embeddings", y.image_embeddings},
                                                        {"low_res_masks", y.low_res_masks}};
  if (y.iou_predictions.defined()) io.emplace_back("iou_predictions", y.iou_predictions);
  const fs::path out = dir / (name + ".onnx"), io_file = dir / (name + ".io.pt");
  REQUIRE_OK(models::write_onnx_model(cfg.model, sam, out, eo));
  CHECK_FALSE(fs::exists(out));  // two files instead
  const auto files = models::sam_onnx_files(out);
  REQUIRE(fs::exists(files[0]));
  REQUIRE(fs::exists(files[1]));
  const std::vector<char> bytes = models::pytorch_state_dict_bytes(io);
  std::ofstream(io_file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return st::shell_quote(files[0].string() + ":" + files[1].string() + ":" + io_file.string());
}

/// Checks sam_onnx_check.py parity's rows: max |diff| <= `rel` (fp16 weights: `rel_fp16`) of the largest.
void sam_onnx_check_rows(const json& results, double rel, double rel_fp16) {
  for (const json& r : results) {
    const std::string name = r["model"], output = r["output"];
    CAPTURE(name);
    CAPTURE(output);
    const double diff = r["max_abs_diff"], max = r["max_abs"];
    MESSAGE(name << " " << output << ": onnxruntime vs segflow max |diff| " << diff << " of max " << max);
    CHECK(max > 0);
    CHECK(diff <= (name.find("_fp16") != std::string::npos ? rel_fp16 : rel) * max);
  }
}

}  // namespace

TEST_CASE("segflow's SAM ONNX export: onnxruntime gives segflow's embedding, low-res masks and IoU") {
  st::TempDir dir("export_onnx_sam_parity");
  // Windows of 3 on the 8 x 8 grid (padded to 9), relative positions, a global block, the IoU head.
  const std::string windowed = sam_onnx_tiny(
      ", depth: 3, use_rel_pos: true, window_size: 3, global_attn_indexes: [1], iou_head: true, "
      "num_multimask_outputs: 2");
  // Batch of 2: a real CT slice and (seeded) noise, each with its box in model-input pixels.
  torch::manual_seed(3);
  const at::Tensor image = at::cat({sam_onnx_real_slice(32), at::rand({1, 3, 32, 32})}, 0);
  const at::Tensor boxes = torch::tensor({{6.0F, 8.5F, 22.0F, 25.0F}, {0.0F, 3.0F, 31.0F, 17.5F}});
  std::string triples;
  triples += " " + sam_onnx_export_with_io(dir.path(), "windowed", windowed, {17, false}, image, boxes);
  triples +=
      " " + sam_onnx_export_with_io(dir.path(), "windowed_opset13", windowed, {13, false}, image, boxes);
  triples += " " + sam_onnx_export_with_io(dir.path(), "windowed_fp16", windowed, {17, true}, image, boxes);
  triples += " " + sam_onnx_export_with_io(dir.path(), "tiny_global", sam_onnx_tiny(", depth: 1"),
                                           {17, false}, image, boxes);
  const json results = sam_onnx_check("parity" + triples);
  REQUIRE(results.size() == 3 * 3 + 2);      // 3 outputs with the IoU head, 2 without
  sam_onnx_check_rows(results, 1e-4, 3e-2);  // fp16: 11 significant bits per weight
  CHECK_FALSE(st::has_temporaries(dir.path()));
}

TEST_CASE("segflow's SAM ONNX export at the vit_b preset (1024 x 1024; manual: SEGFLOW_SAM_ONNX_VIT_B=1)") {
  if (std::getenv("SEGFLOW_SAM_ONNX_VIT_B") == nullptr) {
    st::skip_case("minutes on a CPU; set SEGFLOW_SAM_ONNX_VIT_B=1 to run it");
    return;
  }
  st::TempDir dir("export_onnx_sam_vit_b");
  const at::Tensor image = sam_onnx_real_slice(1024);
  const at::Tensor boxes = torch::tensor({{200.0F, 260.0F, 700.0F, 800.0F}});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string triple = sam_onnx_export_with_io(
      dir.path(), "vit_b", "{name: sam, preset: vit_b, spatial_dims: 2, in_channels: 3, out_channels: 1}",
      {17, false}, image, boxes);
  const auto t1 = std::chrono::steady_clock::now();
  const json results = sam_onnx_check("parity " + triple);
  const auto t2 = std::chrono::steady_clock::now();
  MESSAGE("vit_b: segflow forward + export " << std::chrono::duration<double>(t1 - t0).count()
                                             << " s, onnxruntime encoder + decoder (with session setup) "
                                             << std::chrono::duration<double>(t2 - t1).count() << " s");
  REQUIRE(results.size() == 3);
  sam_onnx_check_rows(results, 1e-4, 1e-4);
}

namespace {

/// A seeded, untrained SAM checkpoint of `job` at dir/<name>.pt, exported by the CLI to
/// dir/out/<name>.onnx; the manifest's JSON (the printed line checked).
json sam_onnx_cli_export(const fs::path& dir, const std::string& name, const std::string& job) {
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(job, "job.yaml"));
  torch::manual_seed(7);
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  REQUIRE_OK(t->save_checkpoint(dir / (name + ".pt")));
  const fs::path out = dir / "out" / (name + ".onnx");
  fs::create_directories(out.parent_path());
  auto r =
      st::run_command(st::shell_quote(st::segflow_bin()) + " export --checkpoint " +
                      st::shell_quote(dir / (name + ".pt")) + " --to onnx " + st::shell_quote(out) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const json printed = json::parse(r.out.substr(r.out.rfind('{')));
  CHECK(printed["family"] == "sam");
  REQUIRE(printed["onnx"].size() == 2);
  CHECK(printed["onnx"][0] == (dir / "out" / (name + ".encoder.onnx")).string());
  CHECK(printed["onnx"][1] == (dir / "out" / (name + ".decoder.onnx")).string());
  CHECK_FALSE(fs::exists(out));
  return json::parse(st::read_file(dir / "out" / (name + ".manifest.json")));
}

struct SamOnnxInput {
  fs::path image;
  std::vector<std::array<double, 6>> boxes;  ///< label, slice, x0, y0, x1, y1 (voxels)
};

/// `segflow infer --boxes` with dir/<name>.pt on each input against sam_onnx_check.py infer
/// driven by dir/out/<name>.manifest.json: > 99.9% of the voxels equal.
void sam_onnx_compare_infer(const fs::path& dir, const std::string& name,
                            const std::vector<SamOnnxInput>& inputs) {
  for (const SamOnnxInput& in : inputs) {
    CAPTURE(in.image);
    const std::string stem = name + "_" + in.image.stem().stem().string();
    const fs::path boxes = dir / (stem + "_boxes.json"), seg = dir / (stem + "_seg.nii.gz");
    st::write_file(boxes, sam_onnx_boxes_json(in.boxes));
    auto inf = st::run_command(st::shell_quote(st::segflow_bin()) + " infer --checkpoint " +
                               st::shell_quote(dir / (name + ".pt")) + " --input " +
                               st::shell_quote(in.image) + " --output " + st::shell_quote(seg) + " --boxes " +
                               st::shell_quote(boxes) + " --device cpu --quiet 2>&1");
    REQUIRE_MESSAGE(inf.exit_code == 0, inf.out);
    const json j =
        sam_onnx_check("infer " + st::shell_quote(dir / "out" / (name + ".manifest.json")) + " " +
                       st::shell_quote(in.image) + " " + st::shell_quote(boxes) + " " + st::shell_quote(seg));
    MESSAGE(stem << ": onnxruntime + manifest vs segflow infer --boxes: " << j.dump());
    CHECK(j["segflow_foreground"].get<int64_t>() > 0);
    CHECK(j["box_agreement"].get<double>() > 0.999);
    CHECK(j["agreement"].get<double>() > 0.999);
  }
}

/// The real CT (122 x 101 x 30: slices neither square nor of the model's size) with two boxes.
SamOnnxInput sam_onnx_real_input() {
  return {st::testdata_path("totalsegmentator/example_ct_sm.nii.gz"),
          {{1, 15, 20, 15, 90, 80}, {1, 12, 50, 30, 110, 95}}};
}

}  // namespace

TEST_CASE(
    "segflow export --to onnx of a SAM checkpoint: its manifest drives onnxruntime to segflow infer "
    "--boxes' masks") {
  st::TempDir dir("export_onnx_sam_infer");
  auto s = st::run_command(st::shell_quote(st::segflow_bin()) +
                           " synth --cases 1 --size 32 --format nifti --seed 9 --out " +
                           st::shell_quote(dir / "data") + " 2>&1");
  REQUIRE_MESSAGE(s.exit_code == 0, s.out);
  const json m = sam_onnx_cli_export(
      dir.path(), "sam",
      sam_onnx_job(dir.path(), sam_onnx_tiny(", depth: 2, iou_head: true, use_rel_pos: true, window_size: 3, "
                                             "global_attn_indexes: [1]")));
  CHECK(m["model"]["image_size"] == 32);
  CHECK(m["model"]["encoder"]["file"] == "sam.encoder.onnx");
  CHECK(m["model"]["decoder"]["outputs"].size() == 2);  // low_res_masks, iou_predictions
  CHECK(m["model"]["decoder"]["outputs"][0]["shape"] == json::array({"batch", 1, 32, 32}));
  CHECK(m["postprocessing"]["mask_threshold"] == 0.5);
  CHECK(m["preprocessing"]["slice"]["resize_longest_side"] == 0);
  REQUIRE(m["preprocessing"]["stages"].size() == 2);  // load, the CT window: before medsam_box
  CHECK(m["preprocessing"]["stages"][1]["name"] == "scale_intensity_range");
  // A synthetic case at the model's size (two overlapping boxes on one slice) and real CT.
  sam_onnx_compare_infer(
      dir.path(), "sam",
      {{dir / "data" / "imagesTr" / "case_000_0000.nii.gz", {{1, 10, 4, 6, 20, 22}, {2, 10, 12, 10, 28, 30}}},
       sam_onnx_real_input()});
  CHECK_FALSE(st::has_temporaries(dir / "out"));
}

TEST_CASE(
    "segflow export --to onnx of a SAM trained through resize_longest_side: the manifest's resize, pad and "
    "crop give segflow infer --boxes' masks") {
  st::TempDir dir("export_onnx_sam_longest");
  const json m =
      sam_onnx_cli_export(dir.path(), "lite", sam_onnx_job(dir.path(), sam_onnx_tiny(", depth: 1"), true));
  CHECK(m["preprocessing"]["slice"]["resize_longest_side"] == 32);
  sam_onnx_compare_infer(dir.path(), "lite", {sam_onnx_real_input()});
}

TEST_CASE("segflow export --to onnx of a SAM: bad input is named and leaves nothing behind") {
  st::TempDir dir("export_onnx_sam_bad");
  REQUIRE_OK_AND_ASSIGN(
      auto cfg, models::parse_job_config(sam_onnx_job(dir.path(), sam_onnx_tiny(", depth: 1")), "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
  // An opset the ONNX library does not check: the encoder is refused before anything is written.
  const Status old = models::write_onnx_model(cfg.model, t->model().module(), dir / "sam.onnx", {12, false});
  CHECK(old.code() == ErrorCode::invalid_argument);
  CHECK_MESSAGE(old.message().find("opset 12: expected 13..17") != std::string::npos, old.message());
  CHECK_MESSAGE(old.message().find("sam_image_encoder") != std::string::npos, old.message());
  for (const auto& f : models::sam_onnx_files(dir / "sam.onnx")) CHECK_FALSE(fs::exists(f));
  // Through the CLI: the opset, and an output folder that does not exist (nothing half-written).
  REQUIRE_OK(t->save_checkpoint(dir / "sam.pt"));
  const std::string bin = st::shell_quote(st::segflow_bin());
  auto opset = st::run_command(bin + " export --checkpoint " + st::shell_quote(dir / "sam.pt") +
                               " --to onnx " + st::shell_quote(dir / "o.onnx") + " --opset 18 2>&1");
  CHECK(opset.exit_code == 2);
  CHECK_MESSAGE(opset.out.find("--opset: expected 13..17, got 18") != std::string::npos, opset.out);
  auto nodir = st::run_command(bin + " export --checkpoint " + st::shell_quote(dir / "sam.pt") +
                               " --to onnx " + st::shell_quote(dir / "missing" / "o.onnx") + " 2>&1");
  CHECK(nodir.exit_code != 0);
  CHECK_MESSAGE(nodir.out.find("missing") != std::string::npos, nodir.out);
  for (const char* f : {"o.encoder.onnx", "o.decoder.onnx", "o.manifest.json"})
    CHECK_FALSE(fs::exists(dir / f));
  CHECK_FALSE(fs::exists(dir / "missing"));
  CHECK_FALSE(st::has_temporaries(dir.path()));
}
