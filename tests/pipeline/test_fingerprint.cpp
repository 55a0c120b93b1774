// The dataset fingerprint: what it records per case and pooled, on every layout, and the
// integrity checks that leave a bad case out (or refuse the dataset) naming file and field.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "pipeline/fingerprint.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/synth.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
namespace fs = std::filesystem;
namespace st = segflow::testing;

namespace {

/// A small MSD / nnU-Net NIfTI dataset from segflow synth.
fs::path synth_nifti(const st::TempDir& dir, int cases, int size = 20,
                     std::array<double, 3> spacing = {0, 0, 0}) {
  SynthOptions o;
  o.cases = cases;
  o.size = size;
  o.out = dir / "ds";
  o.seed = 3;
  o.spacing = spacing;
  REQUIRE_OK(synthesize_dataset(o));
  return o.out;
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(st::read_file(p)); }

void write_json(const fs::path& p, const nlohmann::json& j) { st::write_file(p, j.dump(2)); }

const ExcludedCase* find_excluded(const DatasetFingerprint& fp, const std::string& id) {
  for (const auto& e : fp.excluded)
    if (e.id == id) return &e;
  return nullptr;
}

}  // namespace

TEST_CASE(
    "a fingerprint records size, spacing, orientation, crop shape, class voxels and foreground intensities") {
  st::TempDir dir("fp_basic");
  const fs::path ds = synth_nifti(dir, 3);
  REQUIRE_OK_AND_ASSIGN(auto fp, compute_fingerprint(ds));
  REQUIRE(fp.cases.size() == 3);
  CHECK(fp.excluded.empty());
  CHECK(fp.channel_names == std::vector<std::string>{"CT"});
  CHECK(fp.num_classes == 5);
  CHECK(fp.data_signature.size() == 16);
  for (int i = 0; i < 3; ++i) {
    const auto& c = fp.cases[i];
    const Phantom ph = make_phantom(20, 3, i);
    CHECK(c.size == ph.image.size());
    for (int a = 0; a < 3; ++a)
      CHECK(c.spacing[a] == doctest::Approx(ph.image.geometry.spacing[a]).epsilon(1e-6));
    CHECK(c.orientation.size() == 3);
    // CT air is -1000, not 0: cropping to the non-zero region keeps the whole image.
    CHECK(c.shape_after_crop == c.size);
    CHECK(c.relative_size_after_cropping == doctest::Approx(1.0));
    std::int64_t total = 0;
    for (auto v : c.class_voxels) total += v;
    CHECK(total == c.size[0] * c.size[1] * c.size[2]);
    CHECK(c.class_voxels[2] == (ph.label.voxels == 2).sum().item<std::int64_t>());
    // Per case: exact over its foreground voxels.
    const at::Tensor fg = ph.image.voxels.masked_select(ph.label.voxels > 0).to(torch::kFloat64);
    CHECK(c.foreground[0].voxels == fg.numel());
    CHECK(c.foreground[0].mean == doctest::Approx(fg.mean().item<double>()));
    CHECK(c.foreground[0].max == fg.max().item<double>());
  }
  const auto present = fp.to_json()["cases"][0]["classes_present"];
  REQUIRE(present.size() >= 2);
  CHECK(present[0] == 0);
  CHECK(fp.cases[0].class_voxels[present.back().get<std::size_t>()] > 0);
  // Pooled: each case weighs the same; here every case keeps all its voxels.
  double mean = 0;
  for (const auto& c : fp.cases) mean += c.foreground[0].mean / 3.0;
  CHECK(fp.foreground_intensity[0].mean == doctest::Approx(mean));
  CHECK(fp.foreground_intensity[0].percentile_00_5 < fp.foreground_intensity[0].median);
  CHECK(fp.foreground_intensity[0].median < fp.foreground_intensity[0].percentile_99_5);
}

TEST_CASE("cropping to the non-zero region is the bounding box of voxels non-zero in any channel") {
  st::TempDir dir("fp_crop");
  const fs::path ds = synth_nifti(dir, 1);
  REQUIRE_OK_AND_ASSIGN(Image img, read_image(ds / "imagesTr" / "case_000_0000.nii.gz"));
  // Zero outside a box z 2..9, y 3..12, x 4..15 (an MR-like background).
  at::Tensor v = torch::zeros_like(img.voxels);
  v.narrow(1, 2, 8).narrow(2, 3, 10).narrow(3, 4, 12).fill_(7);
  img.voxels = v;
  REQUIRE_OK(write_nifti(ds / "imagesTr" / "case_000_0000.nii.gz", img));
  REQUIRE_OK_AND_ASSIGN(auto fp, compute_fingerprint(ds));
  REQUIRE(fp.cases.size() == 1);
  CHECK(fp.cases[0].shape_after_crop == Size3{12, 10, 8});
  const auto s = fp.cases[0].size;
  CHECK(fp.cases[0].relative_size_after_cropping ==
        doctest::Approx(960.0 / static_cast<double>(s[0] * s[1] * s[2])));
}

