// segflowd as a DICOM node, against DCMTK's own peers: echoscu, storescu and storescp from
// Debian's dcmtk package, and (for a peer that stalls or is killed in the middle of an
// association) DCMTK's DcmSCU in a child process. What arrived is read back with pydicom
// (tests/tools/dicom_instances.py), not with segflow's reader.
#include <sys/socket.h>
#include <unistd.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmnet/scu.h>
#include <dcmtk/oflog/oflog.h>

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <set>

#include "daemon/config.hpp"
#include "daemon/daemon_harness.hpp"
#include "daemon/dicom/sender.hpp"
#include "daemon/dicom_fixtures.hpp"
#include "daemon/state_db.hpp"
#include "dicom_test_data.hpp"
#include "pipeline/io/image_io.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

constexpr const char* kPeerEntry = "dicom_peer";

/// A DICOM peer in a child process (SEGFLOW_TEST_CHILD=dicom_peer): DcmSCU as MODALITY sends
/// the files listed in $DICOM_PEER_FILES to SEGFLOW on 127.0.0.1:$DICOM_PEER_PORT, writes
/// "sent N" to $DICOM_PEER_READY and then says nothing more (stalls) until it is killed.
int dicom_peer() {
  OFLog::getLogger("dcmtk").setLogLevel(OFLogger::FATAL_LOG_LEVEL);
  const char* port = std::getenv("DICOM_PEER_PORT");
  const char* list = std::getenv("DICOM_PEER_FILES");
  const char* ready = std::getenv("DICOM_PEER_READY");
  if (!port || !list || !ready) return 2;
  std::vector<std::string> files;
  std::ifstream in(list);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) files.push_back(line);
  DcmSCU scu;
  scu.setAETitle("MODALITY");
  scu.setPeerAETitle("SEGFLOW");
  scu.setPeerHostName("127.0.0.1");
  scu.setPeerPort(static_cast<Uint16>(std::atoi(port)));
  std::set<std::string> classes;
  for (const auto& f : files) {
    DcmFileFormat ff;
    if (ff.loadFile(OFFilename(f.c_str())).bad()) return 3;
    OFString cls;
    ff.getDataset()->findAndGetOFString(DCM_SOPClassUID, cls);
    if (classes.insert(cls.c_str()).second) {
      OFList<OFString> ts;
      ts.push_back(UID_LittleEndianExplicitTransferSyntax);
      scu.addPresentationContext(cls, ts);
    }
  }
  if (scu.initNetwork().bad() || scu.negotiateAssociation().bad()) return 4;
  int sent = 0;
  for (const auto& f : files) {
    DcmFileFormat ff;
    ff.loadFile(OFFilename(f.c_str()));
    OFString cls;
    ff.getDataset()->findAndGetOFString(DCM_SOPClassUID, cls);
    Uint16 status = 0xFFFF;
    const T_ASC_PresentationContextID pc = scu.findAnyPresentationContextID(cls, "");
    if (pc == 0 || scu.sendSTORERequest(pc, OFFilename(f.c_str()), nullptr, status).bad() || status != 0)
      return 5;
    ++sent;
  }
  write_file(ready, "sent " + std::to_string(sent));
  std::this_thread::sleep_for(std::chrono::seconds(120));
  return 0;
}
const ChildEntry kDicomPeer(kPeerEntry, dicom_peer);

/// The case folders under data_root/incoming.
std::vector<fs::path> case_dirs(const fs::path& data) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(data / "incoming", ec))
    if (e.is_directory()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Names in a folder (hidden ones too).
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  return out;
}

