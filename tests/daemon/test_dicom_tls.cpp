// DICOM TLS on both sides of segflowd, against real peers: DCMTK's storescu and storescp with
// +tls (Debian's dcmtk), and Orthanc's DICOM TLS port. The certificates are made with openssl
// at test time (make_test_pki); nothing secret is committed.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "daemon/config.hpp"
#include "daemon/daemon_harness.hpp"
#include "daemon/dicom_fixtures.hpp"
#include "dicom_test_data.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

/// The daemon config's error for `yaml` (parsed and finalized as segflowd does at start).
std::string config_error(const std::string& yaml) {
  auto cfg = segflow::daemon::parse_daemon_config(yaml, "daemon.yaml");
  if (!cfg.is_ok()) return cfg.status().message();
  segflow::daemon::DaemonConfig c = *cfg;
  const segflow::Status st = segflow::daemon::finalize_daemon_config(c);
  REQUIRE_MESSAGE(!st.is_ok(), ("accepted: " + yaml));
  return st.message();
}

/// The dicom.tls section of a TLS listener on `port` with the test PKI's server certificate.
std::string node_tls(const TestPki& pki, int port, bool require_client_certificate) {
  return "  tls:\n    port: " + std::to_string(port) +
         "\n    certificate: " + pki.file("server.pem").string() +
         "\n    private_key: " + pki.file("server.key").string() + "\n    trusted_cas: [" +
         pki.file("ca.pem").string() +
         "]\n    require_client_certificate: " + (require_client_certificate ? "true" : "false") + "\n";
}

/// storescu over TLS ("+tls KEY CERT" or "+tla") trusting `ca`, to SEGFLOW on `port`.
CommandResult storescu_tls(int port, const std::vector<fs::path>& files, const std::string& identity,
                           const fs::path& ca) {
  return storescu(port, files, identity + " +cf " + shell_quote(ca.string()));
}

/// The number of case folders of the incoming dataset.
std::size_t incoming_cases(const fs::path& data) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(data / "incoming", ec)) n += e.is_directory();
  return n;
}

}  // namespace

