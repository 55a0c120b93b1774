// DICOMweb on segflowd, against a real server: Orthanc with Debian's DICOMweb plugin
// (orthanc-dicomweb), started by the test on its own loopback ports and storage. SEGs go out
// by STOW-RS through the persistent, retried send queue; studies come in by QIDO-RS and
// WADO-RS (`segflow ctl dicom fetch`). Orthanc's Lua filters make it check an Authorization
// header on /dicom-web (bearer token or basic) and refuse instances described "refuse me".
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "daemon/daemon_harness.hpp"
#include "daemon/dicom_fixtures.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

/// Orthanc's Lua: DICOMweb only with the test's bearer token or alice:secret (basic); an
/// instance whose SeriesDescription is "refuse me" is not stored (its filter fails: Orthanc
/// 1.10's DICOMweb plugin then answers 200 without the instance in ReferencedSOPSequence).
constexpr const char* kOrthancLua = R"lua(
function IncomingHttpRequestFilter(method, uri, ip, username, httpHeaders)
  if string.sub(uri, 1, 10) ~= '/dicom-web' then return true end
  local a = httpHeaders['authorization']
  return a == 'Bearer s3cret-token' or a == 'Basic YWxpY2U6c2VjcmV0'
end
function ReceivedInstanceFilter(dicom, origin, info)
  if dicom.SeriesDescription == 'refuse me' then error('refused by the test filter') end
  return true
end
)lua";

/// A copy of `in` as `out` with a new SOP instance UID and no SeriesInstanceUID: an instance
/// a STOW-RS server cannot file (Orthanc answers 400, FailureReason 0xC000).
void copy_without_series(const fs::path& in, const fs::path& out) {
  copy_as_new_instance(in, out);
  auto r =
      run_command(shell_quote(python()) + " -c " +
                  shell_quote("import pydicom,sys\nd=pydicom.dcmread(sys.argv[1])\ndel d.SeriesInstanceUID\n"
                              "d.save_as(sys.argv[1])\n") +
                  " " + shell_quote(out.string()) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
}

bool have_dicomweb_plugin() {
  return fs::exists("/usr/lib/orthanc/libOrthancDicomWeb.so") ||
         fs::exists("/usr/share/orthanc/plugins/libOrthancDicomWeb.so");
}

/// Skips the case (with the reason) unless Orthanc and its DICOMweb plugin are installed.
bool skip_without_orthanc_dicomweb() {
  if (have_orthanc() && have_dicomweb_plugin()) return false;
  skip_case(
      "Orthanc or its DICOMweb plugin is not installed (Debian's orthanc and orthanc-dicomweb; "
      "scripts/setup.sh installs them)");
  return true;
}

/// A DICOMweb destination of the daemon config on `url` with `extra` keys.
std::string web_destination(const std::string& url, const std::string& extra) {
  return "{kind: dicomweb, url: '" + url + "', retry_initial_s: 0.3, retry_max_s: 1, " + extra + "}";
}

/// Fetch `id` as `segflow ctl dicom` lists it.
json fetch_entry(const std::string& control, std::int64_t id) {
  const json reply = dicom_reply(control);
  for (const auto& f : reply["fetcher"]["fetches"])
    if (f["id"] == id) return f;
  return json();
}

json wait_fetch(ChildProcess& d, const std::string& control, std::int64_t id,
                const std::function<bool(const json&)>& pred, const std::string& what,
                double timeout_s = 60) {
  return wait_daemon_value(
      d, [&] { return fetch_entry(control, id); }, [&](const json& f) { return !f.is_null() && pred(f); },
      what, "fetch", timeout_s);
}

/// `segflow ctl dicom fetch --from NAME --study UID [ARGS]`: the command's result.
CommandResult ctl_fetch(const std::string& control, const std::string& from, const std::string& study,
                        const std::string& args = "") {
  return run_segflow("ctl --endpoint " + shell_quote(control) + " dicom fetch --from " + from + " --study " +
                     study + " " + args);
}

/// The fetch id of `queued as fetch N` in ctl's output.
std::int64_t fetch_id(const CommandResult& r) {
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto at = r.out.find("queued as fetch ");
  REQUIRE_MESSAGE(at != std::string::npos, r.out);
  return std::stoll(r.out.substr(at + 16));
}

}  // namespace