/// Starts the DICOM peer child; returns once it sent its files (or fails).
std::unique_ptr<ChildProcess> start_peer(const Setup& s, int port, const std::vector<fs::path>& files,
                                         const std::string& tag) {
  const fs::path list = s.dir / (tag + ".files"), ready = s.dir / (tag + ".ready");
  std::string text;
  for (const auto& f : files) text += f.string() + "\n";
  write_file(list, text);
  auto child = std::make_unique<ChildProcess>(
      start_child_entry(kPeerEntry,
                        {"DICOM_PEER_PORT=" + std::to_string(port), "DICOM_PEER_FILES=" + list.string(),
                         "DICOM_PEER_READY=" + ready.string()},
                        ChildOutput::log, s.dir / (tag + ".log")));
  const bool sent = eventually([&] { return fs::exists(ready); }, 30);
  REQUIRE_MESSAGE(sent, ("the DICOM peer did not send its files: " + read_file(s.dir / (tag + ".log"))));
  CHECK(read_file(ready) == "sent " + std::to_string(files.size()));
  return child;
}

}  // namespace

TEST_CASE("the dicom section of the daemon config is checked key by key") {
  using segflow::daemon::parse_daemon_config;
  auto error = [](const std::string& yaml) {
    auto r = parse_daemon_config(yaml, "daemon.yaml");
    REQUIRE_MESSAGE(!r.is_ok(), ("accepted: " + yaml));
    return r.status().message();
  };
  auto has = [](const std::string& text, const std::string& part) {
    INFO(text);
    CHECK(text.find(part) != std::string::npos);
  };
  has(error("dicom: {port: 70000}"), "daemon.yaml: dicom.port: expected an integer in [0, 65535], got 70000");
  has(error("dicom: {port: 104, bind: 0.0.0.0}"),
      "dicom.bind: 0.0.0.0 is not loopback: listening there requires a non-empty dicom.allowed_calling_aes");
  has(error("dicom: {port: 104, bind: localhost}"), "dicom.bind: expected an IPv4 address");
  has(error("dicom: {ae_title: ''}"), "dicom.ae_title: expected an AE title of 1-16 printable characters");
  has(error("dicom: {ae_title: SEVENTEEN_CHARS_X}"), "dicom.ae_title: expected an AE title");
  has(error("dicom: {allowed_calling_aes: [CT1, 'A\\B']}"),
      "dicom.allowed_calling_aes[1]: expected an AE title");
  has(error("dicom: {dataset: ../elsewhere}"), "dicom.dataset: expected a folder name");
  has(error("dicom: {max_associations: 0}"), "dicom.max_associations: expected an integer in [1, 64], got 0");
  has(error("dicom: {max_association_bytes: 100}"),
      "dicom.max_association_bytes: expected an integer in [4096,");
  has(error("dicom: {idle_timeout_s: 0.5}"),
      "dicom.idle_timeout_s: expected an integer in [1, 3600], got 0.5");
  has(error("dicom: {send_to: {host: pacs, port: 104}}"), "dicom.send_to.ae_title: missing");
  has(error("dicom: {send_to: {ae_title: PACS, host: pacs, port: 0}}"),
      "dicom.send_to.port: expected an integer");
  has(error("dicom: {send_to: {ae_title: PACS, host: pacs, port: 104, retry_initial_s: 10, retry_max_s: 5}}"),
      "dicom.send_to.retry_max_s: expected a number >= retry_initial_s");
  has(error("dicom: {colour: blue}"), "dicom.colour: unknown key");

  REQUIRE_OK_AND_ASSIGN(auto none, parse_daemon_config("log_level: info\n", "daemon.yaml"));
  CHECK_FALSE(none.dicom.listening());
  CHECK_FALSE(none.dicom.send_to.enabled());
  REQUIRE_OK_AND_ASSIGN(
      auto full,
      parse_daemon_config("dicom:\n  port: 11112\n  ae_title: ' SEGFLOW '\n  bind: 10.1.2.3\n  "
                          "allowed_calling_aes: [CT1, MR2]\n"
                          "  max_associations: 2\n  send_to: {ae_title: PACS, host: pacs.local, port: 104}\n",
                          "daemon.yaml"));
  CHECK(full.dicom.listening());
  CHECK(full.dicom.ae_title == "SEGFLOW");
  CHECK(full.dicom.bind_address == "10.1.2.3");
  CHECK(full.dicom.allowed_calling_aes == std::vector<std::string>{"CT1", "MR2"});
  CHECK(full.dicom.max_associations == 2);
  CHECK(full.dicom.send_to.port == 104);

  // Back-off: the initial delay doubles per failed attempt, up to the maximum.
  segflow::daemon::dicom::DicomDestination d;
  d.retry_initial_s = 5;
  d.retry_max_s = 600;
  CHECK(segflow::daemon::dicom::retry_delay_s(d, 1) == doctest::Approx(5));
  CHECK(segflow::daemon::dicom::retry_delay_s(d, 2) == doctest::Approx(10));
  CHECK(segflow::daemon::dicom::retry_delay_s(d, 4) == doctest::Approx(40));
  CHECK(segflow::daemon::dicom::retry_delay_s(d, 9) == doctest::Approx(600));
}

