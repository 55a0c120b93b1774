// DICOM SEG segment descriptions (read_dicom_seg_segments) against pydicom's reading of the
// SegmentSequence on real SEGs (dcmqi's liver.dcm of pydicom-data, Debian's pydicom test
// files) and on SEGs segflow writes with names; folders of DICOM case folders holding
// localizers or a second series; a label stored on the real CT series' grid with a flipped
// row axis (totalsegmentator's example_seg_dicom.nii.gz), compared with SimpleITK.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcitem.h>
#include <dcmtk/dcmdata/dcsequen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dicom_test_data.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/dicom_seg_style.hpp"
#include "pipeline/io/nifti.hpp"
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

/// `seg_check.py segments FILES...`: pydicom's reading of each file's SegmentSequence.
nlohmann::json pydicom_segments(const std::vector<fs::path>& files) {
  std::string cmd = st::shell_quote(st::python()) + " " +
                    st::shell_quote(st::source_path("tests/tools/seg_check.py").string()) + " segments";
  for (const auto& f : files) cmd += " " + st::shell_quote(f.string());
  auto r = st::run_command(cmd);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return nlohmann::json::parse(r.out);
}

/// Every field read_dicom_seg_segments returns equals pydicom's reading.
void check_like_pydicom(const fs::path& file, const nlohmann::json& ref) {
  CAPTURE(file.string());
  REQUIRE_OK_AND_ASSIGN(auto segs, sp::read_dicom_seg_segments(file));
  REQUIRE(ref.is_array());
  REQUIRE(segs.size() == ref.size());
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const sp::DicomSegment& s = segs[i];
    const auto& r = ref[i];
    CHECK(s.number == r["number"].get<int>());
    CHECK(s.label == r["label"].get<std::string>());
    CHECK(s.description == r["description"].get<std::string>());
    CHECK(s.algorithm_type == r["algorithm_type"].get<std::string>());
    CHECK(s.category == r["category"].get<std::string>());
    CHECK(s.type == r["type"].get<std::string>());
  }
}

/// A copy of `from` at `to` whose SegmentSequence `edit` changed.
template <class F>
void edited_copy(const fs::path& from, const fs::path& to, F edit) {
  DcmFileFormat ff;
  REQUIRE(ff.loadFile(from.c_str()).good());
  REQUIRE(ff.loadAllDataIntoMemory().good());
  DcmDataset& ds = *ff.getDataset();
  DcmSequenceOfItems* seq = nullptr;
  REQUIRE(ds.findAndGetSequence(DCM_SegmentSequence, seq).good());
  REQUIRE(seq != nullptr);
  edit(ds, *seq);
  REQUIRE(ff.saveFile(to.c_str(), ds.getOriginalXfer()).good());
}

std::string segments_error(const fs::path& file) {
  auto r = sp::read_dicom_seg_segments(file);
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

/// A label map (1, Z, Y, X) on `g` with values 1, 2 and 5 in blocks.
Image block_labels(const Image& img) {
  const auto s = img.size();
  auto lab = torch::zeros({1, s[2], s[1], s[0]}, torch::kUInt8);
  using torch::indexing::Slice;
  lab.index_put_({0, Slice(0, 3), Slice(2, 8), Slice(3, 9)}, 1);
  lab.index_put_({0, Slice(1, 4), Slice(9, 14), Slice(2, 6)}, 2);
  lab.index_put_({0, Slice(2, 5), Slice(10, 15), Slice(10, 15)}, 5);
  Image labels;
  labels.voxels = lab;
  labels.geometry = img.geometry;
  return labels;
}

std::vector<sp::SegmentStyle> styles_of(const std::vector<std::string>& names) {
  std::vector<sp::SegmentStyle> styles(names.size());
  for (std::size_t v = 0; v < names.size(); ++v)
    styles[v] = {names[v], sp::default_segment_colour(static_cast<std::int64_t>(v))};
  return styles;
}

}  // namespace

