// Spatial transforms: reorient, resample, crop_foreground, rand_flip, rand_rotate90, rand_affine.
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/spatial.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;
using torch::indexing::None;
using torch::indexing::Slice;

namespace {
void check_geometry(const Geometry& a, const Geometry& b) {
  for (int i = 0; i < 3; ++i) {
    CHECK(a.spacing[i] == doctest::Approx(b.spacing[i]));
    CHECK(a.origin[i] == doctest::Approx(b.origin[i]));
  }
  for (int i = 0; i < 9; ++i) CHECK(a.direction[i] == doctest::Approx(b.direction[i]));
}
// Physical point of voxel (x, y, z) of a sample.
std::array<double, 3> phys(const Sample& s, std::int64_t x, std::int64_t y, std::int64_t z) {
  return index_to_physical(s.geometry, {double(x), double(y), double(z)});
}
}  // namespace

TEST_CASE("reorient transform to RAS flips LPS axes and keeps every voxel at its physical place") {
  Sample s = blob_sample(4, 5, 6);
  s.geometry.spacing = {0.5, 0.7, 2.0};
  s.geometry.origin = {10, 20, 30};
  Sample out = run1(*make_stage("reorient", {{"axcodes", "RAS"}}), s);
  CHECK(out.geometry.direction == std::array<double, 9>{-1, 0, 0, 0, -1, 0, 0, 0, 1});
  // Voxel (x, y, z) of the input is voxel (5 - x, 4 - y, z) of the output.
  for (auto [x, y, z] : std::vector<std::array<std::int64_t, 3>>{{0, 0, 0}, {2, 3, 1}, {5, 4, 3}}) {
    const std::int64_t ox = 5 - x, oy = 4 - y;
    CHECK(out.at("image")[0][z][oy][ox].item<float>() == s.at("image")[0][z][y][x].item<float>());
    CHECK(out.at("label")[0][z][oy][ox].item<int>() == s.at("label")[0][z][y][x].item<int>());
    auto p = phys(s, x, y, z), q = phys(out, ox, oy, z);
    for (int i = 0; i < 3; ++i) CHECK(p[i] == doctest::Approx(q[i]));
  }
  // Back to LPS restores the input exactly.
  Sample back = run1(*make_stage("reorient", {{"axcodes", "LPS"}}), out);
  CHECK(torch::equal(back.at("image"), s.at("image")));
  check_geometry(back.geometry, s.geometry);
}