TEST_CASE("segflowd does not start when its DICOM port is taken, and says which key") {
  Setup s;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  const int port = ntohs(a.sin_port);
  s.write_config(dicom_section(port));
  ChildProcess d = start_segflowd({"--config", s.config.string()}, s.dir / "segflowd.log");
  CHECK(d.wait_exit(60) == 1);
  const std::string log = d.log_tail();
  INFO(log);
  CHECK(log.find("dicom.port: cannot listen on 127.0.0.1:" + std::to_string(port) +
                 ": Address already in use") != std::string::npos);
  ::close(fd);
}

TEST_CASE("echoscu is answered, and an unknown calling AE title or a wrong called AE title is refused") {
  require_dcmtk_tools();
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port));
  auto d = s.start();

  auto r = echoscu(port, "MODALITY");
  CHECK_MESSAGE(r.exit_code == 0, r.out);
  r = echoscu(port, "INTRUDER");
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(r.out.find("Calling AE Title Not Recognized") != std::string::npos, r.out);
  r = echoscu(port, "MODALITY", "SOMEONE_ELSE");
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(r.out.find("Called AE Title Not Recognized") != std::string::npos, r.out);

  json st = node_stats(s.control);
  CHECK(st["listening"] == true);
  CHECK(st["address"] == "127.0.0.1:" + std::to_string(port));
  CHECK(st["echoes"] == 1);
  CHECK(st["associations_completed"] == 1);
  CHECK(st["associations_refused"] == 2);
  REQUIRE(st["recent"].size() == 3);
  CHECK(st["recent"][0]["outcome"] == "refused");
  CHECK(st["recent"][0]["reason"].get<std::string>().find("called AE title 'SOMEONE_ELSE'") !=
        std::string::npos);
  CHECK(st["recent"][1]["calling_ae"] == "INTRUDER");
  CHECK(st["recent"][1]["reason"].get<std::string>().find("not in dicom.allowed_calling_aes") !=
        std::string::npos);

  // `segflow ctl dicom` prints the same counters.
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  CHECK_MESSAGE(ctl.exit_code == 0, ctl.out);
  CHECK_MESSAGE(ctl.out.find("3 received, 1 completed, 2 refused") != std::string::npos, ctl.out);
}

