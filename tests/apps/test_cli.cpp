// The segflow binary, run as a user runs it.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "test_util.hpp"

using namespace segflow::testing;

namespace {
CommandResult run_segflow(const std::string& args) { return run_command(shell_quote(segflow_bin()) + " " + args + " 2>&1"); }
}  // namespace

TEST_CASE("segflow synth then inspect --json prints the DESIGN.md contract") {
  TempDir dir("cli_synth");
  auto r = run_segflow("synth --cases 2 --size 20 --format dicom --compress rle --seed 3 --out " + shell_quote(dir.path().string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto i = run_segflow("inspect " + shell_quote((dir.path() / "case_000").string()) + " --json");
  REQUIRE_MESSAGE(i.exit_code == 0, i.out);
  auto j = nlohmann::json::parse(i.out);
  for (const char* k : {"size", "spacing", "origin", "direction", "dtype", "min", "max", "mean", "labels"})
    CHECK_MESSAGE(j.contains(k), k);
  CHECK(j["size"][0] == 20);
  CHECK(j["direction"].size() == 9);
  CHECK(j["labels"] == nlohmann::json({0, 1, 2, 3, 4}));
}

TEST_CASE("segflow inspect of a DICOM series agrees with SimpleITK") {
  TempDir dir("cli_sitk");
  auto r = run_segflow("synth --cases 3 --size 20 --format dicom --out " + shell_quote(dir.path().string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto case_dir = dir.path() / "case_002";  // oblique
  // SimpleITK's series reader must only see the CT slices, not the SEG.
  TempDir only_ct("cli_sitk_ct");
  for (auto& e : std::filesystem::directory_iterator(case_dir))
    if (e.path().filename().string().rfind("IM_", 0) == 0)
      std::filesystem::copy_file(e.path(), only_ct.path() / e.path().filename());
  auto i = run_segflow("inspect " + shell_quote(only_ct.path().string()) + " --json");
  REQUIRE_MESSAGE(i.exit_code == 0, i.out);
  auto ours = nlohmann::json::parse(i.out);
  auto ref = reference_read("sitk", only_ct.path());
  CHECK(ours["size"] == ref["size"]);
  for (int k = 0; k < 3; ++k) {
    CHECK(ours["spacing"][k].get<double>() == doctest::Approx(ref["spacing"][k].get<double>()).epsilon(1e-5));
    CHECK(ours["origin"][k].get<double>() == doctest::Approx(ref["origin"][k].get<double>()).epsilon(1e-5));
  }
  for (int k = 0; k < 9; ++k)
    CHECK(ours["direction"][k].get<double>() == doctest::Approx(ref["direction"][k].get<double>()).epsilon(1e-5));
  CHECK(ours["min"].get<double>() == ref["min"].get<double>());
  CHECK(ours["max"].get<double>() == ref["max"].get<double>());
  CHECK(ours["mean"].get<double>() == doctest::Approx(ref["mean"].get<double>()).epsilon(1e-9));
}

TEST_CASE("segflow exits non-zero with one line on stderr for bad input") {
  TempDir dir("cli_bad");
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {"inspect /nonexistent/path.nii.gz", "/nonexistent/path.nii.gz: no such file or folder"},
      {"synth --cases abc --out x", "--cases: expected an integer, got 'abc'"},
      {"synth --cases 2 --frobnicate 3 --out x", "unknown option --frobnicate"},
      {"nosuchcommand", "unknown command 'nosuchcommand'"},
      {"inspect", "expected one PATH"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    auto r = run_segflow(c.args);
    CHECK(r.exit_code != 0);
    CHECK(r.out.find(c.expect) != std::string::npos);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
  write_file(dir / "fake.dcm", "this is not a DICOM file\n");
  auto r = run_segflow("inspect " + shell_quote((dir / "fake.dcm").string()));
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("fake.dcm") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
}
