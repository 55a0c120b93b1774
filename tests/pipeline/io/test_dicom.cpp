// DICOM reader, writer and SEG: round trips, independent readers (SimpleITK, pydicom), real
// files nobody here wrote (Debian's pydicom test files) and bad input.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>
#include <dcmtk/dcmdata/dcuid.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dicom_test_data.hpp"
#include "pipeline/io/dicom.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using segflow::Geometry;
using segflow::pipeline::DicomCompression;
using segflow::pipeline::DicomSeriesInfo;
using segflow::pipeline::Image;
namespace sp = segflow::pipeline;
namespace st = segflow::testing;

namespace {

using st::contains;
using st::edit_dicom_file;
using st::read_dicom_error;
using st::read_dicom_ok;

/// A (1, Z, Y, X) float volume of integer HU in [-1000, 2000] on an oblique grid: rotated
/// about z by 20 degrees, anisotropic spacing, non-zero origin.
Image phantom(std::int64_t Z = 6, std::int64_t Y = 40, std::int64_t X = 48) {
  auto z = torch::arange(Z, torch::kInt64).view({Z, 1, 1});
  auto y = torch::arange(Y, torch::kInt64).view({1, Y, 1});
  auto x = torch::arange(X, torch::kInt64).view({1, 1, X});
  auto v = (x * 97 + y * 53 + z * 1009 + x * y * 7) % 3001 - 1000;
  v.index_put_({0, 0, 0}, -1000);
  v.index_put_({Z - 1, Y - 1, X - 1}, 2000);
  Image img;
  img.voxels = v.to(torch::kFloat32).unsqueeze(0).contiguous();
  const double a = 20.0 * std::numbers::pi / 180.0, c = std::cos(a), s = std::sin(a);
  img.geometry.direction = {c, -s, 0, s, c, 0, 0, 0, 1};
  img.geometry.spacing = {0.8, 0.8, 2.5};
  img.geometry.origin = {-120.5, 35.25, -300.75};
  img.modality = "CT";
  return img;
}

std::string compression_name(DicomCompression c) {
  switch (c) {
    case DicomCompression::none:
      return "none";
    case DicomCompression::rle:
      return "rle";
    case DicomCompression::jpeg_ls:
      return "jpeg-ls";
    case DicomCompression::jpeg_lossless:
      return "jpeg-lossless";
  }
  return "?";
}

std::string expected_transfer_syntax(DicomCompression c) {
  switch (c) {
    case DicomCompression::none:
      return "1.2.840.10008.1.2.1";
    case DicomCompression::rle:
      return "1.2.840.10008.1.2.5";
    case DicomCompression::jpeg_ls:
      return "1.2.840.10008.1.2.4.80";
    case DicomCompression::jpeg_lossless:
      return "1.2.840.10008.1.2.4.70";
  }
  return "?";
}

float voxel(const Image& img, std::int64_t c, std::int64_t z, std::int64_t y, std::int64_t x) {
  return img.voxels.index({c, z, y, x}).item<float>();
}

/// Compares an Image with a reference.py result: size, stats and sampled voxels; geometry
/// too when `geometry` (sitk gives all of it).
void check_against_reference(const Image& img, const nlohmann::json& ref, bool geometry,
                             double value_tol = 1e-3) {
  const auto size = img.size();
  REQUIRE(ref.contains("size"));
  CHECK(size[0] == ref["size"][0].get<std::int64_t>());
  CHECK(size[1] == ref["size"][1].get<std::int64_t>());
  CHECK(size[2] == ref["size"][2].get<std::int64_t>());
  auto t = img.voxels.to(torch::kFloat64);
  CHECK(t.min().item<double>() == doctest::Approx(ref["min"].get<double>()).epsilon(1e-6));
  CHECK(t.max().item<double>() == doctest::Approx(ref["max"].get<double>()).epsilon(1e-6));
  CHECK(t.mean().item<double>() == doctest::Approx(ref["mean"].get<double>()).epsilon(1e-6));
  for (const auto& v : ref["voxels"]) {
    auto zyx = v["zyx"];
    CHECK(std::abs(voxel(img, 0, zyx[0], zyx[1], zyx[2]) - v["value"].get<double>()) <= value_tol);
  }
  if (geometry) {
    for (int i = 0; i < 3; ++i) {
      CHECK(img.geometry.spacing[i] == doctest::Approx(ref["spacing"][i].get<double>()).epsilon(1e-6));
      CHECK(std::abs(img.geometry.origin[i] - ref["origin"][i].get<double>()) <= 1e-4);
    }
    for (int i = 0; i < 9; ++i)
      CHECK(std::abs(img.geometry.direction[i] - ref["direction"][i].get<double>()) <= 1e-4);
  }
}

/// pydicom's reading of several files at once (`reference.py pydicom_czyx_list`), by name.
nlohmann::json pydicom_read_all(const std::vector<fs::path>& files) {
  st::TempDir dir("dicom_list");
  std::string list;
  for (const auto& f : files) list += f.string() + "\n";
  st::write_file(dir / "files.txt", list);
  return st::reference_read("pydicom_czyx_list", dir / "files.txt");
}

/// Compares an Image with pydicom's (C, Z, Y, X) reading of the same file: shape, stats and
/// sampled voxels, within `rel_tol` of the largest value.
void check_against_pydicom(const Image& img, const nlohmann::json& ref, double rel_tol = 1e-6) {
  REQUIRE(img.voxels.dim() == 4);
  for (int i = 0; i < 4; ++i) CHECK(img.voxels.size(i) == ref["shape"][i].get<std::int64_t>());
  auto t = img.voxels.to(torch::kFloat64);
  const double max = std::max(1.0, std::abs(ref["max"].get<double>()));
  CHECK(std::abs(t.min().item<double>() - ref["min"].get<double>()) <= rel_tol * max);
  CHECK(std::abs(t.max().item<double>() - ref["max"].get<double>()) <= rel_tol * max);
  CHECK(std::abs(t.mean().item<double>() - ref["mean"].get<double>()) <= rel_tol * max);
  for (const auto& v : ref["voxels"]) {
    auto i = v["czyx"];
    CHECK(std::abs(voxel(img, i[0], i[1], i[2], i[3]) - v["value"].get<double>()) <= rel_tol * max);
  }
}

}  // namespace