TEST_CASE("series pushed with storescu become indexed cases, byte for byte, and a tiny job trains on them") {
  require_dcmtk_tools();
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port));
  const fs::path syn = synth_dicom(s.dir / "synth", 3);
  auto d = s.start();

  std::vector<fs::path> files;
  for (const char* c : {"case_000", "case_001", "case_002"}) {
    auto f = series_files(syn / c);
    files.insert(files.end(), f.begin(), f.end());
    files.push_back(syn / c / "seg.dcm");
  }
  auto r = storescu(port, files);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  json ds = wait_incoming(
      *d, s.control, [](const json& e) { return e["cases"] == 3 && e["pending"] == 0; }, "3 usable cases");
  CHECK(ds["layout"] == "dicom");
  CHECK(ds["bad"] == 0);

  // What arrived is what was sent: every instance, its pixel data bytes, in a folder named
  // <study>_<series>; each SEG beside the series it references.
  json sent = instances(files);
  json got = instances({s.data / "incoming"});
  REQUIRE(sent.size() == files.size());
  CHECK(got.size() == sent.size());
  for (auto it = sent.begin(); it != sent.end(); ++it) {
    INFO(it.key());
    REQUIRE(got.contains(it.key()));
    const json& g = got[it.key()];
    CHECK(g["pixel_sha1"] == it.value()["pixel_sha1"]);
    CHECK(g["transfer_syntax"] == it.value()["transfer_syntax"]);
    const bool seg = it.value()["modality"] == "SEG";
    const std::string series = seg ? it.value()["ref_series"] : it.value()["series"];
    const fs::path file = g["file"].get<std::string>();
    CHECK(file.parent_path().filename().string() == it.value()["study"].get<std::string>() + "_" + series);
    CHECK(file.filename().string() == (seg ? "SEG_" : "") + it.key() + ".dcm");
  }
  json st = node_stats(s.control);
  CHECK(st["instances_stored"] == static_cast<std::int64_t>(files.size()));
  CHECK(st["cases_written"] == 3);
  CHECK(st["associations_completed"] == 1);
  CHECK(names_in(s.data / ".segflow-dicom").empty());

  // A tiny job trains on the received dataset.
  JobYaml job;
  job.name = "from-pacs";
  job.root = s.data / "incoming";
  job.synth = "";
  job.stages.pop_back();  // no rand_flip
  job.model = unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch");
  job.epochs = 2;
  job.train =
      "batch_size: 2, device: cpu, val_interval: 1, checkpoint_interval: 1, loader: simple, threads: 1, "
      "log_every: 1";
  json started = ok(s.control, {{"cmd", "start"}, {"config", job.yaml()}, {"file", "from-pacs.yaml"}});
  const std::int64_t id = started["job"].get<std::int64_t>();
  CHECK(started["dataset"] == "incoming");
  json done = wait_job(*d, s.control, id, "completed", 120);
  CHECK(done["epoch"] == 2);
  CHECK(std::isfinite(done["loss"].get<double>()));
  CHECK(epoch_records(done["run_dir"].get<std::string>()) ==
        std::vector<std::int64_t>{0, 1});  // 0-based in metrics.jsonl
}