TEST_CASE("DICOM SEG segment descriptions read from the header agree with pydicom's SegmentSequence") {
  st::TempDir dir("seg_segments");
  // dcmqi's liver SEG (pydicom-data, explicit little and big endian) and Debian's one-frame copies.
  std::vector<fs::path> files = {st::pydicom_data_path("liver.dcm"), st::pydicom_data_path("liver_expb.dcm")};
  for (const char* name : {"liver_1frame.dcm", "liver_expb_1frame.dcm"})
    if (fs::exists(st::debian_pydicom_path(name))) files.push_back(st::debian_pydicom_path(name));
  // A SEG segflow writes with three named segments (values 1, 2, 5) on a real CT series.
  const fs::path ct = dir / "ct";
  copy_series(st::ct5n_series(), ct);
  REQUIRE_OK_AND_ASSIGN(auto src, sp::dicom_source_series(ct));
  REQUIRE_OK_AND_ASSIGN(auto img, sp::read_dicom(ct));
  const fs::path named = dir / "named.dcm";
  REQUIRE_OK(sp::write_dicom_seg(named, block_labels(img), src,
                                 styles_of({"background", "spleen", "Left Kidney", "", "", "liver"})));
  files.push_back(named);

  const nlohmann::json ref = pydicom_segments(files);
  for (const auto& f : files) check_like_pydicom(f, ref[f.string()]);

  // What the files hold, so that agreeing on nothing cannot pass.
  REQUIRE_OK_AND_ASSIGN(auto liver, sp::read_dicom_seg_segments(files.front()));
  REQUIRE(liver.size() == 1);
  CHECK(liver.front().number == 1);
  CHECK(liver.front().label == "Liver");
  CHECK(liver.front().algorithm_type == "SEMIAUTOMATIC");
  CHECK(liver.front().category == "Tissue");
  CHECK(liver.front().type == "Liver");
  CHECK(sp::segment_class_names(liver) == std::vector<std::string>{"background", "Liver"});

  REQUIRE_OK_AND_ASSIGN(auto ours, sp::read_dicom_seg_segments(named));
  // One segment per value 1..5 (the writer's rule); 3 and 4, unnamed, keep the placeholder.
  REQUIRE(ours.size() == 5);
  CHECK(ours[0].number == 1);
  CHECK(ours[1].label == "Left Kidney");
  CHECK(ours[2].label == "label_3");
  CHECK(ours[4].number == 5);
  CHECK(ours[4].label == "liver");
  CHECK(sp::segment_class_names(ours) ==
        std::vector<std::string>{"background", "spleen", "Left Kidney", "", "", "liver"});

  // segflow's placeholder names ("label_<v>") name nothing.
  const fs::path plain = dir / "plain.dcm";
  REQUIRE_OK(sp::write_dicom_seg(plain, block_labels(img), src));
  REQUIRE_OK_AND_ASSIGN(auto placeholders, sp::read_dicom_seg_segments(plain));
  REQUIRE(placeholders.size() == 5);
  CHECK(placeholders.back().label == "label_5");
  CHECK(sp::segment_class_names(placeholders).empty());
}

