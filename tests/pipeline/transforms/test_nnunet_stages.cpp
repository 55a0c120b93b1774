// The stages an nnU-Net plan needs: normalize_ct, zscore, clip_percentiles, rand_gaussian_blur,
// rand_brightness, rand_contrast, rand_simulate_low_resolution and rand_gamma's nnU-Net options.
// Values are checked against tests/tools/nnunet_reference.py (nnunetv2 / batchgeneratorsv2
// when the venv has them, else their formulas transcribed; scipy for the blur).
#include <cmath>
#include <fstream>

#include "pipeline/cache/compact.hpp"
#include "pipeline/collate.hpp"
#include "pipeline/io/npy.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;
using torch::indexing::Slice;

namespace {

/// One operation of nnunet_reference.py: its name, its input and its parameters.
struct RefOp {
  std::string op;
  at::Tensor in;
  nlohmann::json params = nlohmann::json::object();
};

/// Runs tests/tools/nnunet_reference.py on `ops` (one Python start); the outputs in order.
std::vector<at::Tensor> reference(const std::vector<RefOp>& ops) {
  TempDir dir("nnunet_ref");
  nlohmann::json job = nlohmann::json::array();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const auto in = dir / ("in" + std::to_string(i) + ".npy");
    REQUIRE_OK(write_npy(in, ops[i].in.to(torch::kFloat32).cpu().contiguous()));
    nlohmann::json item = ops[i].params;
    item["op"] = ops[i].op;
    item["in"] = in.string();
    item["out"] = (dir / ("out" + std::to_string(i) + ".npy")).string();
    job.push_back(item);
  }
  write_file(dir / "job.json", job.dump());
  auto r =
      run_command(shell_quote(python()) + " " + shell_quote(source_path("tests/tools/nnunet_reference.py")) +
                  " " + shell_quote(dir / "job.json") + " 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  MESSAGE("reference: " << r.out);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    REQUIRE_OK_AND_ASSIGN(at::Tensor t, read_npy(dir / ("out" + std::to_string(i) + ".npy")));
    out.push_back(t);
  }
  return out;
}

/// max |a - b| (float64).
double max_diff(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a.cpu().to(torch::kFloat64) - b.cpu().to(torch::kFloat64)).abs().max().item<double>();
}

/// A (C, Z, Y, X) "body": zero outside an ellipsoid, a zero hole inside it, noisy values.
at::Tensor body_image(std::int64_t c, std::int64_t z, std::int64_t y, std::int64_t x, std::uint64_t seed) {
  torch::manual_seed(seed);
  auto zz = torch::arange(z, torch::kFloat32).view({z, 1, 1}) - (z - 1) / 2.0;
  auto yy = torch::arange(y, torch::kFloat32).view({1, y, 1}) - (y - 1) / 2.0;
  auto xx = torch::arange(x, torch::kFloat32).view({1, 1, x}) - (x - 1) / 2.0;
  auto r = (zz / (z * 0.45)).pow(2) + (yy / (y * 0.45)).pow(2) + (xx / (x * 0.45)).pow(2);
  auto inside = (r < 1.0f) & (r > 0.08f);  // a hole of zeros at the centre
  auto img = torch::randn({c, z, y, x}) * 40.0f + 100.0f;
  return torch::where(inside.unsqueeze(0), img, torch::zeros_like(img));
}

/// Runs a random stage on `s` for seeds 0..n-1; how often each channel of `key` changed.
std::vector<double> changed_fraction(const Stage& st, const Sample& s, int n,
                                     const std::string& key = "image") {
  const std::int64_t channels = s.at(key).size(0);
  std::vector<double> frac(channels, 0.0);
  for (int seed = 0; seed < n; ++seed) {
    Sample out = run1(st, s, static_cast<std::uint64_t>(seed));
    for (std::int64_t c = 0; c < channels; ++c)
      if (!torch::equal(out.at(key)[c], s.at(key)[c])) frac[c] += 1.0 / n;
  }
  return frac;
}

/// |observed - p| within 4 standard deviations of a binomial proportion over n draws.
bool near_proportion(double observed, double p, int n) {
  return std::abs(observed - p) <= 4.0 * std::sqrt(p * (1 - p) / n) + 1e-12;
}

const std::vector<std::string> kRandomStages{"rand_gaussian_blur", "rand_brightness", "rand_contrast",
                                             "rand_simulate_low_resolution"};

}  // namespace