TEST_CASE("reorient transform permutes axes of a grid stored in another order") {
  // Array x runs along world z (S), y along world x (L), z along world y (A = -P).
  Sample s = blob_sample(4, 5, 6);
  s.geometry.direction = {0, 1, 0, 0, 0, -1, 1, 0, 0};
  s.geometry.spacing = {1, 2, 3};
  Sample out = run1(*make_stage("reorient", {{"axcodes", "LPS"}}), s);
  CHECK(out.geometry.direction == std::array<double, 9>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  CHECK(out.geometry.spacing == std::array<double, 3>{2, 3, 1});
  CHECK(pipeline::detail::spatial_size_xyz(out.at("image")) == Size3{5, 4, 6});
  // Every input voxel lands at an output voxel with the same physical position and value.
  for (auto [x, y, z] : std::vector<std::array<std::int64_t, 3>>{{0, 0, 0}, {5, 1, 2}, {3, 4, 3}}) {
    auto p = phys(s, x, y, z);
    std::int64_t ix = std::llround((p[0] - out.geometry.origin[0]) / 2),
                 iy = std::llround((p[1] - out.geometry.origin[1]) / 3),
                 iz = std::llround((p[2] - out.geometry.origin[2]) / 1);
    CHECK(out.at("image")[0][iz][iy][ix].item<float>() == s.at("image")[0][z][y][x].item<float>());
  }
}

TEST_CASE("resample transform to the same spacing is the identity and to half spacing doubles the size") {
  Sample s = blob_sample(6, 8, 10);
  s.geometry.spacing = {2.0, 2.0, 3.0};
  s.geometry.origin = {-5, 7, 1};
  Sample same = run1(*make_stage("resample", {{"spacing", {2.0, 2.0, 3.0}}}), s);
  CHECK(torch::equal(same.at("image"), s.at("image")));
  CHECK(torch::equal(same.at("label"), s.at("label")));
  check_geometry(same.geometry, s.geometry);

  Sample half = run1(*make_stage("resample", {{"spacing", {1.0, 1.0, 1.5}}}), s);
  CHECK(half.at("image").sizes() == torch::IntArrayRef({1, 12, 16, 20}));
  CHECK(half.at("label").sizes() == torch::IntArrayRef({1, 12, 16, 20}));
  CHECK((half.at("label").scalar_type() == torch::kUInt8));
  CHECK(half.geometry.spacing == std::array<double, 3>{1.0, 1.0, 1.5});
  // Field of view kept: the new first voxel centre is a quarter of an old voxel before the old one.
  CHECK(half.geometry.origin[0] == doctest::Approx(-5 - 0.5));
  CHECK(half.geometry.origin[2] == doctest::Approx(1 - 0.75));
  CHECK(subset(values_of(half.at("label")), values_of(s.at("label"))));
  // Nearest doubling repeats each label voxel 2x2x2.
  CHECK(torch::equal(
      half.at("label").index({0, Slice(None, None, 2), Slice(None, None, 2), Slice(None, None, 2)}),
      s.at("label")[0]));
  // Trilinear keeps the mean of a smooth image.
  CHECK(half.at("image").mean().item<double>() ==
        doctest::Approx(s.at("image").mean().item<double>()).epsilon(0.01));
}

TEST_CASE("resample transform to a coarser spacing keeps label values") {
  Sample s = blob_sample(12, 16, 20);
  Sample out = run1(*make_stage("resample", {{"spacing", {1.7, 2.3, 1.3}}}), s);
  CHECK(out.at("image").sizes() == torch::IntArrayRef({1, 9, 7, 12}));
  CHECK(subset(values_of(out.at("label")), values_of(s.at("label"))));
  CHECK(values_of(out.at("label")).count(3));
}

TEST_CASE("resample transform with grid exact_spacing makes MONAI's Spacingd grid") {
  // A ramp along x (value = x index) in both the image and the label.
  auto ramp = [](std::int64_t nx, double spacing_x) {
    at::Tensor x = torch::arange(nx, torch::kFloat).view({1, 1, 1, nx}).expand({1, 2, 3, nx}).contiguous();
    Sample s = make_sample(x, x.to(torch::kUInt8));
    s.geometry.spacing = {spacing_x, 1.0, 1.0};
    s.geometry.origin = {3, -2, 5};
    return s;
  };
  auto row = [](const at::Tensor& t) {
    at::Tensor r = t[0][1][2].to(torch::kDouble).contiguous();
    return std::vector<double>(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
  };
  // MONAI 1.x Spacing(pixdim=1.5) of 10 voxels at 1 mm: 7 voxels at old indices 0, 1.5, ..., 9,
  // the spacing exactly 1.5 and the origin kept (keep_extent would make 7 voxels of 1.43 mm).
  Sample s = ramp(10, 1.0);
  Sample out = run1(*make_stage("resample", {{"spacing", {1.5, 1.0, 1.0}}, {"grid", "exact_spacing"}}), s);
  CHECK(out.at("image").sizes() == torch::IntArrayRef({1, 2, 3, 7}));
  CHECK(row(out.at("image")) == std::vector<double>{0, 1.5, 3, 4.5, 6, 7.5, 9});
  // Labels nearest, half to even: 1.5 -> 2, 4.5 -> 4, 7.5 -> 8.
  CHECK((out.at("label").scalar_type() == torch::kUInt8));
  CHECK(row(out.at("label")) == std::vector<double>{0, 2, 3, 4, 6, 8, 9});
  check_geometry(out.geometry, [&] {
    Geometry g = s.geometry;
    g.spacing = {1.5, 1.0, 1.0};
    return g;
  }());

  // 64 voxels at 1.513 mm -> 65 at 1.5 (MONAI: 65, the last two 62.459 and 63.0): the last
  // new voxel lies past the old grid and takes the edge value.
  Sample wide = run1(*make_stage("resample", {{"spacing", {1.5, 1.0, 1.0}}, {"grid", "exact_spacing"}}),
                     ramp(64, 1.513));
  const auto v = row(wide.at("image"));
  REQUIRE(v.size() == 65);
  CHECK(v[1] == doctest::Approx(1.5 / 1.513));
  CHECK(v[63] == doctest::Approx(62.459).epsilon(1e-4));
  CHECK(v[64] == 63.0);
  CHECK(row(wide.at("label"))[64] == 63.0);

  // Already at the target spacing: the identity, exactly.
  Sample same = run1(*make_stage("resample", {{"spacing", {1.0, 1.0, 1.0}}, {"grid", "exact_spacing"}}), s);
  CHECK(torch::equal(same.at("image"), s.at("image")));
  check_geometry(same.geometry, s.geometry);

  // An unknown grid is refused with the option's name.
  auto bad = registry().make("resample", {{"grid", "exact"}}, "job.yaml: stages[2]");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("grid") != std::string::npos);
  CHECK(bad.status().message().find("keep_extent") != std::string::npos);
}

TEST_CASE("crop foreground transform crops to the bounding box plus margin and moves the origin") {
  Sample s = blob_sample(12, 16, 20);
  s.geometry.spacing = {0.5, 1.0, 2.0};
  s.geometry.origin = {100, 200, 300};
  s.tensors["fg_indices"] = torch::zeros({3}, torch::kLong);
  s.tensors["bg_indices"] = torch::zeros({3}, torch::kLong);
  // Label foreground: z 3..8, y 4..13, x 5..17 (inclusive).
  Sample out = run1(*make_stage("crop_foreground", {{"source_key", "label"}, {"margin", {1, 2, 0}}}), s);
  CHECK(out.at("label").sizes() == torch::IntArrayRef({1, 6, 14, 15}));
  CHECK(out.at("image").sizes() == torch::IntArrayRef({1, 6, 14, 15}));
  CHECK(out.geometry.origin[0] == doctest::Approx(100 + 4 * 0.5));
  CHECK(out.geometry.origin[1] == doctest::Approx(200 + 2 * 1.0));
  CHECK(out.geometry.origin[2] == doctest::Approx(300 + 3 * 2.0));
  CHECK(out.at("label").sum().item<std::int64_t>() == s.at("label").sum().item<std::int64_t>());
  CHECK(out.at("image")[0][0][0][0].item<float>() == s.at("image")[0][3][2][4].item<float>());
  CHECK_FALSE(out.has("fg_indices"));
  // Margins are clipped at the grid border; a threshold on the image works too.
  Sample img = make_sample(torch::zeros({1, 4, 4, 4}));
  img.at("image").index_put_({0, 1, Slice(0, 2), 3}, 5.0f);
  Sample c =
      run1(*make_stage("crop_foreground", {{"keys", {"image"}}, {"threshold", 1.0}, {"margin", 3}}), img);
  CHECK(c.at("image").sizes() == torch::IntArrayRef({1, 4, 4, 4}));
  Sample c0 = run1(*make_stage("crop_foreground", {{"keys", {"image"}}, {"threshold", 1.0}}), img);
  CHECK(c0.at("image").sizes() == torch::IntArrayRef({1, 1, 2, 1}));
}

TEST_CASE("spatial transform errors name the stage, the sample and the key") {
  Sample s = make_sample(torch::zeros({1, 4, 4, 4}));
  CHECK(run_error(*make_stage("resample"), s) == "resample: sample 'case' has no 'label' (it has: image)");
  s.tensors["label"] = torch::zeros({1, 4, 4, 5}, torch::kUInt8);
  CHECK(run_error(*make_stage("rand_flip"), s) ==
        "rand_flip: sample 'case': spatial shapes differ: 'image' is (1, 4, 4, 4), 'label' is (1, 4, 4, 5)");
  // allow_missing_keys: an image without a label (inference) goes through.
  Sample img = make_sample(torch::ones({1, 4, 4, 4}));
  img.geometry.spacing = {2, 2, 2};
  Sample r = run1(*make_stage("resample", {{"spacing", {1, 1, 1}}, {"allow_missing_keys", true}}), img);
  CHECK(r.at("image").sizes() == torch::IntArrayRef({1, 8, 8, 8}));
  CHECK_FALSE(r.has("label"));
  Sample flat = make_sample(torch::zeros({4, 4}), torch::zeros({4, 4}, torch::kUInt8));
  CHECK(run_error(*make_stage("reorient"), flat) ==
        "reorient: sample 'case': 'image' must be (C, Z, Y, X), got (4, 4)");
}

TEST_CASE("rand flip and rotate90 transforms keep label values and are reproducible under a seed") {
  Sample s = blob_sample(8, 8, 8);
  auto flip = make_stage("rand_flip", {{"prob", 0.5}});
  auto rot = make_stage("rand_rotate90", {{"prob", 1.0}, {"spatial_axes", {0, 2}}});
  int changed = 0;
  for (std::uint64_t seed = 0; seed < 12; ++seed) {
    Sample a = run1(*rot, run1(*flip, s, seed), seed + 100);
    Sample b = run1(*rot, run1(*flip, s, seed), seed + 100);
    CHECK(torch::equal(a.at("image"), b.at("image")));
    CHECK(values_of(a.at("label")) == values_of(s.at("label")));
    CHECK(a.at("label").sum().item<std::int64_t>() == s.at("label").sum().item<std::int64_t>());
    // Image and label move together: the image values under label 3 are the same set.
    auto under = [](const Sample& x) {
      return std::get<0>(at::_unique(x.at("image").masked_select(x.at("label") == 3), true));
    };
    CHECK(torch::equal(under(a), under(s)));
    changed += !torch::equal(a.at("image"), s.at("image"));
  }
  CHECK(changed >= 10);
}

TEST_CASE("rand flip transform updates geometry so voxels keep their physical place") {
  Sample s = blob_sample(4, 5, 6);
  s.geometry.spacing = {1, 2, 3};
  auto flip = make_stage("rand_flip", {{"prob", 1.0}});
  Sample out = run1(*flip, s);
  CHECK(torch::equal(out.at("image"), s.at("image").flip({1, 2, 3})));
  auto p = phys(s, 1, 2, 3), q = phys(out, 6 - 1 - 1, 5 - 1 - 2, 4 - 1 - 3);
  for (int i = 0; i < 3; ++i) CHECK(p[i] == doctest::Approx(q[i]));
  // Rotations too (one quarter turn in x-y, then check a voxel).
  auto rot = make_stage("rand_rotate90", {{"prob", 1.0}, {"max_k", 1}});
  Sample r = run1(*rot, s);
  CHECK(r.at("image").sizes() == torch::IntArrayRef({1, 4, 6, 5}));
  // Find where input voxel (x=1, y=2, z=3) went: the output voxel with the same value.
  const float v = s.at("image")[0][3][2][1].item<float>();
  auto pos = (r.at("image")[0] == v).nonzero();
  REQUIRE(pos.size(0) == 1);
  auto q2 =
      phys(r, pos[0][2].item<std::int64_t>(), pos[0][1].item<std::int64_t>(), pos[0][0].item<std::int64_t>());
  auto p2 = phys(s, 1, 2, 3);
  for (int i = 0; i < 3; ++i) CHECK(p2[i] == doctest::Approx(q2[i]));
}

TEST_CASE("rand affine transform with identity parameters is exact") {
  Sample s = blob_sample(8, 9, 10);
  auto st = make_stage("rand_affine", {{"prob", 1.0}});
  Sample out = run1(*st, s, 3);
  CHECK(torch::equal(out.at("image"), s.at("image")));
  CHECK(torch::equal(out.at("label"), s.at("label")));
  CHECK(torch::equal(affine_tensor(s.at("image"), AffineParams{}, true, "zeros"), s.at("image")));
}

TEST_CASE("rand affine transform keeps label values and moves image and label together") {
  Sample s = blob_sample(10, 12, 14);
  s.at("label").index_put_({0, 0, 0, 0}, 7);
  auto st = make_stage("rand_affine", {{"prob", 1.0},
                                       {"rotate_range", {0.4, 0.3, 0.5}},
                                       {"scale_range", 0.2},
                                       {"translate_range", {2, 1, 1}},
                                       {"padding_mode", "zeros"}});
  const auto orig = values_of(s.at("label"));
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    Sample a = run1(*st, s, seed), b = run1(*st, s, seed);
    CHECK(torch::equal(a.at("image"), b.at("image")));
    CHECK((a.at("label").scalar_type() == torch::kUInt8));
    CHECK(subset(values_of(a.at("label")), orig));
    CHECK_FALSE(torch::equal(a.at("image"), s.at("image")));
  }
  // A pure translation by whole voxels is a shift (nearest on a float image too).
  AffineParams p;
  p.translate = {2, 0, 0};
  at::Tensor img = s.at("image");
  at::Tensor moved = affine_tensor(img, p, false, "zeros");
  CHECK(torch::allclose(moved.index({Slice(), Slice(), Slice(), Slice(0, 12)}),
                        img.index({Slice(), Slice(), Slice(), Slice(2, 14)})));
  // 2-D samples rotate in their plane.
  Sample flat = make_sample(torch::rand({1, 16, 16}), torch::randint(0, 3, {1, 16, 16}, torch::kLong));
  Sample f = run1(*st, flat, 1);
  CHECK(f.at("image").sizes() == torch::IntArrayRef({1, 16, 16}));
  CHECK(subset(values_of(f.at("label")), {0, 1, 2}));
}