TEST_CASE("a SEG pushed after its series becomes the case's label, and a newer SEG replaces it") {
  require_dcmtk_tools();
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port));
  const fs::path syn = synth_dicom(s.dir / "synth", 1);
  auto d = s.start();

  auto r = storescu(port, series_files(syn / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  json ds = wait_incoming(
      *d, s.control, [](const json& e) { return e["unlabelled"] == 1 && e["pending"] == 0; },
      "the series alone is a case without a label");
  // An image-only series is usable for inference, not a bad case.
  CHECK(ds["bad"] == 0);
  CHECK(ds["cases"] == 1);
  CHECK(ds["labelled"] == 0);
  CHECK(ds["uses"]["inference"] == 1);
  CHECK(ds["uses"]["training"] == 0);

  r = storescu(port, {syn / "case_000" / "seg.dcm"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_incoming(
      *d, s.control,
      [](const json& e) {
        return e["labelled"] == 1 && e["unlabelled"] == 0 && e["bad"] == 0 && e["pending"] == 0;
      },
      "the SEG makes the case usable for training");
  auto dirs = case_dirs(s.data);
  REQUIRE(dirs.size() == 1);
  const json seg = instances({syn / "case_000" / "seg.dcm"});
  const std::string seg_uid = seg.begin().key();
  CHECK(seg.begin().value()["segments_present"] == json::array({1, 2, 3, 4}));
  auto inspect = run_segflow("inspect " + shell_quote(dirs[0].string()) + " --json");
  REQUIRE_MESSAGE(inspect.exit_code == 0, inspect.out);
  json info = json::parse(inspect.out);
  CHECK(fs::path(info["label_path"].get<std::string>()).filename() == "SEG_" + seg_uid + ".dcm");
  CHECK(info["labels"] == json::array({0, 1, 2, 3, 4}));

  // A corrected SEG (segment 4 cleared, new SOP instance and series) for the same series
  // takes the place of the first one.
  const fs::path seg2 = s.dir / "seg2.dcm";
  auto made = run_command(shell_quote(python()) + " " +
                          shell_quote(source_path("tests/tools/dicom_instances.py").string()) + " reseg " +
                          shell_quote((syn / "case_000" / "seg.dcm").string()) + " " +
                          shell_quote(seg2.string()) + " 4 2>&1");
  REQUIRE_MESSAGE(made.exit_code == 0, made.out);
  const std::string seg2_uid = json::parse(made.out)["sop_instance"];
  const double before = segflow::daemon::StateDb::now();
  r = storescu(port, {seg2});
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_node(
      *d, s.control, [](const json& n) { return n["associations_completed"] == 3; }, "third push done");
  std::vector<std::string> segs;
  for (const auto& n : names_in(case_dirs(s.data).at(0)))
    if (n.rfind("SEG_", 0) == 0) segs.push_back(n);
  CHECK(segs == std::vector<std::string>{"SEG_" + seg2_uid + ".dcm"});
  const json got = instances({s.data / "incoming"});
  REQUIRE(got.contains(seg2_uid));
  CHECK(got[seg2_uid]["segments_present"] == json::array({1, 2, 3}));
  CHECK(got.size() == series_files(syn / "case_000").size() + 1);
  inspect = run_segflow("inspect " + shell_quote(case_dirs(s.data).at(0).string()) + " --json");
  REQUIRE_MESSAGE(inspect.exit_code == 0, inspect.out);
  CHECK(json::parse(inspect.out)["labels"] == json::array({0, 1, 2, 3}));
  // The watcher indexes the case again, with the new SEG, as usable.
  wait_incoming(
      *d, s.control,
      [&](const json& e) {
        return e["updated"].get<double>() > before && e["cases"] == 1 && e["bad"] == 0 && e["pending"] == 0;
      },
      "the case is indexed again as usable with the new SEG");
}

TEST_CASE("compressed and enhanced instances from real files are accepted and stored as received") {
  require_dcmtk_tools();
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port));
  auto d = s.start();
  auto real = [](const char* name) { return pydicom_data_path(name); };
  // storescu proposes one compressed transfer syntax per run (-xv JPEG 2000 lossless, -xr
  // RLE) beside the uncompressed ones; the node prefers the lossless compressed one.
  const std::vector<std::pair<std::string, std::vector<fs::path>>> pushes = {
      {"-xv", {real("693_J2KR.dcm"), real("MR2_J2KR.dcm")}},
      {"-xr", {real("emri_small_RLE.dcm")}},
      {"", {real("eCT_Supplemental.dcm")}}};
  std::vector<fs::path> files;
  for (const auto& [option, push] : pushes) {
    auto r = storescu(port, push, option);
    REQUIRE_MESSAGE(r.exit_code == 0, r.out);
    files.insert(files.end(), push.begin(), push.end());
  }
  wait_node(
      *d, s.control, [](const json& n) { return n["associations_completed"] == 3; }, "three pushes done");
  json sent = instances(files), got = instances({s.data / "incoming"});
  CHECK(got.size() == files.size());
  std::set<std::string> syntaxes;
  for (auto it = sent.begin(); it != sent.end(); ++it) {
    INFO(it.value()["file"]);
    REQUIRE(got.contains(it.key()));
    CHECK(got[it.key()]["transfer_syntax"] == it.value()["transfer_syntax"]);
    CHECK(got[it.key()]["pixel_sha1"] == it.value()["pixel_sha1"]);
    syntaxes.insert(got[it.key()]["transfer_syntax"].get<std::string>());
    // segflow's reader decodes what the node accepted.
    const fs::path dir = fs::path(got[it.key()]["file"].get<std::string>()).parent_path();
    auto inspect = run_segflow("inspect " + shell_quote(dir.string()) + " --json");
    CHECK_MESSAGE(inspect.exit_code == 0, inspect.out);
  }
  CHECK(syntaxes ==
        std::set<std::string>{"1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.5", "1.2.840.10008.1.2.1"});

  // The same Enhanced MR instance again, JPEG-LS this time: it replaces the stored copy.
  const fs::path jls = real("emri_small_jpeg_ls_lossless.dcm");
  auto r = storescu(port, {jls}, "-xt");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_node(
      *d, s.control, [](const json& n) { return n["associations_completed"] == 4; }, "fourth push done");
  json again = instances({s.data / "incoming"});
  const json one = instances({jls});
  const std::string uid = one.begin().key();
  CHECK(again.size() == files.size());
  REQUIRE(again.contains(uid));
  CHECK(again[uid]["transfer_syntax"] == "1.2.840.10008.1.2.4.80");
  CHECK(again[uid]["pixel_sha1"] == one[uid]["pixel_sha1"]);
}

TEST_CASE(
    "an aborted association, a killed or stalled peer and a push over the byte limit leave no case behind") {
  require_dcmtk_tools();
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port, "  idle_timeout_s: 2\n  max_association_bytes: 30000\n"));
  const fs::path syn = synth_dicom(s.dir / "synth", 1);
  const auto series = series_files(syn / "case_000");
  std::vector<fs::path> few(series.begin(), series.begin() + 3);
  auto d = s.start();

  // storescu --abort: all instances sent, then an A-ABORT instead of a release.
  auto r = storescu(port, few, "--abort");
  CHECK_MESSAGE(r.exit_code == 0, r.out);
  wait_node(
      *d, s.control, [](const json& n) { return n["associations_aborted"] == 1; }, "abort seen");

  // The whole series is more than 30000 bytes: the connection is cut mid-series.
  r = storescu(port, series);
  CHECK(r.exit_code != 0);
  json st = wait_node(
      *d, s.control, [](const json& n) { return n["associations_failed"] == 1; }, "limit hit");
  CHECK(st["recent"][0]["reason"].get<std::string>().find("max_association_bytes") != std::string::npos);

  // A peer killed after two C-STOREs: the connection drops without release.
  {
    auto peer = start_peer(s, port, {series[0], series[1]}, "killed");
    peer->kill();
    wait_node(
        *d, s.control, [](const json& n) { return n["associations_aborted"] == 2; }, "killed peer seen");
  }
  // A peer that stalls after two C-STOREs is cut off after idle_timeout_s.
  {
    auto peer = start_peer(s, port, {series[0], series[1]}, "stalled");
    st = wait_node(
        *d, s.control, [](const json& n) { return n["associations_failed"] == 2; }, "stall cut", 20);
    CHECK(st["recent"][0]["reason"].get<std::string>().find("silent for dicom.idle_timeout_s") !=
          std::string::npos);
    CHECK(peer->alive());
  }

  st = node_stats(s.control);
  CHECK(st["instances_stored"] == 0);
  CHECK(st["cases_written"] == 0);
  CHECK(st["active"] == 0);
  CHECK(case_dirs(s.data).empty());
  CHECK(names_in(s.data / ".segflow-dicom").empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // two watcher passes
  CHECK(dataset_entry(s.control, "incoming").is_null());

  // The node goes on: a small push within the limit lands.
  r = storescu(port, few);
  CHECK_MESSAGE(r.exit_code == 0, r.out);
  wait_incoming(
      *d, s.control, [](const json& e) { return e["unlabelled"] == 1; }, "the small push is indexed");
  CHECK(case_dirs(s.data).size() == 1);
  CHECK(names_in(case_dirs(s.data).at(0)).size() == few.size());
}