TEST_CASE("normalize_ct clips to the dataset percentiles and z-scores with its mean and std, as nnU-Net") {
  torch::manual_seed(1);
  auto x = torch::rand({2, 6, 7, 8}) * 4000.0f - 1500.0f;  // HU
  auto one =
      make_stage("normalize_ct", {{"lower", -958.0}, {"upper", 1503.5}, {"mean", 87.2}, {"std", 301.7}});
  auto per = make_stage("normalize_ct", {{"lower", {-958.0, -100.0}},
                                         {"upper", {1503.5, 250.0}},
                                         {"mean", 87.2},
                                         {"std", {301.7, 0.0}}});  // std 0: divides by 1e-8
  Sample a = run1(*one, make_sample(x)), b = run1(*per, make_sample(x));
  auto ref = reference({{"ct",
                         x,
                         {{"lower", {-958.0, -958.0}},
                          {"upper", {1503.5, 1503.5}},
                          {"mean", {87.2, 87.2}},
                          {"std", {301.7, 301.7}}}},
                        {"ct",
                         x,
                         {{"lower", {-958.0, -100.0}},
                          {"upper", {1503.5, 250.0}},
                          {"mean", {87.2, 87.2}},
                          {"std", {301.7, 0.0}}}}});
  CHECK((a.at("image").scalar_type() == torch::kFloat32));
  CHECK(max_diff(a.at("image"), ref[0]) <= 1e-5);
  // Channel 1 divides by 1e-8: values up to ~1.6e10, compared relatively.
  CHECK(max_diff(b.at("image")[0], ref[1][0]) <= 1e-5);
  CHECK(max_diff(b.at("image")[1] / 1e10, ref[1][1] / 1e10) <= 1e-6);
  // Integer input (a CT in int16) becomes float32; the label is left alone.
  Sample i = run1(*one, make_sample(x.to(torch::kShort), torch::ones({1, 6, 7, 8}, torch::kUInt8)));
  CHECK((i.at("image").scalar_type() == torch::kFloat32));
  CHECK(max_diff(i.at("image"), reference({{"ct",
                                            x.to(torch::kShort).to(torch::kFloat32),
                                            {{"lower", {-958.0, -958.0}},
                                             {"upper", {1503.5, 1503.5}},
                                             {"mean", {87.2, 87.2}},
                                             {"std", {301.7, 301.7}}}}})[0]) <= 1e-5);
  CHECK(torch::equal(i.at("label"), torch::ones({1, 6, 7, 8}, torch::kUInt8)));
  // A list that does not match the channels is an error naming the sample and the tensor.
  auto three = make_stage("normalize_ct", {{"mean", {1.0, 2.0, 3.0}}});
  CHECK(run_error(*three, make_sample(x)) ==
        "normalize_ct: sample 'case': 'image' has shape (2, 6, 7, 8): 3 values for a tensor of 2 channels; "
        "expected 1 or 2");
  CHECK(one->deterministic());
}

TEST_CASE(
    "zscore normalises each channel as nnU-Net's ZScoreNormalization, over the filled non-zero region") {
  auto x = body_image(2, 10, 12, 14, 3);
  Sample plain = run1(*make_stage("zscore"), make_sample(x));
  Sample masked = run1(*make_stage("zscore", {{"nonzero", true}}), make_sample(x));
  auto ref = reference({{"zscore", x, {{"nonzero", false}}}, {"zscore", x, {{"nonzero", true}}}});
  CHECK(max_diff(plain.at("image"), ref[0]) <= 2e-5);
  CHECK(max_diff(masked.at("image"), ref[1]) <= 2e-5);
  // The region: non-zero voxels with the hole filled; outside it zeros stay 0.
  auto region = nonzero_region(x);
  CHECK(region.sum().item<std::int64_t>() > x.ne(0).any(0).sum().item<std::int64_t>());  // the hole
  CHECK(masked.at("image")
            .masked_select(region.logical_not().unsqueeze(0).expand_as(x))
            .abs()
            .max()
            .item<float>() == 0.0f);
  // Not an alias of normalize_intensity: its nonzero keeps the hole at 0 and takes its
  // statistics without it; without nonzero both give the same values.
  Sample monai = run1(*make_stage("normalize_intensity", {{"nonzero", true}}), make_sample(x));
  CHECK(max_diff(monai.at("image"), masked.at("image")) > 0.01);
  Sample monai_plain = run1(*make_stage("normalize_intensity"), make_sample(x));
  CHECK(max_diff(monai_plain.at("image"), plain.at("image")) <= 1e-6);
  // A constant image gives 0 (std clamped to 1e-8), an all-zero one stays 0 with nonzero.
  CHECK(run1(*make_stage("zscore"), make_sample(torch::full({1, 2, 2, 2}, 4.0f)))
            .at("image")
            .abs()
            .max()
            .item<float>() == 0.0f);
  CHECK(run1(*make_stage("zscore", {{"nonzero", true}}), make_sample(torch::zeros({1, 3, 3, 3})))
            .at("image")
            .abs()
            .max()
            .item<float>() == 0.0f);
}

