// DICOM series assembly on real series nobody here wrote (Debian's pydicom test files, the
// Siemens CT series of the totalsegmentator sdist) and on copies of them edited with DCMTK:
// position jitter, a missing slice, localizers and other series in the folder, repeated
// positions split by echo, gantry tilt, blanked UIDs. Geometry and every voxel are checked
// against SimpleITK's ImageSeriesReader (GDCM) on the same folder.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>
#include <dcmtk/dcmdata/dcuid.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "dicom_test_data.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/npy.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
namespace sp = segflow::pipeline;
namespace st = segflow::testing;
using segflow::pipeline::Image;

namespace {

using st::contains;
using st::copy_series;
using st::edit_dicom_file;
using st::files_in;
using st::read_dicom_error;
using st::read_dicom_ok;

std::array<double, 3> position(DcmDataset& ds) {
  std::array<double, 3> p{};
  for (unsigned long i = 0; i < 3; ++i)
    REQUIRE(ds.findAndGetFloat64(DCM_ImagePositionPatient, p[i], i).good());
  return p;
}

void set_position(DcmDataset& ds, const std::array<double, 3>& p) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.6f\\%.6f\\%.6f", p[0], p[1], p[2]);
  REQUIRE(ds.putAndInsertString(DCM_ImagePositionPatient, buf).good());
}

/// SimpleITK's ImageSeriesReader on a folder (or a file): geometry from `reference.py sitk`
/// and the whole (C, Z, Y, X) array from `reference.py arrays sitk`.
struct SitkRead {
  nlohmann::json geometry;
  at::Tensor voxels;
};
SitkRead sitk_read(const fs::path& p) {
  st::TempDir dir("sitk_arrays");
  st::write_file(dir / "list.txt", p.string() + "\n");
  auto r = st::run_command(st::shell_quote(st::python()) + " " +
                           st::shell_quote(st::source_path("tests/tools/reference.py").string()) +
                           " arrays sitk " + st::shell_quote((dir / "list.txt").string()) + " " +
                           st::shell_quote(dir.path().string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto j = nlohmann::json::parse(r.out)[p.string()];
  INFO(j.dump());
  REQUIRE(j.contains("npy"));
  REQUIRE_OK_AND_ASSIGN(auto t, sp::read_npy(j["npy"].get<std::string>()));
  return {st::reference_read("sitk", p), t};
}

/// Size, spacing, origin, direction and every voxel equal to SimpleITK's reading.
void check_like_sitk(const Image& img, const SitkRead& ref, double spacing_rel = 1e-6) {
  const auto size = img.size();
  for (int i = 0; i < 3; ++i) {
    CHECK(size[i] == ref.geometry["size"][i].get<std::int64_t>());
    CHECK(img.geometry.spacing[i] ==
          doctest::Approx(ref.geometry["spacing"][i].get<double>()).epsilon(spacing_rel));
    CHECK(std::abs(img.geometry.origin[i] - ref.geometry["origin"][i].get<double>()) <= 1e-4);
  }
  for (int i = 0; i < 9; ++i)
    CHECK(std::abs(img.geometry.direction[i] - ref.geometry["direction"][i].get<double>()) <= 1e-6);
  REQUIRE((img.voxels.sizes() == ref.voxels.sizes()));
  CHECK(torch::equal(img.voxels, ref.voxels));
}

}  // namespace

TEST_CASE("DICOM slice positions that jitter within the tolerance read with the mean step, like SimpleITK") {
  // A GE-like series: positions rounded so that steps wander by up to 0.09 mm (3.6 % of the
  // 2.5 mm step) along the normal and 0.01 mm across it.
  st::TempDir dir("dicom_jitter");
  auto files = copy_series(st::ct5n_series(), dir.path());
  const double dz[] = {0.04, -0.05, 0.03, -0.02, 0.0};
  const double dx[] = {0.0, 0.01, -0.01, 0.0, 0.01};
  for (std::size_t i = 0; i < files.size(); ++i)
    edit_dicom_file(files[i], [&](DcmDataset& ds, DcmMetaInfo&) {
      auto p = position(ds);
      set_position(ds, {p[0] + dx[i], p[1], p[2] + dz[i]});
    });
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir.path(), &report);
  const SitkRead ref = sitk_read(dir.path());
  INFO(ref.geometry.dump());
  check_like_sitk(img, ref, 1e-5);
  CHECK(report.slices == 5);
  CHECK(report.identity == "SeriesInstanceUID");
  CHECK(report.slice_spacing_mm == doctest::Approx(img.geometry.spacing[2]));
  // Steps (sorted along z): 2.5+0.0-(-0.02)... the largest deviation from the mean step.
  CHECK(report.slice_spacing_max_deviation_mm > 0.03);
  CHECK(report.slice_spacing_max_deviation_mm < 0.1);
  REQUIRE_FALSE(report.warnings.empty());
  CHECK(contains(report.warnings.front(), "slice spacing is not uniform"));
  const nlohmann::json j = report;
  CHECK(j["slice_spacing_max_deviation_mm"].get<double>() ==
        doctest::Approx(report.slice_spacing_max_deviation_mm));

  // Beyond the tolerance: one step 0.4 mm (16 %) short is refused as uneven spacing.
  edit_dicom_file(files[2], [&](DcmDataset& ds, DcmMetaInfo&) {
    auto p = position(ds);
    set_position(ds, {p[0], p[1], p[2] + 0.4});
  });
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, "uneven slice spacing"));
  CHECK(contains(m, "within 10 %"));
}

