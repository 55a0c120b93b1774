// synth -> dataset scan -> load -> inspect, for every output format; bad cases skipped.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "pipeline/inspect.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/synth.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using segflow::testing::TempDir;

namespace {

void check_against_phantom(const LoadedCase& c, const Phantom& ph, bool geometry) {
  REQUIRE(c.label.has_value());
  CHECK(torch::equal(c.image.voxels, ph.image.voxels));
  CHECK(torch::equal(c.label->voxels.to(torch::kUInt8), ph.label.voxels));
  if (geometry) {
    CHECK(geometry_close(c.image.geometry, ph.image.geometry, 1e-4));
    CHECK(geometry_close(c.label->geometry, ph.image.geometry, 1e-4));
  }
}

}  // namespace

TEST_CASE("a synthetic phantom has every structure, integer HU values and CT-like ranges") {
  Phantom ph = make_phantom(48, 7, 0);
  const auto s = ph.image.size();
  CHECK(s[0] == 48);
  CHECK(s[1] == 48);
  CHECK((ph.image.voxels.scalar_type() == torch::kFloat32));
  CHECK(torch::equal(ph.image.voxels, ph.image.voxels.round()));
  CHECK(ph.image.voxels.min().item<float>() >= -1024);
  CHECK(ph.image.voxels.max().item<float>() <= 3071);
  auto labels = std::get<0>(at::_unique(ph.label.voxels.flatten().to(torch::kLong)));
  CHECK(labels.numel() == kPhantomLabels + 1);
  // Mean HU per structure is ordered: liver < spleen < kidney < spine, and air is near -1000.
  std::vector<double> means;
  for (int l = 1; l <= kPhantomLabels; ++l)
    means.push_back(ph.image.voxels.masked_select(ph.label.voxels == l).mean().item<double>());
  for (int l = 1; l < kPhantomLabels; ++l) CHECK(means[l - 1] < means[l]);
  CHECK(ph.image.voxels.min().item<float>() < -900);
  // spacing is anisotropic: slices are thicker than pixels
  CHECK(ph.image.geometry.spacing[2] > ph.image.geometry.spacing[0]);
}

TEST_CASE("a hard phantom: thick slices, low contrast, strong noise, a thin spleen and touching organs") {
  Phantom ph = make_phantom(64, 7, 0, {0, 0, 0}, 0.0, /*hard=*/true);
  const auto& sp = ph.image.geometry.spacing;
  CHECK(sp[0] == doctest::Approx(sp[1]));
  CHECK(sp[0] >= 0.7 * 0.85 - 1e-9);
  CHECK(sp[0] <= 0.7 * 1.15 + 1e-9);
  CHECK(sp[2] >= 5.0 * 0.85 - 1e-9);
  auto labels = std::get<0>(at::_unique(ph.label.voxels.flatten().to(torch::kLong)));
  CHECK(labels.numel() == kPhantomLabels + 1);
  // Low contrast: liver and kidneys (20-35 HU apart before noise and bias) overlap in
  // intensity, where the normal phantom's are many noise widths apart.
  auto contrast = [](const Phantom& p) {
    const at::Tensor liver = p.image.voxels.masked_select(p.label.voxels == 1);
    const at::Tensor kidney = p.image.voxels.masked_select(p.label.voxels == 3);
    return std::abs(kidney.mean().item<double>() - liver.mean().item<double>()) / liver.std().item<double>();
  };
  const double hard_contrast = contrast(ph), normal_contrast = contrast(make_phantom(64, 7, 0));
  MESSAGE("liver-kidney contrast in liver noise widths: hard " << hard_contrast << ", normal "
                                                               << normal_contrast);
  CHECK(hard_contrast < 2.0);
  CHECK(normal_contrast > 4.0);
  CHECK(ph.image.voxels.masked_select(ph.label.voxels == 1).std().item<double>() > 25.0);
  // Touching structures: a spleen voxel next to a kidney voxel, a kidney voxel next to liver
  // (along x, y or z).
  auto touching = [&](int a, int b) {
    const at::Tensor la = ph.label.voxels[0] == a, lb = ph.label.voxels[0] == b;
    bool any = false;
    for (int d = 0; d < 3 && !any; ++d) {
      const auto n = la.size(d);
      any = (la.narrow(d, 0, n - 1) & lb.narrow(d, 1, n - 1)).any().item<bool>() ||
            (lb.narrow(d, 0, n - 1) & la.narrow(d, 1, n - 1)).any().item<bool>();
    }
    return any;
  };
  CHECK(touching(2, 3));
  CHECK(touching(1, 3));
  // The normal phantom of the same case does not change: hard is its own draw.
  Phantom normal = make_phantom(64, 7, 0);
  CHECK(normal.image.geometry.spacing[2] < 3.0 + 1e-9);
}