TEST_CASE("a DICOM series written by segflow reads back with identical HU values and geometry") {
  const Image img = phantom();
  for (DicomCompression c : {DicomCompression::none, DicomCompression::rle, DicomCompression::jpeg_ls,
                             DicomCompression::jpeg_lossless}) {
    CAPTURE(compression_name(c));
    st::TempDir dir("dicom_rt");
    sp::DicomWriteOptions opt;
    opt.compression = c;
    REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), img, opt));
    REQUIRE(info.files.size() == 6);
    CHECK(info.files.front().filename() == "IM_0000.dcm");
    CHECK(info.modality == "CT");
    CHECK(info.sop_class_uid == "1.2.840.10008.5.1.4.1.1.2");
    CHECK(st::dicom_tag_text(info.files.front(), DCM_TransferSyntaxUID) == expected_transfer_syntax(c));
    CHECK(st::dicom_tag_text(info.files[3], DCM_SeriesInstanceUID) == info.series_uid);
    // Only the series files, no temporary leftovers.
    CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 6);

    Image back = read_dicom_ok(dir.path());
    CHECK((back.voxels.scalar_type() == torch::kFloat32));
    CHECK(back.voxels.is_contiguous());
    REQUIRE((back.voxels.sizes() == img.voxels.sizes()));
    CHECK(torch::equal(back.voxels, img.voxels));
    INFO(segflow::describe(back.geometry));
    CHECK(segflow::geometry_close(back.geometry, img.geometry, 1e-4));
    CHECK(back.modality == "CT");
  }
}

TEST_CASE("HU values below -1024 survive a DICOM round trip through a lower RescaleIntercept") {
  Image img = phantom(2, 8, 8);
  img.voxels.index_put_({0, 0, 1, 1}, -3024.0f);
  st::TempDir dir("dicom_low");
  REQUIRE_OK(sp::write_dicom_series(dir.path(), img));
  Image back = read_dicom_ok(dir.path());
  CHECK(torch::equal(back.voxels, img.voxels));
}

TEST_CASE("DICOM slices are ordered by position, not by file name or InstanceNumber") {
  const Image img = phantom(7, 16, 20);
  st::TempDir dir("dicom_order");
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), img));
  // Rename so that name order is a shuffle of slice order, and scramble InstanceNumber.
  std::vector<fs::path> renamed;
  std::mt19937 rng(7);
  std::vector<int> perm(info.files.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (std::size_t i = 0; i < info.files.size(); ++i) {
    edit_dicom_file(info.files[i], [&](DcmDataset& ds) {
      ds.putAndInsertString(DCM_InstanceNumber, std::to_string(100 - perm[i]).c_str());
    });
    fs::path to = dir / ("slice_" + std::to_string(perm[i]) + ".dcm");
    fs::rename(info.files[i], to);
    renamed.push_back(to);
  }
  Image back = read_dicom_ok(dir.path());
  CHECK(torch::equal(back.voxels, img.voxels));
  CHECK(segflow::geometry_close(back.geometry, img.geometry, 1e-4));

  std::reverse(renamed.begin(), renamed.end());
  REQUIRE_OK_AND_ASSIGN(auto direct, sp::read_dicom_series(renamed));
  CHECK(torch::equal(direct.voxels, img.voxels));
}

TEST_CASE("a DICOM series written by segflow reads the same in SimpleITK") {
  const Image img = phantom(5, 24, 32);
  for (DicomCompression c : {DicomCompression::none, DicomCompression::rle, DicomCompression::jpeg_ls,
                             DicomCompression::jpeg_lossless}) {
    CAPTURE(compression_name(c));
    st::TempDir dir("dicom_sitk");
    sp::DicomWriteOptions opt;
    opt.compression = c;
    REQUIRE_OK(sp::write_dicom_series(dir.path(), img, opt));
    auto ref = st::reference_read("sitk", dir.path());
    check_against_reference(img, ref, /*geometry=*/true);
  }
}

