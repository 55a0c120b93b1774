// DICOMweb on segflowd, against a real server: Orthanc with Debian's DICOMweb plugin
// (orthanc-dicomweb), started by the test on its own loopback ports and storage. SEGs go out
// by STOW-RS through the persistent, retried send queue. Orthanc's Lua filters make it check an Authorization
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
  const std::int64_t first = ctl_send(s.control, seg, "WEB");
  json e = wait_send(
      *d, s.control, first, [](const json& x) { return x["state"] != "queued"; }, "STOW-RS");
  REQUIRE_MESSAGE(e["state"] == "sent", (e.dump() + "\n" + orthanc.log_tail()));
  CHECK(e["attempts"] == 1);
  CHECK(e["destination"] == url);
  REQUIRE(orthanc_segs(orthanc.url(), got) == 1);
  CHECK(instance_contents({got}) == instance_contents({seg}));

  // 2. Basic authentication: another SEG.
  const fs::path seg2 = s.dir / "seg2.dcm";
  copy_as_new_instance(seg, seg2);
  e = wait_send(
      *d, s.control, ctl_send(s.control, seg2, "WEB_BASIC"),
      [](const json& x) { return x["state"] != "queued"; }, "STOW-RS with basic auth");
  CHECK_MESSAGE(e["state"] == "sent", e.dump());
  CHECK(orthanc_segs(orthanc.url(), got) == 2);

  // 3. No credentials: Orthanc answers 403, which is retried (credentials may be fixed), then
  // failed after max_attempts.
  const fs::path seg3 = s.dir / "seg3.dcm";
  copy_as_new_instance(seg, seg3);
  e = wait_send(
      *d, s.control, ctl_send(s.control, seg3, "WEB_NO_AUTH"),
      [](const json& x) { return x["state"] != "queued"; }, "STOW-RS without credentials");
  CHECK(e["state"] == "failed");
  CHECK(e["attempts"] == 2);
  CHECK_MESSAGE(e["last_error"].get<std::string>().find("HTTP 403 (Forbidden)") != std::string::npos,
                e.dump());

  // 4. Instances Orthanc refuses fail after one attempt, not retried: one it cannot file (no
  // SeriesInstanceUID: 400 with the instance in FailedSOPSequence), one its Lua filter
  // refuses (200, the instance not among those stored).
  const fs::path unfiled = s.dir / "unfiled.dcm";
  copy_without_series(seg, unfiled);
  e = wait_send(
      *d, s.control, ctl_send(s.control, unfiled, "WEB"),
      [](const json& x) { return x["state"] != "queued"; }, "the STOW-RS Orthanc cannot file");
  CHECK(e["state"] == "failed");
  CHECK(e["attempts"] == 1);
  std::string why = e["last_error"].get<std::string>();
  CHECK_MESSAGE(why.find("refused by " + url + " (not retried): STOW-RS " + url +
                         "/studies: HTTP 400 (Bad Request): FailedSOPSequence: ") != std::string::npos,
                why);
  CHECK_MESSAGE(why.find("FailureReason 0xC000") != std::string::npos, why);
  const fs::path refused = s.dir / "refused.dcm";
  copy_as_new_instance(seg, refused, "refuse me");
  e = wait_send(
      *d, s.control, ctl_send(s.control, refused, "WEB"),
      [](const json& x) { return x["state"] != "queued"; }, "the STOW-RS Orthanc's filter refuses");
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
