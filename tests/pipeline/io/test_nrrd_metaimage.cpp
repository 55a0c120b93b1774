// NRRD and MetaImage readers and writers, checked against SimpleITK on real data: the CT and
// the 117-class label map of TotalSegmentator's test files, written by SimpleITK (an
// independent writer) in every variant (attached/detached, raw/compressed, oblique, RAS/LAS
// spaces, ascii), read by segflow and compared with SimpleITK's own read voxel by voxel; files
// segflow writes are read back by SimpleITK; NRRD/MetaImage datasets in the nnU-Net layout;
// bad files give one-line errors naming the file, the field, what was expected and got.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <regex>

#include "pipeline/io/dataset.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/metaimage.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/io/npy.hpp"
#include "pipeline/io/nrrd.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using segflow::pipeline::Image;
namespace sp = segflow::pipeline;
namespace st = segflow::testing;

namespace {

/// Runs tests/tools/sitk_formats.py with `args`; its JSON output.
json sitk_formats(const std::string& args) {
  auto r = st::run_command(st::shell_quote(st::python()) + " " +
                           st::shell_quote(st::source_path("tests/tools/sitk_formats.py").string()) + " " +
                           args + " 2>&1");
  if (r.exit_code != 0) throw std::runtime_error("sitk_formats.py " + args + " failed: " + r.out);
  return json::parse(r.out);
}

/// SimpleITK writes `src` in every NRRD and MetaImage variant into `dir` (see the script).
json sitk_write(const fs::path& src, const fs::path& dir, const std::string& prefix,
                const std::string& flags) {
  return sitk_formats("write " + st::shell_quote(src.string()) + " " + st::shell_quote(dir.string()) + " " +
                      prefix + " " + flags);
}

std::string dtype_of(const at::Tensor& t) { return sp::dtype_name(t); }

/// segflow's read of `file` agrees with SimpleITK's (`ref`): size, spacing, origin, direction
/// (1e-9) and every voxel (same dtype, equal values).
void check_against_sitk(const Image& img, const json& ref, const std::string& file) {
  INFO("file: " << file);
  const auto size = img.size();
  for (int i = 0; i < 3; ++i) CHECK(size[i] == ref["size"][i].get<std::int64_t>());
  for (int i = 0; i < 3; ++i) {
    CHECK(img.geometry.spacing[i] == doctest::Approx(ref["spacing"][i].get<double>()).epsilon(1e-9));
    CHECK(img.geometry.origin[i] == doctest::Approx(ref["origin"][i].get<double>()).epsilon(1e-9));
  }
  for (int i = 0; i < 9; ++i)
    CHECK(img.geometry.direction[i] == doctest::Approx(ref["direction"][i].get<double>()).epsilon(1e-9));
  REQUIRE_OK_AND_ASSIGN(auto npy, sp::read_npy(ref["npy"].get<std::string>()));
  at::Tensor expected = npy;
  if (expected.dim() == 3) expected = expected.unsqueeze(0);
  CHECK(dtype_of(img.voxels) == ref["dtype"].get<std::string>());
  REQUIRE(img.voxels.sizes() == expected.sizes());
  CHECK(torch::equal(img.voxels, expected));
}

fs::path ct_nifti() { return st::testdata_path("totalsegmentator/example_ct_sm.nii.gz"); }
fs::path seg_nifti() { return st::testdata_path("totalsegmentator/example_seg.nii.gz"); }

std::string read_text(const fs::path& p) { return st::read_file(p); }

/// `text` with the first occurrence of `from` replaced (which must be there).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "'" << from << "' not in the file");
  return text.replace(at, from.size(), to);
}

/// An error that is one line, names `file` and `field`, and says what was expected and got.
void check_error(const segflow::Status& s, const fs::path& file, const std::string& field) {
  INFO("message: " << s.message());
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.message().find('\n') == std::string::npos);
  CHECK(s.message().find(file.string()) != std::string::npos);
  CHECK(s.message().find(field + ":") != std::string::npos);
  CHECK(s.message().find("expected") != std::string::npos);
  CHECK(s.message().find("got") != std::string::npos);
}

}  // namespace