TEST_CASE(
    "a SEG without segments, with a segment number missing, out of range or used twice is refused naming "
    "the file and the tag") {
  st::TempDir dir("seg_segments_bad");
  const fs::path liver = st::pydicom_data_path("liver.dcm");

  const fs::path ct = st::ct5n_series() / files_in(st::ct5n_series()).front().filename();
  CHECK(segments_error(ct) == ct.string() +
                                  ": SOPClassUID (0008,0016): expected Segmentation Storage "
                                  "(1.2.840.10008.5.1.4.1.1.66.4), got \"1.2.840.10008.5.1.4.1.1.2\"");

  const fs::path none = dir / "none.dcm";
  edited_copy(liver, none, [](DcmDataset& ds, DcmSequenceOfItems&) {
    REQUIRE(ds.findAndDeleteElement(DCM_SegmentSequence).good());
  });
  CHECK(segments_error(none) ==
        none.string() + ": SegmentSequence (0062,0002): expected at least one segment, got none");

  const fs::path missing = dir / "missing.dcm";
  edited_copy(liver, missing, [](DcmDataset&, DcmSequenceOfItems& seq) {
    REQUIRE(seq.getItem(0)->findAndDeleteElement(DCM_SegmentNumber).good());
  });
  CHECK(segments_error(missing) ==
        missing.string() +
            ": SegmentSequence (0062,0002) item 1: SegmentNumber (0062,0004): required tag is missing");

  const fs::path zero = dir / "zero.dcm";
  edited_copy(liver, zero, [](DcmDataset&, DcmSequenceOfItems& seq) {
    REQUIRE(seq.getItem(0)->putAndInsertUint16(DCM_SegmentNumber, 0).good());
  });
  CHECK(segments_error(zero) ==
        zero.string() +
            ": SegmentSequence (0062,0002) item 1: SegmentNumber (0062,0004): expected 1..65535, got 0");

  const fs::path twice = dir / "twice.dcm";
  edited_copy(liver, twice, [](DcmDataset&, DcmSequenceOfItems& seq) {
    auto* copy = new DcmItem(*seq.getItem(0));
    REQUIRE(seq.append(copy).good());
  });
  CHECK(segments_error(twice) ==
        twice.string() +
            ": SegmentSequence (0062,0002) item 2: SegmentNumber (0062,0004): expected "
            "each number once, got 1 also in item 1");
  // pydicom reads the duplicate: the file is well-formed DICOM, only not a valid SEG.
  CHECK(pydicom_segments({twice})[twice.string()].size() == 2);

  const fs::path absent = dir / "absent.dcm";
  CHECK(contains(segments_error(absent), absent.string()));
  const fs::path text = dir / "text.dcm";
  st::write_file(text, "not DICOM at all");
  CHECK(contains(segments_error(text), text.string()));
}

