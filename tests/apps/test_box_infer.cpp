// Box-prompted inference (`segflow infer --boxes / --boxes-from / --propagate`): the label map
// equals the SAM forward called slice by slice with the same boxes; propagation follows an
// object through its slices and stops where it vanishes; patient-coordinate boxes equal their
// voxel boxes; bad box files are refused, naming file, field and expectation; a DICOM input
// yields a SEG that pydicom reads with one segment per label.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

#include "job_yaml.hpp"
#include "models/inference/box_inference.hpp"
#include "models/nets/sam.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/transforms/medsam.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::run_segflow;
using segflow::testing::TempDir;
namespace fs = std::filesystem;
namespace F = torch::nn::functional;

namespace {

/// A tiny SAM job (img 32, patch 4) on synthetic 32^3 CT under dir/data; CT window, medsam_box.
std::string box_sam_job(const fs::path& dir) {
  testing::JobYaml job;
  job.name = "box-infer";
  job.seed = "5";
  job.root = dir / "data";
  job.synth = "{cases: 2, size: 32, format: nifti, seed: 9}";
  job.num_classes = "2";
  job.stages = {testing::kLoadStage, testing::kCtWindowStage,
                testing::stage("medsam_box", "{image_size: 32, bbox_shift: 2, num_samples: 2}")};
  job.model =
      "{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, depth: 1, num_heads: 2, "
      "spatial_dims: 2, in_channels: 3, out_channels: 1}";
  job.loss = "{name: dice_bce, sigmoid: true, to_onehot_y: false}";
  job.optimizer = "{name: adamw, lr: 0.001}";
  job.epochs = 1;
  job.train = "batch_size: 4, device: cpu, val_interval: 0, loader: simple, threads: 1";
  job.validation = "";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

/// An untrained (seeded) SAM checkpoint of sam_job, with its synthetic data made first.
fs::path box_sam_checkpoint(const fs::path& dir) {
  auto s = run_segflow(
      "synth --cases 1 --size 32 --format nifti --seed 9 --out " + testing::shell_quote(dir / "data"), dir);
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(box_sam_job(dir), "job.yaml"));
  torch::manual_seed(7);
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device("cpu")));
  const fs::path file = dir / "sam.pt";
  REQUIRE_OK(t->save_checkpoint(file));
  return file;
}

std::string bq(const fs::path& p) { return testing::shell_quote(p.string()); }

at::Tensor box_voxels(const fs::path& p) {
  REQUIRE_OK_AND_ASSIGN(auto img, pipeline::read_image(p));
  return img.voxels;
}

/// The SAM of `ckpt` applied here, slice by slice: the CT window, the slice repeated to three
/// channels and resized to 32 x 32, the box scaled to that frame, SamImpl::forward_full, its
/// low-resolution logits resized to the slice, sigmoid. One box per call.
models::SliceSegmenter box_manual_segmenter(const fs::path& ckpt, const at::Tensor& image) {
  auto loaded = models::load_for_inference(ckpt, "cpu");
  REQUIRE_OK(loaded.status());
  std::shared_ptr<models::Trainer> t(std::move(*loaded));
  const at::Tensor win = ((image.to(at::kFloat) + 200.0) / 500.0).clamp(0.0, 1.0);  // (1, Z, Y, X)
  return [t, win](std::int64_t z, const std::vector<models::SliceBox>& boxes) -> Result<at::Tensor> {
    auto& sam = dynamic_cast<models::SamImpl&>(t->model().module());
    sam.eval();
    torch::NoGradGuard ng;
    const std::int64_t H = win.size(2), W = win.size(3);
    std::vector<at::Tensor> out;
    for (const auto& b : boxes) {
      at::Tensor x = win.select(1, z).repeat({3, 1, 1}).unsqueeze(0);
      if (H != 32 || W != 32)
        x = F::interpolate(x, F::InterpolateFuncOptions()
                                  .size(std::vector<std::int64_t>{32, 32})
                                  .mode(torch::kBilinear)
                                  .align_corners(false));
      const double sx = 32.0 / W, sy = 32.0 / H;
      at::Tensor box =
          torch::tensor({{b.x0 * sx, b.y0 * sy, (b.x1 + 1) * sx - 1, (b.y1 + 1) * sy - 1}}, at::kFloat);
      at::Tensor logits = sam.forward_full(x, box).low_res_masks;
      logits = F::interpolate(logits, F::InterpolateFuncOptions()
                                          .size(std::vector<std::int64_t>{H, W})
                                          .mode(torch::kBilinear)
                                          .align_corners(false));
      out.push_back(torch::sigmoid(logits)[0][0]);
    }
    return torch::stack(out);
  };
}

