// JPEG 2000 DICOM pixel data (OpenJPEG behind DCMTK's codec interface), checked against
// independent decoders on real files nobody here wrote: pydicom with pylibjpeg-openjpeg
// (every voxel, lossless exactly) and SimpleITK/GDCM; Debian's pydicom test files and the
// pydicom-data files fetched by scripts/fetch-test-data.sh.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>
#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>

#include <filesystem>
#include <map>
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
using st::files_in;
using st::read_dicom_ok;

/// Whole (C, Z, Y, X) float32 arrays of `files` as `reader` ("pydicom_czyx" or "sitk")
/// decodes them, through tests/tools/reference.py arrays; one Python start-up for all.
std::map<std::string, at::Tensor> reference_arrays(const std::string& reader,
                                                   const std::vector<fs::path>& files,
                                                   const st::TempDir& dir) {
  std::string list;
  for (const auto& f : files) list += f.string() + "\n";
  st::write_file(dir / "files.txt", list);
  auto r = st::run_command(st::shell_quote(st::python()) + " " +
                           st::shell_quote(st::source_path("tests/tools/reference.py").string()) +
                           " arrays " + reader + " " + st::shell_quote((dir / "files.txt").string()) + " " +
                           st::shell_quote(dir.path().string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto j = nlohmann::json::parse(r.out);
  std::map<std::string, at::Tensor> out;
  for (const auto& f : files) {
    const auto& e = j[f.string()];
    INFO(f.string() << ": " << e.dump());
    REQUIRE(e.contains("npy"));
    REQUIRE_OK_AND_ASSIGN(auto t, sp::read_npy(e["npy"].get<std::string>()));
    out[f.string()] = t;
  }
  return out;
}

/// Largest |a - b| over all voxels (shapes must match).
double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("lossless JPEG 2000 DICOM files decode to exactly the values pydicom's OpenJPEG decoder gives") {
  // Monochrome signed and unsigned (BitsStored 10 to 16, MONOCHROME1 and 2), a codestream
  // whose signedness contradicts PixelRepresentation, colour (YBR_RCT) and multi-frame.
  std::vector<fs::path> files = {st::debian_pydicom_path("MR_small_jp2klossless.dcm"),
                                 st::debian_pydicom_path("J2K_pixelrep_mismatch.dcm"),
                                 st::debian_pydicom_path("GDCMJ2K_TextGBR.dcm")};
  for (const char* name : {"MR2_J2KR.dcm", "RG1_J2KR.dcm", "RG3_J2KR.dcm", "US1_J2KR.dcm", "693_J2KR.dcm",
                           "emri_small_jpeg_2k_lossless.dcm"})
    files.push_back(st::pydicom_data_path(name));
  st::TempDir dir("j2k_lossless");
  const auto ref = reference_arrays("pydicom_czyx", files, dir);
  for (const fs::path& f : files) {
    CAPTURE(f.string());
    CHECK(st::dicom_tag_text(f, DCM_TransferSyntaxUID) == "1.2.840.10008.1.2.4.90");
    Image img = read_dicom_ok(f);
    const at::Tensor& want = ref.at(f.string());
    REQUIRE((img.voxels.sizes() == want.sizes()));
    CHECK((img.voxels.scalar_type() == torch::kFloat32));
    CHECK(torch::equal(img.voxels, want));
  }
  // The multi-frame file is 10 frames of 64 x 64, read as 10 slices.
  Image mf = read_dicom_ok(st::pydicom_data_path("emri_small_jpeg_2k_lossless.dcm"));
  CHECK(mf.size() == segflow::Size3{64, 64, 10});
}

TEST_CASE("lossless JPEG 2000 DICOM files equal their uncompressed twins") {
  for (const auto& twins : {std::pair{"MR2_J2KR.dcm", "MR2_UNCR.dcm"},
                            {"RG1_J2KR.dcm", "RG1_UNCR.dcm"},
                            {"US1_J2KR.dcm", "US1_UNCR.dcm"},
                            {"693_J2KR.dcm", "693_UNCR.dcm"},
                            {"emri_small_jpeg_2k_lossless.dcm", "emri_small.dcm"}}) {
    const std::string j2k = twins.first, plain = twins.second;
    CAPTURE(j2k);
    Image a = read_dicom_ok(st::pydicom_data_path(j2k));
    Image b = read_dicom_ok(st::pydicom_data_path(plain));
    REQUIRE((a.voxels.sizes() == b.voxels.sizes()));
    CHECK(torch::equal(a.voxels, b.voxels));
    CHECK(segflow::geometry_close(a.geometry, b.geometry, 1e-6));
  }
}

TEST_CASE("lossy JPEG 2000 DICOM files decode within one stored unit of pydicom's and GDCM's decoders") {
  // Lossy (.91) decoding runs the 9/7 wavelet in floating point, so two builds of OpenJPEG
  // (Debian's here, the one in pylibjpeg-openjpeg's wheel) may round a sample differently;
  // the documented tolerance is one stored unit (times RescaleSlope).
  std::vector<fs::path> files = {st::debian_pydicom_path("JPEG2000.dcm"),
                                 st::debian_pydicom_path("693_J2KI.dcm")};
  for (const char* name : {"MR2_J2KI.dcm", "RG1_J2KI.dcm", "RG3_J2KI.dcm", "US1_J2KI.dcm"})
    files.push_back(st::pydicom_data_path(name));
  st::TempDir dir("j2k_lossy");
  const auto ref = reference_arrays("pydicom_czyx", files, dir);
  st::TempDir dir2("j2k_lossy_sitk");
  const auto gdcm = reference_arrays("sitk", files, dir2);
  for (const fs::path& f : files) {
    CAPTURE(f.string());
    CHECK(st::dicom_tag_text(f, DCM_TransferSyntaxUID) == "1.2.840.10008.1.2.4.91");
    Image img = read_dicom_ok(f);
    DcmFileFormat ff;
    REQUIRE(ff.loadFile(f.c_str()).good());
    Float64 slope = 1.0;
    if (ff.getDataset()->findAndGetFloat64(DCM_RescaleSlope, slope).bad()) slope = 1.0;
    const at::Tensor& want = ref.at(f.string());
    REQUIRE((img.voxels.sizes() == want.sizes()));
    const double d = max_abs_diff(img.voxels, want);
    MESSAGE(f.filename().string() << ": max |segflow - pydicom| = " << d << " (slope " << slope << ")");
    CHECK(d <= 1.0 * slope + 1e-3);
    // GDCM shows MONOCHROME1 inverted (2^BitsStored - 1 - v); segflow keeps stored values, as
    // pydicom does.
    OFString pi;
    ff.getDataset()->findAndGetOFString(DCM_PhotometricInterpretation, pi);
    Uint16 bits_stored = 16;
    ff.getDataset()->findAndGetUint16(DCM_BitsStored, bits_stored);
    at::Tensor ours = img.voxels;
    if (pi == "MONOCHROME1")
      ours = static_cast<double>((1u << bits_stored) - 1) - img.voxels.to(torch::kFloat64);
    if (gdcm.at(f.string()).sizes() == img.voxels.sizes()) {
      const double dg = max_abs_diff(ours, gdcm.at(f.string()));
      MESSAGE(f.filename().string() << ": max |segflow - GDCM| = " << dg);
      CHECK(dg <= 1.0 * slope + 1e-3);
    }
  }
}

TEST_CASE(
    "a corrupt JPEG 2000 stream is a one-line error naming the file, the frame and OpenJPEG's message") {
  st::TempDir dir("j2k_corrupt");
  const fs::path src = st::pydicom_data_path("emri_small_jpeg_2k_lossless.dcm");
  const fs::path bad = dir / "cut_frame4.dcm";
  {
    // Cut the codestream of frame 4 (fragment 4) to a third of its length.
    DcmFileFormat ff;
    REQUIRE(ff.loadFile(src.c_str()).good());
    REQUIRE(ff.loadAllDataIntoMemory().good());
    DcmElement* e = nullptr;
    REQUIRE(ff.getDataset()->findAndGetElement(DCM_PixelData, e).good());
    auto* pd = static_cast<DcmPixelData*>(e);
    DcmPixelSequence* seq = nullptr;
    REQUIRE(pd->getEncapsulatedRepresentation(EXS_JPEG2000LosslessOnly, nullptr, seq).good());
    REQUIRE(seq->card() == 11);
    DcmPixelItem* item = nullptr;
    REQUIRE(seq->getItem(item, 4).good());
    Uint8* bytes = nullptr;
    REQUIRE(item->getUint8Array(bytes).good());
    std::vector<Uint8> head(bytes, bytes + (item->getLength() / 3 & ~1u));
    REQUIRE(item->putUint8Array(head.data(), static_cast<Uint32>(head.size())).good());
    REQUIRE(ff.saveFile(bad.c_str(), EXS_JPEG2000LosslessOnly).good());
  }
  auto r = sp::read_dicom(bad);
  REQUIRE_FALSE(r.is_ok());
  const std::string m = r.status().message();
  INFO(m);
  CHECK(r.status().code() == segflow::ErrorCode::corrupt_data);
  CHECK(contains(m, bad.string()));
  CHECK(contains(m, "JPEG 2000 frame 4 of 10"));
  CHECK(contains(m, "OpenJPEG: "));
  CHECK(m.find('\n') == std::string::npos);

  // The real truncated sibling (its pixel sequence ends early) names the file; so does GDCM.
  const fs::path short_file = st::pydicom_data_path("emri_small_jpeg_2k_lossless_too_short.dcm");
  auto s = sp::read_dicom(short_file);
  REQUIRE_FALSE(s.is_ok());
  INFO(s.status().message());
  CHECK(contains(s.status().message(), short_file.string()));
  CHECK(contains(s.status().message(), "truncated"));
}

TEST_CASE("JPEG 2000 transfer syntaxes segflow cannot decode are named in the error") {
  // Part 2 multi-component JPEG 2000 (.92): the codec list has nothing for it.
  st::TempDir dir("j2k_part2");
  const fs::path f = dir / "part2.dcm";
  // The meta header's TransferSyntaxUID .90 becomes .92 (same length, bytes edited).
  std::string bytes = st::read_file(st::debian_pydicom_path("MR_small_jp2klossless.dcm"));
  const auto at = bytes.find("1.2.840.10008.1.2.4.90");
  REQUIRE(at != std::string::npos);
  bytes[at + 21] = '2';
  st::write_file(f, bytes);
  REQUIRE(st::dicom_tag_text(f, DCM_TransferSyntaxUID) == "1.2.840.10008.1.2.4.92");
  auto r = sp::read_dicom(f);
  REQUIRE_FALSE(r.is_ok());
  INFO(r.status().message());
  CHECK(r.status().code() == segflow::ErrorCode::unsupported);
  CHECK(contains(r.status().message(), f.string()));
  CHECK(contains(r.status().message(), "1.2.840.10008.1.2.4.92"));
  CHECK(contains(r.status().message(), "JPEG 2000 Part 1 only"));
}

TEST_CASE("JPEG 2000 frames split over several fragments decode with and without a Basic Offset Table") {
  // emri_small_jpeg_2k_lossless.dcm holds one fragment a frame; rewrite it with each frame's
  // codestream cut into two fragments, once with the offset table and once with it empty
  // (frames are then found by the codestream markers).
  const fs::path src = st::pydicom_data_path("emri_small_jpeg_2k_lossless.dcm");
  const Image want = read_dicom_ok(src);
  st::TempDir dir("j2k_fragments");
  for (bool with_table : {true, false}) {
    CAPTURE(with_table);
    const fs::path out = dir / (with_table ? "bot.dcm" : "nobot.dcm");
    DcmFileFormat ff;
    REQUIRE(ff.loadFile(src.c_str()).good());
    REQUIRE(ff.loadAllDataIntoMemory().good());
    DcmElement* e = nullptr;
    REQUIRE(ff.getDataset()->findAndGetElement(DCM_PixelData, e).good());
    auto* pd = static_cast<DcmPixelData*>(e);
    DcmPixelSequence* seq = nullptr;
    REQUIRE(pd->getEncapsulatedRepresentation(EXS_JPEG2000LosslessOnly, nullptr, seq).good());
    std::vector<std::vector<Uint8>> parts;
    std::vector<Uint32> offsets;
    Uint32 pos = 0;
    for (unsigned long i = 1; i < seq->card(); ++i) {
      DcmPixelItem* item = nullptr;
      REQUIRE(seq->getItem(item, i).good());
      Uint8* bytes = nullptr;
      REQUIRE(item->getUint8Array(bytes).good());
      const Uint32 n = item->getLength(), half = (n / 2) & ~1u;
      offsets.push_back(pos);
      parts.emplace_back(bytes, bytes + half);
      parts.emplace_back(bytes + half, bytes + n);
      pos += 8 + half + 8 + (n - half);
    }
    auto* out_seq = new DcmPixelSequence(DCM_PixelSequenceTag);
    auto* table = new DcmPixelItem(DCM_PixelItemTag);
    if (with_table)
      REQUIRE(table
                  ->putUint8Array(reinterpret_cast<const Uint8*>(offsets.data()),
                                  static_cast<Uint32>(4 * offsets.size()))
                  .good());
    out_seq->insert(table);
    for (const auto& p : parts) {
      auto* item = new DcmPixelItem(DCM_PixelItemTag);
      REQUIRE(item->putUint8Array(p.data(), static_cast<Uint32>(p.size())).good());
      out_seq->insert(item);
    }
    pd->putOriginalRepresentation(EXS_JPEG2000LosslessOnly, nullptr, out_seq);
    REQUIRE(ff.saveFile(out.c_str(), EXS_JPEG2000LosslessOnly).good());
    {
      DcmFileFormat check;
      REQUIRE(check.loadFile(out.c_str()).good());
      DcmElement* ce = nullptr;
      REQUIRE(check.getDataset()->findAndGetElement(DCM_PixelData, ce).good());
      DcmPixelSequence* cs = nullptr;
      REQUIRE(static_cast<DcmPixelData*>(ce)
                  ->getEncapsulatedRepresentation(EXS_JPEG2000LosslessOnly, nullptr, cs)
                  .good());
      CHECK(cs->card() == 21);  // the table and 20 fragments for 10 frames
    }
    Image got = read_dicom_ok(out);
    REQUIRE((got.voxels.sizes() == want.voxels.sizes()));
    CHECK(torch::equal(got.voxels, want.voxels));
  }
}
