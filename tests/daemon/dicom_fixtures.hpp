#pragma once
// Fixtures of the DICOM tests (test_dicom_node.cpp, test_hospital_loop.cpp, test_dicomweb.cpp,
// test_dicom_tls.cpp): DCMTK's command line peers, synthetic DICOM series, pydicom's view of
// instances and SEGs (tests/tools/dicom_instances.py, seg_references.py), the node's state
// through the control socket, Orthanc of the test's own (tests/tools/orthanc_pacs.py), a
// checkpoint that segments the phantoms, and test certificates made with openssl.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
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

/// `instances(...)` without the file names: what two sets of files hold, to compare.
inline json instance_contents(const std::vector<fs::path>& paths) {
  json out = instances(paths);
  for (auto& [uid, info] : out.items()) info.erase("file");
  return out;
}

/// A copy of the DICOM file `in` as `out` with a new SOPInstanceUID (data set and meta
/// header) and, when given, another SeriesDescription: another instance of the same kind.
inline void copy_as_new_instance(const fs::path& in, const fs::path& out,
                                 const std::string& description = "") {
  auto r = run_command(
      shell_quote(python()) + " -c " +
      shell_quote("import pydicom,sys\nfrom pydicom.uid import generate_uid\nd=pydicom.dcmread(sys.argv[1])\n"
                  "d.SOPInstanceUID=generate_uid(); d.file_meta.MediaStorageSOPInstanceUID=d.SOPInstanceUID\n"
                  "if sys.argv[3]: d.SeriesDescription=sys.argv[3]\nd.save_as(sys.argv[2])\n") +
      " " + shell_quote(in.string()) + " " + shell_quote(out.string()) + " " + shell_quote(description) +
      " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
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

/// The send `id` of `segflow ctl dicom`'s queue (null when it is not listed).
inline json send_entry(const std::string& control, std::int64_t id) {
  const json reply = dicom_reply(control);  // kept alive: the loop walks into it
  for (const auto& e : reply["sender"]["sends"])
    if (e["id"] == id) return e;
  return json();
}

/// Waits until send `id` satisfies `pred`; returns it.
inline json wait_send(ChildProcess& d, const std::string& control, std::int64_t id,
                      const std::function<bool(const json&)>& pred, const std::string& what,
                      double timeout_s = 60) {
  return wait_daemon_value(
      d, [&] { return send_entry(control, id); }, [&](const json& e) { return !e.is_null() && pred(e); },
      what, "send", timeout_s);
}

/// Waits until send `id` is no longer queued (sent or failed); returns it.
inline json wait_send_ended(ChildProcess& d, const std::string& control, std::int64_t id,
                            double timeout_s = 60) {
  return wait_send(
      d, control, id, [](const json& e) { return e["state"] != "queued"; },
      "send " + std::to_string(id) + " ends", timeout_s);
}

/// `segflow ctl dicom send FILE --to NAME`; the new send's id.
inline std::int64_t ctl_send(const std::string& control, const fs::path& file, const std::string& to) {
  auto r = run_segflow("ctl --endpoint " + shell_quote(control) + " --json dicom send " +
                       shell_quote(file.string()) + " --to " + to);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const json reply = json::parse(r.out.substr(r.out.find('{')));
  REQUIRE(reply["queued"].size() == 1);
  return reply["queued"][0].get<std::int64_t>();
}

/// Queues `file` for the destination `to` with `segflow ctl dicom send` and waits until the
/// send is sent or failed; returns it.
inline json send_until_ended(ChildProcess& d, const std::string& control, const fs::path& file,
                             const std::string& to, double timeout_s = 60) {
  return wait_send_ended(d, control, ctl_send(control, file, to), timeout_s);
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

// ---- The hospital loop: a model whose SEGs are not empty, and pydicom's view of them ----

/// pydicom's view of the one SEG under `seg` against the series folder `series`.
inline json seg_references(const fs::path& seg, const fs::path& series) {
  auto r = run_command(shell_quote(python()) + " " +
                       shell_quote(source_path("tests/tools/seg_references.py").string()) + " " +
                       shell_quote(seg.string()) + " " + shell_quote(series.string()) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return json::parse(r.out);
}

/// The SEG references the source series, study and frame of reference, lies on its grid
/// (same rows, columns and slice positions) and has the model's named segments.
inline void check_seg_on_source(const json& v, const std::vector<std::string>& names) {
  const json& seg = v["seg"];
  const json& src = v["source"];
  CHECK(seg["sop_class"] == "1.2.840.10008.5.1.4.1.1.66.4");
  CHECK(seg["study"] == src["study"]);
  CHECK(seg["ref_series"] == src["series"]);
  CHECK(seg["frame_of_reference"] == src["frame_of_reference"]);
  CHECK(seg["rows"] == src["rows"]);
  CHECK(seg["columns"] == src["columns"]);
  for (const auto& uid : seg["referenced_instances"])
    CHECK_MESSAGE(std::find(src["instances"].begin(), src["instances"].end(), uid) != src["instances"].end(),
                  uid.dump());
  for (const auto& p : seg["frame_positions"])
    CHECK_MESSAGE(std::find(src["positions"].begin(), src["positions"].end(), p) != src["positions"].end(),
                  p.dump());
  // The segments are named by the training's classes (a SEG holds the classes predicted).
  REQUIRE(!seg["segment_labels"].empty());
  for (const auto& l : seg["segment_labels"])
    CHECK_MESSAGE(std::find(names.begin(), names.end(), l.get<std::string>()) != names.end(), l.dump());
}

/// The class names of the tiny dataset the checkpoint was trained on (dataset.json labels, 1..).
inline std::vector<std::string> trained_class_names(const fs::path& dataset) {
  const json ds = json::parse(read_file(dataset / "dataset.json"));
  std::vector<std::string> out;
  for (const auto& [name, value] : ds["labels"].items())
    if (value.get<int>() != 0) out.push_back(name);
  return out;
}

/// A tiny job that segments the synthetic phantoms after a few seconds of training on a CPU
/// (native grid, foreground-heavy crops, no dropout): its SEGs are not empty.
inline std::string segmenting_job(const fs::path& root) {
  JobYaml job;
  job.root = root;
  job.seed = "5";
  job.stages = {kLoadStage, kCtWindowStage, kFgBgStage, crop_stage("[16, 16, 16]", 3, 1, 2)};
  job.model = unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch");
  job.optimizer = "{name: adam, lr: 0.02}";
  job.schedule = "";
  job.epochs = 6;
  job.train = "batch_size: 2, device: cpu, val_interval: 0, loader: simple, threads: 1";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.5, sw_batch_size: 4}";
  return job.yaml();
}

// ---- Orthanc of the test's own (Debian's orthanc and orthanc-dicomweb) ----

/// tests/tools/orthanc_pacs.py with `args`; its output (the call must succeed).
inline std::string pacs_tool(const std::string& args) {
  auto r =
      run_command(shell_quote(python()) + " " +
                  shell_quote(source_path("tests/tools/orthanc_pacs.py").string()) + " " + args + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, (args + ": " + r.out));
  return r.out;
}

/// Downloads the SEGs Orthanc holds into `dir` (emptied first); returns how many.
inline std::int64_t orthanc_segs(const std::string& url, const fs::path& dir) {
  fs::remove_all(dir);
  return json::parse(pacs_tool("segs " + url + " " + shell_quote(dir.string())))["segs"].get<std::int64_t>();
}

/// True when Debian's Orthanc is installed (the Orthanc cases skip, with a message, without it).
inline bool have_orthanc() { return run_command("command -v Orthanc >/dev/null 2>&1").exit_code == 0; }

/// Orthanc on free loopback ports with its storage under `dir`: AE title ORTHANC, the modality
/// "segflow" = SEGFLOW@127.0.0.1:`segflow_port`; `options` are orthanc_pacs.py config's
/// (--dicomweb, --lua FILE, --tls CERT KEY CA). Stopped when destroyed; start() again after
/// stop() brings it back on the same ports and storage.
class TestOrthanc {
 public:
  TestOrthanc(const fs::path& dir, int segflow_port, const std::string& options = "")
      : dir_(dir), http_(free_port()), dicom_(free_port()) {
    fs::create_directories(dir_);
    pacs_tool("config " + shell_quote((dir_ / "orthanc.json").string()) + " " + shell_quote(dir_.string()) +
              " " + std::to_string(http_) + " " + std::to_string(dicom_) + " " +
              std::to_string(segflow_port) + " " + options);
    start();
  }
  /// Starts Orthanc and waits until its REST API answers.
  void start() {
    proc_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"Orthanc", (dir_ / "orthanc.json").string()}, std::vector<std::string>{},
        dir_ / ("orthanc" + std::to_string(runs_++) + ".log"));
    REQUIRE_MESSAGE(
        eventually(
            [&] { return run_command("curl -sf " + url() + "/system >/dev/null 2>&1").exit_code == 0; }, 60),
        proc_->log_tail());
  }
  /// Stops it (SIGKILL: a PACS that went away).
  void stop() { proc_.reset(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(http_); }
  /// Its DICOMweb base URL (the plugin's root).
  std::string dicomweb() const { return url() + "/dicom-web"; }
  int dicom_port() const { return dicom_; }
  std::string log_tail() const { return proc_ ? proc_->log_tail() : std::string("(stopped)"); }

 private:
  fs::path dir_;
  int http_, dicom_;
  int runs_ = 0;
  std::unique_ptr<ChildProcess> proc_;
};

// ---- Test certificates (openssl at test time; never committed) ----

/// A CA and certificates signed by it: the node's and Orthanc's (server.pem, for 127.0.0.1
/// and localhost), a client's; a second CA nobody trusts (rogue_ca.pem) with a client
/// certificate of its own; and a certificate of the trusted CA for another host name
/// (other_host.pem). Keys are unencrypted PEM, RSA 2048.
struct TestPki {
  fs::path dir;
  fs::path file(const std::string& name) const { return dir / name; }
};

inline TestPki make_test_pki(const fs::path& dir) {
  fs::create_directories(dir);
  auto sh = [&](const std::string& cmd) {
    auto r = run_command("cd " + shell_quote(dir.string()) + " && " + cmd + " 2>&1");
    REQUIRE_MESSAGE(r.exit_code == 0, (cmd + ": " + r.out));
  };
  auto ca = [&](const std::string& name, const std::string& cn) {
    sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name +
       ".pem -days 2 -subj '/CN=" + cn +
       "' -addext 'basicConstraints=critical,CA:TRUE' -addext "
       "'keyUsage=critical,keyCertSign,cRLSign'");
  };
  auto leaf = [&](const std::string& name, const std::string& signer, const std::string& cn,
                  const std::string& san) {
    write_file(dir / (name + ".ext"),
               "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=" +
                   san + "\n");
    sh("openssl req -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name + ".csr -subj '/CN=" + cn +
       "'");
    sh("openssl x509 -req -in " + name + ".csr -CA " + signer + ".pem -CAkey " + signer +
       ".key -CAcreateserial -out " + name + ".pem -days 2 -extfile " + name + ".ext");
  };
  ca("ca", "segflow test CA");
  ca("rogue_ca", "another hospital CA");
  leaf("server", "ca", "localhost", "IP:127.0.0.1,DNS:localhost");
  leaf("client", "ca", "MODALITY", "DNS:modality.test");
  leaf("rogue_client", "rogue_ca", "MODALITY", "DNS:modality.test");
  leaf("other_host", "ca", "pacs.elsewhere.test", "DNS:pacs.elsewhere.test");
  return TestPki{dir};
}

}  // namespace segflow::testing::daemon