TEST_CASE("nonzero_region fills holes as scipy's binary_fill_holes, in 2D and 3D") {
  // A ring in 2D (the hole is filled), a cup open to the border (not a hole), face connectivity.
  auto m = torch::zeros({1, 7, 7});
  m.index_put_({0, Slice(1, 6), Slice(1, 6)}, 1.0f);
  m.index_put_({0, Slice(2, 5), Slice(2, 5)}, 0.0f);
  CHECK(nonzero_region(m).sum().item<std::int64_t>() == 25);
  m.index_put_({0, 0, 3}, 0.0f);
  m.index_put_({0, 1, 3}, 0.0f);                              // opens the ring to the border through a face
  CHECK(nonzero_region(m).sum().item<std::int64_t>() == 15);  // the ring alone
  // 3D: a closed shell; a diagonal gap does not open it (faces only).
  auto v = torch::ones({1, 5, 5, 5});
  v.index_put_({0, Slice(1, 4), Slice(1, 4), Slice(1, 4)}, 0.0f);
  CHECK(nonzero_region(v).all().item<bool>());
  v.index_put_({0, 0, 0, 0}, 0.0f);  // touches the cavity only through an edge and a corner
  CHECK(nonzero_region(v).sum().item<std::int64_t>() == 124);
  auto two = torch::zeros({2, 5, 5, 5});
  two.index_put_({1, 2, 2, 2}, 3.0f);  // any channel counts
  CHECK(nonzero_region(two).sum().item<std::int64_t>() == 1);
}

TEST_CASE("clip_percentiles clips each channel to its own percentiles as numpy computes them") {
  torch::manual_seed(5);
  auto x = body_image(2, 8, 9, 10, 5) + torch::randn({2, 8, 9, 10}).pow(3) * 30.0f;
  x.index_put_({0, 0}, 0.0f);
  auto st = make_stage("clip_percentiles");
  auto nz = make_stage("clip_percentiles", {{"lower", 5.0}, {"upper", 90.0}, {"nonzero", true}});
  auto rs = make_stage("clip_percentiles",
                       {{"lower", 1.0}, {"upper", 99.0}, {"rescale", true}, {"b_min", -1.0}, {"b_max", 1.0}});
  auto ref =
      reference({{"clip", x, {{"lower", 0.5}, {"upper", 99.5}, {"nonzero", false}, {"rescale", false}}},
                 {"clip", x, {{"lower", 5.0}, {"upper", 90.0}, {"nonzero", true}, {"rescale", false}}},
                 {"clip",
                  x,
                  {{"lower", 1.0},
                   {"upper", 99.0},
                   {"nonzero", false},
                   {"rescale", true},
                   {"b_min", -1.0},
                   {"b_max", 1.0}}}});
  CHECK(max_diff(run1(*st, make_sample(x)).at("image"), ref[0]) <= 1e-4);
  Sample b = run1(*nz, make_sample(x));
  CHECK(max_diff(b.at("image"), ref[1]) <= 1e-4);
  CHECK(b.at("image").masked_select(x == 0).abs().max().item<float>() == 0.0f);  // zeros stay 0
  Sample c = run1(*rs, make_sample(x));
  CHECK(max_diff(c.at("image"), ref[2]) <= 1e-5);
  CHECK(c.at("image").min().item<float>() == doctest::Approx(-1.0));
  CHECK(c.at("image").max().item<float>() == doctest::Approx(1.0));
  // percentile() itself: numpy's linear rule on a small list.
  auto v = torch::tensor({4.0f, 1.0f, 3.0f, 2.0f});
  CHECK(percentile(v, 0) == 1.0);
  CHECK(percentile(v, 50) == doctest::Approx(2.5));
  CHECK(percentile(v, 90) == doctest::Approx(3.7));
  CHECK(std::isnan(percentile(torch::zeros({0}), 50)));
}