TEST_CASE(
    "fingerprints of DICOM case folders with a SEG and of MedSAM npy are read through the same readers") {
  st::TempDir dir("fp_layouts");
  for (const char* format : {"dicom", "npy"}) {
    SynthOptions o;
    o.cases = 2;
    o.size = 16;
    o.format = format;
    o.out = dir / format;
    REQUIRE_OK(synthesize_dataset(o));
    REQUIRE_OK_AND_ASSIGN(auto fp, compute_fingerprint(o.out));
    INFO(format);
    CHECK(fp.cases.size() == 2);
    CHECK(fp.excluded.empty());
    CHECK(fp.num_classes == 5);
    CHECK(fp.foreground_intensity.size() == 1);
    CHECK(fp.foreground_intensity[0].voxels > 0);
  }
}

TEST_CASE("the fingerprint is the same with one reader thread or two, and survives its JSON") {
  st::TempDir dir("fp_threads");
  const fs::path ds = synth_nifti(dir, 4);
  FingerprintOptions one, two;
  one.threads = 1;
  two.threads = 2;
  one.min_samples_per_case = two.min_samples_per_case = 100;  // subsample, seeded per case
  one.samples_total = two.samples_total = 0;
  REQUIRE_OK_AND_ASSIGN(auto a, compute_fingerprint(ds, one));
  REQUIRE_OK_AND_ASSIGN(auto b, compute_fingerprint(ds, two));
  CHECK(a.samples_per_case == 100);
  CHECK(a.to_json() == b.to_json());
  REQUIRE_OK(write_fingerprint(a, dir / "fingerprint.json"));
  CHECK_FALSE(st::has_temporaries(dir.path()));
  REQUIRE_OK_AND_ASSIGN(auto c, read_fingerprint(dir / "fingerprint.json"));
  CHECK(c.to_json() == a.to_json());
}