TEST_CASE("every third synthetic phantom has an oblique orientation and all are orthonormal") {
  for (int i = 0; i < 3; ++i) {
    Phantom ph = make_phantom(24, 1, i);
    CHECK(direction_is_orthonormal(ph.image.geometry.direction, 1e-9));
    const bool identity = ph.image.geometry.direction[0] == 1.0 && ph.image.geometry.direction[4] == 1.0;
    CHECK(identity == (i % 3 != 2));
  }
}

TEST_CASE("a synthetic phantom is deterministic for a seed and differs across seeds") {
  Phantom a = make_phantom(24, 3, 1), b = make_phantom(24, 3, 1), c = make_phantom(24, 4, 1);
  CHECK(torch::equal(a.image.voxels, b.image.voxels));
  CHECK(torch::equal(a.label.voxels, b.label.voxels));
  CHECK_FALSE(torch::equal(a.image.voxels, c.image.voxels));
}

TEST_CASE("a synthetic NIfTI dataset round-trips exactly through the MSD layout scan and load") {
  TempDir dir("synth_nifti");
  SynthOptions o;
  o.cases = 3;
  o.size = 24;
  o.format = "nifti";
  o.out = dir.path();
  o.seed = 5;
  REQUIRE_OK(synthesize_dataset(o));
  REQUIRE_OK_AND_ASSIGN(auto idx, scan_dataset(dir.path()));
  CHECK(idx.layout == DatasetLayout::msd);
  REQUIRE(idx.cases.size() == 3);
  CHECK(idx.skipped.empty());
  CHECK(idx.label_names.size() == kPhantomLabels + 1);
  CHECK(idx.label_names[2] == "spleen");
  for (int i = 0; i < 3; ++i) {
    REQUIRE_OK_AND_ASSIGN(auto c, load_case(idx.cases[i]));
    check_against_phantom(c, make_phantom(24, 5, i), true);
  }
}

TEST_CASE("a synthetic npy dataset round-trips values through the MedSAM imgs/gts layout") {
  TempDir dir("synth_npy");
  SynthOptions o;
  o.cases = 2;
  o.size = 24;
  o.format = "npy";
  o.out = dir.path();
  REQUIRE_OK(synthesize_dataset(o));
  REQUIRE_OK_AND_ASSIGN(auto idx, scan_dataset(dir.path()));
  CHECK(idx.layout == DatasetLayout::medsam_npy);
  REQUIRE(idx.cases.size() == 2);
  for (int i = 0; i < 2; ++i) {
    REQUIRE_OK_AND_ASSIGN(auto c, load_case(idx.cases[i]));
    check_against_phantom(c, make_phantom(24, 0, i), false);  // npy has no geometry
  }
}

TEST_CASE("a synthetic DICOM dataset round-trips exactly for every compression") {
  for (const char* comp : {"none", "rle", "jpeg-ls", "jpeg-lossless"}) {
    CAPTURE(comp);
    TempDir dir("synth_dicom");
    SynthOptions o;
    o.cases = 3;  // the third case is oblique
    o.size = 20;
    o.format = "dicom";
    o.compress = comp;
    o.out = dir.path();
    o.seed = 11;
    Status st = synthesize_dataset(o);
    REQUIRE_OK(st);
    REQUIRE_OK_AND_ASSIGN(auto idx, scan_dataset(dir.path()));
    CHECK(idx.layout == DatasetLayout::dicom);
    REQUIRE(idx.cases.size() == 3);
    for (int i = 0; i < 3; ++i) {
      REQUIRE_OK_AND_ASSIGN(auto c, load_case(idx.cases[i]));
      check_against_phantom(c, make_phantom(20, 11, i), true);
    }
  }
}

