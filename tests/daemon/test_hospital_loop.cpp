// The hospital loop: a series arrives at segflowd's DICOM node, auto_infer runs the model
// once the series is complete and the DICOM SEG goes back to a DICOM destination by itself.
// The peers are real: DCMTK's storescu and storescp, and Orthanc (Debian's package, its own
// instance on loopback ports) as the PACS. The SEG is read with pydicom
// (tests/tools/seg_references.py), not with segflow's reader.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <set>

#include "daemon/daemon_harness.hpp"
#include "daemon/dicom_fixtures.hpp"
#include "dicom_test_data.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

/// The config of the loop with storescp as RECEIVER on `dest` (dicom.send_to) and the node
/// on `port`: auto_infer runs `checkpoint` on each series and sends the SEG there.
std::string receiver_loop_config(int port, int dest, const fs::path& checkpoint) {
  return dicom_section(port, "  send_to: {ae_title: RECEIVER, host: 127.0.0.1, port: " +
                                 std::to_string(dest) + ", retry_initial_s: 0.5}\n") +
         "auto_infer:\n  - {dataset: incoming, checkpoint: " + checkpoint.string() +
         ", send_to: RECEIVER, quiet_seconds: 1}\n";
}

/// The loop of receiver_loop_config running: storescp receiving into s.dir/received, segflowd
/// started, a subscriber to its auto_infer events.
struct ReceiverLoop {
  ReceiverLoop(Setup& s, int port, int dest, const fs::path& checkpoint)
      : received(s.dir / "received"),
        scp((fs::create_directories(received),
             std::vector<std::string>{"storescp", "-aet", "RECEIVER", "-od", received.string(),
                                      std::to_string(dest)}),
            {}, s.dir / "storescp.log") {
    s.write_config(receiver_loop_config(port, dest, checkpoint));
    d = s.start();
    events = std::make_unique<Events>(s.events, "auto_infer");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  fs::path received;
  ChildProcess scp;
  std::unique_ptr<ChildProcess> d;
  std::unique_ptr<Events> events;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("a series pushed with storescu comes back to a storescp as a DICOM SEG by itself, once") {
  require_dcmtk_tools();
  Setup s;
  const fs::path checkpoint = train_checkpoint(s, 0, segmenting_job(s.data / "tiny"));
  const std::vector<std::string> names = trained_class_names(s.data / "tiny");
  const fs::path syn = synth_dicom(s.dir / "synth", 1, 11);
  const std::vector<fs::path> series = series_files(syn / "case_000");

  const int port = free_port(), dest = free_port();
  ReceiverLoop loop(s, port, dest, checkpoint);
  auto& d = loop.d;
  Events& events = *loop.events;
  const fs::path& received = loop.received;

  auto r = storescu(port, series);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto pushed = std::chrono::steady_clock::now();
  auto sent = events.wait_for(
      [](const std::string&, const json& b) { return b["event"] == "sent" || b["event"] == "failed"; }, 120);
  REQUIRE_MESSAGE(sent.has_value(), d->log_tail());
  REQUIRE_MESSAGE((*sent)["event"] == "sent", sent->dump());
  const double wall = seconds_since(pushed);
  std::printf(
      "hospital loop (storescu -> segflowd -> storescp, 24^3 synthetic series, CPU): %.2f s from the "
      "last instance to the SEG stored (daemon: %.2f s)\n",
      wall, (*sent)["seconds_since_last_instance"].get<double>());

  // received, inferred and sent, in that order, for the one case.
  std::vector<std::string> order;
  for (const auto& [topic, body] : events.got) order.push_back(body["event"].get<std::string>());
  CHECK(order == std::vector<std::string>{"received", "inferred", "sent"});
  const std::string case_id = (*sent)["case"].get<std::string>();
  CHECK((*sent)["dataset"] == "incoming");
  CHECK((*sent)["destination"] == "RECEIVER@127.0.0.1:" + std::to_string(dest));
  CHECK(events.got[0].second["instances"] == static_cast<std::int64_t>(series.size()));

  const auto got = files_in(received);
  REQUIRE(got.size() == 1);
  check_seg_on_source(seg_references(received, syn / "case_000"), names);
  // The SEG the daemon wrote is the one that arrived, and the queue shows it sent.
  CHECK(instances({received}).begin().key() == (*sent)["sop_instance_uid"].get<std::string>());
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  REQUIRE_MESSAGE(ctl.exit_code == 0, ctl.out);
  CHECK_MESSAGE(ctl.out.find("0 queued, 1 sent, 0 failed") != std::string::npos, ctl.out);
  const json ds = dataset_entry(s.control, "incoming");
  CHECK(ds["unlabelled"] == 1);
  CHECK(ds["bad"] == 0);

  // The same series again: stored (the node answers success) but no second SEG.
  const std::int64_t completed = node_stats(s.control)["associations_completed"].get<std::int64_t>();
  r = storescu(port, series);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_node(
      *d, s.control, [&](const json& n) { return n["associations_completed"] == completed + 1; },
      "the second push is stored");
  std::this_thread::sleep_for(std::chrono::seconds(4));  // quiet period, index and two polls
  events.drain(200);
  std::size_t received_events = 0;
  for (const auto& [topic, body] : events.got) received_events += body["event"] == "received";
  CHECK(received_events == 1);
  CHECK(files_in(received).size() == 1);
  CHECK(dicom_reply(s.control)["sender"]["sent"] == 1);

  // After a restart the signature in the state database still says "seen": no second SEG.
  ok(s.control, {{"cmd", "shutdown"}});
  REQUIRE(d->wait_exit(60) == 0);
  d = s.start("segflowd2.log");
  Events events2(s.events, "auto_infer");
  CHECK_MESSAGE(
      eventually(
          [&] {
            return read_file(s.dir / "segflowd2.log").find(case_id + ": the same instances as before") !=
                   std::string::npos;
          },
          30),
      d->log_tail());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  events2.drain(200);
  CHECK(events2.got.empty());
  CHECK(files_in(received).size() == 1);

  // A changed instance (same SOP instance UID, other bytes) makes a new SEG.
  const fs::path changed = s.dir / "changed.dcm";
  auto w = run_command(
      shell_quote(python()) + " -c " +
      shell_quote("import pydicom,sys; d=pydicom.dcmread(sys.argv[1]); d.SeriesDescription='re-sent'; "
                  "d.save_as(sys.argv[2])") +
      " " + shell_quote(series.front().string()) + " " + shell_quote(changed.string()) + " 2>&1");
  REQUIRE_MESSAGE(w.exit_code == 0, w.out);
  r = storescu(port, {changed});
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto sent2 = events2.wait_for([](const std::string&, const json& b) { return b["event"] == "sent"; }, 120);
  REQUIRE_MESSAGE(sent2.has_value(), d->log_tail());
  CHECK(files_in(received).size() == 2);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE("an auto_infer send_to that names no configured destination stops segflowd at start") {
  Setup s;
  const fs::path model = s.dir / "model.pt";
  write_file(model, "a file that exists");
  s.write_config(
      "dicom: {send_to: {ae_title: PACS, host: 127.0.0.1, port: 104}}\nauto_infer:\n  - {dataset: incoming, "
      "checkpoint: " +
      model.string() + ", send_to: ORTHANC}\n");
  ChildProcess d = start_segflowd({"--config", s.config.string()}, s.dir / "bad.log");
  CHECK(d.wait_exit(60) == 2);
  CHECK_MESSAGE(
      d.log_tail().find("auto_infer[0].send_to: ORTHANC: no such DICOM destination (expected one of PACS "
                        "(dicom.send_to))") != std::string::npos,
      d.log_tail());
  s.write_config("auto_infer:\n  - {dataset: incoming, checkpoint: " + model.string() +
                 ", send_to: PACS, output_format: nifti}\n");
  ChildProcess d2 = start_segflowd({"--config", s.config.string()}, s.dir / "bad2.log");
  CHECK(d2.wait_exit(60) == 2);
  CHECK_MESSAGE(d2.log_tail().find("auto_infer[0].send_to: output_format nifti writes no DICOM SEG") !=
                    std::string::npos,
                d2.log_tail());

  // Named destinations: an unknown name lists the known ones; each destination is checked.
  const std::string named =
      "dicom:\n  destinations:\n    PACS_A: {ae_title: A, host: 127.0.0.1, port: 104}\n";
  const std::vector<std::pair<std::string, std::string>> bad_named = {
      {named + "auto_infer:\n  - {dataset: incoming, checkpoint: " + model.string() + ", send_to: PACS_B}\n",
       "auto_infer[0].send_to: PACS_B: no such DICOM destination (expected one of PACS_A)"},
      {"dicom:\n  destinations:\n    PACS_A: {ae_title: A, host: 127.0.0.1}\n",
       "dicom.destinations.PACS_A.port: missing"},
      {"dicom:\n  destinations:\n    PACS_A: {ae_title: A, host: 127.0.0.1, port: 104, retry: 2}\n",
       "dicom.destinations.PACS_A.retry: unknown key"},
      {"dicom:\n  destinations:\n    \"a b\": {ae_title: A, host: 127.0.0.1, port: 104}\n",
       "dicom.destinations.a b: expected a name of 1-64 letters"},
      {"dicom:\n  destinations: [PACS_A]\n", "dicom.destinations: expected a mapping"},
  };
  int m = 0;
  for (const auto& [yaml, message] : bad_named) {
    const auto& config_text = yaml;  // clang 14 cannot capture a structured binding
    CAPTURE(config_text);
    s.write_config(yaml);
    ChildProcess b =
        start_segflowd({"--config", s.config.string()}, s.dir / ("bad_named" + std::to_string(m++) + ".log"));
    CHECK(b.wait_exit(60) == 2);
    CHECK_MESSAGE(b.log_tail().find(message) != std::string::npos, b.log_tail());
  }

  // A model package instead of a checkpoint: one of the two, and the folder must exist.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{dataset: incoming, checkpoint: " + model.string() + ", model: " + s.dir.path().string() + "}",
       "auto_infer[0].model: a model package names its checkpoints: give checkpoint or model, not both"},
      {"{dataset: incoming, model: " + (s.dir / "nopkg").string() + "}",
       "auto_infer[0].model: " + (s.dir / "nopkg").string() + ": no such folder (expected a model package)"},
      {"{dataset: incoming, model: " + s.dir.path().string() + ", tta: mirror}",
       "auto_infer[0].tta: a model package sets its TTA"},
      {"{dataset: incoming}", "auto_infer[0].checkpoint: missing"},
  };
  int n = 0;
  for (const auto& [entry, message] : bad) {
    const auto& yaml_entry = entry;  // clang 14 cannot capture a structured binding
    CAPTURE(yaml_entry);
    s.write_config("auto_infer:\n  - " + entry + "\n");
    ChildProcess b =
        start_segflowd({"--config", s.config.string()}, s.dir / ("bad_model" + std::to_string(n++) + ".log"));
    CHECK(b.wait_exit(60) == 2);
    CHECK_MESSAGE(b.log_tail().find(message) != std::string::npos, b.log_tail());
  }
}

TEST_CASE("Orthanc as the PACS: a series it C-STOREs to segflowd comes back into it as a SEG by itself") {
  if (!have_orthanc()) {
    skip_case("Orthanc is not installed (Debian's orthanc package; scripts/setup.sh installs it)");
    return;
  }
  require_dcmtk_tools();
  Setup s;
  const fs::path checkpoint = train_checkpoint(s, 0, segmenting_job(s.data / "tiny"));
  const std::vector<std::string> names = trained_class_names(s.data / "tiny");
  const fs::path syn = synth_dicom(s.dir / "synth", 1, 21);
  const fs::path other = synth_dicom(s.dir / "other", 1, 22);

  // Orthanc of its own on loopback ports, its storage in the test's folder.
  const int port = free_port();
  TestOrthanc orthanc(s.dir / "orthanc", port);
  const std::string url = orthanc.url();
  const int pacs = orthanc.dicom_port();

  s.write_config("dicom:\n  port: " + std::to_string(port) +
                 "\n  ae_title: SEGFLOW\n  dataset: incoming\n  allowed_calling_aes: [ORTHANC, MODALITY]\n"
                 "  send_to: {ae_title: ORTHANC, host: 127.0.0.1, port: " +
                 std::to_string(pacs) +
                 ", retry_initial_s: 0.5}\nauto_infer:\n  - {dataset: incoming, checkpoint: " +
                 checkpoint.string() + ", send_to: ORTHANC, quiet_seconds: 1}\n");
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // The study is loaded into Orthanc, which pushes it to segflowd (REST /modalities/segflow/store).
  const json up = json::parse(pacs_tool("upload " + url + quoted_files(series_files(syn / "case_000"))));
  REQUIRE(up["series"].size() == 1);
  pacs_tool("store " + url + " segflow " + up["series"][0].get<std::string>());
  const auto pushed = std::chrono::steady_clock::now();
  const fs::path got = s.dir / "from_orthanc";
  const bool arrived = eventually([&] { return orthanc_segs(url, got) == 1; }, 120);
  const double wall = seconds_since(pushed);
  REQUIRE_MESSAGE(arrived, d->log_tail());
  std::printf(
      "hospital loop (Orthanc store -> segflowd -> Orthanc, 24^3 synthetic series, CPU): %.2f s from "
      "the last instance to the SEG in Orthanc (polled every 0.25 s)\n",
      wall);
  auto sent = events.wait_for([](const std::string&, const json& b) { return b["event"] == "sent"; }, 30);
  REQUIRE(sent.has_value());
  CHECK((*sent)["destination"] == "ORTHANC@127.0.0.1:" + std::to_string(pacs));
  check_seg_on_source(seg_references(got, syn / "case_000"), names);

  // The same voxels as `segflow infer` on the same files.
  auto ref = run_segflow("infer --checkpoint " + shell_quote(checkpoint.string()) + " --input " +
                         shell_quote((syn / "case_000").string()) + " --output " +
                         shell_quote((s.dir / "ref.dcm").string()) + " --device cpu");
  REQUIRE_MESSAGE(ref.exit_code == 0, ref.out);
  const json mine = instances({got}), theirs = instances({s.dir / "ref.dcm"});
  REQUIRE(mine.size() == 1);
  REQUIRE(theirs.size() == 1);
  CHECK(mine.begin().value()["pixel_sha1"] == theirs.begin().value()["pixel_sha1"]);
  CHECK(mine.begin().value()["segments_present"] == theirs.begin().value()["segments_present"]);

  // Another series pushed by pynetdicom as MODALITY: its SEG lands in Orthanc too.
  const auto pushed2 = std::chrono::steady_clock::now();
  pacs_tool("push " + std::to_string(port) + " MODALITY SEGFLOW" +
            quoted_files(series_files(other / "case_000")));
  REQUIRE_MESSAGE(eventually([&] { return orthanc_segs(url, got) == 2; }, 120), d->log_tail());
  std::printf(
      "hospital loop (pynetdicom -> segflowd -> Orthanc): %.2f s from the start of the push (a Python "
      "process) to the SEG in Orthanc\n",
      seconds_since(pushed2));
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

namespace {

/// Rewrites every instance of the series under `case_dir` to air (-1000 HU): a series in
/// which the model finds no foreground.
void blank_series(const fs::path& case_dir) {
  auto r = run_command(
      shell_quote(python()) + " -c " +
      shell_quote("import pydicom,sys\n"
                  "for f in sys.argv[1:]:\n"
                  "    d=pydicom.dcmread(f); a=d.pixel_array.copy()\n"
                  "    a[...]=int(round((-1000-float(d.RescaleIntercept))/float(d.RescaleSlope)))\n"
                  "    d.PixelData=a.tobytes(); d.save_as(f)\n") +
      quoted_files(series_files(case_dir)) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
}

/// The events named `name` that `events` got so far.
std::vector<json> events_named(const Events& events, const std::string& name) {
  std::vector<json> out;
  for (const auto& [topic, body] : events.got)
    if (body["event"] == name) out.push_back(body);
  return out;
}

/// RECEIVER on `dest` as dicom.send_to (named by its AE title), or as the named destination
/// PACS_B of dicom.destinations (`named`).
std::string pacs_down_config(const fs::path& checkpoint, int port, int dest, int max_attempts, bool named) {
  const std::string destination =
      "{ae_title: RECEIVER, host: 127.0.0.1, port: " + std::to_string(dest) +
      ", retry_initial_s: 0.3, retry_max_s: 0.5, max_attempts: " + std::to_string(max_attempts) + "}";
  return dicom_section(port, named ? "  destinations:\n    PACS_B: " + destination + "\n"
                                   : "  send_to: " + destination + "\n") +
         "auto_infer:\n  - {dataset: incoming, checkpoint: " + checkpoint.string() +
         ", send_to: " + (named ? "PACS_B" : "RECEIVER") + ", quiet_seconds: 1}\n";
}

}  // namespace

TEST_CASE(
    "the PACS down: an empty series sends nothing, SEGs are retried with back-off, fail after the "
    "limit, survive SIGKILL and reach the PACS once it listens") {
  require_dcmtk_tools();
  Setup s;
  const fs::path checkpoint = train_checkpoint(s, 0, segmenting_job(s.data / "tiny"));
  const fs::path blank = synth_dicom(s.dir / "blank", 1, 31), first = synth_dicom(s.dir / "first", 1, 32),
                 second = synth_dicom(s.dir / "second", 1, 33);
  blank_series(blank / "case_000");
  const int port = free_port(), dest = free_port();  // nothing listens on dest yet

  // 1. At most 3 attempts. A series without foreground: `inferred` with empty: true, nothing queued.
  s.write_config(pacs_down_config(checkpoint, port, dest, 3, false));
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto r = storescu(port, series_files(blank / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto inferred =
      events.wait_for([](const std::string&, const json& b) { return b["event"] != "received"; }, 60);
  REQUIRE_MESSAGE(inferred.has_value(), d->log_tail());
  REQUIRE_MESSAGE((*inferred)["event"] == "inferred", inferred->dump());
  CHECK((*inferred)["empty"] == true);
  CHECK_MESSAGE((*inferred)["reason"].get<std::string>().find("no foreground") != std::string::npos,
                inferred->dump());
  CHECK((*inferred)["outputs"].empty());
  const std::string blank_case = (*inferred)["case"].get<std::string>();

  // 2. A series with foreground, the destination down: retried after 0.3 s, then 0.5 s (the
  // back-off capped by retry_max_s), then failed for good after the third attempt.
  r = storescu(port, series_files(first / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto failed = events.wait_for([](const std::string&, const json& b) { return b["event"] == "failed"; }, 60);
  REQUIRE_MESSAGE(failed.has_value(), d->log_tail());
  CHECK((*failed)["stage"] == "send");
  CHECK((*failed)["attempts"] == 3);
  CHECK_MESSAGE(
      (*failed)["error"].get<std::string>().find("association with RECEIVER@127.0.0.1") != std::string::npos,
      failed->dump());
  const auto retries = events_named(events, "retrying");
  REQUIRE(retries.size() == 2);
  CHECK(retries[0]["attempts"] == 1);
  CHECK(retries[1]["attempts"] == 2);
  CHECK(retries[0]["retry_in_s"].get<double>() == doctest::Approx(0.3).epsilon(0.01));
  CHECK(retries[1]["retry_in_s"].get<double>() == doctest::Approx(0.5).epsilon(0.01));
  CHECK(events_named(events, "sent").empty());
  const json q1 = dicom_reply(s.control)["sender"];
  CHECK(q1["queued"] == 0);
  CHECK(q1["failed"] == 1);
  const json gone = send_entry(s.control, (*failed)["send"].get<std::int64_t>());
  CHECK(gone["state"] == "failed");
  CHECK(gone["attempts"] == 3);
  CHECK_MESSAGE(!gone["last_error"].get<std::string>().empty(), gone.dump());

  // 3. SIGKILL, then the named destination PACS_B (same peer) with unlimited attempts: a new
  // series' SEG is queued for PACS_B and retried ...
  d->kill();
  s.write_config(pacs_down_config(checkpoint, port, dest, 1000, true));
  d = s.start("segflowd2.log");
  Events events2(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  r = storescu(port, series_files(second / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto retry = events2.wait_for(
      [](const std::string&, const json& b) { return b["event"] == "retrying" && b["attempts"] == 2; }, 60);
  REQUIRE_MESSAGE(retry.has_value(), d->log_tail());
  const std::int64_t send = (*retry)["send"].get<std::int64_t>();
  const std::string case_id = (*retry)["case"].get<std::string>();

  // ... and survives another SIGKILL: still queued after the restart, with its attempts.
  d->kill();
  d = s.start("segflowd3.log");
  Events events3(s.events, "auto_infer");
  const json kept = send_entry(s.control, send);
  REQUIRE_MESSAGE(kept["state"] == "queued", kept.dump());
  CHECK(kept["target"] == "PACS_B");
  CHECK(kept["attempts"].get<std::int64_t>() >= 2);
  REQUIRE_MESSAGE(
      eventually(
          [&] {
            return read_file(s.dir / "segflowd3.log").find(case_id + ": the same instances as before") !=
                   std::string::npos;
          },
          30),
      d->log_tail());

  // 4. The PACS comes up: the SEG is delivered once, the failed and the empty case stay as they are.
  const fs::path received = s.dir / "received";
  fs::create_directories(received);
  ChildProcess scp({"storescp", "-aet", "RECEIVER", "-od", received.string(), std::to_string(dest)}, {},
                   s.dir / "storescp.log");
  auto sent = events3.wait_for([](const std::string&, const json& b) { return b["event"] == "sent"; }, 60);
  REQUIRE_MESSAGE(sent.has_value(), d->log_tail());
  CHECK((*sent)["send"] == send);
  CHECK((*sent)["case"] == case_id);
  CHECK((*sent)["destination"] == "RECEIVER@127.0.0.1:" + std::to_string(dest));
  CHECK((*sent)["attempts"].get<std::int64_t>() > kept["attempts"].get<std::int64_t>());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto got = files_in(received);
  REQUIRE(got.size() == 1);
  CHECK(instances({received}).begin().key() == (*sent)["sop_instance_uid"].get<std::string>());
  const json q2 = dicom_reply(s.control)["sender"];
  CHECK(q2["queued"] == 0);
  CHECK(q2["sent"] == 1);
  CHECK(q2["failed"] == 1);
  CHECK(q2["destinations"]["PACS_B"] == "RECEIVER@127.0.0.1:" + std::to_string(dest));
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  REQUIRE_MESSAGE(ctl.exit_code == 0, ctl.out);
  CHECK_MESSAGE(
      ctl.out.find("destination PACS_B: RECEIVER@127.0.0.1:" + std::to_string(dest)) != std::string::npos,
      ctl.out);
  CHECK_MESSAGE(
      ctl.out.find(" -> PACS_B (RECEIVER@127.0.0.1:" + std::to_string(dest) + "): sent") != std::string::npos,
      ctl.out);
  events3.drain(200);
  for (const auto& [topic, body] : events3.got) CHECK_MESSAGE(body["case"] != blank_case, body.dump());
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE("a send queued by an older segflowd (no named destinations in state.db) goes to dicom.send_to") {
  require_dcmtk_tools();
  Setup s;
  const fs::path syn = synth_dicom(s.dir / "synth", 1, 41);
  const fs::path file = series_files(syn / "case_000").front();
  // The state database as segflowd wrote it before dicom_sends had a target column.
  fs::create_directories(s.state / "dicom-outbox");
  const fs::path copy = s.state / "dicom-outbox" / "1-1.dcm";
  fs::copy_file(file, copy);
  const std::string uid = instances({file}).begin().key();
  auto w = run_command(
      shell_quote(python()) + " -c " +
      shell_quote(
          "import sqlite3,sys\n"
          "c=sqlite3.connect(sys.argv[1])\n"
          "c.execute('CREATE TABLE dicom_sends (id INTEGER PRIMARY KEY AUTOINCREMENT, file TEXT NOT NULL, "
          "source TEXT NOT NULL, sop_class_uid TEXT NOT NULL, sop_instance_uid TEXT NOT NULL, state TEXT "
          "NOT NULL, attempts INTEGER NOT NULL, next_attempt REAL NOT NULL, last_error TEXT NOT NULL, "
          "destination TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL)')\n"
          "c.execute('INSERT INTO dicom_sends (file, source, sop_class_uid, sop_instance_uid, state, "
          "attempts, next_attempt, last_error, destination, created, updated) VALUES "
          "(?,?,?,?,?,2,0,?,?,0,0)', (sys.argv[2], sys.argv[3], '1.2.840.10008.5.1.4.1.1.2', sys.argv[4], "
          "'queued', 'refused', 'OLD@127.0.0.1:1'))\n"
          "c.commit()\n") +
      " " + shell_quote((s.state / "state.db").string()) + " " + shell_quote(copy.string()) + " " +
      shell_quote(file.string()) + " " + shell_quote(uid) + " 2>&1");
  REQUIRE_MESSAGE(w.exit_code == 0, w.out);

  const int dest = free_port();
  const fs::path received = s.dir / "received";
  fs::create_directories(received);
  ChildProcess scp({"storescp", "-aet", "RECEIVER", "-od", received.string(), std::to_string(dest)}, {},
                   s.dir / "storescp.log");
  s.write_config("dicom:\n  send_to: {ae_title: RECEIVER, host: 127.0.0.1, port: " + std::to_string(dest) +
                 "}\n  destinations:\n    OTHER: {ae_title: OTHER, host: 127.0.0.1, port: 1}\n");
  auto d = s.start();
  const json sent = wait_daemon_value(
      *d, [&] { return send_entry(s.control, 1); }, [](const json& e) { return e["state"] == "sent"; },
      "the old send is delivered", "send", 30);
  CHECK(sent["target"] == "");
  CHECK(sent["attempts"] == 3);
  CHECK(sent["destination"] == "RECEIVER@127.0.0.1:" + std::to_string(dest));
  CHECK(instances({received}).begin().key() == uid);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

namespace {

/// A storescp association profile that accepts CT and MR images but not DICOM SEG: a PACS
/// that was never set up for Segmentation Storage.
void write_images_only_profile(const fs::path& file) {
  write_file(file,
             "[[TransferSyntaxes]]\n[Uncompressed]\nTransferSyntax1 = LocalEndianExplicit\n"
             "TransferSyntax2 = OppositeEndianExplicit\nTransferSyntax3 = LittleEndianImplicit\n\n"
             "[[PresentationContexts]]\n[ImagesOnly]\nPresentationContext1 = CTImageStorage\\Uncompressed\n"
             "PresentationContext2 = MRImageStorage\\Uncompressed\n\n"
             "[[Profiles]]\n[ImagesOnly]\nPresentationContexts = ImagesOnly\n");
}

/// Tilts the orientation of one slice in the middle of the series under `case_dir`: its
/// slices no longer make one volume.
void tilt_one_slice(const fs::path& case_dir) {
  const auto files = series_files(case_dir);
  auto r = run_command(shell_quote(python()) + " -c " +
                       shell_quote("import pydicom,sys\n"
                                   "d=pydicom.dcmread(sys.argv[1])\n"
                                   "d.ImageOrientationPatient=[1,0,0,0,0.9,0.43589]\n"
                                   "d.save_as(sys.argv[1])\n") +
                       " " + shell_quote(files.at(files.size() / 2).string()) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
}

}  // namespace

TEST_CASE(
    "bad input in the loop: a PACS that refuses SEG fails the send at once, a series that is no volume "
    "fails its inference, each once, with reasons, and the daemon goes on") {
  require_dcmtk_tools();
  Setup s;
  const fs::path checkpoint = train_checkpoint(s, 0, segmenting_job(s.data / "tiny"));
  const fs::path good = synth_dicom(s.dir / "good", 1, 51), tilted = synth_dicom(s.dir / "tilted", 1, 52),
                 later = synth_dicom(s.dir / "later", 1, 53);
  tilt_one_slice(tilted / "case_000");
  const int port = free_port(), dest = free_port();
  const fs::path received = s.dir / "received", profile = s.dir / "images-only.cfg";
  fs::create_directories(received);
  write_images_only_profile(profile);
  auto scp = std::make_unique<ChildProcess>(
      std::vector<std::string>{"storescp", "-xf", profile.string(), "ImagesOnly", "-aet", "RECEIVER", "-od",
                               received.string(), std::to_string(dest)},
      std::vector<std::string>{}, s.dir / "storescp.log");
  s.write_config(pacs_down_config(checkpoint, port, dest, 5, false));
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // 1. The PACS answers but accepts no Segmentation Storage: failed after one attempt, not
  // retried, the reason names the SOP class.
  auto r = storescu(port, series_files(good / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto refused =
      events.wait_for([](const std::string&, const json& b) { return b["event"] == "failed"; }, 60);
  REQUIRE_MESSAGE(refused.has_value(), d->log_tail());
  CHECK((*refused)["stage"] == "send");
  CHECK((*refused)["attempts"] == 1);
  const std::string why = (*refused)["error"].get<std::string>();
  CHECK_MESSAGE(why.find("refused by RECEIVER@127.0.0.1:" + std::to_string(dest)) != std::string::npos, why);
  CHECK_MESSAGE(why.find("1.2.840.10008.5.1.4.1.1.66.4") != std::string::npos, why);
  CHECK(events_named(events, "retrying").empty());
  CHECK(events_named(events, "inferred").size() == 1);
  CHECK(files_in(received).empty());

  // 2. A series one of whose slices is tilted: its inference fails with the reader's reason.
  r = storescu(port, series_files(tilted / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto bad = events.wait_for(
      [](const std::string&, const json& b) { return b["event"] == "failed" && b["stage"] != "send"; }, 60);
  REQUIRE_MESSAGE(bad.has_value(), d->log_tail());
  CHECK((*bad)["stage"] == "inference");
  const std::string reason = (*bad)["error"].get<std::string>();
  CHECK_MESSAGE(reason.find("ImagePositionPatient") != std::string::npos, reason);
  CHECK_MESSAGE(reason.find("set aside as another stack: 1 slice") != std::string::npos, reason);
  const std::string bad_case = (*bad)["case"].get<std::string>();

  // The same bad series again: stored, but no second job and no second failure.
  const std::int64_t completed = node_stats(s.control)["associations_completed"].get<std::int64_t>();
  r = storescu(port, series_files(tilted / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_node(
      *d, s.control, [&](const json& n) { return n["associations_completed"] == completed + 1; },
      "the second push of the bad series is stored");
  std::this_thread::sleep_for(std::chrono::seconds(4));  // quiet period, index and two polls
  events.drain(200);
  CHECK(events_named(events, "received").size() == 2);
  CHECK(events_named(events, "failed").size() == 2);

  // 3. The daemon goes on: the PACS is set up for SEG, the next series' SEG arrives; the
  // refused one stays failed (not re-sent by itself).
  scp.reset();
  scp = std::make_unique<ChildProcess>(std::vector<std::string>{"storescp", "-aet", "RECEIVER", "-od",
                                                                received.string(), std::to_string(dest)},
                                       std::vector<std::string>{}, s.dir / "storescp2.log");
  r = storescu(port, series_files(later / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto sent = events.wait_for([](const std::string&, const json& b) { return b["event"] == "sent"; }, 60);
  REQUIRE_MESSAGE(sent.has_value(), d->log_tail());
  CHECK((*sent)["attempts"] == 1);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  events.drain(200);
  CHECK(events_named(events, "received").size() == 3);
  CHECK(events_named(events, "failed").size() == 2);
  CHECK(events_named(events, "sent").size() == 1);
  CHECK(files_in(received).size() == 1);
  const json q = dicom_reply(s.control)["sender"];
  CHECK(q["queued"] == 0);
  CHECK(q["sent"] == 1);
  CHECK(q["failed"] == 1);
  // The text view names where each send went and why the refused one failed.
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  REQUIRE_MESSAGE(ctl.exit_code == 0, ctl.out);
  const std::string where = " -> send_to (RECEIVER@127.0.0.1:" + std::to_string(dest) + "): ";
  CHECK_MESSAGE(ctl.out.find(where + "failed, 1 attempts; last error: refused by") != std::string::npos,
                ctl.out);
  CHECK_MESSAGE(ctl.out.find(where + "sent, 1 attempts") != std::string::npos, ctl.out);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE(
    "a model that does not fit the series (two input channels for a one-channel CT series) fails each case "
    "with the reason, once, and nothing is queued") {
  require_dcmtk_tools();
  Setup s;
  // A checkpoint of a two-channel UNet: the synthetic cases with their CT repeated as _0001.
  const fs::path two = s.dir / "two-channel";
  auto r =
      run_segflow("synth --cases 3 --size 24 --format nifti --seed 61 --out " + shell_quote(two.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  for (const auto& e : fs::directory_iterator(two / "imagesTr")) {
    const std::string name = e.path().filename().string();
    const auto at = name.find("_0000");
    REQUIRE(at != std::string::npos);
    fs::copy_file(e.path(), two / "imagesTr" / (name.substr(0, at) + "_0001" + name.substr(at + 5)));
  }
  JobYaml job;
  job.root = two;
  job.model =
      "{name: unet, spatial_dims: 3, in_channels: 2, out_channels: 5, channels: [4, 8], strides: [2], "
      "num_res_units: 0, norm: batch}";
  job.epochs = 1;
  job.val_cases = "1";
  job.runs_dir = s.dir / "runs";
  write_file(s.dir / "two.yaml", job.yaml());
  r = run_segflow("train " + shell_quote((s.dir / "two.yaml").string()) + " --quiet");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  fs::path checkpoint;
  for (const auto& e : fs::recursive_directory_iterator(s.dir / "runs"))
    if (e.path().filename() == "last.pt") checkpoint = e.path();
  REQUIRE(!checkpoint.empty());

  const fs::path syn = synth_dicom(s.dir / "synth", 1, 62);
  const int port = free_port(), dest = free_port();
  s.write_config(pacs_down_config(checkpoint, port, dest, 3, false));
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  r = storescu(port, series_files(syn / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto failed = events.wait_for([](const std::string&, const json& b) { return b["event"] == "failed"; }, 60);
  REQUIRE_MESSAGE(failed.has_value(), d->log_tail());
  CHECK((*failed)["stage"] == "inference");
  const std::string why = (*failed)["error"].get<std::string>();
  CHECK_MESSAGE(why.find("takes 2 image channels, got 1") != std::string::npos, why);
  // Nothing queued, nothing written, and the daemon still answers.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  events.drain(200);
  CHECK(events_named(events, "inferred").empty());
  CHECK(events_named(events, "failed").size() == 1);
  const json q = dicom_reply(s.control)["sender"];
  CHECK(q["queued"] == 0);
  CHECK(q["sent"] == 0);
  CHECK(q["failed"] == 0);
  CHECK(files_in(s.state / "inferred" / "incoming").empty());
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

namespace {

/// Rewrites the auto_infer record of the one case of `incoming` in state.db (segflowd stopped):
/// its state, and without its jobs or its send when asked, as a segflowd killed between two
/// steps of auto_infer left it.
void rewind_record(const fs::path& state, const std::string& new_state, bool drop_jobs, bool drop_send) {
  auto r = run_command(
      shell_quote(python()) + " -c " +
      shell_quote("import json,sqlite3,sys\n"
                  "c=sqlite3.connect(sys.argv[1])\n"
                  "(k,v),=c.execute(\"SELECT key,value FROM meta WHERE key LIKE "
                  "'auto_infer:incoming/%'\").fetchall()\n"
                  "r=json.loads(v); r['state']=sys.argv[2]\n"
                  "if sys.argv[3]=='1': r['jobs']=[]; r['outputs']=[]\n"
                  "if sys.argv[4]=='1': r.pop('send',None)\n"
                  "c.execute('UPDATE meta SET value=? WHERE key=?',(json.dumps(r),k)); c.commit()\n") +
      " " + shell_quote((state / "state.db").string()) + " " + new_state + " " + (drop_jobs ? "1" : "0") +
      " " + (drop_send ? "1" : "0") + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
}

/// The auto_infer inference jobs the daemon knows of.
std::size_t auto_infer_jobs(const std::string& control) {
  std::size_t n = 0;
  // The reply held in a variable: a range-for over a member of a temporary (ok(...)["jobs"])
  // reads a destroyed reply before C++23.
  const json status = ok(control, {{"cmd", "status"}});
  for (const auto& j : status["jobs"]) n += j.value("trigger", "") == "auto_infer";
  return n;
}

}  // namespace

TEST_CASE(
    "segflowd killed between auto_infer's steps (jobs submitted but not recorded, a SEG queued but not "
    "recorded) makes no second job and sends no second SEG after its restart") {
  require_dcmtk_tools();
  Setup s;
  const fs::path checkpoint = train_checkpoint(s, 0, segmenting_job(s.data / "tiny"));
  const fs::path syn = synth_dicom(s.dir / "synth", 1, 111);
  const int port = free_port(), dest = free_port();
  ReceiverLoop loop(s, port, dest, checkpoint);
  auto& d = loop.d;
  Events& events = *loop.events;
  const fs::path& received = loop.received;
  auto r = storescu(port, series_files(syn / "case_000"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto sent = events.wait_for([](const std::string&, const json& b) { return b["event"] == "sent"; }, 120);
  REQUIRE_MESSAGE(sent.has_value(), d->log_tail());
  CHECK(auto_infer_jobs(s.control) == 1);
  CHECK(files_in(received).size() == 1);
  const std::string case_id = (*sent)["case"].get<std::string>();

  // A restarted segflowd reports a send that ended before it was listening with a `sent` event
  // at start-up, which can precede any subscriber's connection; so the restarts below are
  // checked in the daemon's log, its state.db and the receiver's folder instead.
  const std::string already = "is already send " + (*sent)["send"].dump() + " (sent)";
  auto log_has = [&](const char* log, const std::string& what) {
    return eventually([&] { return read_file(s.dir / log).find(what) != std::string::npos; }, 60);
  };

  // 1. As if killed after the jobs were submitted, before the record listed them: the job
  // submitted since the record was written is taken as its own; nothing runs twice.
  d->kill();
  rewind_record(s.state, "submitting", true, true);
  d = s.start("segflowd2.log");
  CHECK_MESSAGE(log_has("segflowd2.log", case_id + ": resuming the submission"), d->log_tail());
  CHECK_MESSAGE(log_has("segflowd2.log", already), d->log_tail());  // the SEG's send found again
  CHECK(auto_infer_jobs(s.control) == 1);
  CHECK(dicom_reply(s.control)["sender"]["sent"] == 1);

  // 2. As if killed after the SEG was queued, before the record named the send.
  d->kill();
  rewind_record(s.state, "submitted", false, true);
  d = s.start("segflowd3.log");
  CHECK_MESSAGE(log_has("segflowd3.log", already), d->log_tail());
  CHECK(auto_infer_jobs(s.control) == 1);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK(files_in(received).size() == 1);
  CHECK(dicom_reply(s.control)["sender"]["sent"] == 1);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}