TEST_CASE("gaussian_blur matches scipy's gaussian_filter in 3D and 2D, kernels wider than the image too") {
  torch::manual_seed(7);
  auto x = torch::randn({2, 9, 10, 11});
  auto x2 = torch::randn({1, 12, 13});
  auto ref = reference({{"blur", x, {{"sigma", {0.5, 1.0, 2.5}}, {"truncate", 4.0}}},
                        {"blur", x, {{"sigma", {3.0, 0.0, 0.7}}, {"truncate", 4.0}}},  // radius 12 > 9 voxels
                        {"blur", x2, {{"sigma", {1.3, 0.6}}, {"truncate", 2.0}}}});
  CHECK(max_diff(gaussian_blur(x, {0.5, 1.0, 2.5}, 4.0), ref[0]) <= 2e-6);
  CHECK(max_diff(gaussian_blur(x, {3.0, 0.0, 0.7}, 4.0), ref[1]) <= 2e-6);
  CHECK(max_diff(gaussian_blur(x2, {1.3, 0.6}, 2.0), ref[2]) <= 2e-6);
  // The stage with a fixed sigma is that filter on the channels it picks.
  auto st =
      make_stage("rand_gaussian_blur", {{"prob", 1.0}, {"prob_per_channel", 1.0}, {"sigma", {0.8, 0.8}}});
  CHECK(max_diff(run1(*st, make_sample(x)).at("image"), gaussian_blur(x, {0.8, 0.8, 0.8}, 4.0)) <= 1e-6);
  // per_axis false: one sigma for every axis (an impulse in a cube stays symmetric).
  auto impulse = torch::zeros({1, 9, 9, 9});
  impulse.index_put_({0, 4, 4, 4}, 1.0f);
  auto one =
      make_stage("rand_gaussian_blur", {{"prob", 1.0}, {"prob_per_channel", 1.0}, {"per_axis", false}});
  auto each = make_stage("rand_gaussian_blur", {{"prob", 1.0}, {"prob_per_channel", 1.0}});
  auto y1 = run1(*one, make_sample(impulse), 3).at("image")[0];
  auto y2 = run1(*each, make_sample(impulse), 3).at("image")[0];
  CHECK(max_diff(y1, y1.permute({2, 1, 0})) <= 1e-7);
  CHECK(max_diff(y2, y2.permute({2, 1, 0})) > 1e-4);
}

TEST_CASE("rand_brightness multiplies each channel by its own factor, drawn as nnU-Net's BGContrast") {
  auto x = torch::rand({2, 4, 5, 6}) + 1.0f;
  auto st = make_stage("rand_brightness", {{"prob", 1.0}, {"multiplier", {0.7, 1.5}}});
  auto uni =
      make_stage("rand_brightness", {{"prob", 1.0}, {"multiplier", {0.7, 1.5}}, {"sampling", "uniform"}});
  int below = 0, below_uniform = 0, distinct = 0;
  const int n = 600;
  for (int seed = 0; seed < n; ++seed) {
    auto y = run1(*st, make_sample(x), seed).at("image");
    auto m = y / x;  // constant per channel, in [0.7, 1.5]
    for (int c = 0; c < 2; ++c) {
      CHECK((m[c].max() - m[c].min()).item<float>() <= 1e-5f);
      CHECK(m[c].min().item<float>() >= 0.7f - 1e-5f);
      CHECK(m[c].max().item<float>() <= 1.5f + 1e-5f);
    }
    below += m[0].mean().item<float>() < 1.0f;
    distinct += std::abs((m[0].mean() - m[1].mean()).item<float>()) > 1e-6f;
    below_uniform += (run1(*uni, make_sample(x), seed).at("image")[0] / x[0]).mean().item<float>() < 1.0f;
  }
  CHECK(near_proportion(below / double(n), 0.5, n));                // halves: 1/2 below 1
  CHECK(near_proportion(below_uniform / double(n), 0.3 / 0.8, n));  // uniform: 0.375
  CHECK(distinct == n);                                             // a factor per channel
}