TEST_CASE("a jittered DICOM series with a missing slice is still refused as a gap") {
  st::TempDir dir("dicom_jitter_gap");
  auto files = copy_series(st::ct5n_series(), dir.path());
  for (std::size_t i = 0; i < files.size(); ++i)
    edit_dicom_file(files[i], [&](DcmDataset& ds, DcmMetaInfo&) {
      auto p = position(ds);
      set_position(ds, {p[0], p[1], p[2] + (i % 2 ? 0.03 : -0.03)});
    });
  fs::remove(files[2]);  // 2693: the middle slice
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, "a slice is missing: gap in the series"));
  CHECK(contains(m, "2392"));
  CHECK(contains(m, "3023"));
}

TEST_CASE("localizers and other series in a DICOM folder are skipped and the largest stack is read") {
  st::TempDir dir("dicom_scouts");
  copy_series(st::ct5n_series(), dir.path());
  copy_series(st::mr_scouts_series(), dir.path(), "scout_");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::scan_dicom_folder(dir.path()));
  CHECK(series.size() == 4);  // the CT and three MR localizer series
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir.path(), &report);
  check_like_sitk(img, sitk_read(st::ct5n_series()));
  CHECK(img.modality == "CT");
  CHECK(report.slices == 5);
  REQUIRE(report.skipped_stacks.size() == 7);  // seven single localizer slices
  for (const auto& s : report.skipped_stacks) {
    CAPTURE(s.stack);
    CHECK(s.slices == 1);
    REQUIRE(s.files.size() == 1);
    CHECK(s.files.front().filename().string().rfind("scout_", 0) == 0);
    CHECK(contains(s.reason, "1 slice, fewer than the 5 of the stack read"));
  }
  const nlohmann::json j = report;
  CHECK(j["skipped_stacks"].size() == 7);

  // The localizers alone: single slices in three orientations, nothing to choose.
  const std::string m = read_dicom_error(st::mr_scouts_series());
  CHECK(contains(m, "no stack of 2 or more parallel slices"));
  CHECK(contains(m, "localizers"));
}

