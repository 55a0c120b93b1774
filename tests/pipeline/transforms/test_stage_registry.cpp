// StageRegistry, stage descriptions, Rng and the pipeline spec / config validation.
#include <yaml-cpp/yaml.h>

#include "pipeline/options.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using segflow::testing::registry;

namespace {

const std::vector<std::string> kBuiltins{"clip_percentiles",
                                         "crop_foreground",
                                         "fg_bg_indices",
                                         "load",
                                         "map_labels",
                                         "medsam_box",
                                         "medsam_normalize",
                                         "minmax_slices",
                                         "normalize_ct",
                                         "normalize_intensity",
                                         "rand_affine",
                                         "rand_brightness",
                                         "rand_contrast",
                                         "rand_crop_pos_neg",
                                         "rand_flip",
                                         "rand_gamma",
                                         "rand_gaussian_blur",
                                         "rand_gaussian_noise",
                                         "rand_rotate90",
                                         "rand_scale_intensity",
                                         "rand_shift_intensity",
                                         "rand_simulate_low_resolution",
                                         "remove_small_objects",
                                         "reorient",
                                         "repeat_channels",
                                         "resample",
                                         "resize_longest_side",
                                         "scale_intensity_range",
                                         "zscore"};

Status build_error(const std::string& yaml) {
  auto r = build_pipeline(YAML::Load(yaml)["stages"], registry(), "configs/job.yaml");
  REQUIRE_FALSE(r.is_ok());
  return r.status();
}

}  // namespace

TEST_CASE("the stage registry holds every built-in stage") {
  auto names = registry().names();
  std::vector<std::string> want = kBuiltins;
  std::sort(want.begin(), want.end());
  CHECK(names == want);
}

TEST_CASE("a duplicate stage name is an error listing the known stages") {
  StageRegistry r = builtin_registry();
  Status st = register_builtin_stages(r);
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message().find("stage 'load' is already registered (by builtin); known stages: clip_percentiles, "
                          "crop_foreground, ") == 0);
  for (const auto& n : kBuiltins) CHECK(st.message().find(n) != std::string::npos);
}

TEST_CASE("an unknown stage name is an error listing the known stages") {
  auto r = registry().make("resampel", nlohmann::json::object(), "job.yaml: stages[1].options");
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message().find("job.yaml: stages[1].options: unknown stage 'resampel'; known stages: "
                                  "clip_percentiles, crop_foreground, fg_bg_indices, load") == 0);
}

TEST_CASE("every built-in stage builds with its default options and describes them") {
  nlohmann::json d = describe_stages(registry());
  REQUIRE(d.size() == kBuiltins.size());
  for (const auto& s : d) {
    INFO(s["name"]);
    CHECK(!s["doc"].get<std::string>().empty());
    CHECK(s["origin"] == "builtin");
    CHECK(s["options"].size() > 0);
    for (const auto& o : s["options"]) {
      CHECK(!o["doc"].get<std::string>().empty());
      CHECK(o.contains("default"));
    }
    REQUIRE_OK_AND_ASSIGN(auto st, registry().make(s["name"], nlohmann::json::object(), ""));
    CHECK(st->deterministic() == s["deterministic"].get<bool>());
    // Resolved options: every described option is present with its default.
    for (const auto& o : s["options"]) CHECK(st->options()[o["name"].get<std::string>()] == o["default"]);
  }
  const std::string text = format_stages(registry());
  for (const auto& n : kBuiltins) CHECK(text.find(n + "  (") != std::string::npos);
  CHECK(text.find("spacing") != std::string::npos);
  CHECK(text.find("default [1.5, 1.5, 2.0]") != std::string::npos);
}

TEST_CASE("stage rng streams are reproducible and differ between samples") {
  Rng a = Rng::for_sample(7, 0, 3, 11), b = Rng::for_sample(7, 0, 3, 11), c = Rng::for_sample(7, 0, 3, 12);
  Rng d = Rng::for_sample(7, 1, 3, 11);
  bool differ_c = false, differ_d = false;
  for (int i = 0; i < 16; ++i) {
    const auto x = a.next_u64();
    CHECK(x == b.next_u64());
    differ_c = differ_c || x != c.next_u64();
    differ_d = differ_d || x != d.next_u64();
  }
  CHECK(differ_c);
  CHECK(differ_d);
  Rng r(1);
  int hits[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 5000; ++i) {
    const auto v = r.integer(2, 6);
    REQUIRE(v >= 2);
    REQUIRE(v <= 6);
    ++hits[v - 2];
    const double u = r.uniform(-1.0, 1.0);
    REQUIRE(u >= -1.0);
    REQUIRE(u < 1.0);
  }
  for (int h : hits) CHECK(h > 850);
  CHECK(r.uniform(0.0, 0.0) == 0.0);
}