TEST_CASE(
    "a DICOM case folder with localizers indexes as one case that reads the largest stack, the localizers "
    "listed as skipped") {
  st::TempDir dir("dicom_cases_scouts");
  const fs::path root = dir / "data";
  const fs::path case_a = root / "case_a";
  copy_series(st::ct5n_series(), case_a);
  copy_series(st::mr_scouts_series(), case_a, "scout_");
  // A case folder holding localizers only: nothing to read, skipped with read_dicom's reason.
  copy_series(st::mr_scouts_series(), root / "case_b");

  // The SEG beside case_a: written on the stack read, referencing its five files only.
  REQUIRE_OK_AND_ASSIGN(auto src, sp::dicom_source_series(case_a));
  REQUIRE(src.files.size() == 5);
  for (const auto& f : src.files) CHECK(f.filename().string().rfind("scout_", 0) != 0);
  CHECK(src.modality == "CT");
  REQUIRE_OK_AND_ASSIGN(auto ct, sp::read_dicom(st::ct5n_series()));
  const Image labels = block_labels(ct);
  const std::vector<std::string> names = {"background", "spleen", "Left Kidney", "", "", "liver"};
  REQUIRE_OK(sp::write_dicom_seg(case_a / "seg.dcm", labels, src, styles_of(names)));

  REQUIRE_OK_AND_ASSIGN(auto idx, sp::scan_dataset(root));
  CHECK(idx.layout == sp::DatasetLayout::dicom);
  REQUIRE(idx.cases.size() == 1);
  const sp::CaseEntry& c = idx.cases.front();
  CHECK(c.id == "case_a");
  CHECK(c.images == std::vector<fs::path>{case_a});
  REQUIRE(c.label.has_value());
  CHECK(*c.label == case_a / "seg.dcm");
  CHECK(idx.label_names == names);
  CHECK(sp::dataset_label_names(root) == names);

  // Seven localizer slices of case_a listed, each by its file; case_b skipped as a whole.
  std::size_t scouts = 0, case_b = 0;
  for (const auto& s : idx.skipped) {
    CAPTURE(s.path.string());
    CAPTURE(s.reason);
    if (s.path.parent_path() == case_a) {
      ++scouts;
      CHECK(s.path.filename().string().rfind("scout_", 0) == 0);
      CHECK(contains(s.reason, "case folder case_a: not read: "));
      CHECK(contains(s.reason, "(1 slice): 1 slice, fewer than the 5 of the stack read"));
    } else if (s.path == root / "case_b") {
      ++case_b;
      CHECK(contains(s.reason, "case folder case_b: "));
      CHECK(contains(s.reason, "no stack of 2 or more parallel slices"));
    }
  }
  CHECK(scouts == 7);
  CHECK(case_b == 1);

  // The case loads the CT stack (as SimpleITK reads the CT alone) with its label.
  REQUIRE_OK_AND_ASSIGN(auto loaded, sp::load_case(c));
  CHECK(loaded.image.modality == "CT");
  CHECK(torch::equal(loaded.image.voxels, ct.voxels));
  const auto ref = st::reference_read("sitk", st::ct5n_series());
  for (int i = 0; i < 3; ++i) {
    CHECK(loaded.image.size()[i] == ref["size"][i].get<std::int64_t>());
    CHECK(std::abs(loaded.image.geometry.origin[i] - ref["origin"][i].get<double>()) < 1e-4);
  }
  REQUIRE(loaded.label.has_value());
  CHECK(torch::equal(loaded.label->voxels.to(torch::kInt64), labels.voxels.to(torch::kInt64)));

  // A dataset whose first case has a NIfTI label: its labels are volumes, and the SEG of a
  // later case names nothing (nor are the other cases' headers read for it).
  const fs::path mixed = dir / "mixed";
  copy_series(st::ct5n_series(), mixed / "a");
  REQUIRE_OK(sp::write_nifti(mixed / "a" / "label.nii.gz", labels));
  copy_series(case_a, mixed / "b");
  REQUIRE_OK_AND_ASSIGN(auto mixed_idx, sp::scan_dataset(mixed));
  REQUIRE(mixed_idx.cases.size() == 2);
  CHECK(mixed_idx.cases[1].label == mixed / "b" / "seg.dcm");
  CHECK(mixed_idx.label_names.empty());
  CHECK(sp::dataset_label_names(mixed).empty());
}