TEST_CASE("inspect reports the exact geometry, statistics and labels of synthetic files") {
  TempDir dir("synth_inspect");
  SynthOptions o;
  o.cases = 3;
  o.size = 20;
  o.out = dir.path();
  o.seed = 2;
  for (const char* fmt : {"nifti", "dicom"}) {
    CAPTURE(fmt);
    o.format = fmt;
    o.out = dir.path() / fmt;
    REQUIRE_OK(synthesize_dataset(o));
    Phantom ph = make_phantom(20, 2, 2);
    const auto image_path =
        std::string(fmt) == "nifti" ? o.out / "imagesTr" / "case_002_0000.nii.gz" : o.out / "case_002";
    REQUIRE_OK_AND_ASSIGN(auto j, inspect_path(image_path));
    const auto s = ph.image.size();
    CHECK(j["size"] == nlohmann::json({s[0], s[1], s[2]}));
    for (int k = 0; k < 3; ++k) {
      CHECK(j["spacing"][k].get<double>() == doctest::Approx(ph.image.geometry.spacing[k]).epsilon(1e-6));
      CHECK(j["origin"][k].get<double>() == doctest::Approx(ph.image.geometry.origin[k]).epsilon(1e-6));
    }
    for (int k = 0; k < 9; ++k)
      CHECK(j["direction"][k].get<double>() == doctest::Approx(ph.image.geometry.direction[k]).epsilon(1e-6));
    CHECK(j["min"].get<double>() == ph.image.voxels.min().item<double>());
    CHECK(j["max"].get<double>() == ph.image.voxels.max().item<double>());
    CHECK(j["mean"].get<double>() ==
          doctest::Approx(ph.image.voxels.to(torch::kDouble).mean().item<double>()).epsilon(1e-9));
    if (std::string(fmt) == "dicom") {
      CHECK(j["labels"] == nlohmann::json({0, 1, 2, 3, 4}));
    } else {
      REQUIRE_OK_AND_ASSIGN(auto jl, inspect_path(o.out / "labelsTr" / "case_002.nii.gz"));
      CHECK(jl["labels"] == nlohmann::json({0, 1, 2, 3, 4}));
      CHECK(jl["dtype"] == "uint8");
      CHECK_FALSE(j.contains("labels"));
    }
  }
}

TEST_CASE("a dataset scan skips a corrupt case, reports it and keeps the good ones") {
  TempDir dir("scan_bad");
  SynthOptions o;
  o.cases = 4;
  o.size = 20;
  o.format = "nifti";
  o.out = dir.path();
  REQUIRE_OK(synthesize_dataset(o));
  // case_001: truncated image; case_002: label on another grid; case_003: zero-byte label.
  auto img1 = dir.path() / "imagesTr" / "case_001_0000.nii.gz";
  auto bytes = segflow::testing::read_file(img1);
  segflow::testing::write_file(img1, bytes.substr(0, bytes.size() / 3));
  Phantom other = make_phantom(24, 99, 0);
  REQUIRE_OK(write_nifti(dir.path() / "labelsTr" / "case_002.nii.gz", other.label));
  segflow::testing::write_file(dir.path() / "labelsTr" / "case_003.nii.gz", "");
  REQUIRE_OK_AND_ASSIGN(auto idx, scan_dataset(dir.path()));
  REQUIRE(idx.cases.size() == 1);
  CHECK(idx.cases[0].id == "case_000");
  REQUIRE(idx.skipped.size() == 3);
  std::string all;
  for (auto& s : idx.skipped) all += s.path.string() + " | " + s.reason + "\n";
  CAPTURE(all);
  CHECK(all.find("case_001_0000.nii.gz") != std::string::npos);
  CHECK(all.find("case_002.nii.gz: label size") != std::string::npos);
  CHECK(all.find("case_003.nii.gz") != std::string::npos);
}

TEST_CASE("synth rejects bad options with a message naming the option") {
  SynthOptions o;
  o.out = "/tmp/never";
  o.cases = 0;
  CHECK(synthesize_dataset(o).message().find("--cases") != std::string::npos);
  o.cases = 1;
  o.format = "png";
  CHECK(synthesize_dataset(o).message().find("--format: expected dicom, nifti or npy, got 'png'") !=
        std::string::npos);
  o.format = "nifti";
  o.compress = "rle";
  CHECK(synthesize_dataset(o).message().find("--compress") != std::string::npos);
}