TEST_CASE("a stage pipeline spec parses from YAML and splits at the first random stage") {
  auto y = YAML::Load(R"(
stages:
  - load
  - name: resample
    options: {spacing: [1.0, 1.0, 2.0], mode: nearest}
  - {name: scale_intensity_range, options: {a_min: -57, a_max: 164, clip: true}}
  - name: rand_crop_pos_neg
    options: {spatial_size: 8, num_samples: 2}
  - normalize_intensity
  - rand_flip
)");
  REQUIRE_OK_AND_ASSIGN(auto spec, parse_pipeline_spec(y["stages"], "configs/job.yaml"));
  REQUIRE(spec.stages.size() == 6);
  CHECK(spec.stages[1].options["spacing"] == nlohmann::json({1.0, 1.0, 2.0}));
  CHECK(spec.stages[2].options["a_min"] == -57);
  CHECK(spec.stages[2].options["clip"] == true);
  REQUIRE_OK_AND_ASSIGN(auto p, build_pipeline(spec, registry()));
  CHECK(p.cache_boundary() == 3);
  CHECK(p.to_json()[1]["options"]["mode"] == "nearest");
  CHECK(p.to_json()[3]["options"]["spatial_size"] == nlohmann::json({8, 8, 8}));
  CHECK_OK(p.check_device(c10::Device("cuda:0")));
  CHECK(yaml_to_json(YAML::Load("[\"12\", 12, 1.5, true, ~, abc]")) ==
        nlohmann::json::parse(R"(["12", 12, 1.5, true, null, "abc"])"));
}

TEST_CASE("stage config errors name the file, the path, what was expected and what was got") {
  SUBCASE("unknown stage") {
    Status st = build_error("stages: [load, {name: resampel}]");
    CHECK(st.code() == ErrorCode::invalid_config);
    CHECK(st.message().find(
              "configs/job.yaml: stages[1].name: unknown stage 'resampel'; known stages: clip_percentiles, "
              "crop_foreground, ") == 0);
  }
  SUBCASE("unknown option key") {
    Status st = build_error("stages: [load, {name: resample, options: {spacing: 1, sigma: 2}}]");
    // The first error wins: spacing needs 3 numbers.
    CHECK(st.message() == "configs/job.yaml: stages[1].options.spacing: expected 3 positive numbers, got 1");
    st = build_error("stages: [load, {name: resample, options: {sigma: 2}}]");
    CHECK(st.message() ==
          "configs/job.yaml: stages[1].options.sigma: unknown option for stage 'resample'; expected "
          "keys, spacing, mode, grid, allow_missing_keys");
  }
  SUBCASE("wrong type") {
    CHECK(build_error("stages: [{name: resample, options: {mode: 3}}]").message() ==
          "configs/job.yaml: stages[0].options.mode: expected one of trilinear, nearest, got 3");
    CHECK(build_error("stages: [{name: rand_flip, options: {prob: yes}}]").message() ==
          "configs/job.yaml: stages[0].options.prob: expected a number in [0, 1], got \"yes\"");
    CHECK(build_error("stages: [{name: scale_intensity_range, options: {clip: 1}}]").message() ==
          "configs/job.yaml: stages[0].options.clip: expected true or false, got 1");
    CHECK(build_error("stages: [{name: rand_crop_pos_neg, options: {num_samples: 2.5}}]").message() ==
          "configs/job.yaml: stages[0].options.num_samples: expected an integer in [1, 1024], got 2.5");
    CHECK(build_error("stages: [{name: rand_flip, options: {keys: 3}}]").message() ==
          "configs/job.yaml: stages[0].options.keys: expected a non-empty list of names, got 3");
    CHECK(build_error("stages: [{name: rand_flip, options: [1, 2]}]").message() ==
          "configs/job.yaml: stages[0].options: expected a map of options, got [1, 2]");
  }
  SUBCASE("out of range") {
    CHECK(build_error("stages: [load, reorient, {name: resample, options: {spacing: [1.5, 0]}}]").message() ==
          "configs/job.yaml: stages[2].options.spacing: expected 3 positive numbers, got [1.5, 0]");
    CHECK(build_error("stages: [load, reorient, {name: resample, options: {spacing: [1.5, 1.5, -2.0]}}]")
              .message() ==
          "configs/job.yaml: stages[2].options.spacing: expected 3 positive numbers, got [1.5, 1.5, -2.0]");
    CHECK(build_error("stages: [{name: rand_flip, options: {prob: 1.5}}]").message() ==
          "configs/job.yaml: stages[0].options.prob: expected a number in [0, 1], got 1.5");
    CHECK(build_error("stages: [{name: crop_foreground, options: {margin: [1, -1, 0]}}]").message() ==
          "configs/job.yaml: stages[0].options.margin: expected a non-negative integer or 3 non-negative "
          "integers, got [1, -1, 0]");
    CHECK(build_error("stages: [{name: scale_intensity_range, options: {a_min: 5, a_max: 5}}]").message() ==
          "configs/job.yaml: stages[0].options.a_max: expected a value different from a_min (5.0)");
    CHECK(build_error("stages: [{name: rand_gamma, options: {gamma: [2, 1]}}]").message() ==
          "configs/job.yaml: stages[0].options.gamma: expected [lo, hi] with lo <= hi, got [2.0, 1.0]");
    CHECK(build_error("stages: [{name: reorient, options: {axcodes: RAR}}]").message() ==
          "configs/job.yaml: stages[0].options.axcodes: expected 3 letters, one of L/R, one of P/A and one "
          "of I/S (e.g. \"RAS\", \"LPS\"), got \"RAR\"");
  }
  SUBCASE("malformed entries") {
    CHECK(build_error("stages: {load: 1}").message() ==
          "configs/job.yaml: stages: expected a list of stages, got {load: 1}");
    CHECK(build_error("stages: [load, {name: resample, opts: {}}]").message() ==
          "configs/job.yaml: stages[1]: unknown key 'opts'; expected name, options");
    CHECK(build_error("stages: [load, 3]").message() ==
          "configs/job.yaml: stages[1]: expected a stage name or a map with name and options, got 3");
    CHECK(build_error("stages: [reorient, load]").message() ==
          "configs/job.yaml: stages[1].name: stage 'load' reads the data and must come first");
  }
}