TEST_CASE("pydicom's CT and MR DICOM test files read with the values pydicom reads") {
  std::vector<fs::path> files;
  for (const char* name : {"CT_small.dcm", "MR_small.dcm", "MR_small_implicit.dcm", "MR_small_bigendian.dcm",
                           "MR_small_expb.dcm", "MR_small_RLE.dcm", "MR_small_padded.dcm", "image_dfl.dcm"})
    files.push_back(st::debian_pydicom_path(name));
  const auto refs = pydicom_read_all(files);
  for (const fs::path& f : files) {
    CAPTURE(f.string());
    Image img = read_dicom_ok(f);
    CHECK((img.voxels.scalar_type() == torch::kFloat32));
    check_against_pydicom(img, refs[f.string()]);
  }
  // Geometry of a single CT slice, against SimpleITK.
  Image ct = read_dicom_ok(st::debian_pydicom_path("CT_small.dcm"));
  check_against_reference(ct, st::reference_read("sitk", st::debian_pydicom_path("CT_small.dcm")),
                          /*geometry=*/true);
  CHECK(ct.modality == "CT");
  CHECK(ct.geometry.spacing[2] == doctest::Approx(5.0));  // SpacingBetweenSlices of a lone slice
}

TEST_CASE("JPEG and JPEG-LS compressed DICOM test files decode like their uncompressed twin and SimpleITK") {
  const Image plain = read_dicom_ok(st::debian_pydicom_path("MR_small.dcm"));
  for (const char* name : {"MR_small_jpeg_ls_lossless.dcm", "MR_small_RLE.dcm"}) {
    CAPTURE(std::string(name));
    Image img = read_dicom_ok(st::debian_pydicom_path(name));
    CHECK(torch::equal(img.voxels, plain.voxels));
    CHECK(segflow::geometry_close(img.geometry, plain.geometry, 1e-6));
  }
  // 12-bit JPEG extended (process 2 & 4), lossy: GDCM (through SimpleITK) as the reference.
  for (const char* name : {"JPGExtended.dcm", "JPEG-lossy.dcm"}) {
    CAPTURE(std::string(name));
    Image img = read_dicom_ok(st::debian_pydicom_path(name));
    check_against_reference(img, st::reference_read("sitk", st::debian_pydicom_path(name)), /*geometry=*/true,
                            1.0);
  }
}

TEST_CASE("a multi-frame DICOM file with functional groups orders its frames by PlanePositionSequence") {
  // An enhanced-CT-like file: frames stored out of order, geometry and rescale in the
  // Shared/PerFrame functional groups only, signed storage with its own intercept.
  const Image img = phantom(4, 10, 12);
  const auto& g = img.geometry;
  const std::vector<int> order = {2, 0, 3, 1};  // slice stored as frame f
  auto ds_string = [](std::initializer_list<double> v) {
    std::string s;
    char buf[40];
    for (double x : v) {
      std::snprintf(buf, sizeof buf, "%.10g", x);
      if (!s.empty()) s += '\\';
      s += buf;
    }
    return s;
  };
  DcmFileFormat ff;
  DcmDataset& ds = *ff.getDataset();
  char uid[100];
  ds.putAndInsertString(DCM_SOPClassUID, UID_EnhancedCTImageStorage);
  ds.putAndInsertString(DCM_SOPInstanceUID, dcmGenerateUniqueIdentifier(uid, SITE_INSTANCE_UID_ROOT));
  ds.putAndInsertString(DCM_StudyInstanceUID, dcmGenerateUniqueIdentifier(uid, SITE_STUDY_UID_ROOT));
  ds.putAndInsertString(DCM_SeriesInstanceUID, dcmGenerateUniqueIdentifier(uid, SITE_SERIES_UID_ROOT));
  ds.putAndInsertString(DCM_Modality, "CT");
  ds.putAndInsertString(DCM_NumberOfFrames, "4");
  ds.putAndInsertUint16(DCM_Rows, 10);
  ds.putAndInsertUint16(DCM_Columns, 12);
  ds.putAndInsertUint16(DCM_SamplesPerPixel, 1);
  ds.putAndInsertString(DCM_PhotometricInterpretation, "MONOCHROME2");
  ds.putAndInsertUint16(DCM_BitsAllocated, 16);
  ds.putAndInsertUint16(DCM_BitsStored, 16);
  ds.putAndInsertUint16(DCM_HighBit, 15);
  ds.putAndInsertUint16(DCM_PixelRepresentation, 1);
  DcmItem* shared = nullptr;
  DcmItem* it = nullptr;
  REQUIRE(ds.findOrCreateSequenceItem(DCM_SharedFunctionalGroupsSequence, shared, 0).good());
  REQUIRE(shared->findOrCreateSequenceItem(DCM_PlaneOrientationSequence, it, 0).good());
  it->putAndInsertString(DCM_ImageOrientationPatient,
                         ds_string({g.direction[0], g.direction[3], g.direction[6], g.direction[1],
                                    g.direction[4], g.direction[7]})
                             .c_str());
  REQUIRE(shared->findOrCreateSequenceItem(DCM_PixelMeasuresSequence, it, 0).good());
  it->putAndInsertString(DCM_PixelSpacing, ds_string({g.spacing[1], g.spacing[0]}).c_str());
  it->putAndInsertString(DCM_SliceThickness, ds_string({g.spacing[2]}).c_str());
  REQUIRE(shared->findOrCreateSequenceItem(DCM_PixelValueTransformationSequence, it, 0).good());
  it->putAndInsertString(DCM_RescaleIntercept, "-24");
  it->putAndInsertString(DCM_RescaleSlope, "1");
  auto hu = img.voxels[0].to(torch::kInt64);
  std::vector<Uint16> pixels;
  for (std::size_t f = 0; f < order.size(); ++f) {
    const int z = order[f];
    DcmItem* frame = nullptr;
    REQUIRE(ds.findOrCreateSequenceItem(DCM_PerFrameFunctionalGroupsSequence, frame, -2).good());
    REQUIRE(frame->findOrCreateSequenceItem(DCM_PlanePositionSequence, it, 0).good());
    std::array<double, 3> p{};
    for (int r = 0; r < 3; ++r) p[r] = g.origin[r] + g.direction[r * 3 + 2] * g.spacing[2] * z;
    it->putAndInsertString(DCM_ImagePositionPatient, ds_string({p[0], p[1], p[2]}).c_str());
    auto slice = (hu[z] + 24).to(torch::kInt16).contiguous();
    const auto* v = slice.data_ptr<std::int16_t>();
    for (std::int64_t i = 0; i < slice.numel(); ++i) pixels.push_back(static_cast<Uint16>(v[i]));
  }
  REQUIRE(ds.putAndInsertUint16Array(DCM_PixelData, pixels.data(), static_cast<unsigned long>(pixels.size()))
              .good());
  st::TempDir dir("dicom_mf");
  const fs::path file = dir / "enhanced.dcm";
  REQUIRE(ff.saveFile(file.c_str(), EXS_LittleEndianExplicit).good());

  Image back = read_dicom_ok(file);
  CHECK(torch::equal(back.voxels, img.voxels));
  INFO(segflow::describe(back.geometry));
  CHECK(segflow::geometry_close(back.geometry, img.geometry, 1e-4));
}