TEST_CASE(
    "rand_contrast scales around the channel mean and keeps the channel's range, as batchgeneratorsv2") {
  torch::manual_seed(11);
  auto x = torch::randn({1, 6, 7, 8}) * 50.0f + 20.0f;
  auto ref = reference({{"contrast", x, {{"factor", 1.2}, {"preserve_range", true}}},
                        {"contrast", x, {{"factor", 0.8}, {"preserve_range", true}}},
                        {"contrast", x, {{"factor", 1.2}, {"preserve_range", false}}}});
  CHECK(max_diff(adjust_contrast(x[0], 1.2, true), ref[0][0]) <= 1e-4);
  CHECK(max_diff(adjust_contrast(x[0], 0.8, true), ref[1][0]) <= 1e-4);
  CHECK(max_diff(adjust_contrast(x[0], 1.2, false), ref[2][0]) <= 1e-4);
  // The stage with a fixed factor: f < 1 keeps the mean exactly (nothing is clipped).
  auto st = make_stage("rand_contrast", {{"prob", 1.0}, {"factor", {0.8, 0.8}}, {"sampling", "uniform"}});
  auto y = run1(*st, make_sample(x)).at("image");
  CHECK(max_diff(y, adjust_contrast(x[0], 0.8, true).unsqueeze(0)) == 0.0);
  CHECK(y.mean().item<double>() == doctest::Approx(x.mean().item<double>()).epsilon(1e-5));
  auto up =
      run1(*make_stage("rand_contrast", {{"prob", 1.0}, {"factor", {1.25, 1.25}}, {"sampling", "uniform"}}),
           make_sample(x))
          .at("image");
  CHECK(up.min().item<float>() == x.min().item<float>());
  CHECK(up.max().item<float>() == x.max().item<float>());
}

TEST_CASE("rand_simulate_low_resolution downsamples nearest and upsamples linearly, as batchgeneratorsv2") {
  torch::manual_seed(13);
  auto x = torch::randn({1, 10, 11, 12});
  auto x2 = torch::randn({1, 15, 9});
  auto ref = reference({{"lowres", x, {{"zoom", {0.5, 0.7, 1.0}}}},
                        {"lowres", x, {{"zoom", {0.55, 0.55, 0.55}}}},
                        {"lowres", x2, {{"zoom", {0.5, 0.83}}}}});  // 7.5 -> 8 (half to even), 7.47 -> 7
  CHECK(max_diff(simulate_low_resolution(x, {0.5, 0.7, 1.0}), ref[0]) <= 1e-6);
  CHECK(max_diff(simulate_low_resolution(x, {0.55, 0.55, 0.55}), ref[1]) <= 1e-6);
  CHECK(max_diff(simulate_low_resolution(x2, {0.5, 0.83}), ref[2]) <= 1e-6);
  CHECK(torch::equal(simulate_low_resolution(x, {1.0, 1.0, 1.0}), x));
  // The stage with a fixed zoom, one for all axes (per_axis false, nnU-Net's).
  auto st = make_stage("rand_simulate_low_resolution",
                       {{"prob", 1.0}, {"prob_per_channel", 1.0}, {"zoom", {0.55, 0.55}}});
  CHECK(max_diff(run1(*st, make_sample(x)).at("image"), ref[1]) <= 1e-6);
  // ignore_axes [2]: z keeps its resolution; an image varying along z only is unchanged.
  auto zonly =
      torch::arange(10, torch::kFloat32).pow(2).view({1, 10, 1, 1}).expand({1, 10, 11, 12}).contiguous();
  auto keep_z =
      make_stage("rand_simulate_low_resolution",
                 {{"prob", 1.0}, {"prob_per_channel", 1.0}, {"zoom", {0.5, 0.5}}, {"ignore_axes", {2}}});
  CHECK(max_diff(run1(*keep_z, make_sample(zonly)).at("image"), zonly) <= 1e-4);
  auto all = make_stage("rand_simulate_low_resolution",
                        {{"prob", 1.0}, {"prob_per_channel", 1.0}, {"zoom", {0.5, 0.5}}});
  CHECK(max_diff(run1(*all, make_sample(zonly)).at("image"), zonly) > 1.0);
}

