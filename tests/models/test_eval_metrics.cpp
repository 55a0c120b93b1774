// Evaluation metrics (models/evidence/eval_metrics.hpp): the exact distance transform against brute
// force, surface voxels, and every score against MONAI 1.4 on anisotropic label maps that
// tests/tools/monai_metrics.py writes with nibabel.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "models/evidence/eval_metrics.hpp"
#include "pipeline/io/nifti.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::TempDir;

namespace {

/// Runs tests/tools/monai_metrics.py with `args`; its JSON output.
nlohmann::json monai_metrics(const std::string& args) {
  auto r = testing::run_command(
      testing::shell_quote(testing::python()) + " " +
      testing::shell_quote(testing::source_path("tests/tools/monai_metrics.py").string()) + " " + args);
  REQUIRE_MESSAGE(r.exit_code == 0, "monai_metrics.py " << args << ": " << r.out);
  return nlohmann::json::parse(r.out);
}

/// MONAI's value: a number, NaN for null, +inf for "inf".
double monai_value(const nlohmann::json& v) {
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (v.is_string()) return v.get<std::string>() == "inf" ? INFINITY : -INFINITY;
  return v.get<double>();
}

/// Compares our scores of `labels` with MONAI's on the files in `dir`; NSD at each of
/// `tolerances` (mm, written as Python prints them: "1.7"), the rest at the first.
void compare_with_monai(const std::filesystem::path& dir, const std::vector<std::int64_t>& labels,
                        const std::vector<std::string>& tolerances, bool two_d) {
  std::string cls, tols;
  for (auto l : labels) cls += (cls.empty() ? "" : ",") + std::to_string(l);
  for (const auto& t : tolerances) tols += (tols.empty() ? "" : ",") + t;
  const auto ref = monai_metrics("score " + testing::shell_quote((dir / "pred.nii.gz").string()) + " " +
                                 testing::shell_quote((dir / "gt.nii.gz").string()) + " --classes " + cls +
                                 " --tolerance " + tols);
  auto pred = pipeline::read_nifti(dir / "pred.nii.gz");
  auto gt = pipeline::read_nifti(dir / "gt.nii.gz");
  REQUIRE_OK(pred);
  REQUIRE_OK(gt);
  const auto sp = gt->geometry.spacing;
  const auto score = [&](double tolerance) {
    models::EvalMetricOptions o;
    o.tolerance_mm = tolerance;
    return two_d ? models::score_label_maps(pred->voxels[0][0], gt->voxels[0][0], labels, {sp[0], sp[1]}, o)
                 : models::score_label_maps(pred->voxels, gt->voxels, labels, {sp[0], sp[1], sp[2]}, o);
  };
  const auto ours = score(std::stod(tolerances.front()));
  REQUIRE(ours.size() == labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const auto& s = ours[i];
    const auto& m = ref["classes"][std::to_string(labels[i])];
    INFO("class " << labels[i] << " MONAI " << m.dump());
    CHECK(s.label == labels[i]);
    CHECK(s.volume_pred_ml == doctest::Approx(m["volume_pred_ml"].get<double>()).epsilon(1e-6));
    CHECK(s.volume_gt_ml == doctest::Approx(m["volume_gt_ml"].get<double>()).epsilon(1e-6));
    CHECK(s.dice == doctest::Approx(monai_value(m["dice"])).epsilon(1e-6));
    CHECK(s.iou == doctest::Approx(monai_value(m["iou"])).epsilon(1e-6));
    const bool both_empty = s.voxels_pred == 0 && s.voxels_gt == 0;
    const bool one_empty = !both_empty && (s.voxels_pred == 0 || s.voxels_gt == 0);
    if (both_empty) {
      // MONAI: NaN for every surface metric; so are ours.
      CHECK(std::isnan(monai_value(m["hd95"])));
      CHECK(std::isnan(monai_value(m["assd"])));
      CHECK(std::isnan(monai_value(m["nsd"])));
      CHECK(std::isnan(s.hd95));
      CHECK(std::isnan(s.assd));
      CHECK(std::isnan(s.nsd));
    } else if (one_empty) {
      // MONAI: ASSD inf, NSD 0, HD95 NaN (torch.quantile of infinities); ours: inf, 0, inf.
      CHECK(std::isinf(monai_value(m["assd"])));
      CHECK(std::isinf(s.assd));
      CHECK(monai_value(m["nsd"]) == 0.0);
      CHECK(s.nsd == 0.0);
      CHECK(std::isnan(monai_value(m["hd95"])));
      CHECK(std::isinf(s.hd95));
    } else {
      // MONAI's distances are float32.
      CHECK(s.hd95 == doctest::Approx(monai_value(m["hd95"])).epsilon(1e-5));
      CHECK(s.assd == doctest::Approx(monai_value(m["assd"])).epsilon(1e-5));
      CHECK(s.nsd == doctest::Approx(monai_value(m["nsd"])).epsilon(1e-6));
      for (const auto& t : tolerances) {
        INFO("tolerance " << t);
        CHECK(score(std::stod(t))[i].nsd == doctest::Approx(monai_value(m["nsd_at"][t])).epsilon(1e-6));
      }
      CHECK(s.hd95 > 0);
      CHECK(s.nsd > 0.0);
      CHECK(s.nsd < 1.0);
    }
  }
}

}  // namespace

