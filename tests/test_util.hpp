#pragma once
// Helpers shared by the test suites: temporary folders, running commands (the segflow
// binary, the Python reference readers) and reading their output.

#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>

namespace segflow::testing {

/// Entry points a test can start as a child process (see tests/doctest_main.cpp): the
/// suite's own executable run with SEGFLOW_TEST_CHILD=<name> calls the entry and exits.
inline std::map<std::string, std::function<int()>>& child_entries() {
  static std::map<std::string, std::function<int()>> entries;
  return entries;
}

/// Registers a child entry at static-initialisation time (one per name and suite).
struct ChildEntry {
  ChildEntry(const std::string& name, std::function<int()> fn) { child_entries()[name] = std::move(fn); }
};

/// Set by skip_case() while a case runs; the suites' main (tests/doctest_main.cpp) lets a
/// case that skipped itself make no assertion, and fails any other such case.
inline bool& case_skipped_flag() {
  static thread_local bool skipped = false;
  return skipped;
}

/// Marks the running case as skipped at run time (a missing GPU, say) with the reason in
/// the output. The caller returns right after.
inline void skip_case(const std::string& reason) {
  case_skipped_flag() = true;
  MESSAGE("skipped: " << reason);
}

/// A fresh folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "segflow") {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            (tag + "_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    if (!std::getenv("SEGFLOW_KEEP_TEMP")) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }

 private:
  std::filesystem::path path_;
};

/// Result of a command: exit status and what it printed (stdout; stderr when merged).
struct CommandResult {
  int exit_code = -1;
  std::string out;
};

/// Runs a shell command, capturing stdout (append " 2>&1" to capture stderr as well).
inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

/// Single-quotes a string for the shell.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

/// The project venv's Python (has numpy, pydicom, nibabel, SimpleITK); $SEGFLOW_PYTHON
/// overrides it (the GPU bundle runs where the build's venv does not exist).
inline std::string python() {
  const char* p = std::getenv("SEGFLOW_PYTHON");
  return p && *p ? std::string(p) : std::string(SEGFLOW_PYTHON_EXE);
}

/// Path of a file in the source tree; $SEGFLOW_SOURCE_DIR overrides the build's (the GPU
/// bundle runs from another checkout).
inline std::filesystem::path source_path(const std::string& rel) {
  const char* d = std::getenv("SEGFLOW_SOURCE_DIR");
  return std::filesystem::path(d && *d ? d : SEGFLOW_SOURCE_DIR) / rel;
}

/// The folder scripts/fetch-test-data.sh fills with real third-party files (PyPI source
/// archives, never committed): $SEGFLOW_TESTDATA, else ~/.cache/segflow-testdata.
inline std::filesystem::path testdata_dir() {
  if (const char* d = std::getenv("SEGFLOW_TESTDATA"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "/tmp") / ".cache" / "segflow-testdata";
}

/// A real test file under testdata_dir(); throws (the test fails, it is not skipped) with the
/// command that fetches it when it is missing.
inline std::filesystem::path testdata_path(const std::string& rel) {
  auto p = testdata_dir() / rel;
  if (!std::filesystem::exists(p))
    throw std::runtime_error("missing real test data " + p.string() +
                             ": run scripts/fetch-test-data.sh (scripts/setup.sh does)");
  return p;
}

/// The built `segflow` binary (from SEGFLOW_BIN, set by CTest).
inline std::string segflow_bin() {
  const char* d = std::getenv("SEGFLOW_BIN");
  return d ? std::string(d) + "/segflow" : std::string("segflow");
}

/// Runs tests/tools/reference.py (an independent reader) and parses its JSON output.
inline nlohmann::json reference_read(const std::string& reader, const std::filesystem::path& p) {
  auto r = run_command(shell_quote(python()) + " " +
                       shell_quote(source_path("tests/tools/reference.py").string()) + " " + reader + " " +
                       shell_quote(p.string()));
  if (r.exit_code != 0)
    throw std::runtime_error("reference.py " + reader + " failed on " + p.string() + ": " + r.out);
  return nlohmann::json::parse(r.out);
}

/// True when `dir` holds a temporary of write_file_atomically / replace_file_atomically
/// ("<name>.tmp.<pid>.<n>"): a write that left something half-done behind.
inline bool has_temporaries(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) return true;
  return false;
}

/// Writes bytes to a file.
inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Reads a whole file.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The tiny 3D training job the apps, daemon and parallel suites run (epochs take a second
/// or two on a CPU): 5 synthetic 24^3 NIfTI cases in a data root, resampled to 2.5 x 2.5 x
/// 3 mm, a CT window to [0, 1], 16^3 pos/neg crops x 2, then `after_crop`; a 3D UNet with
/// `model`, DiceCE, Adam 0.01, `train`, validation on 16^3 windows.
struct TinyJob {
  std::string name = "tiny";
  std::string after_crop = "  - name: rand_flip\n    options: {prob: 0.5, spatial_axis: [0]}\n";
  std::string model = "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch, dropout: 0.1";
  int epochs = 4;
  /// The rest of the `train` line; suites append to it (e.g. ", log_every: 1").
  std::string train =
      "batch_size: 2, device: cpu, val_interval: 2, checkpoint_interval: 1, loader: simple, threads: 1";
};

/// `job` as YAML with its cases under `data_root` (made on first use); no `output` section.
inline std::string tiny_job_yaml(const std::filesystem::path& data_root, const TinyJob& job = {}) {
  return "name: " + job.name +
         "\n"
         "seed: 3\n"
         "data:\n"
         "  root: " +
         data_root.string() +
         "\n"
         "  synth: {cases: 5, size: 24, format: nifti, seed: 9}\n"
         "  val_cases: 1\n"
         "  num_classes: 5\n"
         "stages:\n"
         "  - name: load\n"
         "  - name: resample\n"
         "    options: {spacing: [2.5, 2.5, 3.0]}\n"
         "  - name: scale_intensity_range\n"
         "    options: {a_min: -200, a_max: 300, b_min: 0.0, b_max: 1.0, clip: true}\n"
         "  - name: fg_bg_indices\n"
         "  - name: rand_crop_pos_neg\n"
         "    options: {spatial_size: [16, 16, 16], pos: 1, neg: 1, num_samples: 2}\n" +
         job.after_crop + "model: {name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, " +
         job.model +
         "}\n"
         "loss: {name: dice_ce, to_onehot_y: true, softmax: true}\n"
         "optimizer: {name: adam, lr: 0.01}\n"
         "schedule: {name: constant}\n"
         "train: {epochs: " +
         std::to_string(job.epochs) + ", " + job.train +
         "}\n"
         "validation: {roi_size: [16, 16, 16], overlap: 0.25, sw_batch_size: 2}\n";
}

/// First statement of every test case that needs CUDA: `if (!cuda_or_skip()) return;`.
/// True when a CUDA device is visible. Without one the case is skipped with a message, or,
/// when SEGFLOW_REQUIRE_CUDA is set (to anything but 0; scripts/gpu-check.sh sets it),
/// fails, so a GPU check cannot pass by skipping. CUDA cases have "CUDA" in their names:
/// that is how the GPU check selects them.
inline bool cuda_or_skip() {
  if (torch::cuda::is_available()) return true;
  const char* req = std::getenv("SEGFLOW_REQUIRE_CUDA");
  if (req && *req && std::string(req) != "0") {
    FAIL_CHECK("SEGFLOW_REQUIRE_CUDA is set but no CUDA device is visible: this CUDA case may not skip");
    return false;
  }
  skip_case("no CUDA device is visible");
  return false;
}

}  // namespace segflow::testing