TEST_CASE(
    "a real CT written by SimpleITK as NRRD and MetaImage (raw and compressed, oblique) reads as SimpleITK "
    "reads it") {
  st::TempDir dir("nrrd_mha_ct");
  const json ref = sitk_write(ct_nifti(), dir.path(), "ct", "--oblique --derived");
  REQUIRE(ref.size() == 11);
  for (const auto& [name, r] : ref.items()) {
    const fs::path p = dir.path() / name;
    REQUIRE_OK_AND_ASSIGN(auto img, sp::read_image(p));
    check_against_sitk(img, r, name);
    CHECK(img.channels() == 1);
    // The oblique direction is really there (not the NIfTI's axis-aligned one).
    CHECK(std::abs(img.geometry.direction[1]) > 0.3);
  }
  // The converted spaces (RAS, LAS) and the ascii encoding describe the same grid as the LPS file.
  for (const char* name : {"ct_ras.nrrd", "ct_las.nrrd", "ct_ascii.nrrd"}) {
    REQUIRE_OK_AND_ASSIGN(auto img, sp::read_image(dir.path() / name));
    const json& e = ref[name]["expected"];
    for (int i = 0; i < 3; ++i)
      CHECK(img.geometry.origin[i] == doctest::Approx(e["origin"][i].get<double>()));
    for (int i = 0; i < 9; ++i)
      CHECK(img.geometry.direction[i] == doctest::Approx(e["direction"][i].get<double>()).epsilon(1e-9));
  }
  CHECK(sp::detect_format(dir.path() / "ct.nhdr") == sp::ImageFormat::nrrd);
  CHECK(sp::detect_format(dir.path() / "ct.mhd") == sp::ImageFormat::metaimage);
}

TEST_CASE(
    "the real 117-class label map as NRRD and MetaImage keeps every label value and loads as a case's "
    "label") {
  st::TempDir dir("nrrd_mha_seg");
  const json ref = sitk_write(seg_nifti(), dir.path(), "seg", "");
  const json ct = sitk_write(ct_nifti(), dir.path(), "ct", "");
  REQUIRE_OK_AND_ASSIGN(auto nifti_label, sp::read_nifti(seg_nifti()));
  const auto distinct = std::get<0>(at::_unique(nifti_label.voxels.flatten().to(torch::kLong), true));
  CHECK(distinct.numel() > 40);  // a real multi-organ map: dozens of TotalSegmentator classes
  for (const auto& [name, r] : ref.items()) {
    REQUIRE_OK_AND_ASSIGN(auto img, sp::read_image(dir.path() / name));
    check_against_sitk(img, r, name);
    CHECK(torch::equal(img.voxels, nifti_label.voxels));
  }
  // As a dataset case: image and label in the same format; the label stays integer on the image grid.
  for (const char* ext : {".nrrd", ".nhdr", ".mha", ".mhd"}) {
    sp::CaseEntry c;
    c.id = "real";
    c.images.push_back(dir.path() / (std::string("ct") + ext));
    c.label = dir.path() / (std::string("seg") + ext);
    REQUIRE_OK_AND_ASSIGN(auto loaded, sp::load_case(c));
    REQUIRE(loaded.label);
    CHECK(dtype_of(loaded.label->voxels) == "uint8");
    CHECK(torch::equal(loaded.label->voxels, nifti_label.voxels));
  }
}

