#pragma once
// Helpers shared by the test suites: REQUIRE_OK and friends for Status and Result<T>,
// temporary folders, running commands (the segflow binary, the Python reference readers)
// and reading their output.

#include <ATen/core/Tensor.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "child_process.hpp"
#include "messages/status.hpp"

namespace segflow::testing {

namespace detail {
inline const Status& status_of(const Status& s) { return s; }
template <class T>
Status status_of(const Result<T>& r) {
  return r.status();
}
}  // namespace detail

}  // namespace segflow::testing

/// `REQUIRE_OK(expr)`: `expr` (a Status or a Result<T>) must be ok; otherwise the case stops
/// and the report shows the expression and its Status ("invalid_config: job.yaml: ...").
#define REQUIRE_OK(...) SEGFLOW_TEST_OK_IMPL(REQUIRE_MESSAGE, __VA_ARGS__)
/// `CHECK_OK(expr)`: the same, but the case goes on after a failure.
#define CHECK_OK(...) SEGFLOW_TEST_OK_IMPL(CHECK_MESSAGE, __VA_ARGS__)
#define SEGFLOW_TEST_OK_IMPL(ASSERT_MESSAGE, ...)                                                           \
  do {                                                                                                      \
    const auto& segflow_status_ = (__VA_ARGS__);                                                            \
    ASSERT_MESSAGE(                                                                                         \
        segflow_status_.is_ok(),                                                                            \
        #__VA_ARGS__ " is not ok: " << ::segflow::testing::detail::status_of(segflow_status_).to_string()); \
  } while (0)

/// `REQUIRE_OK_AND_ASSIGN(auto x, make())`: `make()` (a Result<T>) must be ok (as
/// REQUIRE_OK); then its value is moved into `x`. A statement of its own, like a declaration.
#define REQUIRE_OK_AND_ASSIGN(lhs, ...) \
  SEGFLOW_TEST_OK_AND_ASSIGN_IMPL(SEGFLOW_CONCAT(segflow_result_, __LINE__), lhs, __VA_ARGS__)
#define SEGFLOW_TEST_OK_AND_ASSIGN_IMPL(tmp, lhs, ...)                                   \
  auto tmp = (__VA_ARGS__);                                                              \
  REQUIRE_MESSAGE(tmp.is_ok(), #__VA_ARGS__ " is not ok: " << tmp.status().to_string()); \
  lhs = std::move(tmp).value()

namespace segflow::testing {

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

/// True when `part` occurs in `s` (error messages, logs).
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
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

/// Single-quotes a path, or a C string, for the shell.
inline std::string shell_quote(const std::filesystem::path& p) { return shell_quote(p.string()); }
inline std::string shell_quote(const char* s) { return shell_quote(std::string(s)); }

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

/// Runs `segflow ARGS` with stderr merged into the output.
inline CommandResult run_segflow(const std::string& args) {
  return run_command(shell_quote(segflow_bin()) + " " + args + " 2>&1");
}

/// What `segflow ARGS` did, with stdout and stderr apart.
struct SegflowRun {
  int exit_code = -1;
  std::string out, err;
};

/// Runs `segflow ARGS`, its stderr kept apart (through a file in `scratch`).
inline SegflowRun run_segflow(const std::string& args, const std::filesystem::path& scratch) {
  const auto err = scratch / "stderr.txt";
  auto r = run_command(shell_quote(segflow_bin()) + " " + args + " 2>" + shell_quote(err.string()));
  std::ifstream f(err, std::ios::binary);
  return {r.exit_code, r.out, {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()}};
}

/// Runs a Python snippet (`python -c CODE ARGS...`) in the project venv; its output (stderr
/// merged). The case stops when it fails.
inline std::string run_python(const std::string& code, const std::vector<std::string>& args) {
  std::string cmd = shell_quote(python()) + " -c " + shell_quote(code);
  for (const auto& a : args) cmd.append(" ").append(shell_quote(a));
  auto r = run_command(cmd + " 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

/// Runs the checker tests/tools/TOOL with `args` (`-W ignore`, stderr merged); the case stops
/// unless it exits 0 (3: onnxruntime or another optional module missing; setup.sh installs
/// them). Returns the last JSON value it printed (its last line).
inline nlohmann::json python_tool_json(const std::string& tool, const std::string& args) {
  auto r = run_command(shell_quote(python()) + " -W ignore " +
                       shell_quote(source_path("tests/tools/" + tool).string()) + " " + args + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  std::string out = r.out;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  const auto nl = out.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? out : out.substr(nl + 1));
}

/// True when two tensors have the same dtype, shape and bytes (NaNs compare equal).
inline bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
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

/// A free TCP port on 127.0.0.1 (bound and released: another process may take it before
/// the caller binds it, which the tests accept).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
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