TEST_CASE("a DICOM slice of another size leaves its stack, and the gap it leaves is refused") {
  st::TempDir dir("dicom_size");
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), phantom(4, 8, 8)));
  edit_dicom_file(info.files[1], [](DcmDataset& ds) { ds.putAndInsertUint16(DCM_Columns, 10); });
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, info.files[2].string()));
  CHECK(contains(m, info.files[0].string()));
  CHECK(contains(m, "a slice is missing: gap in the series"));
  // The error names the slice that left: why the stack has a gap.
  CHECK(contains(m, "set aside as another stack: 1 slice (" + info.files[1].filename().string() + ")"));
  CHECK(contains(m, "8 x 10"));
  // An extra image of another size (a screen capture in the series) is skipped instead.
  edit_dicom_file(info.files[1], [](DcmDataset& ds) { ds.putAndInsertUint16(DCM_Columns, 8); });
  fs::copy_file(info.files[1], dir / "capture.dcm");
  edit_dicom_file(dir / "capture.dcm", [](DcmDataset& ds) {
    ds.putAndInsertString(DCM_SOPInstanceUID, "1.2.3.4.5.6");
    ds.putAndInsertUint16(DCM_Rows, 4);
    ds.putAndInsertUint16(DCM_Columns, 4);
  });
  sp::DicomReadReport report;
  REQUIRE_OK_AND_ASSIGN(auto r, sp::read_dicom(dir.path(), &report));
  CHECK(r.size() == segflow::Size3{8, 8, 4});
  REQUIRE(report.skipped_stacks.size() == 1);
  CHECK(report.skipped_stacks.front().files == std::vector<fs::path>{dir / "capture.dcm"});
  CHECK(contains(report.skipped_stacks.front().stack, "4 x 4"));
}

TEST_CASE("a single DICOM file without position tags gets identity geometry with its PixelSpacing") {
  Image img = read_dicom_ok(st::debian_pydicom_path("JPGExtended.dcm"));
  CHECK(img.size() == segflow::Size3{256, 1024, 1});
  CHECK(img.geometry.spacing[0] == doctest::Approx(2.26));
  CHECK(img.geometry.spacing[1] == doctest::Approx(2.26));
  CHECK(img.geometry.spacing[2] == doctest::Approx(1.0));
  CHECK(img.geometry.origin == std::array<double, 3>{0, 0, 0});
  CHECK(img.geometry.direction == std::array<double, 9>{1, 0, 0, 0, 1, 0, 0, 0, 1});
}

