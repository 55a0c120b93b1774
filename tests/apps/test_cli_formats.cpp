// `segflow inspect` on NRRD and MetaImage files: the real TotalSegmentator CT and label map
// written by SimpleITK (oblique, every variant) agree with SimpleITK's reading of them (the
// shared reference reader, tests/tools/reference.py); label names come from dataset.json; bad
// files exit non-zero with one line on stderr.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <set>

#include "pipeline/io/npy.hpp"
#include "pipeline/io/nrrd.hpp"
#include "test_util.hpp"

using namespace segflow::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// SimpleITK writes `src` as NRRD and MetaImage files into `dir` (tests/tools/sitk_formats.py).
json sitk_write(const fs::path& src, const fs::path& dir, const std::string& prefix) {
  auto r = run_command(shell_quote(python()) + " " +
                       shell_quote(source_path("tests/tools/sitk_formats.py").string()) + " write " +
                       shell_quote(src.string()) + " " + shell_quote(dir.string()) + " " + prefix +
                       " --oblique 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return json::parse(r.out);
}

/// Runs `segflow inspect PATH --json` and parses its stdout.
json inspect_json(const fs::path& p) {
  auto r =
      run_command(shell_quote(segflow_bin()) + " inspect " + shell_quote(p.string()) + " --json 2>/dev/null");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return json::parse(r.out);
}

std::vector<std::int64_t> distinct(const fs::path& npy) {
  REQUIRE_OK_AND_ASSIGN(auto t, segflow::pipeline::read_npy(npy));
  at::Tensor u = std::get<0>(at::_unique(t.flatten().to(torch::kLong), true));
  return std::vector<std::int64_t>(u.data_ptr<std::int64_t>(), u.data_ptr<std::int64_t>() + u.numel());
}

}  // namespace

TEST_CASE(
    "segflow inspect agrees with SimpleITK on NRRD and MetaImage files of a real CT and its label map") {
  TempDir dir("cli_formats");
  const json ct = sitk_write(testdata_path("totalsegmentator/example_ct_sm.nii.gz"), dir.path(), "ct");
  const json seg = sitk_write(testdata_path("totalsegmentator/example_seg.nii.gz"), dir.path(), "seg");
  std::vector<fs::path> files;
  for (const json* set : {&ct, &seg})
    for (const auto& [name, r] : set->items()) files.push_back(dir.path() / name);
  REQUIRE(files.size() == 16);
  std::string paths;
  for (const auto& f : files) {
    paths += ' ';
    paths += shell_quote(f.string());
  }
  auto ref =
      run_command(shell_quote(python()) + " " +
                  shell_quote(source_path("tests/tools/reference.py").string()) + " many sitk" + paths);
  REQUIRE_MESSAGE(ref.exit_code == 0, ref.out);
  const json sitk = json::parse(ref.out);
  for (const auto& f : files) {
    INFO("file: " << f);
    const json& s = sitk[f.string()];
    REQUIRE_FALSE(s.contains("error"));
    const json j = inspect_json(f);
    CHECK(j["format"] == (segflow::pipeline::is_nrrd_path(f) ? "nrrd" : "metaimage"));
    CHECK(j["size"] == s["size"]);
    for (int i = 0; i < 3; ++i) {
      CHECK(j["spacing"][i].get<double>() == doctest::Approx(s["spacing"][i].get<double>()).epsilon(1e-9));
      CHECK(j["origin"][i].get<double>() == doctest::Approx(s["origin"][i].get<double>()).epsilon(1e-9));
    }
    for (int i = 0; i < 9; ++i)
      CHECK(j["direction"][i].get<double>() ==
            doctest::Approx(s["direction"][i].get<double>()).epsilon(1e-9));
    CHECK(j["dtype"] == s["dtype"]);
    CHECK(j["min"].get<double>() == s["min"].get<double>());
    CHECK(j["max"].get<double>() == s["max"].get<double>());
    CHECK(j["mean"].get<double>() == doctest::Approx(s["mean"].get<double>()).epsilon(1e-9));
    const bool label = f.filename().string().rfind("seg", 0) == 0;
    CHECK(j.contains("labels") == label);
    if (label) {
      const std::string name = f.filename().string();
      CHECK(j["labels"].get<std::vector<std::int64_t>>() == distinct(seg[name]["npy"].get<std::string>()));
      CHECK(j["labels"].size() > 40);
    }
  }
}

TEST_CASE("segflow inspect names the labels of a NRRD label map from the dataset's dataset.json") {
  TempDir dir("cli_formats_names");
  sitk_write(testdata_path("totalsegmentator/example_seg.nii.gz"), dir.path() / "tmp", "seg");
  fs::create_directories(dir.path() / "labelsTr");
  fs::copy_file(dir.path() / "tmp" / "seg.nrrd", dir.path() / "labelsTr" / "case_0.nrrd");
  // TotalSegmentator v2 class map (totalsegmentator==2.18.0, map_to_binary.py), a few of its classes.
  write_file(dir.path() / "dataset.json",
             json{{"labels",
                   {{"background", 0}, {"spleen", 1}, {"kidney_right", 2}, {"kidney_left", 3}, {"liver", 5}}},
                  {"file_ending", ".nrrd"}}
                 .dump());
  const json j = inspect_json(dir.path() / "labelsTr" / "case_0.nrrd");
  REQUIRE(j.contains("label_names"));
  CHECK(
      j["label_names"] ==
      json{
          {"0", "background"}, {"1", "spleen"}, {"2", "kidney_right"}, {"3", "kidney_left"}, {"5", "liver"}});
}

TEST_CASE(
    "segflow inspect of a bad NRRD or MetaImage file exits 1 with one line naming the file and the field") {
  TempDir dir("cli_formats_bad");
  sitk_write(testdata_path("totalsegmentator/example_ct_sm.nii.gz"), dir.path(), "ct");
  std::string nrrd = read_file(dir.path() / "ct.nrrd");
  nrrd.replace(nrrd.find("sizes: 122 101 30"), 17, "sizes: 122 101 31");
  write_file(dir.path() / "sizes.nrrd", nrrd);
  std::string mhd = read_file(dir.path() / "ct_raw.mhd");
  mhd.replace(mhd.find("ElementDataFile = ct_raw.raw"), 28, "ElementDataFile = gone.raw");
  write_file(dir.path() / "lost.mhd", mhd);
  const std::pair<std::string, std::string> cases[] = {
      {"sizes.nrrd", ": sizes: expected 763964 bytes of short"},
      {"lost.mhd", ": ElementDataFile: expected a readable file"}};
  for (const auto& [name, field] : cases) {
    const fs::path p = dir.path() / name;
    auto r = run_command(shell_quote(segflow_bin()) + " inspect " + shell_quote(p.string()) +
                         " --json 2>&1 >/dev/null");
    INFO("stderr: " << r.out);
    CHECK(r.exit_code == 1);
    REQUIRE_FALSE(r.out.empty());
    CHECK(r.out.find('\n') == r.out.size() - 1);  // one line
    CHECK(r.out.find(p.string() + field) != std::string::npos);
    CHECK(r.out.find("got") != std::string::npos);
  }
}