namespace {
// Intensity-weighted centre (x, y, z index) of a (1, Z, Y, X) tensor.
std::array<double, 3> centroid_xyz(const at::Tensor& t) {
  at::Tensor w = t[0].to(torch::kFloat64).clamp_min(0);
  const double total = w.sum().item<double>();
  std::array<double, 3> c{};
  for (int a = 0; a < 3; ++a) {
    const std::int64_t dim = 2 - a;  // x is the last tensor dim
    at::Tensor coord = torch::arange(w.size(dim), torch::kFloat64);
    std::vector<std::int64_t> shape{1, 1, 1};
    shape[static_cast<std::size_t>(dim)] = w.size(dim);
    c[static_cast<std::size_t>(a)] = (w * coord.view(shape)).sum().item<double>() / total;
  }
  return c;
}

// A smooth blob centred at index (x, y, z) on a (1, 24, 26, 28) grid.
at::Tensor gaussian_blob(double x, double y, double z) {
  auto zz = torch::arange(24, torch::kFloat64).view({24, 1, 1}),
       yy = torch::arange(26, torch::kFloat64).view({1, 26, 1}),
       xx = torch::arange(28, torch::kFloat64).view({1, 1, 28});
  auto r2 = (xx - x).pow(2) + (yy - y).pow(2) + (zz - z).pow(2);
  return torch::exp(-r2 / 8.0).to(torch::kFloat32).unsqueeze(0);
}
}  // namespace