TEST_CASE("RGB DICOM files put colour in channels and frames in slices") {
  std::vector<fs::path> files;
  for (const char* name : {"SC_rgb_rle.dcm", "SC_rgb_rle_2frame.dcm", "SC_rgb_rle_16bit_2frame.dcm",
                           "SC_rgb_rle_32bit_2frame.dcm", "SC_rgb_small_odd.dcm"})
    files.push_back(st::debian_pydicom_path(name));
  const auto refs = pydicom_read_all(files);
  for (const fs::path& f : files) {
    CAPTURE(f.string());
    Image img = read_dicom_ok(f);
    CHECK(img.channels() == 3);
    // 32-bit samples do not fit float32 exactly: compare relative to the range.
    check_against_pydicom(img, refs[f.string()], 1e-6);
  }
  Image two = read_dicom_ok(st::debian_pydicom_path("SC_rgb_rle_2frame.dcm"));
  CHECK((two.voxels.sizes() == torch::IntArrayRef({3, 2, 100, 100})));
}

TEST_CASE("a multi-frame RT dose DICOM file reads its frames as slices spaced by GridFrameOffsetVector") {
  const fs::path f = st::debian_pydicom_path("rtdose.dcm");
  Image img = read_dicom_ok(f);
  CHECK(img.modality == "RTDOSE");
  check_against_pydicom(img, st::reference_read("pydicom_czyx", f));
  auto sitk = st::reference_read("sitk", f);
  CHECK(img.size() == segflow::Size3{10, 10, 15});
  for (int i = 0; i < 3; ++i) {
    CHECK(img.geometry.spacing[i] == doctest::Approx(sitk["spacing"][i].get<double>()));
    CHECK(img.geometry.origin[i] == doctest::Approx(sitk["origin"][i].get<double>()));
  }
  for (int i = 0; i < 9; ++i)
    CHECK(img.geometry.direction[i] == doctest::Approx(sitk["direction"][i].get<double>()));
  // The same dose in explicit big endian (32-bit samples). (rtdose_rle.dcm is not a twin:
  // gdcmconv wrote its dataset implicit VR under an explicit RLE transfer syntax.)
  for (const char* twin : {"rtdose_expb.dcm"}) {
    CAPTURE(std::string(twin));
    Image other = read_dicom_ok(st::debian_pydicom_path(twin));
    CHECK(torch::equal(other.voxels, img.voxels));
    CHECK(segflow::geometry_close(other.geometry, img.geometry, 1e-6));
  }
}

TEST_CASE("a real DICOM CT series is ordered along the slice normal like SimpleITK orders it") {
  // Five axial CT slices whose InstanceNumber runs against their position.
  const fs::path dir = st::debian_pydicom_path("dicomdirtests/98892001/CT5N");
  Image img = read_dicom_ok(dir);
  CHECK(img.size() == segflow::Size3{16, 16, 5});
  check_against_reference(img, st::reference_read("sitk", dir), /*geometry=*/true);
}

TEST_CASE("a truncated, empty or non-DICOM file gives an error naming the file") {
  st::TempDir dir("dicom_bad");
  st::write_file(dir / "empty.dcm", "");
  st::write_file(dir / "x.dcm", "this is a text file, not DICOM\n");
  for (const char* name : {"empty.dcm", "x.dcm"}) {
    CAPTURE(std::string(name));
    const std::string m = read_dicom_error(dir / name);
    CHECK(contains(m, (dir / name).string()));
  }
  CHECK(contains(read_dicom_error(dir / "empty.dcm"), "empty file"));
  CHECK(contains(read_dicom_error(dir / "x.dcm"), "DICOM"));
  {  // Debian's pydicom test files
    const std::string m = read_dicom_error(st::debian_pydicom_path("MR_truncated.dcm"));
    CHECK(contains(m, "MR_truncated.dcm"));
    CHECK(contains(m, "truncated"));
  }
  // Pixel data cut short inside a file segflow wrote.
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir / "series", phantom(1, 32, 32)));
  std::string bytes = st::read_file(info.files[0]);
  st::write_file(dir / "cut.dcm", bytes.substr(0, bytes.size() - 700));
  const std::string m = read_dicom_error(dir / "cut.dcm");
  CHECK(contains(m, "cut.dcm"));
  CHECK(contains(m, "truncated"));
}

TEST_CASE("a DICOM file without Rows is rejected naming the file and the tag") {
  st::TempDir dir("dicom_norows");
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), phantom(3, 8, 8)));
  edit_dicom_file(info.files[1], [](DcmDataset& ds) { REQUIRE(ds.findAndDeleteElement(DCM_Rows).good()); });
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, info.files[1].string()));
  CHECK(contains(m, "Rows (0028,0010)"));
  CHECK(contains(m, "missing"));
  // And one without ImagePositionPatient in a multi-slice series.
  edit_dicom_file(info.files[1], [](DcmDataset& ds) { ds.putAndInsertUint16(DCM_Rows, 8); });
  edit_dicom_file(info.files[2], [](DcmDataset& ds) { ds.findAndDeleteElement(DCM_ImagePositionPatient); });
  const std::string m2 = read_dicom_error(dir.path());
  CHECK(contains(m2, info.files[2].string()));
  CHECK(contains(m2, "ImagePositionPatient (0020,0032)"));
}

