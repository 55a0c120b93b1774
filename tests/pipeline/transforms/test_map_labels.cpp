// The map_labels stage: mappings and keep lists on tensors (checked voxel by voxel against a
// plain loop), on TotalSegmentator's real 117-class label map, the once-per-label report of a
// source that does not occur, and bad options refused with the option's name.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <regex>

#include "pipeline/io/nifti.hpp"
#include "pipeline/transforms/map_labels.hpp"
#include "stage_test_util.hpp"
#include "test_util.hpp"

using namespace segflow;
using nlohmann::json;
using segflow::testing::make_sample;
using segflow::testing::make_stage;
using segflow::testing::run1;

namespace {

/// A (1, Z, Y, X) label map holding every value 0..n-1 several times, in a fixed shuffle.
at::Tensor all_values(std::int64_t n, at::ScalarType type) {
  const std::int64_t total = n * 24;  // 37 is prime and does not divide it: i -> 37 i mod total permutes
  at::Tensor v = (torch::arange(total, torch::kLong) * 37).remainder(total).remainder(n);
  return v.reshape({1, 4, 6, n}).to(type).contiguous();
}

/// The expected result by a plain loop over the voxels.
at::Tensor mapped_by_loop(const at::Tensor& labels, const std::map<std::int64_t, std::int64_t>& m) {
  at::Tensor in = labels.to(torch::kLong).contiguous();
  at::Tensor out = torch::zeros_like(in);
  const auto* p = in.data_ptr<std::int64_t>();
  auto* q = out.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < in.numel(); ++i) {
    auto it = m.find(p[i]);
    q[i] = it == m.end() ? 0 : it->second;
  }
  return out.to(labels.scalar_type());
}

/// Captures what the process writes to stderr (spdlog's sink) while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    file_ = std::tmpfile();
    ::dup2(::fileno(file_), 2);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::string s;
    std::rewind(file_);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) s.append(buf, n);
    return s;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  std::FILE* file_ = nullptr;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string map_labels_error(const json& options) {
  auto r = testing::registry().make("map_labels", options, "job.yaml: stages[1].options");
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

}  // namespace

TEST_CASE("map_labels with a mapping replaces each source by its target and every other label by 0") {
  const std::map<std::int64_t, std::int64_t> m = {{1, 1}, {5, 2}, {2, 3}, {3, 3}, {9, 0}};
  for (auto type : {torch::kUInt8, torch::kLong}) {
    const at::Tensor labels = all_values(12, type);
    auto st = make_stage("map_labels", {{"mapping", {{"1", 1}, {"5", 2}, {"2", 3}, {"3", 3}, {"9", 0}}}});
    CHECK(st->deterministic());
    Sample out = run1(*st, make_sample(torch::zeros({1, 4, 6, 12}), labels));
    const at::Tensor& got = out.at("label");
    CHECK((got.scalar_type() == type));
    CHECK((got.sizes() == labels.sizes()));
    CHECK(torch::equal(got, mapped_by_loop(labels, m)));
    CHECK(testing::values_of(got) == std::set<std::int64_t>{0, 1, 2, 3});
    CHECK(torch::equal(out.at("image"), torch::zeros({1, 4, 6, 12})));  // other tensors untouched
  }
}

TEST_CASE("map_labels with keep renumbers the kept labels 1..n in the listed order") {
  const at::Tensor labels = all_values(10, torch::kUInt8);
  auto st = make_stage("map_labels", {{"keep", {5, 1, 2}}});
  Sample out = run1(*st, make_sample(torch::zeros({1, 4, 6, 10}), labels));
  CHECK(torch::equal(out.at("label"), mapped_by_loop(labels, {{5, 1}, {1, 2}, {2, 3}})));
  // The stage's resolved options are what run folders record.
  CHECK(st->options()["keep"] == json({5, 1, 2}));
  // The input tensor (possibly shared with the cache) is not modified.
  CHECK(torch::equal(labels, all_values(10, torch::kUInt8)));
}

TEST_CASE("map_labels keeps spleen, liver and kidneys of TotalSegmentator's real 117-class label map") {
  // TotalSegmentator v2 "total" class map (totalsegmentator==2.18.0, map_to_binary.py):
  // 1 spleen, 2 kidney_right, 3 kidney_left, 5 liver.
  REQUIRE_OK_AND_ASSIGN(auto seg,
                        pipeline::read_nifti(testing::testdata_path("totalsegmentator/example_seg.nii.gz")));
  const at::Tensor labels = seg.voxels;
  REQUIRE(testing::values_of(labels).size() > 40);
  auto st = make_stage("map_labels", {{"keep", {1, 5, 2, 3}}});
  Sample out = run1(*st, make_sample(torch::zeros({1, 1, 1, 1}), labels));
  const at::Tensor& got = out.at("label");
  CHECK(testing::values_of(got) == std::set<std::int64_t>{0, 1, 2, 3, 4});
  const std::int64_t sources[] = {1, 5, 2, 3};
  std::int64_t kept = 0;
  for (int t = 1; t <= 4; ++t) {
    const auto n = (labels == sources[t - 1]).sum().item<std::int64_t>();
    CHECK(n > 1000);  // each organ is really there
    CHECK((got == t).sum().item<std::int64_t>() == n);
    CHECK(torch::equal(got == t, labels == sources[t - 1]));  // the same voxels
    kept += n;
  }
  CHECK((got == 0).sum().item<std::int64_t>() == labels.numel() - kept);
}