TEST_CASE(
    "rand_gamma inverts and retains statistics as nnU-Net's GammaTransform; its defaults are unchanged") {
  torch::manual_seed(17);
  auto x = torch::randn({1, 5, 6, 7}) * 3.0f + 1.0f;
  auto ref = reference({{"gamma", x, {{"gamma", 1.7}, {"invert", false}, {"retain", false}}},
                        {"gamma", x, {{"gamma", 0.6}, {"invert", true}, {"retain", false}}},
                        {"gamma", x, {{"gamma", 1.4}, {"invert", true}, {"retain", true}}},
                        {"gamma", x, {{"gamma", 0.8}, {"invert", false}, {"retain", true}}}});
  CHECK(max_diff(adjust_gamma(x, 1.7, false, false), ref[0]) <= 2e-5);
  CHECK(max_diff(adjust_gamma(x, 0.6, true, false), ref[1]) <= 2e-5);
  CHECK(max_diff(adjust_gamma(x, 1.4, true, true), ref[2]) <= 2e-5);
  CHECK(max_diff(adjust_gamma(x, 0.8, false, true), ref[3]) <= 2e-5);
  // Defaults: the draws and values of rand_gamma before these options (bernoulli, one uniform).
  auto st = make_stage("rand_gamma", {{"prob", 1.0}});
  Rng r(42);
  REQUIRE(r.bernoulli(1.0));
  const double g = r.uniform(0.5, 4.5);
  CHECK(torch::equal(run1(*st, make_sample(x), 42).at("image"), adjust_gamma(x, g)));
  // invert_prob: about that share of the samples is inverted.
  auto inv = make_stage("rand_gamma", {{"prob", 1.0}, {"gamma", {2.0, 2.0}}, {"invert_prob", 0.3}});
  int inverted = 0;
  const int n = 400;
  for (int seed = 0; seed < n; ++seed) {
    auto y = run1(*inv, make_sample(x), seed).at("image");
    const bool is_inv = torch::equal(y, adjust_gamma(x, 2.0, true, false));
    CHECK((is_inv || torch::equal(y, adjust_gamma(x, 2.0, false, false))));
    inverted += is_inv;
  }
  CHECK(near_proportion(inverted / double(n), 0.3, n));
  // retain_stats keeps mean and std; channel_wise takes each channel's own min and max.
  auto keep = make_stage("rand_gamma", {{"prob", 1.0}, {"retain_stats", true}, {"invert_prob", 1.0}});
  auto y = run1(*keep, make_sample(x), 5).at("image");
  CHECK(y.mean().item<double>() == doctest::Approx(x.mean().item<double>()).epsilon(1e-4));
  CHECK(y.std().item<double>() == doctest::Approx(x.std().item<double>()).epsilon(1e-4));
  auto two = torch::cat({x, x * 10.0f + 100.0f}, 0);  // channel 1 above channel 0
  auto cw = make_stage("rand_gamma", {{"prob", 1.0}, {"gamma", {2.0, 2.0}}, {"channel_wise", true}});
  auto z = run1(*cw, make_sample(two)).at("image");
  CHECK(max_diff(z[1], adjust_gamma(two[1], 2.0)) == 0.0);
  CHECK(max_diff(run1(*make_stage("rand_gamma", {{"prob", 1.0}, {"gamma", {2.0, 2.0}}}), make_sample(two))
                     .at("image")[1],
                 adjust_gamma(two[1], 2.0)) > 1.0);
}