TEST_CASE("NRRD and MetaImage files segflow writes are read by SimpleITK with the same grid and voxels") {
  st::TempDir dir("nrrd_mha_write");
  REQUIRE_OK_AND_ASSIGN(auto ct, sp::read_nifti(ct_nifti()));
  // An oblique geometry, so direction and origin handling are exercised in both directions.
  Image img = ct;
  const double c = std::cos(0.4), s = std::sin(0.4);
  img.geometry.direction = {c, -s, 0, s * 0.8, c * 0.8, -0.6, s * 0.6, c * 0.6, 0.8};
  REQUIRE(segflow::direction_is_orthonormal(img.geometry.direction, 1e-12));
  Image two = img;  // two channels: NRRD "list" axis / MetaImage ElementNumberOfChannels
  two.voxels = torch::cat({img.voxels, img.voxels.neg()}, 0);
  struct Out {
    std::string name;
    const Image* image;
    bool compress;
  };
  const std::vector<Out> outs = {{"w.nrrd", &img, true},  {"w_raw.nrrd", &img, false},
                                 {"w.nhdr", &img, true},  {"w_raw.nhdr", &img, false},
                                 {"w.mha", &img, true},   {"w_raw.mha", &img, false},
                                 {"w.mhd", &img, true},   {"w_raw.mhd", &img, false},
                                 {"w2.nrrd", &two, true}, {"w2.mha", &two, true}};
  std::string args = "read " + st::shell_quote((dir.path() / "npy").string());
  for (const auto& o : outs) {
    const fs::path p = dir.path() / o.name;
    segflow::Status w = sp::is_nrrd_path(p) ? sp::write_nrrd(p, *o.image, {.compress = o.compress})
                                            : sp::write_metaimage(p, *o.image, {.compress = o.compress});
    REQUIRE_OK(w);
    args += " " + st::shell_quote(p.string());
  }
  CHECK(fs::exists(dir.path() / "w.raw.gz"));  // detached data beside the .nhdr
  CHECK(fs::exists(dir.path() / "w.zraw"));    // and beside the .mhd
  CHECK(fs::exists(dir.path() / "w_raw.raw"));
  const json ref = sitk_formats(args);
  for (const auto& o : outs) {
    const fs::path p = dir.path() / o.name;
    const json& r = ref[p.string()];
    INFO("file: " << o.name);
    CHECK(r["components"] == o.image->channels());
    check_against_sitk(*o.image, r, o.name);
    // And segflow reads its own file back unchanged.
    REQUIRE_OK_AND_ASSIGN(auto back, sp::read_image(p));
    CHECK(torch::equal(back.voxels, o.image->voxels));
    CHECK(segflow::geometry_close(back.geometry, o.image->geometry, 1e-9));
  }
  // Compression did something (noisy int16 CT: SimpleITK's own files shrink to about 65%).
  CHECK(fs::file_size(dir.path() / "w.nrrd") * 10 < fs::file_size(dir.path() / "w_raw.nrrd") * 8);
  CHECK(fs::file_size(dir.path() / "w.mha") * 10 < fs::file_size(dir.path() / "w_raw.mha") * 8);
  // No staging folders are left behind.
  for (const auto& e : fs::directory_iterator(dir.path()))
    CHECK_MESSAGE(e.path().filename().string().rfind(".segflow-tmp", 0) != 0, e.path());
}

TEST_CASE("an nnU-Net dataset with file_ending .nrrd or .mha is indexed and loaded like its NIfTI original") {
  st::TempDir dir("nrrd_mha_dataset");
  auto ct = sp::read_nifti(ct_nifti());
  auto seg = sp::read_nifti(seg_nifti());
  REQUIRE_OK(ct);
  REQUIRE_OK(seg);
  for (const std::string ending : {".nrrd", ".nhdr", ".mha", ".mhd"}) {
    INFO("file_ending " << ending);
    const fs::path root = dir.path() / ("ds" + ending.substr(1));
    fs::create_directories(root / "imagesTr");
    fs::create_directories(root / "labelsTr");
    for (const char* id : {"case_a", "case_b"}) {
      const fs::path image = root / "imagesTr" / (std::string(id) + "_0000" + ending);
      const fs::path label = root / "labelsTr" / (std::string(id) + ending);
      REQUIRE_OK(sp::is_nrrd_path(image) ? sp::write_nrrd(image, *ct) : sp::write_metaimage(image, *ct));
      REQUIRE_OK(sp::is_nrrd_path(label) ? sp::write_nrrd(label, *seg) : sp::write_metaimage(label, *seg));
    }
    // A NIfTI file that does not match file_ending is skipped, with the reason.
    REQUIRE_OK(sp::write_nifti(root / "imagesTr" / "stray_0000.nii.gz", *ct));
    st::write_file(root / "dataset.json",
                   json{{"labels", {{"background", 0}, {"spleen", 1}, {"kidney_right", 2}}},
                        {"channel_names", {{"0", "CT"}}},
                        {"file_ending", ending}}
                       .dump());
    REQUIRE_OK_AND_ASSIGN(auto idx, sp::scan_dataset(root));
    CHECK(idx.layout == sp::DatasetLayout::msd);
    CHECK(idx.file_ending == ending);
    REQUIRE(idx.cases.size() == 2);
    CHECK(idx.cases[0].id == "case_a");
    REQUIRE(idx.cases[0].label);
    CHECK(idx.label_names.at(1) == "spleen");
    REQUIRE(idx.skipped.size() == 1);
    CHECK(idx.skipped[0].reason.find("file_ending") != std::string::npos);
    REQUIRE_OK_AND_ASSIGN(auto loaded, sp::load_case(idx.cases[1]));
    CHECK(torch::equal(loaded.image.voxels, ct->voxels.to(torch::kFloat)));
    CHECK(torch::equal(loaded.label->voxels, seg->voxels));
    CHECK(segflow::geometry_close(loaded.image.geometry, ct->geometry, 1e-9));
  }
}