TEST_CASE("weighted percentiles with equal weights are numpy's linear percentiles") {
  const std::vector<float> v{5, 1, 4, 2, 3};
  const std::vector<double> w(5, 0.2);
  CHECK(weighted_percentile(v, w, 0) == doctest::Approx(1));
  CHECK(weighted_percentile(v, w, 50) == doctest::Approx(3));
  CHECK(weighted_percentile(v, w, 100) == doctest::Approx(5));
  CHECK(weighted_percentile(v, w, 10) == doctest::Approx(1.4));  // numpy: 1 + 0.4 * (2 - 1)
  CHECK(weighted_percentile(v, w, 99.5) == doctest::Approx(4.98));
  // Two cases of different sizes weigh the same: {0} x 1 and {10, 10, 10} x 3.
  CHECK(weighted_percentile({0, 10, 10, 10}, {1.0, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 50) ==
        doctest::Approx(10).epsilon(0.3));
}

TEST_CASE(
    "a case whose label holds values outside dataset.json's labels is left out, naming file and field") {
  st::TempDir dir("fp_labels");
  const fs::path ds = synth_nifti(dir, 3);
  const fs::path lp = ds / "labelsTr" / "case_001.nii.gz";
  REQUIRE_OK_AND_ASSIGN(Image lab, read_image(lp));
  lab.voxels.view(-1)[0] = 7;
  REQUIRE_OK(write_nifti(lp, lab));
  REQUIRE_OK_AND_ASSIGN(auto fp, compute_fingerprint(ds));
  CHECK(fp.cases.size() == 2);
  const auto* e = find_excluded(fp, "case_001");
  REQUIRE(e != nullptr);
  CHECK(e->field == "label values");
  CHECK(e->file == lp);
  CHECK(st::contains(e->message,
                     lp.string() + ": label values: expected values 0..4 (dataset.json labels), got 7"));
}

TEST_CASE("NaN voxels, a label on another grid and a wrong channel count each leave their case out") {
  st::TempDir dir("fp_integrity");
  const fs::path ds = synth_nifti(dir, 4);
  const fs::path img0 = ds / "imagesTr" / "case_000_0000.nii.gz";
  REQUIRE_OK_AND_ASSIGN(Image img, read_image(img0));
  img.voxels = img.voxels.to(torch::kFloat32);
  img.voxels.view(-1)[5] = NAN;
  REQUIRE_OK(write_nifti(img0, img));
  const fs::path lab1 = ds / "labelsTr" / "case_001.nii.gz";
  REQUIRE_OK_AND_ASSIGN(Image lab, read_image(lab1));
  lab.voxels = lab.voxels.narrow(3, 0, lab.voxels.size(3) - 2).contiguous();
  REQUIRE_OK(write_nifti(lab1, lab));
  // case_002 gets a second channel file: dataset.json promises one.
  fs::copy_file(ds / "imagesTr" / "case_002_0000.nii.gz", ds / "imagesTr" / "case_002_0001.nii.gz");
  REQUIRE_OK_AND_ASSIGN(auto fp, compute_fingerprint(ds));
  REQUIRE(fp.cases.size() == 1);
  CHECK(fp.cases[0].id == "case_003");
  const auto* nan = find_excluded(fp, "case_000");
  REQUIRE(nan != nullptr);
  CHECK(nan->field == "voxels");
  CHECK(st::contains(nan->message, img0.string() + ": voxels: expected finite values, got 1 NaN"));
  const auto* grid = find_excluded(fp, "case_001");
  REQUIRE(grid != nullptr);
  CHECK(grid->field == "grid");
  CHECK(st::contains(grid->message, lab1.string()));
  const auto* ch = find_excluded(fp, "case_002");
  REQUIRE(ch != nullptr);
  CHECK(ch->field == "channels");
  CHECK(st::contains(ch->message, "expected 1 (dataset.json channel_names), got 2"));
}

TEST_CASE("an unreadable case is listed and the rest is still fingerprinted") {
  st::TempDir dir("fp_unreadable");
  const fs::path ds = synth_nifti(dir, 3);
  st::write_file(ds / "imagesTr" / "case_002_0000.nii.gz", "not a nifti file");
  REQUIRE_OK_AND_ASSIGN(auto fp, compute_fingerprint(ds));
  CHECK(fp.cases.size() == 2);
  const auto* e = find_excluded(fp, "case_002");
  REQUIRE(e != nullptr);
  CHECK(st::contains(e->message, "case_002_0000.nii.gz"));
}

TEST_CASE("numTraining that does not match, no labels at all, or no good case refuse the dataset") {
  st::TempDir dir("fp_refuse");
  const fs::path ds = synth_nifti(dir, 2);
  auto dj = read_json(ds / "dataset.json");
  dj["numTraining"] = 5;
  write_json(ds / "dataset.json", dj);
  auto r = compute_fingerprint(ds);
  REQUIRE_FALSE(r.is_ok());
  CHECK(st::contains(r.status().message(), "dataset.json: numTraining: expected 2"));
  CHECK(st::contains(r.status().message(), "got 5"));
  dj["numTraining"] = 2;
  write_json(ds / "dataset.json", dj);
  fs::rename(ds / "labelsTr", ds / "labels_gone");
  r = compute_fingerprint(ds);
  REQUIRE_FALSE(r.is_ok());
  CHECK(st::contains(r.status().message(), "labels: expected a label map per case"));
  fs::rename(ds / "labels_gone", ds / "labelsTr");
  dj["channel_names"] = {{"0", "CT"}, {"1", "PET"}};  // lies: every case has one channel
  write_json(ds / "dataset.json", dj);
  r = compute_fingerprint(ds);
  REQUIRE_FALSE(r.is_ok());
  CHECK(st::contains(r.status().message(), "every case failed its checks"));
  CHECK(st::contains(r.status().message(), "channels: expected 2 (dataset.json channel_names), got 1"));
}

TEST_CASE("the data signature changes when a case's file changes and not otherwise") {
  st::TempDir dir("fp_signature");
  const fs::path ds = synth_nifti(dir, 2);
  REQUIRE_OK_AND_ASSIGN(auto a, dataset_signature(ds));
  REQUIRE_OK_AND_ASSIGN(auto b, dataset_signature(ds));
  CHECK(a == b);
  st::write_file(ds / "labelsTr" / "case_001.nii.gz",
                 st::read_file(ds / "labelsTr" / "case_001.nii.gz") + "x");
  REQUIRE_OK_AND_ASSIGN(auto c, dataset_signature(ds));
  CHECK(c != a);
}
