// End to end on real data nobody here wrote: a short training on TotalSegmentator's real CT
// series (the Siemens DICOM series of the totalsegmentator==2.18.0 sdist, lossless JPEG
// 2000, UIDs only in the meta header) with its 117-class label beside it (stored with a
// flipped row axis), keeping spleen, liver and kidneys; then `segflow infer` on the series
// writes a DICOM SEG that pydicom reads on the series grid, its segments named by the
// training's classes.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

using namespace segflow;
namespace fs = std::filesystem;
namespace st = segflow::testing;

namespace {

/// The SOP instance UID (from the meta header, where this series keeps it) and the
/// ImagePositionPatient of each file of a series.
std::map<std::string, std::array<double, 3>> source_positions(const fs::path& dir) {
  std::map<std::string, std::array<double, 3>> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    DcmFileFormat ff;
    REQUIRE(ff.loadFile(e.path().c_str()).good());
    OFString uid;
    REQUIRE(ff.getMetaInfo()->findAndGetOFString(DCM_MediaStorageSOPInstanceUID, uid).good());
    std::array<double, 3> p{};
    for (unsigned long i = 0; i < 3; ++i)
      REQUIRE(ff.getDataset()->findAndGetFloat64(DCM_ImagePositionPatient, p[i], i).good());
    out[uid.c_str()] = p;
  }
  return out;
}

}  // namespace

TEST_CASE(
    "a short training on the real CT series and its flipped label, then segflow infer on the series, writes "
    "a "
    "DICOM SEG on the series grid named by the training's classes") {
  const fs::path ts = st::testdata_path("totalsegmentator");
  const fs::path series = ts / "example_ct_dicom";
  st::TempDir dir("infer_real_ct");
  // Two DICOM case folders (the series and its label; one trains, one validates) and the
  // TotalSegmentator v2 class map (totalsegmentator 2.18.0, map_to_binary.py) as dataset.json.
  const fs::path data = dir / "data";
  for (const char* id : {"s01", "s02"}) {
    fs::create_directories(data / id);
    for (const auto& e : fs::directory_iterator(series))
      fs::copy_file(e.path(), data / id / e.path().filename());
    fs::copy_file(ts / "example_seg_dicom.nii.gz", data / id / "label.nii.gz");
  }
  st::write_file(
      data / "dataset.json",
      R"({"labels": {"background": 0, "spleen": 1, "kidney_right": 2, "kidney_left": 3, "liver": 5}})");
  st::JobYaml job;
  job.name = "ts-dicom";
  job.root = data;
  job.synth = job.num_classes = "";
  job.stages = {"load",
                st::stage("map_labels", "{keep: [1, 5, 2, 3]}"),
                st::stage("resample", "{spacing: [4.0, 4.0, 4.0]}"),
                st::kCtWindowStage,
                "fg_bg_indices",
                st::crop_stage("[48, 48, 8]", 3, 1, 2)};
  job.model = st::unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1");
  job.schedule = "";
  job.epochs = 3;
  job.train = "batch_size: 2, device: cpu, val_interval: 0, loader: simple, threads: 2";
  job.validation = "{roi_size: [48, 48, 8], overlap: 0.25}";
  job.runs_dir = dir / "runs";
  const std::string yaml = job.yaml();
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(yaml, "job.yaml"));
  models::TrainObserver quiet;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, quiet));
  const fs::path ckpt = run / "last.pt";

  const fs::path seg = dir / "ts_seg.dcm";
  auto r =
      st::run_command(st::shell_quote(st::segflow_bin()) + " infer --checkpoint " + st::shell_quote(ckpt) +
                      " --input " + st::shell_quote(series) + " --output " + st::shell_quote(seg) +
                      " --device cpu --quiet 2>" + st::shell_quote(dir / "err.txt"));
  REQUIRE_MESSAGE(r.exit_code == 0, st::read_file(dir / "err.txt"));
  const auto line = nlohmann::json::parse(r.out);
  const std::int64_t max_label = line["labels"].back().get<std::int64_t>();
  REQUIRE(max_label >= 1);

  // pydicom: a SEG of 512 x 512 frames with the series' pixel spacing and orientation, each
  // frame derived from a slice of the series and lying at that slice's position.
  REQUIRE_OK_AND_ASSIGN(auto img, pipeline::read_dicom(series));
  const auto js = st::reference_read("pydicom_seg", seg);
  INFO(js.dump().substr(0, 2000));
  CHECK(js["sop_class"] == "1.2.840.10008.5.1.4.1.1.66.4");
  CHECK(js["rows"] == 512);
  CHECK(js["columns"] == 512);
  const auto& g = img.geometry;
  CHECK(std::abs(js["pixel_spacing"][0].get<double>() - g.spacing[1]) < 1e-6);
  CHECK(std::abs(js["pixel_spacing"][1].get<double>() - g.spacing[0]) < 1e-6);
  for (int k = 0; k < 3; ++k) {
    CHECK(std::abs(js["orientation"][k].get<double>() - g.direction[k * 3 + 0]) < 1e-6);
    CHECK(std::abs(js["orientation"][3 + k].get<double>() - g.direction[k * 3 + 1]) < 1e-6);
  }
  // The series has no SeriesInstanceUID: the SEG references one derived from its instances.
  REQUIRE(js["referenced_series"].size() == 1);
  CHECK(js["referenced_series"][0].get<std::string>().rfind("2.25.", 0) == 0);
  const auto sources = source_positions(series);
  REQUIRE(sources.size() == 20);
  REQUIRE(js["frames"].size() >= 1);
  for (const auto& fr : js["frames"]) {
    REQUIRE(fr.contains("source_sop"));
    auto it = sources.find(fr["source_sop"].get<std::string>());
    REQUIRE(it != sources.end());
    for (int k = 0; k < 3; ++k) CHECK(std::abs(fr["position"][k].get<double>() - it->second[k]) < 1e-3);
  }
  // Segments named by the training's classes: dataset.json's names through map_labels keep.
  const std::vector<std::string> names = {"background", "spleen", "liver", "kidney_right", "kidney_left"};
  REQUIRE(js["segments"].size() == static_cast<std::size_t>(max_label));
  for (std::int64_t v = 1; v <= max_label; ++v) {
    CHECK(js["segments"][v - 1]["number"] == v);
    CHECK(js["segments"][v - 1]["label"] == names[static_cast<std::size_t>(v)]);
  }

  // The SEG holds the labels inferred: read onto the series grid it equals the NIfTI output
  // of the same inference, voxel for voxel.
  auto n = st::run_command(st::shell_quote(st::segflow_bin()) + " infer --checkpoint " +
                           st::shell_quote(ckpt) + " --input " + st::shell_quote(series) + " --output " +
                           st::shell_quote(dir / "ts.nii.gz") + " --device cpu --quiet 2>" +
                           st::shell_quote(dir / "err.txt"));
  REQUIRE_MESSAGE(n.exit_code == 0, st::read_file(dir / "err.txt"));
  REQUIRE_OK_AND_ASSIGN(auto nifti, pipeline::read_image(dir / "ts.nii.gz"));
  REQUIRE_OK_AND_ASSIGN(auto back, pipeline::read_dicom_seg(seg, img));
  CHECK(torch::equal(back.voxels.to(torch::kInt64), nifti.voxels.to(torch::kInt64)));
  CHECK(nifti.voxels.max().item<std::int64_t>() == max_label);
}