TEST_CASE("a DICOM series with a missing slice is rejected as a gap") {
  st::TempDir dir("dicom_gap");
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), phantom(5, 8, 8)));
  fs::remove(info.files[2]);
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, info.files[3].string()));
  CHECK(contains(m, info.files[1].string()));
  CHECK(contains(m, "gap"));
  {  // Debian's pydicom test files
    // A real series: one slice 200 mm away from the other three.
    const std::string real = read_dicom_error(st::debian_pydicom_path("dicomdirtests/77654033/CT2"));
    CHECK(contains(real, "gap"));
    CHECK(contains(real, "17106"));
  }
}

TEST_CASE("DICOM slices with duplicate positions and nothing to tell them apart are rejected") {
  st::TempDir dir("dicom_dup");
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), phantom(4, 8, 8)));
  fs::copy_file(info.files[1], dir / "copy.dcm");
  edit_dicom_file(dir / "copy.dcm",
                  [](DcmDataset& ds) { ds.putAndInsertString(DCM_SOPInstanceUID, "1.2.3.4.5"); });
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, "duplicate"));
  CHECK(contains(m, "copy.dcm"));
  CHECK(contains(m, "IM_0001.dcm"));
  CHECK(contains(m, "no tag tells the repeats apart"));
}

TEST_CASE("a DICOM slice in another orientation leaves its stack, and the gap it leaves is refused") {
  st::TempDir dir("dicom_orient");
  REQUIRE_OK_AND_ASSIGN(auto info, sp::write_dicom_series(dir.path(), phantom(4, 8, 8)));
  edit_dicom_file(info.files[2], [](DcmDataset& ds) {
    ds.putAndInsertString(DCM_ImageOrientationPatient, "1\\0\\0\\0\\0\\-1");
  });
  const std::string m = read_dicom_error(dir.path());
  CHECK(contains(m, info.files[3].string()));
  CHECK(contains(m, info.files[1].string()));
  CHECK(contains(m, "gap in the series"));
  CHECK(contains(m, "set aside as another stack: 1 slice (" + info.files[2].filename().string() + ")"));
  CHECK(contains(m, "orientation [1, 0, 0, 0, 0, -1]"));
  {  // Debian's pydicom test files
    // A real radial localizer series: seven slices, seven orientations, no stack to read.
    const std::string real = read_dicom_error(st::debian_pydicom_path("dicomdirtests/98892003/MR700"));
    CHECK(contains(real, "no stack of 2 or more parallel slices"));
    CHECK(contains(real, "7 single slices"));
  }
}

TEST_CASE("scanning a DICOM folder groups series and lists bad files without failing") {
  st::TempDir dir("dicom_scan");
  REQUIRE_OK_AND_ASSIGN(auto a, sp::write_dicom_series(dir.path(), phantom(3, 8, 8)));
  st::write_file(dir / "empty.dcm", "");
  st::write_file(dir / "x.dcm", "hello, not DICOM\n");
  std::string bytes = st::read_file(a.files[0]);
  st::write_file(dir / "trunc.dcm", bytes.substr(0, bytes.size() / 3));

  std::vector<sp::SkippedFile> skipped;
  REQUIRE_OK_AND_ASSIGN(auto series, sp::scan_dicom_folder(dir.path(), &skipped));
  REQUIRE(series.size() == 1);
  CHECK(series.front().series_uid == a.series_uid);
  CHECK(series.front().modality == "CT");
  CHECK(series.front().files.size() == 3);
  REQUIRE(skipped.size() == 3);
  for (const auto& s : skipped) {
    CAPTURE(s.reason);
    CHECK(contains(s.reason, s.path.string()));
  }
  // The good series still reads, bad files and all.
  Image img = read_dicom_ok(dir.path());
  CHECK(img.size() == segflow::Size3{8, 8, 3});

  // A second series: the larger one is read, the other is listed as skipped.
  {  // Debian's pydicom test files
    fs::copy_file(st::debian_pydicom_path("MR_small.dcm"), dir / "mr.dcm");
    REQUIRE_OK_AND_ASSIGN(auto two, sp::scan_dicom_folder(dir.path()));
    CHECK(two.size() == 2);
    sp::DicomReadReport report;
    REQUIRE_OK_AND_ASSIGN(auto r, sp::read_dicom(dir.path(), &report));
    CHECK(r.size() == segflow::Size3{8, 8, 3});
    CHECK(report.series == a.series_uid);
    REQUIRE(report.skipped_stacks.size() == 1);
    CHECK(contains(report.skipped_stacks.front().stack,
                   st::dicom_tag_text(dir / "mr.dcm", DCM_SeriesInstanceUID)));
    CHECK(report.skipped_files.size() == 3);  // empty.dcm, x.dcm, trunc.dcm
  }
  CHECK_FALSE(sp::scan_dicom_folder(dir / "nope").is_ok());
}

TEST_CASE("read_dicom on a folder ignores DICOM SEG files") {
  st::TempDir dir("dicom_segignore");
  fs::copy_file(st::debian_pydicom_path("MR_small.dcm"), dir / "mr.dcm");
  fs::copy_file(st::debian_pydicom_path("liver_1frame.dcm"), dir / "seg.dcm");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::scan_dicom_folder(dir.path()));
  CHECK(series.size() == 2);
  Image img = read_dicom_ok(dir.path());
  CHECK(img.modality == "MR");
  CHECK(img.size() == segflow::Size3{64, 64, 1});
}