/// The label map of `boxes` by the manual segmenter, merged here: highest probability above
/// 0.5 wins, the earlier box on a tie.
at::Tensor box_manual_labels(const fs::path& ckpt, const at::Tensor& image,
                             const std::vector<models::SliceBox>& boxes) {
  const auto segment = box_manual_segmenter(ckpt, image);
  const std::int64_t Z = image.size(1), H = image.size(2), W = image.size(3);
  at::Tensor labels = torch::zeros({Z, H, W}, at::kLong), best = torch::zeros({Z, H, W});
  for (const auto& b : boxes) {
    REQUIRE_OK_AND_ASSIGN(at::Tensor p, segment(b.slice, {b}));
    const at::Tensor take = (p[0] > 0.5) & (p[0] > best[b.slice]);
    best[b.slice] = torch::where(take, p[0], best[b.slice]);
    labels[b.slice] = torch::where(take, torch::full_like(labels[b.slice], b.label), labels[b.slice]);
  }
  return labels.unsqueeze(0);
}

std::string box_file_json(const std::vector<models::SliceBox>& boxes) {
  nlohmann::json j = {{"space", "voxel"}, {"boxes", nlohmann::json::array()}};
  for (const auto& b : boxes)
    j["boxes"].push_back(
        {{"label", b.label}, {"slice", b.slice}, {"x0", b.x0}, {"y0", b.y0}, {"x1", b.x1}, {"y1", b.y1}});
  return j.dump();
}

/// Box inference options for `scan` written as dir/<name>.nii.gz with `boxes` as dir/<name>.json
/// (voxel space), on the CPU, output dir/<name>_out.nii.gz.
models::BoxInferOptions box_scan_options(const fs::path& dir, const std::string& name,
                                         const pipeline::Image& scan,
                                         const std::vector<models::SliceBox>& boxes, const fs::path& ckpt) {
  REQUIRE_OK(pipeline::write_nifti(dir / (name + ".nii.gz"), scan));
  testing::write_file(dir / (name + ".json"), box_file_json(boxes));
  models::BoxInferOptions o;
  o.checkpoint = ckpt;
  o.input = dir / (name + ".nii.gz");
  o.output = dir / (name + "_out.nii.gz");
  o.device = "cpu";
  o.boxes = dir / (name + ".json");
  return o;
}

}  // namespace