TEST_CASE(
    "the TLS and DICOMweb keys of the dicom section are checked at start, naming file, key and expected") {
  Setup s;
  const TestPki pki = make_test_pki(s.dir / "pki");
  const std::string cert = pki.file("server.pem").string(), key = pki.file("server.key").string(),
                    ca = pki.file("ca.pem").string();
  const std::string client_key = pki.file("client.key").string();
  const std::string listener = "dicom: {tls: {port: 2762, certificate: " + cert + ", private_key: " + key;
  const std::string web = "dicom:\n  destinations:\n    WEB: {kind: dicomweb, url: ";
  const std::string no_token = (s.dir / "no-token").string(), empty_token = (s.dir / "empty-token").string();
  write_file(empty_token, "\n");
  struct Bad {
    std::string yaml, expected;  ///< the config, and a part of its error
  };
  // clang-format off
  const Bad bad[] = {
      // The TLS listener.
      {"dicom: {tls: {port: 2762}}", "daemon.yaml: dicom.tls.certificate: missing (the TLS listener needs a certificate)"},
      {"dicom: {tls: {port: 2762, certificate: " + cert + "}}",
       "dicom.tls.private_key: missing (certificate and private_key go together)"},
      {listener + "}}", "dicom.tls.trusted_cas: missing (expected the CA files client certificates are checked against"},
      {"dicom: {port: 2762, tls: {port: 2762, certificate: " + cert + ", private_key: " + key + ", trusted_cas: [" + ca + "]}}",
       "dicom.tls.port: expected a port other than dicom.port (2762)"},
      {listener + ", trusted_cas: [" + ca + "], profile: tls13}}",
       "dicom.tls.profile: expected one of bcp195-nd, bcp195, bcp195-extended, got \"tls13\""},
      {"dicom: {tls: {port: 2762, certificate: " + cert + ", private_key: " + client_key + ", trusted_cas: [" + ca + "]}}",
       "daemon.yaml: dicom.tls.private_key: " + client_key + ": is not the private key of " + cert},
      {listener + ", trusted_cas: [" + ca + ", /nonexistent/ca.pem]}}",
       "dicom.tls.trusted_cas[1]: /nonexistent/ca.pem: cannot read a PEM CA certificate"},
      {"dicom: {tls: {port: 2762, certificate: " + ca + ".missing, private_key: " + key + ", trusted_cas: [" + ca + "]}}",
       "dicom.tls.certificate: " + ca + ".missing: cannot read a PEM certificate"},
      // A TLS destination.
      {"dicom: {send_to: {ae_title: PACS, host: pacs, port: 2762, tls: {certificate: " + cert + ", private_key: " + key + "}}}",
       "dicom.send_to.tls.trusted_cas: missing (expected the CA files the peer's certificate is checked against)"},
      {"dicom: {send_to: {ae_title: PACS, host: pacs, port: 2762, tls: {trusted_cas: [" + ca + "], verify_host: false}}}",
       "dicom.send_to.tls.verify_host: unknown key; expected certificate, private_key, trusted_cas, profile, verify_peer_name"},
      // DICOMweb destinations.
      {"dicom:\n  destinations:\n    WEB: {kind: dicomweb}", "dicom.destinations.WEB.url: missing"},
      {web + "ftp://pacs/dicom-web}",
       "dicom.destinations.WEB.url: expected an http:// or https:// URL without query or fragment, got \"ftp://pacs/dicom-web\""},
      {web + "'http://pacs/dicom-web', ae_title: PACS}", "dicom.destinations.WEB.ae_title: used only with kind: dimse, got kind: dicomweb"},
      {"dicom:\n  destinations:\n    WEB: {ae_title: PACS, host: pacs, port: 104, url: 'http://pacs/dicom-web'}",
       "dicom.destinations.WEB.url: used only with kind: dicomweb, got kind: dimse"},
      {web + "'http://pacs/dicom-web', auth: basic}",
       "dicom.destinations.WEB.username: missing (auth: basic needs username and password_file)"},
      {web + "'http://pacs/dicom-web', auth: bearer}", "dicom.destinations.WEB.token_file: missing (auth: bearer needs token_file)"},
      {web + "'http://pacs/dicom-web', auth: oauth}", "dicom.destinations.WEB.auth: expected one of none, basic, bearer, got \"oauth\""},
      {web + "'http://pacs/dicom-web', token_file: /t}", "dicom.destinations.WEB.token_file: used only with auth: bearer, got auth: none"},
      {web + "'https://pacs/dicom-web', auth: bearer, token_file: " + no_token + "}",
       "daemon.yaml: dicom.destinations.WEB.token_file: " + no_token + ": cannot read the file"},
      {web + "'https://pacs/dicom-web', auth: bearer, token_file: " + empty_token + "}",
       "dicom.destinations.WEB.token_file: " + empty_token + ": expected a secret, got an empty file"},
      {web + "'http://pacs/dicom-web', tls: {trusted_cas: [" + ca + "]}}",
       "dicom.destinations.WEB.tls: used only with an https:// url, got http://pacs/dicom-web"},
      {web + "'https://pacs/dicom-web', tls: {trusted_cas: [" + ca + "], profile: bcp195}}",
       "dicom.destinations.WEB.tls.profile: unknown key; expected certificate, private_key, trusted_cas"},
      {web + "'https://pacs/dicom-web'}\nauto_infer:\n  - {dataset: incoming, checkpoint: " + cert + ", send_to: PACS}\n",
       "auto_infer[0].send_to: PACS: no such DICOM destination (expected one of WEB)"},
  };
  // clang-format on
  for (const auto& b : bad) {
    CAPTURE(b.yaml);
    const std::string error = config_error(b.yaml);
    CHECK_MESSAGE(error.find(b.expected) != std::string::npos, error);
  }

  // A good config: the paths are made absolute and the kinds read.
  write_file(s.dir / "token", "s3cret-token\n");
  REQUIRE_OK_AND_ASSIGN(auto good,
                        segflow::daemon::parse_daemon_config(
                            "dicom:\n" + node_tls(pki, 2762, true) +
                                "  destinations:\n    WEB: {kind: dicomweb, "
                                "url: 'https://pacs.example.org/dicom-web/', auth: bearer, token_file: " +
                                (s.dir / "token").string() +
                                "}\n    PACS: {ae_title: PACS, host: 127.0.0.1, port: "
                                "2762, tls: {trusted_cas: [" +
                                ca + "]}}\n",
                            "daemon.yaml"));
  REQUIRE_OK(segflow::daemon::finalize_daemon_config(good));
  CHECK(good.dicom.listening());
  CHECK(good.dicom.tls.require_client_certificate);
  CHECK(good.dicom.tls.profile == "bcp195-nd");
  const auto& w = good.dicom.destinations.at("WEB");
  CHECK(w.kind == segflow::daemon::dicom::DestinationKind::dicomweb);
  CHECK(w.url == "https://pacs.example.org/dicom-web");  // the trailing '/' dropped
  CHECK(segflow::daemon::dicom::destination_text(good.dicom.destinations.at("PACS")) ==
        "PACS@127.0.0.1:2762 (TLS)");

  // segflowd itself stops at start with the message (exit status 2).
  s.write_config("dicom: {tls: {port: " + std::to_string(free_port()) + ", certificate: " + cert +
                 ", private_key: " + pki.file("client.key").string() + ", trusted_cas: [" + ca + "]}}\n");
  ChildProcess d = start_segflowd({"--config", s.config.string()}, s.dir / "bad.log");
  CHECK(d.wait_exit(60) == 2);
  CHECK_MESSAGE(d.log_tail().find("dicom.tls.private_key: " + pki.file("client.key").string() +
                                  ": is not the private key of") != std::string::npos,
                d.log_tail());
}