TEST_CASE("looks_like_dicom accepts DICOM files with and without a preamble") {
  st::TempDir dir("dicom_looks");
  st::write_file(dir / "empty.dcm", "");
  st::write_file(dir / "x.dcm",
                 "plain text that is long enough to have 132 bytes ............................"
                 "..................................................................");
  CHECK_FALSE(sp::looks_like_dicom(dir / "empty.dcm"));
  CHECK_FALSE(sp::looks_like_dicom(dir / "x.dcm"));
  CHECK_FALSE(sp::looks_like_dicom(dir / "missing.dcm"));
  CHECK(sp::looks_like_dicom(st::debian_pydicom_path("MR_small.dcm")));
  CHECK(sp::looks_like_dicom(st::debian_pydicom_path("ExplVR_BigEndNoMeta.dcm")));
  CHECK(sp::looks_like_dicom(st::debian_pydicom_path("ExplVR_LitEndNoMeta.dcm")));
}

TEST_CASE("parse_dicom_compression accepts the four DICOM compression names and lists them on error") {
  CHECK(*sp::parse_dicom_compression("none") == DicomCompression::none);
  CHECK(*sp::parse_dicom_compression("rle") == DicomCompression::rle);
  CHECK(*sp::parse_dicom_compression("jpeg-ls") == DicomCompression::jpeg_ls);
  CHECK(*sp::parse_dicom_compression("jpeg-lossless") == DicomCompression::jpeg_lossless);
  auto bad = sp::parse_dicom_compression("jpeg2000");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().code() == segflow::ErrorCode::invalid_argument);
  CHECK(contains(bad.status().message(), "none, rle, jpeg-ls, jpeg-lossless"));
  CHECK(contains(bad.status().message(), "jpeg2000"));
}

TEST_CASE("a DICOM SEG written by segflow reads back as the same label map") {
  const Image img = phantom(5, 24, 28);
  st::TempDir dir("dicom_seg");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::write_dicom_series(dir / "ct", img));

  // Four labels, one of them (4) only on one slice; slice 0 empty.
  auto lab = torch::zeros({1, 5, 24, 28}, torch::kUInt8);
  lab.index_put_(
      {0, torch::indexing::Slice(1, 4), torch::indexing::Slice(2, 10), torch::indexing::Slice(3, 12)}, 1);
  lab.index_put_(
      {0, torch::indexing::Slice(1, 5), torch::indexing::Slice(12, 20), torch::indexing::Slice(5, 9)}, 2);
  lab.index_put_({0, 4, torch::indexing::Slice(0, 3), torch::indexing::Slice(20, 28)}, 3);
  lab.index_put_({0, 2, 22, 27}, 4);
  Image labels;
  labels.voxels = lab;
  labels.geometry = img.geometry;
  const fs::path seg_file = dir / "labels.seg.dcm";
  REQUIRE_OK(sp::write_dicom_seg(seg_file, labels, series));

  Image ref = read_dicom_ok(dir / "ct");
  REQUIRE_OK_AND_ASSIGN(auto back, sp::read_dicom_seg(seg_file, ref));
  CHECK((back.voxels.scalar_type() == torch::kUInt8));
  CHECK(back.modality == "SEG");
  CHECK(torch::equal(back.voxels, lab));
  CHECK(segflow::geometry_close(back.geometry, ref.geometry, 1e-9));

  // On its own (no source image): the grid of its frames, slices 1..4 (slice 0 has none).
  REQUIRE_OK_AND_ASSIGN(auto own, sp::read_dicom(seg_file));
  CHECK(own.modality == "SEG");
  CHECK(own.size() == segflow::Size3{28, 24, 4});
  CHECK(torch::equal(own.voxels, lab.index({torch::indexing::Slice(), torch::indexing::Slice(1, 5)})));
  segflow::Geometry shifted = ref.geometry;
  shifted.origin = segflow::index_to_physical(ref.geometry, {0.0, 0.0, 1.0});
  INFO(segflow::describe(own.geometry));
  CHECK(segflow::geometry_close(own.geometry, shifted, 1e-4));
  CHECK(sp::is_dicom_seg_file(seg_file));
  CHECK_FALSE(sp::is_dicom_seg_file(series.files.front()));

  // pydicom, independently: segments, frames, positions, pixel counts, source images.
  auto js = st::reference_read("pydicom_seg", seg_file);
  CHECK(js["sop_class"] == "1.2.840.10008.5.1.4.1.1.66.4");
  CHECK(js["segmentation_type"] == "BINARY");
  REQUIRE(js["segments"].size() == 4);
  for (int v = 1; v <= 4; ++v) {
    CHECK(js["segments"][v - 1]["number"] == v);
    CHECK(js["segments"][v - 1]["label"] == "label_" + std::to_string(v));
  }
  CHECK(js["referenced_series"][0] == series.series_uid);
  std::size_t expected_frames = 0;
  for (int v = 1; v <= 4; ++v)
    for (int z = 0; z < 5; ++z) expected_frames += lab[0][z].eq(v).any().item<bool>() ? 1 : 0;
  REQUIRE(js["frames"].size() == expected_frames);
  const segflow::Geometry& g = img.geometry;
  for (const auto& fr : js["frames"]) {
    const int v = fr["segment"];
    double k = 0;
    for (int r = 0; r < 3; ++r) k += (fr["position"][r].get<double>() - g.origin[r]) * g.direction[r * 3 + 2];
    const int z = static_cast<int>(std::lround(k / g.spacing[2]));
    CAPTURE(v);
    CAPTURE(z);
    REQUIRE(z >= 0);
    REQUIRE(z < 5);
    CHECK(std::abs(k / g.spacing[2] - z) < 1e-6);
    CHECK(fr["count"].get<std::int64_t>() == lab[0][z].eq(v).sum().item<std::int64_t>());
    CHECK(fr["source_sop"] ==
          st::dicom_tag_text(series.files[static_cast<std::size_t>(z)], DCM_SOPInstanceUID));
  }
}