TEST_CASE(
    "SEGs go to Orthanc by STOW-RS with a bearer token or basic auth; an instance Orthanc refuses fails at "
    "once, a 403 is retried, and with Orthanc down a SEG waits and arrives when it is back") {
  if (skip_without_orthanc_dicomweb()) return;
  Setup s;
  const fs::path syn = synth_dicom(s.dir / "synth", 1, 91);
  const fs::path seg = syn / "case_000" / "seg.dcm";
  write_file(s.dir / "orthanc.lua", kOrthancLua);
  TestOrthanc orthanc(s.dir / "orthanc", free_port(), "--dicomweb --lua " + (s.dir / "orthanc.lua").string());
  write_file(s.dir / "token", "s3cret-token\n");
  write_file(s.dir / "password", "secret\n");
  const std::string url = orthanc.dicomweb();
  s.write_config(
      "dicom:\n  destinations:\n    WEB: " +
      web_destination(url,
                      "auth: bearer, token_file: " + (s.dir / "token").string() + ", max_attempts: 1000") +
      "\n    WEB_BASIC: " +
      web_destination(url, "auth: basic, username: alice, password_file: " + (s.dir / "password").string()) +
      "\n    WEB_NO_AUTH: " + web_destination(url, "max_attempts: 2") + "\n");
  auto d = s.start();
  const fs::path got = s.dir / "from_orthanc";

  // 1. Bearer token: stored in Orthanc, as sent.
  json e = send_until_ended(*d, s.control, seg, "WEB");
  REQUIRE_MESSAGE(e["state"] == "sent", (e.dump() + "\n" + orthanc.log_tail()));
  CHECK(e["attempts"] == 1);
  CHECK(e["destination"] == url);
  REQUIRE(orthanc_segs(orthanc.url(), got) == 1);
  CHECK(instance_contents({got}) == instance_contents({seg}));

  // 2. Basic authentication: another SEG.
  const fs::path seg2 = s.dir / "seg2.dcm";
  copy_as_new_instance(seg, seg2);
  e = send_until_ended(*d, s.control, seg2, "WEB_BASIC");
  CHECK_MESSAGE(e["state"] == "sent", e.dump());
  CHECK(orthanc_segs(orthanc.url(), got) == 2);

  // 3. No credentials: Orthanc answers 403, which is retried (credentials may be fixed), then
  // failed after max_attempts.
  const fs::path seg3 = s.dir / "seg3.dcm";
  copy_as_new_instance(seg, seg3);
  e = send_until_ended(*d, s.control, seg3, "WEB_NO_AUTH");
  CHECK(e["state"] == "failed");
  CHECK(e["attempts"] == 2);
  CHECK_MESSAGE(e["last_error"].get<std::string>().find("HTTP 403 (Forbidden)") != std::string::npos,
                e.dump());

  // 4. Instances Orthanc refuses fail after one attempt, not retried: one it cannot file (no
  // SeriesInstanceUID: 400 with the instance in FailedSOPSequence), one its Lua filter
  // refuses (200, the instance not among those stored).
  const fs::path unfiled = s.dir / "unfiled.dcm";
  copy_without_series(seg, unfiled);
  e = send_until_ended(*d, s.control, unfiled, "WEB");
  CHECK(e["state"] == "failed");
  CHECK(e["attempts"] == 1);
  std::string why = e["last_error"].get<std::string>();
  CHECK_MESSAGE(why.find("refused by " + url + " (not retried): STOW-RS " + url +
                         "/studies: HTTP 400 (Bad Request): FailedSOPSequence: ") != std::string::npos,
                why);
  CHECK_MESSAGE(why.find("FailureReason 0xC000") != std::string::npos, why);
  const fs::path refused = s.dir / "refused.dcm";
  copy_as_new_instance(seg, refused, "refuse me");
  e = send_until_ended(*d, s.control, refused, "WEB");
  CHECK(e["state"] == "failed");
  CHECK(e["attempts"] == 1);
  why = e["last_error"].get<std::string>();
  CHECK_MESSAGE(why.find("HTTP 200 (OK): the answer lists " + e["sop_instance_uid"].get<std::string>() +
                         " neither as stored (ReferencedSOPSequence) nor as failed") != std::string::npos,
                why);
  CHECK(orthanc_segs(orthanc.url(), got) == 2);

  // 5. Orthanc down: the SEG is retried (connection refused) ...
  orthanc.stop();
  const fs::path seg4 = s.dir / "seg4.dcm";
  copy_as_new_instance(seg, seg4);
  const std::int64_t late = ctl_send(s.control, seg4, "WEB");
  e = wait_send(
      *d, s.control, late, [](const json& x) { return x["attempts"].get<int>() >= 2; },
      "retries while Orthanc is down");
  CHECK(e["state"] == "queued");
  CHECK_MESSAGE(
      e["last_error"].get<std::string>().find("STOW-RS: " + url + "/studies: ") != std::string::npos,
      e.dump());
  // ... and survives a SIGKILL of segflowd ...
  d->kill();
  d = s.start("segflowd2.log");
  // ... and arrives once Orthanc is back.
  orthanc.start();
  e = wait_send(
      *d, s.control, late, [](const json& x) { return x["state"] != "queued"; }, "delivery");
  CHECK_MESSAGE(e["state"] == "sent", e.dump());
  CHECK(e["attempts"].get<int>() >= 3);
  CHECK(orthanc_segs(orthanc.url(), got) == 3);
  CHECK(instance_contents({got}).contains(instance_contents({seg4}).begin().key()));

  // The text view names the destination and the STOW-RS outcome of each send.
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  REQUIRE_MESSAGE(ctl.exit_code == 0, ctl.out);
  CHECK_MESSAGE(ctl.out.find("destination WEB: " + url) != std::string::npos, ctl.out);
  CHECK_MESSAGE(
      ctl.out.find(" -> WEB (" + url + "): failed, 1 attempts; last error: refused by") != std::string::npos,
      ctl.out);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE(
    "a study fetched from Orthanc by QIDO-RS and WADO-RS lands in the dataset byte for byte, auto_infer "
    "sends its SEG back by STOW-RS, and a fetch waits out Orthanc being down") {
  if (skip_without_orthanc_dicomweb()) return;
  Setup s;
  const fs::path checkpoint = train_checkpoint(s, 0, segmenting_job(s.data / "tiny"));
  const std::vector<std::string> names = trained_class_names(s.data / "tiny");
  const fs::path syn = synth_dicom(s.dir / "synth", 2, 95);
  TestOrthanc orthanc(s.dir / "orthanc", free_port(), "--dicomweb");
  const std::string url = orthanc.dicomweb();
  const std::vector<fs::path> first = series_files(syn / "case_000"), second = series_files(syn / "case_001");
  json up = json::parse(pacs_tool("upload " + orthanc.url() + quoted_files(first)));
  REQUIRE(up["series"].size() == 1);
  const json mine = instances(first);
  const std::string study = mine.begin().value()["study"].get<std::string>();
  const std::string series = mine.begin().value()["series"].get<std::string>();
  s.write_config(
      "dicom:\n  dataset: incoming\n  destinations:\n    WEB: " + web_destination(url, "max_attempts: 1000") +
      "\n    PACS: {ae_title: PACS, host: 127.0.0.1, port: " + std::to_string(free_port()) +
      "}\nauto_infer:\n  - {dataset: incoming, checkpoint: " + checkpoint.string() +
      ", send_to: WEB, quiet_seconds: 1}\n");
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // 1. The study by QIDO-RS and WADO-RS: every instance as Orthanc holds it, byte for byte.
  const std::int64_t id = fetch_id(ctl_fetch(s.control, "WEB", study));
  json f = wait_fetch(
      *d, s.control, id, [](const json& x) { return x["state"] != "queued" && x["state"] != "running"; },
      "the fetch ends");
  REQUIRE_MESSAGE(f["state"] == "done", f.dump());
  CHECK(f["series_total"] == 1);
  CHECK(f["series_done"] == 1);
  CHECK(f["instances"] == static_cast<std::int64_t>(first.size()));
  const fs::path case_dir = s.data / "incoming" / (study + "_" + series);
  REQUIRE(fs::is_directory(case_dir));
  for (const auto& [uid, info] : mine.items()) {
    const fs::path stored = case_dir / (uid + ".dcm");
    REQUIRE_MESSAGE(fs::exists(stored), stored.string());
    CHECK_MESSAGE(read_file(stored) == read_file(info["file"].get<std::string>()), stored.string());
  }

  // 2. auto_infer takes it as a pushed series: its SEG goes back into Orthanc by STOW-RS.
  auto sent = events.wait_for(
      [](const std::string&, const json& b) { return b["event"] == "sent" || b["event"] == "failed"; }, 120);
  REQUIRE_MESSAGE(sent.has_value(), d->log_tail());
  REQUIRE_MESSAGE((*sent)["event"] == "sent", sent->dump());
  CHECK((*sent)["destination"] == url);
  const fs::path got = s.dir / "from_orthanc";
  REQUIRE(orthanc_segs(orthanc.url(), got) == 1);
  check_seg_on_source(seg_references(got, syn / "case_000"), names);

  // 3. The same study again: stored as it was, no second SEG.
  const std::int64_t again = fetch_id(ctl_fetch(s.control, "WEB", study));
  wait_fetch(
      *d, s.control, again, [](const json& x) { return x["state"] == "done"; }, "the second fetch");
  CHECK(eventually(
      [&] {
        return read_file(s.dir / "segflowd.log").find("the same instances as before") != std::string::npos;
      },
      30));

  // 4. Bad requests name the field; a study Orthanc does not have fails the fetch at once.
  auto bad = ctl_fetch(s.control, "PACS", study);
  CHECK(bad.exit_code != 0);
  CHECK_MESSAGE(
      bad.out.find("from: PACS: not a DICOMweb destination (expected one of WEB)") != std::string::npos,
      bad.out);
  bad = ctl_fetch(s.control, "WEB", "1.2.x");
  CHECK(bad.exit_code != 0);
  CHECK_MESSAGE(bad.out.find("study: expected a StudyInstanceUID") != std::string::npos, bad.out);
  bad = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom fetch --study " + study);
  CHECK(bad.exit_code != 0);
  CHECK_MESSAGE(bad.out.find("--from: missing") != std::string::npos, bad.out);
  const std::int64_t none = fetch_id(ctl_fetch(s.control, "WEB", "1.2.3.4.5.6.7"));
  f = wait_fetch(
      *d, s.control, none, [](const json& x) { return x["state"] == "failed"; }, "the unknown study fails");
  CHECK(f["attempts"] == 1);
  CHECK_MESSAGE(
      f["last_error"].get<std::string>().find("has no series of study 1.2.3.4.5.6.7") != std::string::npos,
      f.dump());

  // 5. One series of another study, asked for while Orthanc is down: retried until it is back.
  up = json::parse(pacs_tool("upload " + orthanc.url() + quoted_files(second)));
  const json theirs = instances(second);
  const std::string study2 = theirs.begin().value()["study"].get<std::string>();
  const std::string series2 = theirs.begin().value()["series"].get<std::string>();
  orthanc.stop();
  const std::int64_t late = fetch_id(ctl_fetch(s.control, "WEB", study2, "--series " + series2));
  f = wait_fetch(
      *d, s.control, late, [](const json& x) { return x["attempts"].get<int>() >= 2; },
      "fetch retries while Orthanc is down");
  CHECK(f["state"] == "queued");
  CHECK_MESSAGE(f["last_error"].get<std::string>().find(url + "/studies/" + study2) != std::string::npos,
                f.dump());
  orthanc.start();
  f = wait_fetch(
      *d, s.control, late, [](const json& x) { return x["state"] == "done"; }, "the late fetch", 60);
  CHECK(f["instances"] == static_cast<std::int64_t>(second.size()));
  CHECK(fs::is_directory(s.data / "incoming" / (study2 + "_" + series2)));
  REQUIRE_MESSAGE(eventually([&] { return orthanc_segs(orthanc.url(), got) == 2; }, 120), d->log_tail());
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  REQUIRE_MESSAGE(ctl.exit_code == 0, ctl.out);
  CHECK_MESSAGE(ctl.out.find("fetches: 0 queued, 0 running, 3 done, 1 failed") != std::string::npos, ctl.out);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}