TEST_CASE("rand affine transform records the warped geometry: anatomy keeps its physical place") {
  AffineParams p;
  p.rotate = {0.2, -0.15, 0.35};
  p.scale = {1.1, 0.9, 1.05};
  p.translate = {1.5, -2.0, 1.0};
  Geometry g;
  g.spacing = {1.5, 1.5, 1.5};
  g.origin = {10, -5, 3};
  g.direction = {0, 1, 0, 0, 0, -1, 1, 0, 0};
  const at::Tensor img = gaussian_blob(15.0, 11.0, 12.5);
  const Size3 size{28, 26, 24};

  // Isotropic voxels: the recorded geometry is exact, so the blob's physical centre is kept.
  const Geometry out = affine_geometry(g, size, 3, p);
  CHECK(direction_is_orthonormal(out.direction, 1e-9));
  const auto before = index_to_physical(g, {15.0, 11.0, 12.5});
  const auto after = index_to_physical(out, centroid_xyz(affine_tensor(img, p, true, "zeros")));
  for (int i = 0; i < 3; ++i) CHECK(std::abs(after[i] - before[i]) < 0.2);  // mm
  for (int j = 0; j < 3; ++j) CHECK(out.spacing[j] == doctest::Approx(1.5 / p.scale[j]));

  // Anisotropic voxels, zoom and shift only: exact as well.
  AffineParams zoom = p;
  zoom.rotate = {0, 0, 0};
  Geometry aniso = g;
  aniso.spacing = {0.8, 0.8, 2.5};
  const Geometry zo = affine_geometry(aniso, size, 3, zoom);
  const auto zb = index_to_physical(aniso, {15.0, 11.0, 12.5});
  const auto za = index_to_physical(zo, centroid_xyz(affine_tensor(img, zoom, true, "zeros")));
  for (int i = 0; i < 3; ++i) CHECK(std::abs(za[i] - zb[i]) < 0.2);

  // Anisotropic voxels with rotation (a physical shear): direction stays orthonormal and the
  // grid centre stays exactly where it maps to.
  const Geometry sh = affine_geometry(aniso, size, 3, p);
  CHECK(direction_is_orthonormal(sh.direction, 1e-9));
  const auto c_out = index_to_physical(sh, {13.5, 12.5, 11.5});
  const auto c_in = index_to_physical(aniso, {13.5 + 1.5, 12.5 - 2.0, 11.5 + 1.0});
  for (int i = 0; i < 3; ++i) CHECK(c_out[i] == doctest::Approx(c_in[i]));

  // The stage records it too: same seed, same warp, geometry no longer the input's.
  Sample s = make_sample(img, (img > 0.5).to(torch::kUInt8));
  s.geometry = g;
  auto st = make_stage("rand_affine", {{"prob", 1.0}, {"rotate_range", 0.3}, {"scale_range", 0.1}});
  Sample w = run1(*st, s, 5);
  CHECK_FALSE(geometry_close(w.geometry, g));
  const auto wa = index_to_physical(w.geometry, centroid_xyz(w.at("image")));
  for (int i = 0; i < 3; ++i) CHECK(std::abs(wa[i] - before[i]) < 0.2);
}