TEST_CASE("garbage bytes, a silent connection and an unsupported SOP class leave the DICOM node answering") {
  require_dcmtk_tools();
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port, "  idle_timeout_s: 2\n"));
  auto d = s.start();

  auto connect = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    return fd;
  };
  auto send_and_close = [&](const std::string& bytes) {
    const int fd = connect();
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::close(fd);
  };
  std::mt19937 rng(7);
  std::string noise(8192, '\0');
  for (auto& c : noise) c = static_cast<char>(rng());
  send_and_close(noise);
  // An A-ASSOCIATE-RQ header that claims a 4 GiB PDU.
  send_and_close(std::string("\x01\x00\xff\xff\xff\xff", 6) + std::string(64, 'A'));
  send_and_close("GET / HTTP/1.1\r\nHost: segflow\r\n\r\n");
  send_and_close("");
  // A connection that says nothing at all is dropped after idle_timeout_s.
  const int silent = connect();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  // An RT Structure Set is no class the node stores: the association is refused.
  auto r = storescu(port, {debian_pydicom_path("rtstruct.dcm")});
  CHECK(r.exit_code != 0);
  CHECK_MESSAGE(r.out.find("Association Rejected") != std::string::npos, r.out);

  json st = wait_node(
      *d, s.control, [](const json& n) { return n["bad_connections"] >= 5; }, "five bad connections counted");
  ::close(silent);
  CHECK(st["associations_refused"] == 1);
  CHECK(st["recent"][0]["reason"].get<std::string>().find("no acceptable presentation context") !=
        std::string::npos);
  auto e = echoscu(port, "MODALITY");
  CHECK_MESSAGE(e.exit_code == 0, e.out);
  CHECK(ok(s.control, {{"cmd", "ping"}})["ok"] == true);
  CHECK(case_dirs(s.data).empty());

  // Without dicom.send_to there is nowhere to send a result: a clear error, nothing queued.
  json bad = call(s.control, {{"cmd", "dicom"}, {"send", {(s.dir / "x.dcm").string()}}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("dicom.send_to: not configured") != std::string::npos);
}

