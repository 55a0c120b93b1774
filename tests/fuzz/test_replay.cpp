// The replay suite: every fuzz harness fed its seed corpus (make_seeds.py: real files and
// small volumes from independent writers) and every input a fuzzer ever found failing
// (tests/fuzz/regressions/<harness>/, kept forever). A crash, hang or broken promise of a
// harness fails its case here, in the normal test run, without a fuzzing toolchain.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <vector>

#include "fuzz_target.hpp"
#include "test_util.hpp"

SEGFLOW_FUZZ_DECLARE(dicom)
SEGFLOW_FUZZ_DECLARE(dicom_seg)
SEGFLOW_FUZZ_DECLARE(dicom_series)
SEGFLOW_FUZZ_DECLARE(nifti)
SEGFLOW_FUZZ_DECLARE(nrrd_mha)
SEGFLOW_FUZZ_DECLARE(npy)
SEGFLOW_FUZZ_DECLARE(job_config)
SEGFLOW_FUZZ_DECLARE(control)

namespace {

namespace fs = std::filesystem;
using segflow::testing::TempDir;

/// The seed corpora, written once per process.
const fs::path& seeds() {
  static TempDir dir("segflow_fuzz_seeds");
  static const bool made = [] {
    auto r = segflow::testing::run_command(
        segflow::testing::python() + " " +
        segflow::testing::shell_quote(segflow::testing::source_path("tests/fuzz/make_seeds.py").string()) +
        " " + segflow::testing::shell_quote((dir.path() / "seeds").string()) + " 2>&1");
    if (r.exit_code != 0) throw std::runtime_error("make_seeds.py failed: " + r.out);
    return true;
  }();
  (void)made;
  static const fs::path p = dir.path() / "seeds";
  return p;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Feeds the harness its seeds and kept findings; returns how many inputs it ran.
std::size_t replay(const std::string& name, int (*harness)(const std::uint8_t*, std::size_t)) {
  auto inputs = files_in(seeds() / name);
  const auto kept = files_in(segflow::testing::source_path("tests/fuzz/regressions/" + name));
  inputs.insert(inputs.end(), kept.begin(), kept.end());
  for (const auto& f : inputs) {
    INFO("input: " << f.string());
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(harness(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) == 0);
  }
  return inputs.size();
}

}  // namespace

TEST_SUITE("fuzz") {
  TEST_CASE("the DICOM file harness replays its seeds and kept findings") {
    CHECK(replay("dicom", segflow::fuzz::run_dicom) >= 20);
  }
  TEST_CASE("the DICOM SEG harness replays its seeds and kept findings") {
    CHECK(replay("dicom_seg", segflow::fuzz::run_dicom_seg) >= 1);
  }
  TEST_CASE("the DICOM series harness replays its seeds and kept findings") {
    CHECK(replay("dicom_series", segflow::fuzz::run_dicom_series) >= 3);
  }
  TEST_CASE("the NIfTI harness replays its seeds and kept findings") {
    CHECK(replay("nifti", segflow::fuzz::run_nifti) >= 8);
  }
  TEST_CASE("the NRRD and MetaImage harness replays its seeds and kept findings") {
    CHECK(replay("nrrd_mha", segflow::fuzz::run_nrrd_mha) >= 8);
  }
  TEST_CASE("the npy harness replays its seeds and kept findings") {
    CHECK(replay("npy", segflow::fuzz::run_npy) >= 5);
  }
  TEST_CASE("the job config harness replays its seeds and kept findings") {
    CHECK(replay("job_config", segflow::fuzz::run_job_config) >= 5);
  }
  TEST_CASE("the control request harness replays its seeds and kept findings") {
    CHECK(replay("control", segflow::fuzz::run_control) >= 10);
  }
}