TEST_CASE("box inference equals the SAM forward called slice by slice with the same boxes") {
  TempDir dir("box_infer_exact");
  const fs::path ckpt = box_sam_checkpoint(dir.path());
  const fs::path input = dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz";
  // Two labels on one slice (overlapping boxes: the merge rule decides), one on another.
  const std::vector<models::SliceBox> boxes = {
      {1, 10, 4, 6, 20, 22}, {2, 10, 12, 10, 28, 30}, {1, 14, 8, 8, 24, 24}};
  testing::write_file(dir.path() / "boxes.json", box_file_json(boxes));
  auto r = run_segflow("infer --checkpoint " + bq(ckpt) + " --input " + bq(input) + " --output " +
                           bq(dir.path() / "out.nii.gz") + " --boxes " + bq(dir.path() / "boxes.json") +
                           " --device cpu",
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["slices_embedded"] == 2);  // slices 10 and 14: one image embedding each
  const at::Tensor got = box_voxels(dir.path() / "out.nii.gz").to(at::kLong);
  const at::Tensor want = box_manual_labels(ckpt, box_voxels(input), boxes);
  CHECK((want > 0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(got, want));
  // The synthetic data's names (dataset.json) name the segments.
  CHECK(j["segments"][0]["name"] == "liver");
  CHECK(j["segments"][1]["name"] == "spleen");

  // A 24^3 scan: the slice is resized to 32 x 32 and the box scaled as medsam_box does.
  REQUIRE_OK_AND_ASSIGN(auto img, pipeline::read_image(input));
  img.voxels = img.voxels.slice(1, 0, 24).slice(2, 4, 28).slice(3, 2, 26).contiguous();
  const std::vector<models::SliceBox> small = {{1, 10, 3, 5, 15, 17}, {2, 12, 9, 7, 22, 21}};
  REQUIRE_OK_AND_ASSIGN(auto res,
                        models::run_box_inference(box_scan_options(dir.path(), "small", img, small, ckpt)));
  const at::Tensor want_small = box_manual_labels(ckpt, img.voxels, small);
  CHECK((want_small > 0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(box_voxels(res.result.output).to(at::kLong), want_small));
}

TEST_CASE("box inference takes a checkpoint trained through resize_longest_side (MedSAM's recipe)") {
  // medsam_box at the slice's own size, then the longest side to the model's 32 and padding:
  // each slice is resized and padded as the training stage does, the box scaled by the same
  // factor, and the low-resolution mask brought up to 32 x 32, cut to the unpadded part and
  // resized to the slice (LiteMedSAM's inference).
  TempDir dir("box_infer_longest");
  auto s = run_segflow("synth --cases 1 --size 32 --format nifti --seed 9 --out " + bq(dir.path() / "data"),
                       dir.path());
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  auto job_with = [&](const std::string& resize) {
    std::string yaml = box_sam_job(dir.path());
    const std::string from = "medsam_box, options: {image_size: 32, bbox_shift: 2, num_samples: 2}}";
    const auto at = yaml.find(from);
    REQUIRE(at != std::string::npos);
    return yaml.replace(at, from.size(),
                        "medsam_box, options: {image_size: 0, bbox_shift: 2, num_samples: 2}}\n  - {name: "
                        "resize_longest_side, options: " +
                            resize + "}");
  };
  auto checkpoint = [&](const std::string& resize, const fs::path& file) {
    REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(job_with(resize), "job.yaml"));
    torch::manual_seed(7);
    REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device("cpu")));
    REQUIRE_OK(t->save_checkpoint(file));
  };
  const fs::path ckpt = dir.path() / "sam_longest.pt";
  checkpoint("{size: 32}", ckpt);
  // A scan of 16 x 24 x 32 (x, y, z): its slices are neither square nor of the model's size.
  REQUIRE_OK_AND_ASSIGN(auto img,
                        pipeline::read_image(dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz"));
  img.voxels = img.voxels.slice(2, 4, 28).slice(3, 6, 22).contiguous();
  const std::vector<models::SliceBox> boxes = {{1, 10, 2, 5, 12, 20}, {2, 14, 4, 6, 14, 22}};
  models::BoxInferOptions o = box_scan_options(dir.path(), "narrow", img, boxes, ckpt);
  REQUIRE_OK_AND_ASSIGN(auto res, models::run_box_inference(o));

  REQUIRE_OK_AND_ASSIGN(auto loaded, models::load_for_inference(ckpt, "cpu"));
  auto& sam = dynamic_cast<models::SamImpl&>(loaded->model().module());
  sam.eval();
  torch::NoGradGuard ng;
  const at::Tensor win = ((img.voxels.to(at::kFloat) + 200.0) / 500.0).clamp(0.0, 1.0);
  const std::int64_t Z = win.size(1), H = win.size(2), W = win.size(3);
  REQUIRE(H == 24);
  REQUIRE(W == 16);
  at::Tensor labels = torch::zeros({Z, H, W}, at::kLong);
  for (const auto& b : boxes) {
    // The training stage's resize on the (C, Y, X) slice: 24 x 16 -> 32 x 21, padded to 32 x 32.
    const at::Tensor x =
        pipeline::resize_longest_side(win.select(1, b.slice).repeat({3, 1, 1}), 32, false, true).unsqueeze(0);
    REQUIRE(x.size(2) == 32);
    REQUIRE(x.size(3) == 32);
    const double k = 32.0 / 24.0;  // size / longest side
    at::Tensor box = torch::tensor({{b.x0 * k, b.y0 * k, b.x1 * k, b.y1 * k}}, at::kFloat);
    at::Tensor logits = sam.forward_full(x, box).low_res_masks;
    logits = F::interpolate(logits, F::InterpolateFuncOptions()
                                        .size(std::vector<std::int64_t>{32, 32})
                                        .mode(torch::kBilinear)
                                        .align_corners(false))
                 .narrow(2, 0, 32)
                 .narrow(3, 0, 21);
    logits = F::interpolate(logits, F::InterpolateFuncOptions()
                                        .size(std::vector<std::int64_t>{H, W})
                                        .mode(torch::kBilinear)
                                        .align_corners(false));
    const at::Tensor p = torch::sigmoid(logits)[0][0];
    labels[b.slice] = torch::where(p > 0.5, torch::full_like(labels[b.slice], b.label), labels[b.slice]);
  }
  CHECK((labels > 0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(box_voxels(res.result.output).to(at::kLong), labels.unsqueeze(0)));

  // A resize to another size than the model's input is refused, naming the stage and field.
  checkpoint("{size: 64}", dir.path() / "sam_64.pt");
  o.checkpoint = dir.path() / "sam_64.pt";
  o.output = dir.path() / "out64.nii.gz";
  auto refused = models::run_box_inference(o);
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().message().find(
            "resize_longest_side): size: expected the model's img_size 32, got 64") != std::string::npos);
  CHECK_FALSE(fs::exists(o.output));
}

TEST_CASE("propagation follows an object through its slices and stops where its mask vanishes") {
  // A cylinder (label 1, slices 5..14) and a sphere (label 2, radius 4 around slice 10) on a
  // 20 x 24 x 28 grid; an oracle segmenter answers the ground truth inside the box.
  const std::int64_t Z = 20, Y = 24, X = 28;
  auto zz = torch::arange(Z).view({Z, 1, 1}), yy = torch::arange(Y).view({1, Y, 1}),
       xx = torch::arange(X).view({1, 1, X});
  at::Tensor gt = torch::zeros({Z, Y, X}, at::kLong);
  gt.masked_fill_(((xx - 8).pow(2) + (yy - 8).pow(2) <= 16) & (zz >= 5) & (zz <= 14), 1);
  gt.masked_fill_(((xx - 19).pow(2) + (yy - 15).pow(2) + (zz - 10).pow(2) <= 16), 2);
  std::map<std::int64_t, std::set<std::int64_t>> seen;  // label -> slices it was prompted on
  const models::SliceSegmenter oracle = [&](std::int64_t z, const std::vector<models::SliceBox>& boxes) {
    at::Tensor p = torch::full({static_cast<std::int64_t>(boxes.size()), Y, X}, 0.1);
    for (std::size_t i = 0; i < boxes.size(); ++i) {
      const auto& b = boxes[i];
      seen[b.label].insert(z);
      const at::Tensor in = (xx[0] >= b.x0) & (xx[0] <= b.x1) & (yy[0] >= b.y0) & (yy[0] <= b.y1);
      p[static_cast<std::int64_t>(i)].masked_fill_(in & (gt[z] == b.label), 0.9);
    }
    return Result<at::Tensor>(p);
  };
  const Size3 size{X, Y, Z};
  const auto seeds = models::seed_boxes_from_label_map(gt.unsqueeze(0));
  REQUIRE(seeds.size() == 2);
  CHECK(seeds[0].slice == 9);  // the lower middle of slices 5..14
  CHECK(seeds[1].slice == 10);
  REQUIRE_OK_AND_ASSIGN(auto m, models::propagate_boxes(seeds, size, models::kDefaultBoxMargin, oracle));
  CHECK(torch::equal(m.labels, gt));
  // Prompted from the seed to the first empty slice on each side, no further.
  std::set<std::int64_t> cyl, sph;
  for (std::int64_t z = 4; z <= 15; ++z) cyl.insert(z);
  for (std::int64_t z = 5; z <= 15; ++z) sph.insert(z);
  CHECK(seen[1] == cyl);
  CHECK(seen[2] == sph);

  // A seed box that only covers part of the object: the margin grows it slice by slice.
  seen.clear();
  auto seed = seeds[0];
  seed.x0 += 2;
  REQUIRE_OK_AND_ASSIGN(auto part, models::propagate_boxes({seed}, size, 1, oracle));
  CHECK((part.labels == 1).sum().item<std::int64_t>() > 0);
  CHECK(seen[1] == cyl);
  // Boxes of every slice (MedSAM's evaluation): the ground truth back, one call per slice.
  std::int64_t calls = 0;
  const models::SliceSegmenter counted = [&](std::int64_t z, const std::vector<models::SliceBox>& b) {
    ++calls;
    return oracle(z, b);
  };
  REQUIRE_OK_AND_ASSIGN(auto all,
                        models::segment_boxes(models::boxes_from_label_map(gt.unsqueeze(0)), size, counted));
  CHECK(torch::equal(all.labels, gt));
  CHECK(calls == 10);  // slices 5..14 hold a label
  auto twice = models::propagate_boxes({seeds[0], seeds[0]}, size, 3, oracle);
  REQUIRE_FALSE(twice.is_ok());
  CHECK(twice.status().message().find("expected one seed box per label") != std::string::npos);
}

TEST_CASE("boxes in patient coordinates give the voxel boxes' result; --propagate and --boxes-from run") {
  TempDir dir("box_infer_patient");
  const fs::path ckpt = box_sam_checkpoint(dir.path());
  // The scan on an oblique, anisotropic grid, so that mm and voxels differ on every axis.
  REQUIRE_OK_AND_ASSIGN(auto img,
                        pipeline::read_image(dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz"));
  img.geometry.spacing = {0.8, 0.7, 2.5};
  img.geometry.origin = {-10.0, 20.0, 30.0};
  const double c = std::cos(0.3), s = std::sin(0.3);
  img.geometry.direction = {c, -s, 0, s, c, 0, 0, 0, 1};
  const fs::path input = dir.path() / "oblique.nii.gz";
  REQUIRE_OK(pipeline::write_nifti(input, img));
  REQUIRE_OK_AND_ASSIGN(img, pipeline::read_image(input));
  const std::vector<models::SliceBox> boxes = {{1, 11, 5, 6, 20, 22}, {2, 16, 10, 9, 27, 29}};
  testing::write_file(dir.path() / "voxel.json", box_file_json(boxes));
  std::string csv = "label,x0,y0,z0,x1,y1,z1\n";
  for (const auto& b : boxes) {
    const auto p0 = index_to_physical(img.geometry, {b.x0, b.y0, static_cast<double>(b.slice)});
    const auto p1 = index_to_physical(img.geometry, {b.x1, b.y1, static_cast<double>(b.slice)});
    csv += (b.label == 1 ? "liver" : "2");
    for (double v : {p0[0], p0[1], p0[2], p1[0], p1[1], p1[2]}) csv += "," + std::to_string(v);
    csv += "\n";
  }
  testing::write_file(dir.path() / "mm.csv", csv);
  auto run = [&](const std::string& extra, const std::string& out) {
    auto r = run_segflow("infer --checkpoint " + bq(ckpt) + " --input " + bq(input) + " --output " +
                             bq(dir.path() / out) + " --device cpu " + extra,
                         dir.path());
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return nlohmann::json::parse(r.out);
  };
  run("--boxes " + bq(dir.path() / "voxel.json"), "voxel.nii.gz");
  run("--boxes " + bq(dir.path() / "mm.csv"), "mm.nii.gz");
  const at::Tensor a = box_voxels(dir.path() / "voxel.nii.gz"), b = box_voxels(dir.path() / "mm.nii.gz");
  CHECK((a > 0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(a, b));

  // --propagate: the CLI equals propagate_boxes over the manual segmenter (the same slices,
  // boxes and masks); one label's slices are contiguous and hold its seed.
  testing::write_file(dir.path() / "one.json", box_file_json({boxes[0]}));
  auto p = run("--boxes " + bq(dir.path() / "one.json") + " --propagate --box-margin 2", "prop.nii.gz");
  REQUIRE_OK_AND_ASSIGN(auto manual, models::propagate_boxes({boxes[0]}, img.size(), 2,
                                                             box_manual_segmenter(ckpt, img.voxels)));
  const at::Tensor prop = box_voxels(dir.path() / "prop.nii.gz")[0].to(at::kLong);
  CHECK(torch::equal(prop, manual.labels));
  const auto& span = p["segments"][0];
  REQUIRE(span["voxels"].get<std::int64_t>() > 0);
  CHECK(span["first_slice"].get<std::int64_t>() <= 11);
  CHECK(span["last_slice"].get<std::int64_t>() >= 11);
  CHECK((prop == 1).flatten(1).any(1).sum().item<std::int64_t>() ==
        span["last_slice"].get<std::int64_t>() - span["first_slice"].get<std::int64_t>() + 1);
  auto two = run("--boxes " + bq(dir.path() / "voxel.json") + " --propagate", "prop2.nii.gz");
  CHECK(two["segments"].size() == 2);
  // --boxes-from the case's label map (its grid moved the same way).
  REQUIRE_OK_AND_ASSIGN(auto lab, pipeline::read_image(dir.path() / "data" / "labelsTr" / "case_000.nii.gz"));
  lab.geometry = img.geometry;
  REQUIRE_OK(pipeline::write_nifti(dir.path() / "lab.nii.gz", lab));
  auto f = run("--boxes-from " + bq(dir.path() / "lab.nii.gz"), "from.nii.gz");
  const auto expect = models::boxes_from_label_map(lab.voxels);
  const at::Tensor want = box_manual_labels(ckpt, img.voxels, expect);
  CHECK(torch::equal(box_voxels(dir.path() / "from.nii.gz").to(at::kLong), want));
}

TEST_CASE("bad box files and options are refused with the file, the field and what was expected") {
  TempDir dir("box_infer_bad");
  const fs::path ckpt = box_sam_checkpoint(dir.path());
  const fs::path input = dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz";
  const fs::path out = dir.path() / "out.nii.gz";
  auto refused = [&](const std::string& name, const std::string& text, const std::string& extra = "") {
    const fs::path f = dir.path() / name;
    testing::write_file(f, text);
    auto r = run_segflow("infer --checkpoint " + bq(ckpt) + " --input " + bq(input) + " --output " + bq(out) +
                             " --device cpu --boxes " + bq(f) + " " + extra,
                         dir.path());
    CHECK(r.exit_code != 0);
    CHECK_FALSE(fs::exists(out));
    return r.err;
  };
  const std::string b = dir.path().string() + "/";
  CHECK(refused("missing.json", R"({"boxes": [{"label": 1, "slice": 3, "x0": 1, "y0": 1, "x1": 5}]})") ==
        "segflow infer: " + b +
            "missing.json: boxes[0]: missing field 'y1' (expected label, slice, x0, y0, x1, y1 "
            "for space voxel)\n");
  CHECK(refused("outside.csv", "label,slice,x0,y0,x1,y1\n1,3,1,1,5,5\n1,4,2,2,40,9\n") ==
        "segflow infer: " + b +
            "outside.csv: line 3.x1: expected a voxel index in [0, 31] (the image's columns), "
            "got 40\n");
  CHECK(refused("slice.json",
                R"({"boxes": [{"label": 1, "slice": 19, "x0": 1, "y0": 1, "x1": 5, "y1": 5}]})") ==
        "segflow infer: " + b +
            "slice.json: boxes[0].slice: expected a voxel index in [0, 18] (the image's slices), "
            "got 19\n");
  const std::string known = "expected one of 1 (liver), 2 (spleen), 3 (kidney), 4 (spine)";
  CHECK(refused("name.json",
                R"({"boxes": [{"label": "lung", "slice": 3, "x0": 1, "y0": 1, "x1": 5, "y1": 5}]})") ==
        "segflow infer: " + b + "name.json: boxes[0].label: unknown label \"lung\"; " + known + "\n");
  CHECK(
      refused("seven.json", R"({"boxes": [{"label": 7, "slice": 3, "x0": 1, "y0": 1, "x1": 5, "y1": 5}]})") ==
      "segflow infer: " + b + "seven.json: boxes[0].label: unknown label 7; " + known + "\n");
  CHECK(refused("empty.json", R"({"boxes": [{"label": 1, "slice": 3, "x0": 9, "y0": 1, "x1": 5, "y1": 5}]})")
            .find("empty.json: boxes[0]: expected x0 <= x1 and y0 <= y1 (an empty box)") !=
        std::string::npos);
  CHECK(refused("space.json", R"({"space": "world", "boxes": []})") ==
        "segflow infer: " + b + "space.json: space: expected \"voxel\" or \"patient\", got \"world\"\n");
  CHECK(refused("two.json",
                R"({"boxes": [{"label": 1, "slice": 3, "x0": 1, "y0": 1, "x1": 5, "y1": 5},
                              {"label": 1, "slice": 8, "x0": 1, "y0": 1, "x1": 5, "y1": 5}]})",
                "--propagate")
            .find("label 1 has seed boxes on slices 3 and 8; expected one seed box per label") !=
        std::string::npos);
  // A UNet checkpoint given boxes.
  testing::JobYaml unet;
  unet.root = dir.path() / "data";
  unet.runs_dir = dir.path() / "runs";
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(unet.yaml(), "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device("cpu")));
  REQUIRE_OK(t->save_checkpoint(dir.path() / "unet.pt"));
  testing::write_file(dir.path() / "ok.json",
                      R"({"boxes": [{"label": 1, "slice": 3, "x0": 1, "y0": 1, "x1": 5, "y1": 5}]})");
  auto r = run_segflow("infer --checkpoint " + bq(dir.path() / "unet.pt") + " --input " + bq(input) +
                           " --output " + bq(out) + " --boxes " + bq(dir.path() / "ok.json"),
                       dir.path());
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("expected a box-prompted (sam) checkpoint, got a 'unet' model") != std::string::npos);
  // A SAM checkpoint without boxes: the plain infer path says how to give them.
  auto n = run_segflow("infer --checkpoint " + bq(ckpt) + " --input " + bq(input) + " --output " + bq(out),
                       dir.path());
  CHECK(n.exit_code != 0);
  CHECK(n.err.find("give --boxes FILE or --boxes-from LABELMAP") != std::string::npos);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("a DICOM input yields a DICOM SEG with one named segment per label that pydicom reads") {
  TempDir dir("box_infer_dicom");
  const fs::path ckpt = box_sam_checkpoint(dir.path());
  auto s = run_segflow("synth --cases 1 --size 32 --format dicom --seed 9 --out " + bq(dir.path() / "dicom"),
                       dir.path());
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  const fs::path series = dir.path() / "dicom" / "case_000";
  const std::vector<models::SliceBox> boxes = {
      {1, 10, 4, 6, 20, 22}, {2, 12, 12, 10, 28, 30}, {1, 11, 4, 6, 20, 22}};
  testing::write_file(dir.path() / "boxes.json", box_file_json(boxes));
  fs::create_directories(dir.path() / "out");
  auto r = run_segflow("infer --checkpoint " + bq(ckpt) + " --input " + bq(series) + " --output " +
                           bq(dir.path() / "out") + " --device cpu --boxes " + bq(dir.path() / "boxes.json") +
                           " --class-names bg,Liver,Spleen",
                       dir.path());
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const auto j = nlohmann::json::parse(r.out);
  const fs::path seg = dir.path() / "out" / "seg.dcm";
  CHECK(j["output"] == seg.string());
  // Frames: one per (segment, slice holding it); a segment without voxels gets one empty
  // frame. Counted on the same run written as NIfTI.
  auto n = run_segflow("infer --checkpoint " + bq(ckpt) + " --input " + bq(series) + " --output " +
                           bq(dir.path() / "labels.nii.gz") + " --device cpu --boxes " +
                           bq(dir.path() / "boxes.json"),
                       dir.path());
  REQUIRE_MESSAGE(n.exit_code == 0, n.err);
  const at::Tensor labels = box_voxels(dir.path() / "labels.nii.gz")[0];
  const std::int64_t top = labels.max().item<std::int64_t>();
  std::int64_t frames = 0;
  for (std::int64_t v = 1; v <= top; ++v)
    frames += std::max<std::int64_t>(1, (labels == v).flatten(1).any(1).sum().item<std::int64_t>());
  REQUIRE(top == 2);
  REQUIRE_OK_AND_ASSIGN(auto nii, pipeline::read_image(series));
  const std::string out = testing::run_python(
      "import sys, json, pydicom\n"
      "ds = pydicom.dcmread(sys.argv[1])\n"
      "print(json.dumps({'segments': [str(s.SegmentLabel) for s in ds.SegmentSequence],"
      " 'frames': int(ds.NumberOfFrames), 'rows': int(ds.Rows)}))\n",
      {seg.string()});
  const auto pj = nlohmann::json::parse(out);
  CHECK(pj["segments"] == nlohmann::json::array({"Liver", "Spleen"}));
  CHECK(pj["frames"] == frames);
  CHECK(pj["rows"] == nii.size()[1]);
}

TEST_CASE("a folder of scans takes a folder of prompts case by case; --amp bf16 follows float32") {
  TempDir dir("box_infer_folder");
  const fs::path ckpt = box_sam_checkpoint(dir.path());
  const fs::path image = dir.path() / "data" / "imagesTr" / "case_000_0000.nii.gz";
  const fs::path label = dir.path() / "data" / "labelsTr" / "case_000.nii.gz";
  // Three scans; label maps for a and b only; a box file for a only.
  fs::create_directories(dir.path() / "scans");
  fs::create_directories(dir.path() / "labels");
  fs::create_directories(dir.path() / "boxes");
  for (const char* id : {"a", "b", "c"})
    fs::copy_file(image, dir.path() / "scans" / (std::string(id) + ".nii.gz"));
  for (const char* id : {"a", "b"})
    fs::copy_file(label, dir.path() / "labels" / (std::string(id) + ".nii.gz"));
  testing::write_file(dir.path() / "boxes" / "a.json", box_file_json({{1, 11, 5, 6, 20, 22}}));
  auto infer = [&](const std::string& args) {
    return run_segflow("infer --checkpoint " + bq(ckpt) + " --device cpu " + args, dir.path());
  };
  // The single-scan runs the folder must reproduce.
  auto one = infer("--input " + bq(image) + " --boxes-from " + bq(label) + " --output " +
                   bq(dir.path() / "one.nii.gz"));
  REQUIRE_MESSAGE(one.exit_code == 0, one.err);
  auto one_box = infer("--input " + bq(image) + " --boxes " + bq(dir.path() / "boxes" / "a.json") +
                       " --output " + bq(dir.path() / "one_box.nii.gz"));
  REQUIRE_MESSAGE(one_box.exit_code == 0, one_box.err);

  auto f = infer("--input " + bq(dir.path() / "scans") + " --boxes-from " + bq(dir.path() / "labels") +
                 " --output " + bq(dir.path() / "out"));
  CHECK(f.exit_code == 1);  // c has no label map: reported, a and b written
  CHECK_MESSAGE(f.err.find("c: ") != std::string::npos, f.err);
  CHECK_MESSAGE(f.err.find("no label map for case c") != std::string::npos, f.err);
  CHECK_MESSAGE(f.err.find("2 of 3 cases written") != std::string::npos, f.err);
  const at::Tensor want = box_voxels(dir.path() / "one.nii.gz");
  for (const char* id : {"a", "b"}) {
    CAPTURE(id);
    REQUIRE(fs::exists(dir.path() / "out" / (std::string(id) + ".nii.gz")));
    CHECK(torch::equal(box_voxels(dir.path() / "out" / (std::string(id) + ".nii.gz")), want));
  }
  CHECK_FALSE(fs::exists(dir.path() / "out" / "c.nii.gz"));
  std::size_t lines = 0;
  for (std::size_t p = 0; (p = f.out.find('\n', p)) != std::string::npos; ++p) ++lines;
  CHECK(lines == 3);  // one JSON line per case, the failed one with its error

  auto fb = infer("--input " + bq(dir.path() / "scans") + " --boxes " + bq(dir.path() / "boxes") +
                  " --output " + bq(dir.path() / "outb"));
  CHECK(fb.exit_code == 1);
  CHECK_MESSAGE(fb.err.find("no box file b.json or .csv for case b") != std::string::npos, fb.err);
  REQUIRE(fs::exists(dir.path() / "outb" / "a.nii.gz"));
  CHECK(
      torch::equal(box_voxels(dir.path() / "outb" / "a.nii.gz"), box_voxels(dir.path() / "one_box.nii.gz")));
  // The checkpoint is loaded once for the folder: a missing one fails the run once, before any case.
  const fs::path missing = dir.path() / "missing.pt";
  auto no_ckpt =
      run_segflow("infer --checkpoint " + bq(missing) + " --device cpu --input " + bq(dir.path() / "scans") +
                      " --boxes-from " + bq(dir.path() / "labels") + " --output " + bq(dir.path() / "outm"),
                  dir.path());
  CHECK(no_ckpt.exit_code != 0);
  const std::size_t first = no_ckpt.err.find(missing.string());
  CHECK_MESSAGE(first != std::string::npos, no_ckpt.err);
  CHECK_MESSAGE(no_ckpt.err.find(missing.string(), first + 1) == std::string::npos, no_ckpt.err);
  CHECK(no_ckpt.out.empty());
  CHECK_FALSE(fs::exists(dir.path() / "outm"));
  auto not_folder = infer("--input " + bq(dir.path() / "scans") + " --boxes-from " + bq(label) +
                          " --output " + bq(dir.path() / "outx"));
  CHECK(not_folder.exit_code == 2);
  CHECK_MESSAGE(not_folder.err.find("a folder input takes a folder of label maps") != std::string::npos,
                not_folder.err);

  // --amp bf16 (autocast in the encoder and decoder, masks thresholded in float32): the same
  // label map on nearly every voxel; fp16 on a CPU is refused naming the setting.
  auto bf = infer("--input " + bq(image) + " --boxes-from " + bq(label) + " --amp bf16 --output " +
                  bq(dir.path() / "bf16.nii.gz"));
  REQUIRE_MESSAGE(bf.exit_code == 0, bf.err);
  const at::Tensor b16 = box_voxels(dir.path() / "bf16.nii.gz");
  const double agree = (b16 == want).to(at::kDouble).mean().item<double>();
  const double fg = (want > 0).to(at::kDouble).sum().item<double>();
  MESSAGE("bf16 vs float32 label agreement " << agree << " (float32 foreground " << fg << " voxels)");
  CHECK(fg > 0);
  CHECK(agree > 0.99);
  auto fp16 = infer("--input " + bq(image) + " --boxes-from " + bq(label) + " --amp fp16 --output " +
                    bq(dir.path() / "fp16.nii.gz"));
  CHECK(fp16.exit_code == 2);
  CHECK_MESSAGE(fp16.err.find("fp16") != std::string::npos, fp16.err);
  CHECK_FALSE(fs::exists(dir.path() / "fp16.nii.gz"));
}