TEST_CASE(
    "the nnU-Net random stages honour prob and prob_per_channel, repeat under a seed, spare the label") {
  Sample s = blob_sample(6, 6, 6);
  s.at("image") = torch::cat({s.at("image"), s.at("image") * 2.0f + 1.0f}, 0);  // 2 channels
  const int n = 500;
  for (const auto& name : kRandomStages) {
    INFO(name);
    // A zoom that always changes a 6-voxel axis (round(6 * 0.8) = 5).
    const nlohmann::json extra = name == "rand_simulate_low_resolution" ? nlohmann::json{{"zoom", {0.5, 0.8}}}
                                                                        : nlohmann::json::object();
    auto with = [&](nlohmann::json o) {
      o.update(extra);
      return make_stage(name, o);
    };
    auto st = with({{"prob", 0.3}, {"prob_per_channel", 1.0}});
    CHECK_FALSE(st->deterministic());
    auto f = changed_fraction(*st, s, n);
    CHECK(near_proportion(f[0], 0.3, n));
    auto pc = with({{"prob", 1.0}, {"prob_per_channel", 0.4}});
    auto g = changed_fraction(*pc, s, n);
    CHECK(near_proportion(g[0], 0.4, n));
    CHECK(near_proportion(g[1], 0.4, n));
    auto always = with({{"prob", 1.0}, {"prob_per_channel", 1.0}});
    Sample a = run1(*always, s, 5), b = run1(*always, s, 5), c = run1(*always, s, 6);
    CHECK(torch::equal(a.at("image"), b.at("image")));
    CHECK_FALSE(torch::equal(a.at("image"), c.at("image")));
    CHECK(torch::equal(a.at("label"), s.at("label")));
    CHECK(torch::equal(run1(*make_stage(name, {{"prob", 0.0}}), s, 5).at("image"), s.at("image")));
    // The input tensor is not written to (it may be the cache's).
    auto before = s.at("image").clone();
    (void)run1(*always, s, 7);
    CHECK(torch::equal(before, s.at("image")));
    // Integer tensors are refused, naming the stage.
    CHECK(contains(run_error(*make_stage(name, {{"keys", {"label"}}}), s),
                   name + ": sample 'case': 'label' is Byte; intensity stages need floating tensors"));
  }
  CHECK(run_error(*make_stage("rand_gaussian_blur"), make_sample(torch::zeros({5}))) ==
        "rand_gaussian_blur: sample 'case': 'image' has shape (5,); expected (C, Y, X) or (C, Z, Y, X)");
}

TEST_CASE("the nnU-Net stages refuse bad options, naming the field") {
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases{
      {"normalize_ct",
       {{"lower", {1.0, 2.0}}, {"upper", {3.0, 4.0, 5.0}}},
       "test.upper: expected 1 or 2 values (as lower), got 3"},
      {"normalize_ct",
       {{"std", -1}},
       "test.std: expected a non-negative number or a non-empty list of non-negative numbers, got -1"},
      {"normalize_ct",
       {{"mean", nlohmann::json::array()}},
       "test.mean: expected a number or a non-empty list of numbers, got []"},
      {"normalize_ct",
       {{"lower", 10}, {"upper", 0}},
       "test.upper: expected upper >= lower, got lower 10.0 and upper 0.0"},
      {"zscore",
       {{"nonzer", true}},
       "test.nonzer: unknown option for stage 'zscore'; expected keys, nonzero, allow_missing_keys"},
      {"clip_percentiles",
       {{"lower", 60}, {"upper", 40}},
       "test.upper: expected upper >= lower, got lower 60.0 and upper 40.0"},
      {"clip_percentiles", {{"upper", 101}}, "test.upper: expected a number in [0, 100], got 101"},
      {"rand_gaussian_blur",
       {{"sigma", {1.0, 0.5}}},
       "test.sigma: expected [lo, hi] with lo <= hi, got [1.0, 0.5]"},
      {"rand_gaussian_blur", {{"truncate", 0}}, "test.truncate: expected a positive number, got 0"},
      {"rand_gaussian_blur",
       {{"prob_per_channel", 1.5}},
       "test.prob_per_channel: expected a number in [0, 1], got 1.5"},
      {"rand_brightness",
       {{"multiplier", {1.1, 1.3}}},
       "test.multiplier: expected [lo, hi] with lo <= 1 <= hi for sampling: halves, got [1.1, 1.3]"},
      {"rand_contrast",
       {{"sampling", "gauss"}},
       "test.sampling: expected one of uniform, halves, got \"gauss\""},
      {"rand_simulate_low_resolution",
       {{"zoom", {0, 1}}},
       "test.zoom: expected 2 numbers in (0, 1], got [0, 1]"},
      {"rand_simulate_low_resolution",
       {{"ignore_axes", {3}}},
       "test.ignore_axes: expected a list of distinct integers in [0, 2], got [3]"},
      {"rand_gamma", {{"invert_prob", 2}}, "test.invert_prob: expected a number in [0, 1], got 2"},
      {"rand_gamma",
       {{"sampling", "halves"}, {"gamma", {1.5, 4.5}}},
       "test.gamma: expected [lo, hi] with lo <= 1 <= hi for sampling: halves, got [1.5, 4.5]"},
  };
  for (const auto& [name, opts, want] : cases) {
    INFO(name << " " << opts.dump());
    auto r = registry().make(name, opts, "test");
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message() == want);
  }
}

