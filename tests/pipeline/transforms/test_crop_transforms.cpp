// fg_bg_indices and rand_crop_pos_neg.
#include "pipeline/transforms/crop.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;
using torch::indexing::Slice;

namespace {
// A 24^3 volume with a foreground cube well inside (so centres never need shifting).
Sample cube_sample() {
  auto label = torch::zeros({1, 24, 24, 24}, torch::kUInt8);
  label.index_put_({0, Slice(8, 14), Slice(9, 15), Slice(10, 16)}, 2);
  return make_sample(torch::rand({1, 24, 24, 24}) + 1.0f, label, "vol");
}
std::vector<Sample> crops(const Stage& st, Sample s, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<Sample> v{std::move(s)};
  Status e = st.apply(v, rng);
  REQUIRE_OK(e);
  return v;
}
}  // namespace

TEST_CASE("fg bg indices transform stores flat foreground and background indices") {
  Sample s = cube_sample();
  Sample out = run1(*make_stage("fg_bg_indices"), s);
  auto fg = out.at("fg_indices"), bg = out.at("bg_indices");
  CHECK((fg.scalar_type() == torch::kLong));
  CHECK(fg.numel() == 6 * 6 * 6);
  CHECK(bg.numel() == 24 * 24 * 24 - 216);
  auto flat = s.at("label").flatten();
  CHECK((flat.index_select(0, fg) > 0).all().item<bool>());
  CHECK((flat.index_select(0, bg) == 0).all().item<bool>());
  Sample capped = run1(*make_stage("fg_bg_indices", {{"max_per_class", 50}}), s);
  CHECK(capped.at("fg_indices").numel() == 50);
  CHECK(capped.at("bg_indices").numel() == 50);
}

TEST_CASE("fg bg indices with image_key keeps background only where the image exceeds the threshold") {
  // The spleen recipe's setting (MONAI's FgBgToIndicesd(image_key="image")): air and fat, at or
  // below the threshold after scaling, are never background crop centres.
  Sample s = cube_sample();
  auto image = torch::full({1, 24, 24, 24}, 0.5f);
  image.index_put_({0, Slice(), Slice(), Slice(0, 6)}, 0.0f);    // "air": x < 6
  image.index_put_({0, Slice(0, 4), Slice(), Slice()}, -0.25f);  // below the threshold too: z < 4
  s.at("image") = image;
  Sample out = run1(*make_stage("fg_bg_indices", {{"image_key", "image"}, {"image_threshold", 0.0}}), s);
  auto bg = out.at("bg_indices");
  const std::int64_t above = (image > 0).sum().item<std::int64_t>();  // the fg cube lies inside it
  CHECK(bg.numel() == above - 216);
  auto img = image.flatten(), lab = s.at("label").flatten();
  CHECK((img.index_select(0, bg) > 0).all().item<bool>());
  CHECK((lab.index_select(0, bg) == 0).all().item<bool>());
  CHECK(out.at("fg_indices").numel() == 216);  // foreground does not depend on the image
  // Negative-only crops then centre on voxels above the threshold, with or without precomputed indices.
  auto st = make_stage("rand_crop_pos_neg", {{"spatial_size", 5},
                                             {"pos", 0},
                                             {"neg", 1},
                                             {"num_samples", 8},
                                             {"image_key", "image"},
                                             {"image_threshold", 0.0}});
  Sample plain = s;
  for (const Sample* in : {&out, &plain})
    for (std::uint64_t seed = 0; seed < 40; ++seed)
      for (const Sample& c : crops(*st, *in, seed)) {
        CHECK(c.at("image")[0][2][2][2].item<float>() > 0.0f);
        CHECK(c.at("label")[0][2][2][2].item<int>() == 0);
      }
}