TEST_CASE(
    "a result queued while the destination is down is retried with back-off, survives a restart and "
    "reaches a storescp") {
  require_dcmtk_tools();
  Setup s;
  const int dest = free_port();
  s.write_config(
      "dicom:\n  ae_title: SEGFLOW\n  idle_timeout_s: 5\n  send_to: {ae_title: RECEIVER, host: "
      "127.0.0.1, port: " +
      std::to_string(dest) + ", retry_initial_s: 0.2, retry_max_s: 0.8, max_attempts: 1000}\n");
  const fs::path syn = synth_dicom(s.dir / "synth", 1);
  const fs::path seg = syn / "case_000" / "seg.dcm";
  auto d = s.start();

  // Bad files are refused and name the file.
  json bad = call(s.control, {{"cmd", "dicom"}, {"send", {(s.dir / "missing.dcm").string()}}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("send[0]: " + (s.dir / "missing.dcm").string() +
                                             ": no such file") != std::string::npos);
  write_file(s.dir / "notes.txt", "not DICOM");
  bad = call(s.control, {{"cmd", "dicom"}, {"send", {(s.dir / "notes.txt").string()}}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("notes.txt: not a readable DICOM file") != std::string::npos);

  auto q =
      run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom send " + shell_quote(seg.string()));
  REQUIRE_MESSAGE(q.exit_code == 0, q.out);
  CHECK_MESSAGE(q.out.find("queued as send 1") != std::string::npos, q.out);

  // Nobody listens at the destination: attempts fail and are spaced by the back-off.
  json send;
  const bool retried = eventually(
      [&] {
        send = dicom_reply(s.control)["sender"]["sends"][0];
        return send["attempts"].get<std::int64_t>() >= 4;
      },
      30);
  REQUIRE_MESSAGE(retried, send.dump());
  CHECK(send["state"] == "queued");
  CHECK(send["last_error"].get<std::string>().find("association with RECEIVER@127.0.0.1:" +
                                                   std::to_string(dest)) != std::string::npos);
  segflow::daemon::dicom::DicomDestination dd;
  dd.retry_initial_s = 0.2;
  dd.retry_max_s = 0.8;
  CHECK(send["next_attempt"].get<double>() - send["updated"].get<double>() ==
        doctest::Approx(segflow::daemon::dicom::retry_delay_s(dd, send["attempts"].get<std::int64_t>()))
            .epsilon(0.05));

  // The queue survives a restart; once a storescp listens, the file gets there.
  ok(s.control, {{"cmd", "shutdown"}});
  REQUIRE(d->wait_exit(60) == 0);
  d.reset();
  const fs::path received = s.dir / "received";
  fs::create_directories(received);
  ChildProcess scp({"storescp", "-aet", "RECEIVER", "-od", received.string(), std::to_string(dest)}, {},
                   s.dir / "storescp.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  d = s.start("segflowd2.log");
  const bool delivered = eventually(
      [&] {
        send = dicom_reply(s.control)["sender"]["sends"][0];
        return send["state"] == "sent";
      },
      30);
  REQUIRE_MESSAGE(delivered, (send.dump() + "\n" + d->log_tail()));
  json reply = dicom_reply(s.control);
  CHECK(reply["sender"]["sent"] == 1);
  CHECK(reply["sender"]["queued"] == 0);
  CHECK(names_in(s.state / "dicom-outbox").empty());
  const json sent = instances({seg}), got = instances({received});
  REQUIRE(got.size() == 1);
  const std::string uid = sent.begin().key();
  REQUIRE(got.contains(uid));
  CHECK(got[uid]["sop_class"] == "1.2.840.10008.5.1.4.1.1.66.4");
  CHECK(got[uid]["pixel_sha1"] == sent[uid]["pixel_sha1"]);
  CHECK(got[uid]["ref_series"] == sent[uid]["ref_series"]);
}

TEST_CASE(
    "a real CT series without SeriesInstanceUID is filed by its frame of reference and reads as the source") {
  require_dcmtk_tools();
  // TotalSegmentator's Siemens example series: Study, Series and SOP UIDs blank in the data
  // set (only the file meta header has the SOP UIDs). storescu takes the SOP UIDs from the
  // data set, so they are filled from the meta header here; Study and Series stay blank.
  const fs::path source = segflow::testing::testdata_path("totalsegmentator/example_ct_dicom");
  REQUIRE_MESSAGE(fs::is_directory(source), source.string() << " is missing: run scripts/fetch-test-data.sh");
  Setup s;
  const int port = free_port();
  s.write_config(dicom_section(port));
  const fs::path copy = s.dir / "ts";
  segflow::testing::run_python(
      "import pathlib, sys, pydicom\n"
      "out = pathlib.Path(sys.argv[2]); out.mkdir()\n"
      "for f in sorted(pathlib.Path(sys.argv[1]).iterdir()):\n"
      "    d = pydicom.dcmread(f)\n"
      "    assert not d.get('SeriesInstanceUID') and not d.get('SOPInstanceUID')\n"
      "    d.SOPClassUID = d.file_meta.MediaStorageSOPClassUID\n"
      "    d.SOPInstanceUID = d.file_meta.MediaStorageSOPInstanceUID\n"
      "    d.save_as(out / f.name)\n",
      {source.string(), copy.string()});
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(copy)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 20);
  auto d = s.start();
  auto r = storescu(port, files, "-xv");  // the series is JPEG 2000 lossless: propose it
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_node(
      *d, s.control, [](const json& n) { return n["instances_stored"] == 20 && n["cases_written"] == 1; },
      "20 instances in one case");
  // One case folder named after the frame of reference; it reads as the source series does.
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(s.data / "incoming"))
    if (e.is_directory()) cases.push_back(e.path());
  REQUIRE(cases.size() == 1);
  CHECK(segflow::testing::contains(cases[0].filename().string(),
                                   "1.3.12.2.1107.5.1.4.60064.30000022120807274275100000041"));
  REQUIRE_OK_AND_ASSIGN(auto got, segflow::pipeline::read_image(cases[0]));
  REQUIRE_OK_AND_ASSIGN(auto want, segflow::pipeline::read_image(source));
  CHECK(got.size() == want.size());
  CHECK(torch::equal(got.voxels, want.voxels));
  for (int i = 0; i < 3; ++i) {
    CHECK(got.geometry.spacing[i] == doctest::Approx(want.geometry.spacing[i]));
    CHECK(got.geometry.origin[i] == doctest::Approx(want.geometry.origin[i]));
  }
  CHECK(
      segflow::testing::contains(d->log_tail(), "has no SeriesInstanceUID; filed by its frame of reference"));
}
