// The segflow binary, run as a user runs it.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "job_yaml.hpp"
#include "test_util.hpp"

using namespace segflow::testing;

namespace {}  // namespace

TEST_CASE("segflow synth then inspect --json prints the DESIGN.md contract") {
  TempDir dir("cli_synth");
  auto r = run_segflow("synth --cases 2 --size 20 --format dicom --compress rle --seed 3 --out " +
                       shell_quote(dir.path().string()));
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

TEST_CASE("segflow inspect of a DICOM SEG file on its own reads its frames' grid and labels") {
  TempDir dir("cli_inspect_seg");
  auto r = run_segflow("synth --cases 1 --size 20 --format dicom --seed 5 --out " +
                       shell_quote(dir.path().string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto seg = dir.path() / "case_000" / "seg.dcm";
  auto i = run_segflow("inspect " + shell_quote(seg.string()) + " --json");
  REQUIRE_MESSAGE(i.exit_code == 0, i.out);
  auto j = nlohmann::json::parse(i.out);
  CHECK(j["modality"] == "SEG");
  CHECK(j["dtype"] == "uint8");
  CHECK(j["size"][0] == 20);
  CHECK(j["size"][1] == 20);
  CHECK(j["labels"] == nlohmann::json({0, 1, 2, 3, 4}));
  // The case folder (series + SEG) has the same in-plane spacing as the SEG alone.
  auto c = nlohmann::json::parse(
      run_segflow("inspect " + shell_quote((dir.path() / "case_000").string()) + " --json").out);
  for (int k = 0; k < 2; ++k)
    CHECK(j["spacing"][k].get<double>() == doctest::Approx(c["spacing"][k].get<double>()));
  CHECK(j["size"][2].get<int>() <= c["size"][2].get<int>());
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
    CHECK(ours["direction"][k].get<double>() ==
          doctest::Approx(ref["direction"][k].get<double>()).epsilon(1e-5));
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

namespace {
/// A job small enough for CLI tests: 4 synthetic cases of 24^3, a 2-level UNet.
std::string cli_job(const std::filesystem::path& dir, int epochs) {
  JobYaml job;
  job.name = "cli";
  job.seed = "1";
  job.root = dir / "data";
  job.synth = "{cases: 4, size: 24, format: nifti, seed: 2}";
  job.stages = {kLoadStage, kCtWindowStage, kFgBgStage, crop_stage("[16, 16, 16]", 1, 1, 2)};
  job.model = unet3d(5, "channels: [4, 8], strides: [2], num_res_units: 1");
  job.schedule = "";
  job.epochs = epochs;
  job.train = "batch_size: 2, device: cpu, val_interval: 1, loader: actors";
  job.validation = "{roi_size: [16, 16, 16]}";
  job.runs_dir = dir / "runs";
  return job.yaml();
}
}  // namespace

TEST_CASE("segflow bench prints e2e, compute and summary JSON lines with the pipeline efficiency") {
  TempDir dir("cli_bench");
  write_file(dir / "job.yaml", cli_job(dir.path(), 1));
  auto r = run_command(shell_quote(segflow_bin()) + " bench " + shell_quote((dir / "job.yaml").string()) +
                       " --json --epochs 2 --loaders actors,simple 2>/dev/null");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  REQUIRE(lines.size() == 5);  // e2e + compute per loader, then the summary
  for (int i = 0; i < 4; ++i) {
    CHECK(lines[i]["bench"] == (i % 2 == 0 ? "e2e" : "compute"));
    CHECK(lines[i]["loader"] == (i < 2 ? "actors" : "simple"));
    CHECK(lines[i]["epochs"] == 2);
    CHECK(lines[i]["steps"].get<int>() > 0);
    CHECK(lines[i]["samples_per_s"].get<double>() > 0);
  }
  CHECK(lines[1]["data_wait_ms"] == 0.0);  // staged batches: no data path at all
  const auto& s = lines[4];
  CHECK(s["bench"] == "summary");
  for (const char* l : {"actors", "simple"}) {
    const double e = s["pipeline_efficiency"][l].get<double>();
    CHECK(e > 0.0);
    CHECK(e == doctest::Approx(s["samples_per_s"][l].get<double>() /
                               lines[std::string(l) == "actors" ? 1 : 3]["samples_per_s"].get<double>()));
  }
  CHECK(s["peak_host_mb"].get<double>() > 10.0);
  CHECK(s.contains("actors_over_simple"));
  auto bad = run_segflow("bench " + shell_quote((dir / "job.yaml").string()) + " --seconds 0");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("--seconds: expected an integer >= 1") != std::string::npos);
}

TEST_CASE("segflow bench --profile writes a Chrome trace of the measured steps' ops, named by the summary") {
  TempDir dir("cli_bench_profile");
  write_file(dir / "job.yaml", cli_job(dir.path(), 1));
  const auto trace = dir / "trace.json";
  auto r = run_command(shell_quote(segflow_bin()) + " bench " + shell_quote((dir / "job.yaml").string()) +
                       " --json --epochs 1 --loaders simple --profile " + shell_quote(trace.string()) +
                       " 2>/dev/null");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  REQUIRE(lines.size() == 3);
  // The team the trainer ran with, and why.
  CHECK(lines[0]["threads"].get<int>() >= 1);
  CHECK(lines[0]["threads_reason"].get<std::string>().rfind("auto: ", 0) == 0);
  CHECK(lines[2]["profile"] == trace.string());
  REQUIRE(std::filesystem::exists(trace));
  std::ifstream f(trace);
  const auto j = nlohmann::json::parse(f);
  REQUIRE(j.contains("traceEvents"));
  // The UNet's convolutions, forward and backward, are among the recorded ops.
  std::size_t convs = 0;
  for (const auto& e : j["traceEvents"])
    if (e.value("name", "").find("convolution") != std::string::npos) ++convs;
  CHECK(convs > 0);
  auto bad = run_segflow("bench " + shell_quote((dir / "job.yaml").string()) + " --profile");
  CHECK(bad.exit_code == 2);
}

TEST_CASE("segflow train --ranks 2 trains data-parallel and writes one run folder") {
  TempDir dir("cli_ranks");
  write_file(dir / "job.yaml", cli_job(dir.path(), 2));
  auto r = run_segflow("train " + shell_quote((dir / "job.yaml").string()) + " --ranks 2 --quiet");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  CHECK(r.out.find("run folder: ") != std::string::npos);
  std::size_t runs = 0;
  for (auto& e : std::filesystem::directory_iterator(dir / "runs")) {
    ++runs;
    CHECK(std::filesystem::exists(e.path() / "last.pt"));
    CHECK(std::filesystem::exists(e.path() / "metrics.jsonl"));
  }
  CHECK(runs == 1);
  auto bad = run_segflow("train " + shell_quote((dir / "job.yaml").string()) + " --ranks 2 --devices cpu");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("--ranks 2 does not match the 1 --devices given") != std::string::npos);

  // The same from the config: train.devices lists one rank per entry.
  auto cfg = run_segflow("train " + shell_quote((dir / "job.yaml").string()) +
                         " --set 'train.devices=[cpu, cpu]' --quiet");
  REQUIRE_MESSAGE(cfg.exit_code == 0, cfg.out);
  CHECK_MESSAGE(cfg.out.find("2 ranks on cpu .. cpu") != std::string::npos, cfg.out);
  auto wrong =
      run_segflow("train " + shell_quote((dir / "job.yaml").string()) + " --set 'train.devices=[gpu0]'");
  CHECK(wrong.exit_code != 0);
  CHECK_MESSAGE(wrong.out.find("train.devices: expected a list of cpu, cuda or cuda:N") != std::string::npos,
                wrong.out);
}