TEST_CASE("the exact distance transform equals brute force on an anisotropic grid") {
  torch::manual_seed(7);
  const std::vector<double> sp = {2.5, 1.1, 0.8};  // (z, y, x)
  at::Tensor f = torch::rand({9, 11, 13}) < 0.02;
  f[4][5][6] = true;
  at::Tensor d = models::euclidean_distance_transform(f, sp);
  REQUIRE(d.sizes() == f.sizes());
  at::Tensor idx = f.nonzero();  // (n, 3)
  const auto zz = torch::arange(9, torch::kFloat64).view({9, 1, 1}) * sp[0];
  const auto yy = torch::arange(11, torch::kFloat64).view({1, 11, 1}) * sp[1];
  const auto xx = torch::arange(13, torch::kFloat64).view({1, 1, 13}) * sp[2];
  at::Tensor best = torch::full({9, 11, 13}, INFINITY, torch::kFloat64);
  for (std::int64_t i = 0; i < idx.size(0); ++i) {
    const double z = idx[i][0].item<double>() * sp[0], y = idx[i][1].item<double>() * sp[1],
                 x = idx[i][2].item<double>() * sp[2];
    best = torch::minimum(best, ((zz - z).square() + (yy - y).square() + (xx - x).square()).sqrt());
  }
  CHECK(torch::allclose(d, best, 1e-12, 1e-9));
  CHECK((d.masked_select(f) == 0).all().item<bool>());

  // 2D, and no feature at all.
  at::Tensor f2 = torch::zeros({7, 5}, torch::kBool);
  f2[0][4] = true;
  at::Tensor d2 = models::euclidean_distance_transform(f2, {3.0, 0.5});
  CHECK(d2[6][0].item<double>() == doctest::Approx(std::sqrt(18.0 * 18.0 + 2.0 * 2.0)));
  CHECK(d2[0][0].item<double>() == doctest::Approx(2.0));
  at::Tensor none = models::euclidean_distance_transform(torch::zeros({3, 4, 5}), {1.0, 1.0, 1.0});
  CHECK(std::isinf(none.min().item<double>()));
}

TEST_CASE("surface voxels are the mask voxels with a face neighbour outside, the grid edge included") {
  at::Tensor m = torch::zeros({5, 5, 5}, torch::kByte);
  m.slice(0, 1, 4).slice(1, 1, 4).slice(2, 1, 4).fill_(1);  // a 3x3x3 cube inside
  at::Tensor s = models::surface_voxels(m);
  CHECK(s.sum().item<int>() == 26);  // all but the centre
  CHECK(s[2][2][2].item<int>() == 0);
  CHECK(s[1][1][1].item<int>() == 1);
  // A full grid: only the voxels on the grid's faces (5^3 - 3^3).
  CHECK(models::surface_voxels(torch::ones({5, 5, 5}, torch::kByte)).sum().item<int>() == 98);
  // Only a diagonal neighbour outside is not enough: the 6-neighbourhood of scipy's
  // default erosion (the structure MONAI's get_mask_edges uses).
  m[1][1][1] = 0;
  CHECK(models::surface_voxels(m)[2][2][2].item<int>() == 0);
  // 2D: a 3x3 square has 8 surface pixels.
  at::Tensor sq = torch::zeros({5, 5}, torch::kByte);
  sq.slice(0, 1, 4).slice(1, 1, 4).fill_(1);
  CHECK(models::surface_voxels(sq).sum().item<int>() == 8);
}

TEST_CASE("the linear percentile matches numpy's definition") {
  std::vector<double> v = {10, 1, 4, 3, 2};
  CHECK(models::percentile_linear(v, 95) == doctest::Approx(4 + 0.8 * 6));
  std::vector<double> w = {5};
  CHECK(models::percentile_linear(w, 95) == 5);
  std::vector<double> inf = {INFINITY, INFINITY};
  CHECK(std::isinf(models::percentile_linear(inf, 95)));
  std::vector<double> empty;
  CHECK(std::isnan(models::percentile_linear(empty, 95)));
}

TEST_CASE("Dice, IoU, HD95, ASSD, surface Dice and volumes match MONAI on anisotropic noisy ellipsoids") {
  TempDir dir("evalm");
  monai_metrics("make " + testing::shell_quote(dir.path().string()) +
                " --seed 3 --shape 48,40,20 --spacing 0.8,1.1,2.5");
  // 1-3 in both maps, 4 only predicted, 5 only in the ground truth, 6 in neither.
  compare_with_monai(dir.path(), {1, 2, 3, 4, 5, 6}, {"1.7", "3.3", "0.5"}, false);
}

TEST_CASE("the scores of 2D label maps match MONAI's 2D metrics") {
  TempDir dir("evalm2d");
  monai_metrics("make " + testing::shell_quote(dir.path().string()) +
                " --seed 5 --shape 64,50,1 --spacing 0.7,1.3,1");
  compare_with_monai(dir.path(), {1, 2, 3, 5}, {"1.5"}, true);
}

TEST_CASE("label maps of different shapes are refused") {
  CHECK_THROWS(models::score_label_maps(torch::zeros({4, 4, 4}, torch::kByte),
                                        torch::zeros({4, 4, 5}, torch::kByte), {1}, {1.0, 1.0, 1.0}));
  CHECK_THROWS(models::score_label_maps(torch::zeros({4, 4, 4}, torch::kByte),
                                        torch::zeros({4, 4, 4}, torch::kByte), {1}, {1.0, 0.0, 1.0}));
}