TEST_CASE("a NRRD whose sizes do not match its data is one clear error naming the file and the field") {
  st::TempDir dir("nrrd_bad_sizes");
  sitk_write(ct_nifti(), dir.path(), "ct", "");
  const std::string raw = read_text(dir.path() / "ct_raw.nrrd");
  const std::string gz = read_text(dir.path() / "ct.nrrd");
  struct Bad {
    std::string name, text;
  };
  const std::vector<Bad> bad = {
      {"more_slices_raw.nrrd", replaced(raw, "sizes: 122 101 30", "sizes: 122 101 31")},
      {"fewer_slices_raw.nrrd", replaced(raw, "sizes: 122 101 30", "sizes: 122 101 29")},
      {"more_slices_gzip.nrrd", replaced(gz, "sizes: 122 101 30", "sizes: 122 101 31")},
      {"fewer_slices_gzip.nrrd", replaced(gz, "sizes: 122 101 30", "sizes: 122 101 29")},
      {"wider_gzip.nrrd", replaced(gz, "sizes: 122 101 30", "sizes: 123 101 30")},
  };
  for (const auto& b : bad) {
    const fs::path p = dir.path() / b.name;
    st::write_file(p, b.text);
    auto r = sp::read_image(p);
    check_error(r.status(), p, "sizes");
    CHECK(r.status().code() == segflow::ErrorCode::corrupt_data);
  }
  // The figures: 122 * 101 * 31 shorts expected, 122 * 101 * 30 there.
  auto r = sp::read_nrrd(dir.path() / "more_slices_gzip.nrrd");
  CHECK(r.status().message().find("expected 763964 bytes of short") != std::string::npos);
  CHECK(r.status().message().find("got 739320") != std::string::npos);
  // A truncated gzip stream is corrupt data, not a crash.
  const fs::path cut = dir.path() / "cut.nrrd";
  st::write_file(cut, gz.substr(0, gz.size() / 2));
  auto c = sp::read_image(cut);
  REQUIRE_FALSE(c.is_ok());
  CHECK(c.status().message().find(cut.string()) != std::string::npos);
  CHECK(c.status().message().find('\n') == std::string::npos);
}

TEST_CASE("a detached NRRD or MetaImage header whose data file is missing is one clear error naming it") {
  st::TempDir dir("nrrd_mha_missing");
  sitk_write(ct_nifti(), dir.path(), "ct", "");
  const fs::path nhdr = dir.path() / "lost.nhdr";
  st::write_file(
      nhdr, replaced(read_text(dir.path() / "ct_raw.nhdr"), "data file: ct_raw.raw", "data file: gone.raw"));
  auto n = sp::read_image(nhdr);
  check_error(n.status(), nhdr, "data file");
  CHECK(n.status().message().find("gone.raw") != std::string::npos);
  CHECK(n.status().code() == segflow::ErrorCode::not_found);

  const fs::path mhd = dir.path() / "lost.mhd";
  st::write_file(mhd, replaced(read_text(dir.path() / "ct_raw.mhd"), "ElementDataFile = ct_raw.raw",
                               "ElementDataFile = gone.raw"));
  auto m = sp::read_image(mhd);
  check_error(m.status(), mhd, "ElementDataFile");
  CHECK(m.status().message().find((dir.path() / "gone.raw").string()) != std::string::npos);
  CHECK(m.status().code() == segflow::ErrorCode::not_found);
}