TEST_CASE("DICOM slices repeated at each position are split by EchoNumbers and the first echo is read") {
  st::TempDir dir("dicom_echoes");
  auto files = copy_series(st::ct5n_series(), dir.path());
  std::map<std::string, std::string> uids;
  for (const auto& f : files) {
    edit_dicom_file(
        f, [](DcmDataset& ds, DcmMetaInfo&) { REQUIRE(ds.putAndInsertString(DCM_EchoNumbers, "1").good()); });
    // Echo 2: same positions, other pixels, its own SOP instance.
    edit_dicom_file(
        f,
        [&](DcmDataset& ds, DcmMetaInfo& meta) {
          char uid[100];
          dcmGenerateUniqueIdentifier(uid, SITE_INSTANCE_UID_ROOT);
          ds.putAndInsertString(DCM_SOPInstanceUID, uid);
          meta.putAndInsertString(DCM_MediaStorageSOPInstanceUID, uid);
          ds.putAndInsertString(DCM_EchoNumbers, "2");
          std::vector<Uint16> px(16 * 16, 7);
          REQUIRE(ds.putAndInsertUint16Array(DCM_PixelData, px.data(), static_cast<unsigned long>(px.size()))
                      .good());
        },
        dir / ("echo2_" + f.filename().string()));
  }
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir.path(), &report);
  check_like_sitk(img, sitk_read(st::ct5n_series()));
  CHECK(report.split_tag == "EchoNumbers");
  CHECK(report.split_value == 1);
  REQUIRE(report.skipped_stacks.size() == 1);
  CHECK(report.skipped_stacks.front().slices == 5);
  CHECK(contains(report.skipped_stacks.front().stack, "EchoNumbers 2"));
  CHECK(contains(report.skipped_stacks.front().reason,
                 "repeats the slice positions of the stack read (EchoNumbers 1)"));
  for (const auto& f : report.skipped_stacks.front().files)
    CHECK(f.filename().string().rfind("echo2_", 0) == 0);

  // Repeats that no tag tells apart are refused, naming the tags tried.
  for (const auto& f : files_in(dir.path()))
    edit_dicom_file(f, [](DcmDataset& ds, DcmMetaInfo&) { ds.putAndInsertString(DCM_EchoNumbers, "1"); });
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, "duplicate slice position"));
  CHECK(contains(m,
                 "no tag tells the repeats apart (tried EchoNumbers, EffectiveEchoTime, EchoTime, "
                 "DiffusionBValue, TemporalPositionIdentifier, TemporalPositionIndex, AcquisitionNumber)"));
}

TEST_CASE("DICOM slices repeated by acquisition are split by AcquisitionNumber") {
  st::TempDir dir("dicom_acq");
  auto files = copy_series(st::ct5n_series(), dir.path());
  for (const auto& f : files)
    edit_dicom_file(
        f,
        [](DcmDataset& ds, DcmMetaInfo& meta) {
          char uid[100];
          dcmGenerateUniqueIdentifier(uid, SITE_INSTANCE_UID_ROOT);
          ds.putAndInsertString(DCM_SOPInstanceUID, uid);
          meta.putAndInsertString(DCM_MediaStorageSOPInstanceUID, uid);
          ds.putAndInsertString(DCM_AcquisitionNumber, "0");  // the original files say 1
          std::vector<Uint16> px(16 * 16, 3);
          REQUIRE(ds.putAndInsertUint16Array(DCM_PixelData, px.data(), static_cast<unsigned long>(px.size()))
                      .good());
        },
        dir / ("acq0_" + f.filename().string()));
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir.path(), &report);
  CHECK(report.split_tag == "AcquisitionNumber");
  CHECK(report.split_value == 0);
  CHECK(img.voxels.min().item<float>() == img.voxels.max().item<float>());  // the acquisition-0 copies
  CHECK(img.size() == segflow::Size3{16, 16, 5});
}