TEST_CASE("a DICOM SEG keeps segment number = label value for labels that are not 1..N") {
  const Image img = phantom(3, 10, 12);
  st::TempDir dir("dicom_seg_sparse");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::write_dicom_series(dir / "ct", img));
  auto lab = torch::zeros({1, 3, 10, 12}, torch::kInt64);
  lab.index_put_({0, 0, torch::indexing::Slice(0, 4), torch::indexing::Slice(0, 4)}, 2);
  lab.index_put_({0, 2, torch::indexing::Slice(5, 9), torch::indexing::Slice(6, 11)}, 7);
  Image labels;
  labels.voxels = lab;
  labels.geometry = img.geometry;
  REQUIRE_OK(sp::write_dicom_seg(dir / "seg.dcm", labels, series));
  Image ref = read_dicom_ok(dir / "ct");
  REQUIRE_OK_AND_ASSIGN(auto back, sp::read_dicom_seg(dir / "seg.dcm", ref));
  CHECK(torch::equal(back.voxels, lab.to(torch::kUInt8)));
  auto js = st::reference_read("pydicom_seg", dir / "seg.dcm");
  CHECK(js["segments"].size() == 7);
  // Two frames with voxels, one empty frame for each of the five unused values 1, 3..6.
  REQUIRE(js["frames"].size() == 7);
  int with_voxels = 0;
  for (const auto& fr : js["frames"]) with_voxels += fr["count"].get<int>() > 0 ? 1 : 0;
  CHECK(with_voxels == 2);
}

TEST_CASE("a DICOM SEG whose frames are off the reference grid is rejected") {
  const Image img = phantom(4, 12, 12);
  st::TempDir dir("dicom_seg_off");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::write_dicom_series(dir / "ct", img));
  auto lab = torch::zeros({1, 4, 12, 12}, torch::kUInt8);
  lab.index_put_({0, 1, torch::indexing::Slice(2, 6), torch::indexing::Slice(2, 6)}, 1);
  Image labels;
  labels.voxels = lab;
  labels.geometry = img.geometry;
  const fs::path seg_file = dir / "seg.dcm";
  REQUIRE_OK(sp::write_dicom_seg(seg_file, labels, series));
  Image ref = read_dicom_ok(dir / "ct");

  Image shifted = ref;
  shifted.geometry.origin[2] += 0.5 * ref.geometry.spacing[2];
  auto r = sp::read_dicom_seg(seg_file, shifted);
  REQUIRE_FALSE(r.is_ok());
  CHECK(contains(r.status().message(), seg_file.string()));
  CHECK(contains(r.status().message(), "frame 1"));
  CHECK(contains(r.status().message(), "ImagePositionPatient"));

  Image turned = ref;
  turned.geometry.direction = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  auto r2 = sp::read_dicom_seg(seg_file, turned);
  REQUIRE_FALSE(r2.is_ok());
  CHECK(contains(r2.status().message(), "ImageOrientationPatient"));

  // A label map whose grid does not match the series it references.
  Image moved = labels;
  moved.geometry.origin[0] += 3.0;
  auto w = sp::write_dicom_seg(dir / "bad.dcm", moved, series);
  REQUIRE_FALSE(w.is_ok());
  CHECK(contains(w.message(), "ImagePositionPatient"));
}

TEST_CASE(
    "a label map without foreground is no_foreground for a DICOM SEG, naming the file, and nothing is "
    "written") {
  const Image img = phantom(4, 12, 12);
  st::TempDir dir("dicom_seg_empty");
  REQUIRE_OK_AND_ASSIGN(auto series, sp::write_dicom_series(dir / "ct", img));
  Image labels;
  labels.voxels = torch::zeros({1, 4, 12, 12}, torch::kUInt8);
  labels.geometry = img.geometry;
  const fs::path seg_file = dir / "empty.dcm";
  auto w = sp::write_dicom_seg(seg_file, labels, series);
  REQUIRE_FALSE(w.is_ok());
  CHECK(w.code() == segflow::ErrorCode::no_foreground);
  CHECK(contains(w.message(), seg_file.string()));
  CHECK(contains(w.message(), "expected at least one label value > 0"));
  CHECK_FALSE(fs::exists(seg_file));
}