TEST_CASE("a source label that never occurs is reported once per label for the life of the stage") {
  // label 7 is in no sample; label 9 only in the second.
  auto a = torch::tensor({0, 1, 1, 2}, torch::kUInt8).reshape({1, 1, 1, 4});
  auto b = torch::tensor({9, 1, 2, 2}, torch::kUInt8).reshape({1, 1, 1, 4});
  auto st = make_stage("map_labels", {{"keep", {1, 7, 9}}});
  std::string log;
  {
    StderrCapture capture;
    for (int i = 0; i < 3; ++i) {
      run1(*st, make_sample(torch::zeros({1, 1, 1, 4}), a, "case_a" + std::to_string(i)));
      run1(*st, make_sample(torch::zeros({1, 1, 1, 4}), b, "case_b" + std::to_string(i)));
    }
    log = capture.text();
  }
  INFO("log: " << log);
  CHECK(count(log, "source label 7 does not occur") == 1);
  CHECK(count(log, "source label 9 does not occur in case 'case_a0'") == 1);
  CHECK(count(log, "source label 9") == 1);
  CHECK(count(log, "source label 1 ") == 0);
  // A new stage (the next job) reports again.
  auto again = make_stage("map_labels", {{"keep", {1, 7, 9}}});
  StderrCapture capture;
  run1(*again, make_sample(torch::zeros({1, 1, 1, 4}), a, "next_job"));
  CHECK(count(capture.text(), "source label 7 does not occur in case 'next_job'") == 1);
  // An all-background map (what inference feeds through the stages) reports nothing.
  {
    auto quiet = make_stage("map_labels", {{"keep", {1, 7, 9}}});
    StderrCapture none;
    run1(*quiet, make_sample(torch::zeros({1, 1, 1, 4}), torch::zeros({1, 1, 1, 4}, torch::kUInt8), "empty"));
    CHECK(count(none.text(), "does not occur") == 0);
  }
  // The kernel says which sources are absent.
  std::vector<std::int64_t> absent;
  REQUIRE_OK(pipeline::map_label_values(b, {{1, 1}, {7, 2}, {9, 3}}, &absent));
  CHECK(absent == std::vector<std::int64_t>{7});
}

TEST_CASE("map_labels options are validated when the pipeline is built, naming the option") {
  const std::string at = "job.yaml: stages[1].options.";
  CHECK(map_labels_error({{"keep", {1, 2}}, {"kep", 3}})
            .find(at + "kep: unknown option for stage 'map_labels'") == 0);
  CHECK(map_labels_error({{"keep", {1, 5, 1}}}) ==
        at + "keep: expected a list of distinct non-negative integers, got [1, 5, 1]");
  CHECK(map_labels_error({{"mapping", {{"1", 2}, {"01", 3}}}}) ==
        at + "mapping: expected each source label once, got source 1 twice (as \"01\" and \"1\")");
  CHECK(map_labels_error({{"mapping", {{"1", 2}}}, {"keep", {1}}})
            .find(at + "keep: expected either mapping or keep, got both") == 0);
  CHECK(map_labels_error({{"names", {"a", "b"}}})
            .find(at + "names: expected names only with a mapping or a keep list") == 0);
  CHECK(map_labels_error({{"mapping", {{"spleen", 1}}}})
            .find(at + "mapping: expected a map {source: target} of label values") == 0);
  CHECK(map_labels_error({{"mapping", {{"3", -1}}}}).find(at + "mapping: expected a map") == 0);
  CHECK(map_labels_error({{"mapping", json::array({1, 2})}}).find(at + "mapping: expected a map") == 0);
  CHECK(map_labels_error({{"keep", {1, 2}}, {"names", {"background", "spleen"}}}) ==
        at + "names: expected 3 names (classes 0..2, background first), got 2");
  CHECK(map_labels_error({{"mapping", {{"4", 0}}}}) ==
        at + "mapping: expected at least one target label > 0, got none");
  // Without mapping and keep (the defaults) the labels pass unchanged.
  auto none = make_stage("map_labels");
  const at::Tensor labels = all_values(10, torch::kUInt8);
  CHECK(torch::equal(run1(*none, make_sample(torch::zeros({1, 4, 6, 10}), labels)).at("label"), labels));
  // A float label map is refused at run time, naming the case.
  auto st = make_stage("map_labels", {{"keep", {1}}});
  CHECK(testing::run_error(*st, make_sample(torch::zeros({1, 1, 1, 2}), torch::ones({1, 1, 1, 2}), "c7"))
            .find("case 'c7': map_labels: expected an integer label map, got Float") != std::string::npos);
}

TEST_CASE("map_labels class names come from its names option or from the sources' names") {
  REQUIRE_OK_AND_ASSIGN(auto o, pipeline::parse_map_labels_options(
                                    {{"mapping", {{"1", 1}, {"5", 2}, {"2", 3}, {"3", 3}}}}, "x"));
  CHECK(pipeline::map_labels_num_classes(o) == 4);
  const std::vector<std::string> total = {"background", "spleen", "kidney_right", "kidney_left", "", "liver"};
  CHECK(pipeline::map_labels_class_names(o, total) ==
        std::vector<std::string>{"background", "spleen", "liver", "kidney_right+kidney_left"});
  CHECK(pipeline::map_labels_class_names(o, {}).empty());
  auto named =
      pipeline::parse_map_labels_options({{"keep", {1, 5}}, {"names", {"bg", "Spleen", "Liver"}}}, "x");
  REQUIRE_OK(named);
  CHECK(pipeline::map_labels_class_names(*named, total) == std::vector<std::string>{"bg", "Spleen", "Liver"});
}