TEST_CASE("a DICOM series acquired with gantry tilt is refused naming the angle") {
  st::TempDir dir("dicom_tilt");
  auto files = copy_series(st::ct5n_series(), dir.path());
  const double t = std::tan(15.0 * std::numbers::pi / 180.0);
  for (const auto& f : files)
    edit_dicom_file(f, [&](DcmDataset& ds, DcmMetaInfo&) {
      auto p = position(ds);
      set_position(ds, {p[0], p[1] + t * p[2], p[2]});
      ds.putAndInsertString(DCM_GantryDetectorTilt, "15");
    });
  auto r = sp::read_dicom(dir.path());
  REQUIRE_FALSE(r.is_ok());
  const std::string m = r.status().message();
  INFO(m);
  CHECK(r.status().code() == segflow::ErrorCode::unsupported);
  CHECK(contains(m, "slice positions run at 15.0 degrees to the normal of ImageOrientationPatient"));
  CHECK(contains(m, "GantryDetectorTilt 15"));
  CHECK(contains(m, "gantry tilt"));
  CHECK(m.find('\n') == std::string::npos);
}

TEST_CASE("copies of one DICOM instance in a folder are read once") {
  st::TempDir dir("dicom_copies");
  auto files = copy_series(st::ct5n_series(), dir.path());
  fs::copy_file(files[1], dir / "zz_copy_of_2392");
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir.path(), &report);
  check_like_sitk(img, sitk_read(st::ct5n_series()));
  REQUIRE(report.skipped_files.size() == 1);
  CHECK(report.skipped_files.front().path.filename() == "zz_copy_of_2392");
  CHECK(contains(report.skipped_files.front().reason, "same SOPInstanceUID"));
}

TEST_CASE("the real CT series with its UIDs only in the meta header reads like SimpleITK reads it") {
  // totalsegmentator's example_ct_dicom: Siemens CT, 20 slices of 512 x 512, lossless JPEG
  // 2000, SeriesInstanceUID, SOPInstanceUID and SOPClassUID empty in the dataset.
  const fs::path dir = st::testdata_path("totalsegmentator/example_ct_dicom");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::scan_dicom_folder(dir));
  REQUIRE(series.size() == 1);
  CHECK(series.front().series_uid.empty());
  CHECK(contains(series.front().identity,
                 "FrameOfReferenceUID 1.3.12.2.1107.5.1.4.60064.30000022120807274275100000041"));
  CHECK(series.front().sop_class_uid == "1.2.840.10008.5.1.4.1.1.2");  // from the meta header
  CHECK(series.front().files.size() == 20);
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir, &report);
  check_like_sitk(img, sitk_read(dir));
  CHECK(img.size() == segflow::Size3{512, 512, 20});
  CHECK(report.identity == "FrameOfReferenceUID + orientation + geometry");
  CHECK(report.slice_spacing_max_deviation_mm < 1e-9);
  CHECK(report.warnings.empty());
}

TEST_CASE("two DICOM series without SeriesInstanceUID are told apart by frame of reference and geometry") {
  st::TempDir dir("dicom_nouid");
  const fs::path ts = st::testdata_path("totalsegmentator/example_ct_dicom");
  auto big = copy_series(ts, dir.path());
  for (const auto& f : copy_series(st::ct5n_series(), dir.path(), "ct5n_"))
    edit_dicom_file(f, [](DcmDataset& ds, DcmMetaInfo&) {
      ds.putAndInsertString(DCM_SeriesInstanceUID, "");
      ds.putAndInsertString(DCM_StudyInstanceUID, "");
    });
  REQUIRE_OK_AND_ASSIGN(auto series, sp::scan_dicom_folder(dir.path()));
  REQUIRE(series.size() == 2);
  for (const auto& s : series) {
    CHECK(s.series_uid.empty());
    CHECK(s.files.size() == (s.files.front().filename().string().rfind("ct5n_", 0) == 0 ? 5u : 20u));
  }
  sp::DicomReadReport report;
  Image img = read_dicom_ok(dir.path(), &report);
  check_like_sitk(img, sitk_read(ts));
  REQUIRE(report.skipped_stacks.size() == 1);
  CHECK(report.skipped_stacks.front().slices == 5);
  CHECK(contains(report.skipped_stacks.front().stack,
                 "FrameOfReferenceUID 1.3.6.1.4.1.5962.1.1.0.0.0.1194734704.16302.0.4"));
}
