// Intensity transforms: scale_intensity_range, normalize_intensity and the random ones.
#include "pipeline/transforms/intensity.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;

TEST_CASE("scale intensity range transform maps a_min to b_min and a_max to b_max") {
  auto x = torch::tensor({-1000.0f, -57.0f, 53.5f, 164.0f, 3000.0f}).reshape({1, 1, 1, 5});
  auto st =
      make_stage("scale_intensity_range", {{"a_min", -57}, {"a_max", 164}, {"b_min", 0.0}, {"b_max", 1.0}});
  Sample out = run1(*st, make_sample(x));
  auto y = out.at("image").flatten();
  CHECK(y[0].item<float>() == 0.0f);  // clipped
  CHECK(y[1].item<float>() == 0.0f);
  CHECK(y[2].item<float>() == doctest::Approx(0.5));
  CHECK(y[3].item<float>() == 1.0f);
  CHECK(y[4].item<float>() == 1.0f);  // clipped
  auto noclip = make_stage("scale_intensity_range",
                           {{"a_min", 0}, {"a_max", 10}, {"b_min", -1}, {"b_max", 1}, {"clip", false}});
  auto z = run1(*noclip, make_sample(torch::tensor({0.0f, 10.0f, 20.0f}).reshape({1, 1, 1, 3})))
               .at("image")
               .flatten();
  CHECK(z[0].item<float>() == -1.0f);
  CHECK(z[1].item<float>() == 1.0f);
  CHECK(z[2].item<float>() == 3.0f);
  // Integer input becomes float32.
  auto i = run1(*st, make_sample(torch::full({1, 1, 2, 2}, 164, torch::kShort))).at("image");
  CHECK((i.scalar_type() == torch::kFloat32));
}

TEST_CASE("normalize intensity transform gives mean 0 and std 1") {
  torch::manual_seed(0);
  auto x = torch::randn({2, 6, 7, 8}) * torch::tensor({3.0f, 50.0f}).reshape({2, 1, 1, 1}) +
           torch::tensor({10.0f, -200.0f}).reshape({2, 1, 1, 1});
  Sample out = run1(*make_stage("normalize_intensity"), make_sample(x));
  for (int c = 0; c < 2; ++c) {
    auto y = out.at("image")[c].to(torch::kFloat64);
    CHECK(y.mean().item<double>() == doctest::Approx(0.0).epsilon(1e-6));
    CHECK(y.std(false).item<double>() == doctest::Approx(1.0).epsilon(1e-5));
  }
  // nonzero: statistics over non-zero voxels; zeros stay zero.
  auto m = x.clone();
  m.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, 3)}, 0.0f);
  Sample nz =
      run1(*make_stage("normalize_intensity", {{"nonzero", true}, {"channel_wise", false}}), make_sample(m));
  auto y = nz.at("image");
  CHECK(y.index({torch::indexing::Slice(), torch::indexing::Slice(0, 3)}).abs().max().item<float>() == 0.0f);
  auto sel = y.masked_select(m != 0).to(torch::kFloat64);
  CHECK(sel.mean().item<double>() == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(sel.std(false).item<double>() == doctest::Approx(1.0).epsilon(1e-5));
  // mask_key: statistics inside the label only.
  Sample lm = blob_sample(12, 16, 20);
  lm.at("image") = lm.at("image") * 3 + 7;
  Sample o = run1(*make_stage("normalize_intensity", {{"mask_key", "label"}}), lm);
  auto in = o.at("image").masked_select(lm.at("label") > 0).to(torch::kFloat64);
  CHECK(in.mean().item<double>() == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(in.std(false).item<double>() == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(o.at("image").masked_select(lm.at("label") == 0).abs().max().item<float>() == 0.0f);
  // A constant image does not divide by zero.
  auto c = run1(*make_stage("normalize_intensity"), make_sample(torch::full({1, 2, 2, 2}, 4.0f))).at("image");
  CHECK(c.abs().max().item<float>() == 0.0f);
}

TEST_CASE("random intensity transforms are reproducible under a seed and differ between seeds") {
  Sample s = blob_sample(6, 6, 6);
  for (const char* name :
       {"rand_shift_intensity", "rand_scale_intensity", "rand_gamma", "rand_gaussian_noise"}) {
    INFO(name);
    auto st = make_stage(name, {{"prob", 1.0}});
    CHECK_FALSE(st->deterministic());
    Sample a = run1(*st, s, 5), b = run1(*st, s, 5), c = run1(*st, s, 6);
    CHECK(torch::equal(a.at("image"), b.at("image")));
    CHECK_FALSE(torch::equal(a.at("image"), c.at("image")));
    CHECK_FALSE(torch::equal(a.at("image"), s.at("image")));
    CHECK(torch::equal(a.at("label"), s.at("label")));  // not in keys
    // prob 0 leaves the sample alone.
    auto off = make_stage(name, {{"prob", 0.0}});
    CHECK(torch::equal(run1(*off, s, 5).at("image"), s.at("image")));
  }
  // Semantics of the simple ones.
  auto shift = make_stage("rand_shift_intensity", {{"prob", 1.0}, {"offsets", 2.0}});
  auto d = (run1(*shift, s, 9).at("image") - s.at("image"));
  CHECK((d.max() - d.min()).item<float>() < 1e-4f);
  CHECK(std::abs(d.mean().item<float>()) <= 2.0f);
  auto gamma = adjust_gamma(torch::tensor({0.0f, 0.5f, 1.0f}), 2.0);
  CHECK(gamma[1].item<float>() == doctest::Approx(0.25));
  CHECK(gamma[2].item<float>() == doctest::Approx(1.0));
  auto noise = make_stage("rand_gaussian_noise", {{"prob", 1.0}, {"std", 0.5}, {"sample_std", false}});
  Sample big = make_sample(torch::zeros({1, 32, 32, 32}));
  auto n = run1(*noise, big, 1).at("image");
  CHECK(n.std().item<double>() == doctest::Approx(0.5).epsilon(0.02));
  // Integer tensors are refused by the random intensity stages.
  auto on_label = make_stage("rand_gamma", {{"keys", {"label"}}});
  CHECK(run_error(*on_label, s) ==
        "rand_gamma: sample 'case': 'label' is Byte; intensity stages need floating tensors");
}
