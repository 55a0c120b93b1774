// train.cache_dtype and train.cache_device: read, defaulted, validated at submission, and
// kept out of the run folder name when they do not change the batches.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "job_yaml.hpp"
#include "models/training/job_config.hpp"
#include "test_util.hpp"

using namespace segflow::models;

namespace {

/// A job of stages and a model only (no data, loss, optimizer or train section).
std::string cache_job() {
  segflow::testing::JobYaml job;
  job.name = "cachetest";
  job.seed = "";
  job.stages = {"load", "fg_bg_indices",
                segflow::testing::stage("rand_crop_pos_neg", "{spatial_size: [8, 8, 8]}")};
  job.model = segflow::testing::unet3d(2, "channels: [4, 8], strides: [2]");
  job.loss = job.optimizer = job.schedule = job.train = job.validation = "";
  job.epochs = -1;
  return job.yaml();
}

}  // namespace

TEST_CASE("train.cache_dtype and train.cache_device default to exact on the host and are validated") {
  REQUIRE_OK_AND_ASSIGN(auto c, parse_job_config(cache_job(), "job.yaml"));
  CHECK(c.train.cache_dtype == "exact");
  CHECK(c.train.cache_device == "cpu");
  CHECK(c.resolved["train"]["cache_dtype"] == "exact");
  CHECK(c.resolved["train"]["cache_device"] == "cpu");

  struct Bad {
    std::vector<std::string> set;
    std::string expect;
  };
  const std::vector<Bad> bad = {
      {{"train.cache_dtype=fp8"},
       "job.yaml: train.cache_dtype: expected one of exact, float16, bfloat16, none, got \"fp8\""},
      {{"train.cache_device=gpu"}, "job.yaml: train.cache_device: expected one of cpu, cuda, got \"gpu\""},
      {{"train.cache_device=cuda", "train.device=cpu"},
       "job.yaml: train.cache_device: expected cpu when training on the CPU (train.device/devices), got "
       "cuda"},
      {{"train.cache_device=cuda", "train.devices=[cuda:0, cpu]"},
       "job.yaml: train.cache_device: expected cpu when training on the CPU (train.device/devices), got "
       "cuda"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.set.front());
    auto r = parse_job_config(cache_job(), "job.yaml", b.set);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message() == b.expect);
  }
  for (const char* ok : {"train.cache_dtype=float16", "train.cache_dtype=bfloat16", "train.cache_dtype=none",
                         "train.cache_device=cuda"}) {
    CAPTURE(ok);
    auto r = parse_job_config(cache_job(), "job.yaml", {ok});
    CHECK_OK(r);
  }
}

TEST_CASE("lossless cache settings keep the run folder name; float16 and bfloat16 change it") {
  auto name_with = [](std::vector<std::string> set) {
    REQUIRE_OK_AND_ASSIGN(auto c, parse_job_config(cache_job(), "job.yaml", set));
    return run_name(c);
  };
  const std::string base = name_with({});
  CHECK(name_with({"train.cache_dtype=none"}) == base);
  CHECK(name_with({"train.cache_device=cuda"}) == base);
  CHECK(name_with({"train.cache_dtype=float16"}) != base);
  CHECK(name_with({"train.cache_dtype=bfloat16"}) != name_with({"train.cache_dtype=float16"}));
}