TEST_CASE("rand crop pos neg centres crops on foreground at the configured ratio") {
  Sample s = run1(*make_stage("fg_bg_indices"), cube_sample());
  auto st =
      make_stage("rand_crop_pos_neg", {{"spatial_size", 5}, {"pos", 1}, {"neg", 3}, {"num_samples", 16}});
  int on_fg = 0, total = 0;
  for (std::uint64_t seed = 0; seed < 250; ++seed) {
    for (const Sample& c : crops(*st, s, seed)) {
      REQUIRE(c.at("image").sizes() == torch::IntArrayRef({1, 5, 5, 5}));
      REQUIRE(c.at("label").sizes() == torch::IntArrayRef({1, 5, 5, 5}));
      on_fg += c.at("label")[0][2][2][2].item<int>() > 0;
      ++total;
    }
  }
  const double ratio = double(on_fg) / total;           // expected 1 / (1 + 3)
  CHECK(ratio == doctest::Approx(0.25).epsilon(0.12));  // 4000 draws: sd ~0.007
  // Without precomputed indices the result is the same.
  Sample plain = cube_sample();
  plain.at("image") = s.at("image");
  auto a = crops(*st, s, 42), b = crops(*st, plain, 42);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].at("image"), b[i].at("image")));
}

TEST_CASE("rand crop pos neg is reproducible, names crops and moves their origin") {
  Sample s = cube_sample();
  s.geometry.spacing = {2, 3, 4};
  auto st = make_stage("rand_crop_pos_neg", {{"spatial_size", {6, 7, 8}}, {"num_samples", 4}});
  auto a = crops(*st, s, 7), b = crops(*st, s, 7), c = crops(*st, s, 8);
  REQUIRE(a.size() == 4);
  bool differ = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].id == "vol#" + std::to_string(i));
    CHECK(a[i].at("image").sizes() == torch::IntArrayRef({1, 8, 7, 6}));
    CHECK(torch::equal(a[i].at("image"), b[i].at("image")));
    differ = differ || !torch::equal(a[i].at("image"), c[i].at("image"));
    // The crop's first voxel is the input voxel at the crop origin.
    const auto& o = a[i].geometry.origin;
    const std::int64_t x = std::llround(o[0] / 2), y = std::llround(o[1] / 3), z = std::llround(o[2] / 4);
    CHECK(a[i].at("image")[0][0][0][0].item<float>() == s.at("image")[0][z][y][x].item<float>());
  }
  CHECK(differ);
}

TEST_CASE("rand crop pos neg keeps crops inside the volume and pads small volumes") {
  // Foreground in a corner: the centre must shift so the crop fits.
  auto label = torch::zeros({1, 10, 10, 10}, torch::kUInt8);
  label.index_put_({0, 0, 0, 0}, 1);
  Sample corner = make_sample(torch::rand({1, 10, 10, 10}), label);
  auto st =
      make_stage("rand_crop_pos_neg", {{"spatial_size", 4}, {"pos", 1}, {"neg", 0}, {"num_samples", 3}});
  for (const Sample& c : crops(*st, corner, 1)) {
    CHECK(c.at("label")[0][0][0][0].item<int>() == 1);
    CHECK(c.geometry.origin == std::array<double, 3>{0, 0, 0});
  }
  // A volume smaller than the crop is zero-padded, centred.
  Sample small = make_sample(torch::ones({1, 2, 3, 4}), torch::ones({1, 2, 3, 4}, torch::kUInt8));
  auto big = make_stage("rand_crop_pos_neg", {{"spatial_size", {6, 5, 4}}, {"num_samples", 2}});
  for (const Sample& c : crops(*big, small, 3)) {
    CHECK(c.at("image").sizes() == torch::IntArrayRef({1, 4, 5, 6}));
    CHECK(c.at("image").sum().item<float>() == 24.0f);
    CHECK(c.at("label").sum().item<int>() == 24);
    CHECK(subset(values_of(c.at("label")), {0, 1}));
    CHECK(c.geometry.origin == std::array<double, 3>{-1, -1, -1});
  }
  // No foreground at all: background crops only, no error.
  Sample empty = make_sample(torch::rand({1, 8, 8, 8}), torch::zeros({1, 8, 8, 8}, torch::kUInt8));
  CHECK(crops(*st, empty, 2).size() == 3);
}

TEST_CASE("rand crop pos neg refuses stale precomputed indices") {
  Sample s = run1(*make_stage("fg_bg_indices"), cube_sample());
  s.at("label") = s.at("label").narrow(1, 0, 12);
  s.at("image") = s.at("image").narrow(1, 0, 12);
  auto st = make_stage("rand_crop_pos_neg", {{"spatial_size", 4}});
  CHECK(run_error(*st, s).find("rand_crop_pos_neg: sample 'vol': fg_indices/bg_indices do not fit the label "
                               "grid (1, 12, 24, 24)") == 0);
}
