#pragma once
// Fixtures of the DICOM node tests (test_dicom_node.cpp, test_hospital_loop.cpp): DCMTK's
// command line peers, synthetic DICOM series, pydicom's view of instances
// (tests/tools/dicom_instances.py) and the node's state through the control socket.

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "daemon/daemon_harness.hpp"

namespace segflow::testing::daemon {

/// The DCMTK command line tools must be there (scripts/setup.sh installs Debian's dcmtk).
inline void require_dcmtk_tools() {
  for (const char* tool : {"echoscu", "storescu", "storescp"})
    REQUIRE_MESSAGE(
        run_command(std::string("command -v ") + tool + " >/dev/null 2>&1").exit_code == 0,
        (std::string(tool) + " is missing: install Debian's dcmtk package (scripts/setup.sh does)"));
}

inline std::string quoted_files(const std::vector<fs::path>& files) {
  std::string s;
  for (const auto& f : files) s += " " + shell_quote(f.string());
  return s;
}

/// storescu -R (propose only the SOP classes of the files) as `calling` to SEGFLOW.
inline CommandResult storescu(int port, const std::vector<fs::path>& files, const std::string& options = "",
                              const std::string& calling = "MODALITY") {
  return run_command("storescu -R " + options + " -aet " + calling + " -aec SEGFLOW 127.0.0.1 " +
                     std::to_string(port) + quoted_files(files) + " 2>&1");
}

inline CommandResult echoscu(int port, const std::string& calling, const std::string& called = "SEGFLOW") {
  return run_command("echoscu -aet " + calling + " -aec " + called + " 127.0.0.1 " + std::to_string(port) +
                     " 2>&1");
}

/// Synthetic DICOM cases: case_000/ ... each with a CT series (IM_*.dcm) and seg.dcm.
inline fs::path synth_dicom(const fs::path& out, int cases, int seed = 5) {
  auto r = run_segflow("synth --cases " + std::to_string(cases) + " --size 24 --format dicom --seed " +
                       std::to_string(seed) + " --out " + shell_quote(out.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return out;
}

inline std::vector<fs::path> series_files(const fs::path& case_dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(case_dir))
    if (e.path().filename().string().rfind("IM_", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  REQUIRE(!out.empty());
  return out;
}

/// pydicom's view of the instances under `paths`, keyed by SOPInstanceUID.
inline json instances(const std::vector<fs::path>& paths) {
  auto r = run_command(shell_quote(python()) + " " +
                       shell_quote(source_path("tests/tools/dicom_instances.py").string()) + " list" +
                       quoted_files(paths) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return json::parse(r.out);
}

inline json dicom_reply(const std::string& control) { return ok(control, {{"cmd", "dicom"}}); }
inline json node_stats(const std::string& control) { return dicom_reply(control)["node"]; }

/// Waits until `pred(fetch())` holds while segflowd lives; fails naming `what`, the last value
/// (`label`) and the daemon's log.
inline json wait_daemon_value(ChildProcess& d, const std::function<json()>& fetch,
                              const std::function<bool(const json&)>& pred, const std::string& what,
                              const std::string& label, double timeout_s) {
  json last;
  const bool ok_ = eventually(
      [&] {
        REQUIRE_MESSAGE(d.alive(), ("segflowd died:\n" + d.log_tail()));
        last = fetch();
        return pred(last);
      },
      timeout_s);
  REQUIRE_MESSAGE(ok_, (what + "; last " + label + ": " + last.dump() + "\n--- log ---\n" + d.log_tail()));
  return last;
}

/// Waits until `pred(datasets entry of "incoming")` holds; fails with the daemon's log.
inline json wait_incoming(ChildProcess& d, const std::string& control,
                          const std::function<bool(const json&)>& pred, const std::string& what,
                          double timeout_s = 30) {
  return wait_daemon_value(
      d, [&] { return dataset_entry(control, "incoming"); },
      [&](const json& e) { return !e.is_null() && pred(e); }, what, "datasets entry", timeout_s);
}

/// The daemon config's dicom section for a listener on `port` plus `extra` lines (indented).
inline std::string dicom_section(int port, const std::string& extra = "") {
  return "dicom:\n  port: " + std::to_string(port) +
         "\n  ae_title: SEGFLOW\n  dataset: incoming\n  allowed_calling_aes: [MODALITY]\n" + extra;
}

/// Waits until the node's stats satisfy `pred`.
inline json wait_node(ChildProcess& d, const std::string& control,
                      const std::function<bool(const json&)>& pred, const std::string& what,
                      double timeout_s = 30) {
  return wait_daemon_value(
      d, [&] { return node_stats(control); }, pred, what, "node stats", timeout_s);
}

}  // namespace segflow::testing::daemon