TEST_CASE(
    "a label stored with a flipped row axis on the real CT series' lattice is read onto the series grid "
    "like SimpleITK resamples it") {
  // totalsegmentator's example_seg_dicom.nii.gz: 117 classes on the grid of example_ct_dicom
  // (20 slices of 512 x 512, lossless JPEG 2000) with its row axis stored bottom-up.
  const fs::path ts = st::testdata_path("totalsegmentator");
  st::TempDir dir("dicom_case_flipped");
  const fs::path case_dir = dir / "data" / "s01";
  fs::create_directories(case_dir);
  for (const auto& f : files_in(ts / "example_ct_dicom")) fs::copy_file(f, case_dir / f.filename());
  fs::copy_file(ts / "example_seg_dicom.nii.gz", case_dir / "label.nii.gz");

  REQUIRE_OK_AND_ASSIGN(auto idx, sp::scan_dataset(dir / "data"));
  REQUIRE(idx.cases.size() == 1);
  REQUIRE(idx.cases.front().label.has_value());
  CHECK(*idx.cases.front().label == case_dir / "label.nii.gz");
  REQUIRE_OK_AND_ASSIGN(auto loaded, sp::load_case(idx.cases.front()));
  REQUIRE(loaded.label.has_value());
  CHECK(segflow::geometry_close(loaded.label->geometry, loaded.image.geometry, 1e-9));

  // The label file is not on the series grid as stored (row axis flipped) ...
  REQUIRE_OK_AND_ASSIGN(auto raw, sp::read_nifti(ts / "example_seg_dicom.nii.gz"));
  CHECK_FALSE(segflow::geometry_close(raw.geometry, loaded.image.geometry, 1e-3));
  // ... and SimpleITK, resampling it onto the series through patient coordinates, gets the
  // same voxels (so the same count per class).
  const fs::path npy = dir / "onto.npy";
  auto r = st::run_command(st::shell_quote(st::python()) + " " +
                           st::shell_quote(st::source_path("tests/tools/seg_check.py").string()) + " onto " +
                           st::shell_quote((ts / "example_ct_dicom").string()) + " " +
                           st::shell_quote((ts / "example_seg_dicom.nii.gz").string()) + " " +
                           st::shell_quote(npy.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE_OK_AND_ASSIGN(auto sitk, sp::read_npy(npy));
  const at::Tensor ours = loaded.label->voxels.to(torch::kInt32);
  REQUIRE((ours.sizes() == sitk.sizes()));
  CHECK(torch::equal(ours, sitk));
  std::size_t classes = 0;
  for (const auto& [value, count] : j["counts"].items()) {
    const auto& label_value = value;  // clang 14 cannot capture a structured binding
    CAPTURE(label_value);
    CHECK(ours.eq(std::stoi(value)).sum().item<std::int64_t>() == count.get<std::int64_t>());
    ++classes;
  }
  CHECK(classes > 20);  // the real label: many organs on these 20 slices
}

TEST_CASE(
    "pydicom-data's real Enhanced CT multi-frame file reads the values SimpleITK reads at the same patient "
    "positions") {
  // eCT_Supplemental.dcm: 2 frames of 512 x 512, 10 mm apart, geometry in functional groups,
  // rescale in the shared PixelValueTransformationSequence. segflow keeps the frames along
  // the slice normal of the orientation (z decreasing here); SimpleITK orders them by
  // increasing z: the same lattice with the slice axis reversed.
  const fs::path file = st::pydicom_data_path("eCT_Supplemental.dcm");
  REQUIRE_OK_AND_ASSIGN(auto img, sp::read_dicom(file));
  st::TempDir dir("ect_sitk");
  st::write_file(dir / "list.txt", file.string() + "\n");
  auto r = st::run_command(st::shell_quote(st::python()) + " " +
                           st::shell_quote(st::source_path("tests/tools/reference.py").string()) +
                           " arrays sitk " + st::shell_quote((dir / "list.txt").string()) + " " +
                           st::shell_quote(dir.path().string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto arr = nlohmann::json::parse(r.out)[file.string()];
  INFO(arr.dump());
  REQUIRE(arr.contains("npy"));
  REQUIRE_OK_AND_ASSIGN(auto sitk, sp::read_npy(arr["npy"].get<std::string>()));
  const auto ref = st::reference_read("sitk", file);

  const auto& g = img.geometry;
  CHECK(img.size() == segflow::Size3{512, 512, 2});
  for (int i = 0; i < 3; ++i) {
    CHECK(img.size()[i] == ref["size"][i].get<std::int64_t>());
    CHECK(g.spacing[i] == doctest::Approx(ref["spacing"][i].get<double>()).epsilon(1e-6));
  }
  // In-plane axes equal; the slice axis reversed; the last slice of ours is SimpleITK's first.
  for (int k = 0; k < 3; ++k) {
    CHECK(std::abs(g.direction[k * 3 + 0] - ref["direction"][k * 3 + 0].get<double>()) < 1e-6);
    CHECK(std::abs(g.direction[k * 3 + 1] - ref["direction"][k * 3 + 1].get<double>()) < 1e-6);
    CHECK(std::abs(g.direction[k * 3 + 2] + ref["direction"][k * 3 + 2].get<double>()) < 1e-6);
  }
  const auto last = segflow::index_to_physical(g, {0.0, 0.0, 1.0});
  for (int k = 0; k < 3; ++k) CHECK(std::abs(last[k] - ref["origin"][k].get<double>()) < 1e-4);
  REQUIRE((img.voxels.sizes() == sitk.sizes()));
  CHECK(torch::equal(img.voxels.flip({1}), sitk));
  CHECK(img.voxels.min().item<double>() == -1024.0);  // the shared rescale applied
}