TEST_CASE(
    "the DICOM TLS port stores what storescu +tls sends and refuses a plain client, an untrusted certificate "
    "and none, logging the peer and storing nothing of them") {
  require_dcmtk_tools();
  Setup s;
  const TestPki pki = make_test_pki(s.dir / "pki");
  const fs::path syn = synth_dicom(s.dir / "synth", 3, 71);
  const int port = free_port(), tls = free_port();
  s.write_config(dicom_section(port, node_tls(pki, tls, true)));
  auto d = s.start();
  const std::string client = "+tls " + shell_quote(pki.file("client.key").string()) + " " +
                             shell_quote(pki.file("client.pem").string());

  // 1. storescu with a client certificate of the trusted CA, checking the node's: stored.
  auto r = storescu_tls(tls, series_files(syn / "case_000"), client, pki.file("ca.pem"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_incoming(
      *d, s.control, [](const json& e) { return e["unlabelled"] == 1; }, "the TLS push is indexed");
  json st = node_stats(s.control);
  CHECK(st["tls_address"] == "127.0.0.1:" + std::to_string(tls));
  CHECK(st["recent"][0]["tls"] == true);
  CHECK(st["recent"][0]["outcome"] == "completed");
  const json sent = instance_contents(series_files(syn / "case_000"));
  std::vector<fs::path> stored;
  for (const auto& e : fs::directory_iterator(s.data / "incoming"))
    for (const auto& f : fs::directory_iterator(e.path())) stored.push_back(f.path());
  CHECK(instance_contents(stored) == sent);  // what arrived is what was sent, read by pydicom

  // 2. Refused handshakes, each counted and logged with the peer's address, nothing stored:
  // a plain client on the TLS port, a client certificate of another CA, no client certificate
  // (require_client_certificate), and a client that does not trust the node's CA.
  const std::vector<fs::path> other = series_files(syn / "case_001");
  r = storescu(tls, other);
  CHECK(r.exit_code != 0);
  r = storescu_tls(tls, other,
                   "+tls " + shell_quote(pki.file("rogue_client.key").string()) + " " +
                       shell_quote(pki.file("rogue_client.pem").string()),
                   pki.file("ca.pem"));
  CHECK(r.exit_code != 0);
  r = storescu_tls(tls, other, "+tla", pki.file("ca.pem"));
  CHECK(r.exit_code != 0);
  r = storescu_tls(tls, other, client, pki.file("rogue_ca.pem"));
  CHECK(r.exit_code != 0);
  st = wait_node(
      *d, s.control, [](const json& n) { return n["tls_handshakes_refused"] == 4; },
      "four refused TLS handshakes");
  CHECK_MESSAGE(
      st["last_error"].get<std::string>().find("TLS handshake with 127.0.0.1 on port " + std::to_string(tls) +
                                               " refused") != std::string::npos,
      st.dump());
  CHECK(st["associations_received"] == 1);
  CHECK(st["instances_stored"] == static_cast<std::int64_t>(sent.size()));
  const std::string log = read_file(s.dir / "segflowd.log");
  CHECK(log.find("dicom: TLS handshake with 127.0.0.1 on port " + std::to_string(tls) + " refused") !=
        std::string::npos);
  CHECK(incoming_cases(s.data) == 1);

  // 3. The plain port stays open beside it, and `segflow ctl dicom` shows both.
  r = storescu(port, series_files(syn / "case_002"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  wait_incoming(
      *d, s.control, [](const json& e) { return e["unlabelled"] == 2; }, "the plain push is indexed");
  auto ctl = run_segflow("ctl --endpoint " + shell_quote(s.control) + " dicom");
  REQUIRE_MESSAGE(ctl.exit_code == 0, ctl.out);
  CHECK_MESSAGE(ctl.out.find("127.0.0.1:" + std::to_string(port) + " and 127.0.0.1:" + std::to_string(tls) +
                             " (TLS)") != std::string::npos,
                ctl.out);
  CHECK_MESSAGE(ctl.out.find("TLS handshakes refused: 4") != std::string::npos, ctl.out);
  CHECK(incoming_cases(s.data) == 2);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE(
    "SEGs go by C-STORE over DICOM TLS to storescp +tls and to Orthanc; a wrong CA, a certificate for "
    "another host and a missing client certificate fail the send") {
  require_dcmtk_tools();
  Setup s;
  const TestPki pki = make_test_pki(s.dir / "pki");
  const fs::path syn = synth_dicom(s.dir / "synth", 2, 81);
  const fs::path seg = syn / "case_000" / "seg.dcm";
  REQUIRE(fs::exists(seg));
  const fs::path received = s.dir / "received";
  fs::create_directories(received);
  const int scp_port = free_port();
  auto file = [&](const char* n) { return pki.file(n).string(); };
  // storescp over TLS (BCP 195 non-downgrading), requiring a client certificate of the CA.
  auto scp_ptr = std::make_unique<ChildProcess>(
      std::vector<std::string>{"storescp", "+tls", file("server.key"), file("server.pem"), "+cf",
                               file("ca.pem"), "-aet", "RECEIVER", "-od", received.string(),
                               std::to_string(scp_port)},
      std::vector<std::string>{}, s.dir / "storescp.log");
  const bool orthanc = have_orthanc();
  std::unique_ptr<TestOrthanc> pacs;
  if (orthanc)
    pacs = std::make_unique<TestOrthanc>(s.dir / "orthanc", free_port(),
                                         "--tls " + file("server.pem") + " " + file("server.key") + " " +
                                             file("ca.pem") + " --require-client-cert");
  auto dest = [&](const std::string& ae, int p, const std::string& tls) {
    return "{ae_title: " + ae + ", host: 127.0.0.1, port: " + std::to_string(p) +
           ", retry_initial_s: 0.2, retry_max_s: 0.2, max_attempts: 2, tls: {" + tls + "}}";
  };
  const std::string me = "certificate: " + file("client.pem") + ", private_key: " + file("client.key");
  std::string config =
      "dicom:\n  destinations:\n    TLS_SCP: " +
      dest("RECEIVER", scp_port, "trusted_cas: [" + file("ca.pem") + "], " + me) +
      "\n    WRONG_CA: " + dest("RECEIVER", scp_port, "trusted_cas: [" + file("rogue_ca.pem") + "], " + me) +
      "\n    NO_CLIENT_CERT: " + dest("RECEIVER", scp_port, "trusted_cas: [" + file("ca.pem") + "]") + "\n";
  if (orthanc)
    config += "    ORTHANC_TLS: " +
              dest("ORTHANC", pacs->dicom_port(), "trusted_cas: [" + file("ca.pem") + "], " + me) + "\n";
  s.write_config(config);
  auto d = s.start();

  // 1. storescp: the SEG arrives, as sent.
  json e = send_until_ended(*d, s.control, seg, "TLS_SCP");
  CHECK_MESSAGE(e["state"] == "sent", e.dump());
  CHECK(e["destination"] == "RECEIVER@127.0.0.1:" + std::to_string(scp_port) + " (TLS)");
  REQUIRE(files_in(received).size() == 1);
  CHECK(instance_contents({received}) == instance_contents({seg}));

  // 2. The peer's certificate is not of the trusted CA: the handshake fails on our side,
  // retried, then failed; nothing arrives.
  e = send_until_ended(*d, s.control, seg, "WRONG_CA");
  CHECK(e["state"] == "failed");
  CHECK(e["attempts"] == 2);
  CHECK_MESSAGE(
      e["last_error"].get<std::string>().find("association with RECEIVER@127.0.0.1") != std::string::npos,
      e.dump());
  // 3. No client certificate: storescp refuses the handshake.
  e = send_until_ended(*d, s.control, seg, "NO_CLIENT_CERT");
  CHECK(e["state"] == "failed");
  CHECK(files_in(received).size() == 1);

  // 4. Orthanc's DICOM TLS port (client certificate required): the SEG is stored there.
  if (orthanc) {
    e = send_until_ended(*d, s.control, syn / "case_001" / "seg.dcm", "ORTHANC_TLS");
    CHECK_MESSAGE(e["state"] == "sent", (e.dump() + "\n" + pacs->log_tail()));
    const fs::path got = s.dir / "from_orthanc";
    CHECK(orthanc_segs(pacs->url(), got) == 1);
    CHECK(instance_contents({got}) == instance_contents({syn / "case_001" / "seg.dcm"}));
  }
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);

  // 5. A certificate of the trusted CA for another host: refused by the peer-name check (the
  // same destination with verify_peer_name: false goes through).
  scp_ptr.reset();
  ChildProcess scp3({"storescp", "+tls", file("other_host.key"), file("other_host.pem"), "+cf",
                     file("ca.pem"), "-aet", "RECEIVER", "-od", received.string(), std::to_string(scp_port)},
                    {}, s.dir / "storescp3.log");
  const std::string ca_and_me = "trusted_cas: [" + file("ca.pem") + "], " + me;
  s.write_config("dicom:\n  destinations:\n    NAMED: " + dest("RECEIVER", scp_port, ca_and_me) +
                 "\n    UNNAMED: " + dest("RECEIVER", scp_port, ca_and_me + ", verify_peer_name: false") +
                 "\n");
  d = s.start("segflowd2.log");
  const fs::path seg2 = s.dir / "seg2.dcm";
  copy_as_new_instance(seg, seg2);
  e = send_until_ended(*d, s.control, seg2, "NAMED");
  CHECK(e["state"] == "failed");
  e = send_until_ended(*d, s.control, seg2, "UNNAMED");
  CHECK_MESSAGE(e["state"] == "sent", e.dump());
  CHECK(files_in(received).size() == 2);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}