TEST_CASE("unknown NRRD encodings and types and MetaImage element types are refused by name") {
  st::TempDir dir("nrrd_mha_unknown");
  sitk_write(ct_nifti(), dir.path(), "ct", "");
  const std::string gz = read_text(dir.path() / "ct.nrrd");
  struct Bad {
    std::string name, text, field, got;
  };
  const std::vector<Bad> bad = {
      {"lzw.nrrd", replaced(gz, "encoding: gzip", "encoding: lzw"), "encoding", "lzw"},
      {"quat.nrrd", replaced(gz, "type: short", "type: quaternion"), "type", "quaternion"},
      {"bzip2.nrrd", replaced(gz, "encoding: gzip", "encoding: bzip2"), "encoding", "bzip2"},
      {"foo.mhd", replaced(read_text(dir.path() / "ct_raw.mhd"), "MET_SHORT", "MET_FOO"), "ElementType",
       "MET_FOO"},
      {"ascii.mha", replaced(read_text(dir.path() / "ct_raw.mha"), "BinaryData = True", "BinaryData = False"),
       "BinaryData", "False"},
      {"ndims.mhd", replaced(read_text(dir.path() / "ct_raw.mhd"), "NDims = 3", "NDims = 4"), "NDims", "4"},
  };
  for (const auto& b : bad) {
    const fs::path p = dir.path() / b.name;
    st::write_file(p, b.text);
    auto r = sp::read_image(p);
    check_error(r.status(), p, b.field);
    CHECK_MESSAGE(r.status().message().find(b.got) != std::string::npos, r.status().message());
  }
}

TEST_CASE("MetaImage data shorter or longer than DimSize, raw or compressed, is one clear error") {
  st::TempDir dir("mha_bad_sizes");
  sitk_write(ct_nifti(), dir.path(), "ct", "");
  const std::string raw_mha = read_text(dir.path() / "ct_raw.mha");
  const std::string z_mha = read_text(dir.path() / "ct.mha");
  const std::string raw_mhd = read_text(dir.path() / "ct_raw.mhd");
  struct Bad {
    std::string name, text, field;
  };
  const std::vector<Bad> bad = {
      {"short_raw.mha", raw_mha.substr(0, raw_mha.size() - 1000), "DimSize"},
      {"more_raw.mhd", replaced(raw_mhd, "DimSize = 122 101 30", "DimSize = 122 101 31"), "DimSize"},
      {"less_raw.mhd", replaced(raw_mhd, "DimSize = 122 101 30", "DimSize = 122 101 29"), "DimSize"},
      {"more_z.mha", replaced(z_mha, "DimSize = 122 101 30", "DimSize = 122 101 31"), "DimSize"},
      {"less_z.mha", replaced(z_mha, "DimSize = 122 101 30", "DimSize = 122 101 29"), "DimSize"},
      {"cut_z.mha", z_mha.substr(0, z_mha.size() / 2), "CompressedDataSize"},
      {"nodims.mha", replaced(raw_mha, "DimSize = 122 101 30", "DimSize = 122 101"), "DimSize"},
  };
  for (const auto& b : bad) {
    const fs::path p = dir.path() / b.name;
    st::write_file(p, b.text);
    auto r = sp::read_image(p);
    check_error(r.status(), p, b.field);
  }
  auto r = sp::read_image(dir.path() / "more_z.mha");
  CHECK(r.status().message().find("expected 763964 bytes of MET_SHORT") != std::string::npos);
  CHECK(r.status().message().find("got 739320 after decompression") != std::string::npos);
  // Not a MetaImage header at all.
  const fs::path junk = dir.path() / "junk.mha";
  st::write_file(junk, "hello world\n");
  auto j = sp::read_image(junk);
  REQUIRE_FALSE(j.is_ok());
  CHECK(j.status().message().find("expected 'Key = Value'") != std::string::npos);
}