TEST_CASE("the nnU-Net stages run on CUDA tensors and give the CPU's values") {
  if (!cuda_or_skip()) return;
  auto x = body_image(2, 10, 12, 14, 19);
  Sample cpu = make_sample(x, torch::ones({1, 10, 12, 14}, torch::kUInt8));
  Sample gpu = cpu;
  for (auto& [k, t] : gpu.tensors) t = t.to(torch::kCUDA);
  const std::vector<std::pair<std::string, nlohmann::json>> stages{
      {"normalize_ct", {{"lower", -20.0}, {"upper", 150.0}, {"mean", 60.0}, {"std", {30.0, 35.0}}}},
      {"zscore", {{"nonzero", true}}},
      {"clip_percentiles", {{"nonzero", true}, {"rescale", true}}},
      {"rand_gaussian_blur", {{"prob", 1.0}, {"prob_per_channel", 1.0}}},
      {"rand_brightness", {{"prob", 1.0}}},
      {"rand_contrast", {{"prob", 1.0}}},
      {"rand_simulate_low_resolution", {{"prob", 1.0}, {"prob_per_channel", 1.0}}},
      {"rand_gamma", {{"prob", 1.0}, {"invert_prob", 0.5}, {"retain_stats", true}, {"channel_wise", true}}},
  };
  for (const auto& [name, opts] : stages) {
    INFO(name);
    auto st = make_stage(name, opts);
    Sample a = run1(*st, cpu, 9), b = run1(*st, gpu, 9);
    CHECK(b.at("image").is_cuda());
    CHECK(b.at("label").is_cuda());
    const double scale = std::max(1.0, a.at("image").abs().max().item<double>());
    CHECK(max_diff(a.at("image"), b.at("image")) <= 1e-4 * scale);
  }
}

TEST_CASE("an nnU-Net-style stage list runs from YAML through the compact cache into batches") {
  // What segflow plan writes for a CT dataset: dataset statistics, per-class indices, then
  // nnU-Net's augmentation (every probability raised so that each stage acts).
  const char* yaml = R"(
- {name: normalize_ct, options: {lower: -20, upper: 180, mean: 80.5, std: 35.2}}
- {name: fg_bg_indices, options: {per_class: true}}
- {name: rand_crop_pos_neg, options: {spatial_size: [8, 8, 6], pos: 1, neg: 2, num_samples: 2, class_balanced: true}}
- {name: rand_gaussian_blur, options: {prob: 1.0}}
- {name: rand_brightness, options: {prob: 1.0}}
- {name: rand_contrast, options: {prob: 1.0}}
- {name: rand_simulate_low_resolution, options: {prob: 1.0, ignore_axes: [2]}}
- {name: rand_gamma, options: {prob: 1.0, gamma: [0.7, 1.5], sampling: halves, invert_prob: 1, retain_stats: true, channel_wise: true}}
- {name: rand_gamma, options: {prob: 1.0, gamma: [0.7, 1.5], sampling: halves, retain_stats: true, channel_wise: true}}
- {name: rand_flip, options: {prob: 0.5}}
)";
  REQUIRE_OK_AND_ASSIGN(Pipeline p, build_pipeline(YAML::Load(yaml), registry(), "plan.yaml"));
  CHECK(p.cache_boundary() == 2);
  Sample s = blob_sample(12, 16, 20);
  s.at("image") = s.at("image") * 100.0f - 50.0f;
  REQUIRE_OK_AND_ASSIGN(Sample cached, p.run_deterministic(s));
  CHECK(cached.has("fg_indices_1"));
  CHECK(cached.has("fg_indices_3"));
  REQUIRE_OK_AND_ASSIGN(Sample compact, compact_sample(cached, CacheDtype::exact));
  std::vector<Sample> a{compact}, b{cached};
  Rng r1(4), r2(4);
  REQUIRE_OK(p.run_random(a, r1));
  REQUIRE_OK(p.run_random(b, r2));
  REQUIRE(a.size() == 2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(torch::equal(a[i].at("image"), b[i].at("image")));  // the compact cache changes nothing
    CHECK(subset(values_of(a[i].at("label")), {0, 1, 3}));
  }
  REQUIRE_OK_AND_ASSIGN(Batch batch, collate(a));
  CHECK(batch.tensors.at("image").sizes() == torch::IntArrayRef({2, 1, 6, 8, 8}));
  CHECK(batch.tensors.size() == 2);  // image and label: no index lists
}
