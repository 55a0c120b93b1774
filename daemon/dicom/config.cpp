#include "daemon/dicom/config.hpp"

#include <arpa/inet.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmtls/tlslayer.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon/dicom/tls.hpp"
#include "messages/log.hpp"
#include "pipeline/options.hpp"

namespace segflow::daemon::dicom {

using pipeline::OptionParser;
using pipeline::Range;

namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(' ');
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(' ') - b + 1);
}

/// An AE title key: a valid title, stored without its insignificant spaces.
void read_ae_title(OptionParser& p, const char* key, std::string& field, const char* doc) {
  p.string(key, field, doc);
  if (!p.ok() || !p.given(key)) return;
  if (!is_valid_ae_title(field))
    p.fail(key, "expected an AE title of 1-16 printable characters without backslash, got \"" + field + "\"");
  field = trimmed(field);
}

}  // namespace

bool is_valid_ae_title(const std::string& ae) {
  if (ae.empty() || ae.size() > 16) return false;
  for (unsigned char c : ae)
    if (c < 0x20 || c > 0x7e || c == '\\') return false;
  return !trimmed(ae).empty();
}

bool is_loopback_ipv4(const std::string& address) {
  in_addr a{};
  if (::inet_pton(AF_INET, address.c_str(), &a) != 1) return false;
  return (ntohl(a.s_addr) >> 24) == 127;
}

const char* to_string(DestinationKind kind) {
  switch (kind) {
    case DestinationKind::dimse:
      return "dimse";
    case DestinationKind::dicomweb:
      return "dicomweb";
  }
  return "?";
}

const char* to_string(WebAuth auth) {
  switch (auth) {
    case WebAuth::none:
      return "none";
    case WebAuth::basic:
      return "basic";
    case WebAuth::bearer:
      return "bearer";
  }
  return "?";
}

bool is_valid_uid(const std::string& uid) {
  if (uid.empty() || uid.size() > 64 || uid.front() == '.' || uid.back() == '.') return false;
  char prev = '.';
  for (char c : uid) {
    if (c != '.' && (c < '0' || c > '9')) return false;
    if (c == '.' && prev == '.') return false;
    prev = c;
  }
  return true;
}

namespace {

// clang-format off
/// The keys of each destination kind (a key of the other kind is an error naming the kind).
const char* const kDimseKeys[] = {"ae_title", "host", "port"};
const char* const kWebKeys[] = {"url", "auth", "username", "password_file", "token_file", "timeout_s"};
// clang-format on

/// The TLS files of a section: certificate and private_key go together; trusted_cas is a
/// list of paths.
void bind_tls_files(OptionParser& p, TlsFiles& t, bool with_profile) {
  p.string("certificate", t.certificate, "PEM certificate of this side");
  p.string("private_key", t.private_key, "its PEM private key (unencrypted)");
  p.string_list("trusted_cas", t.trusted_cas, false, "PEM CA files, or folders of hashed CA files");
  if (with_profile)
    p.choice("profile", t.profile, {"bcp195-nd", "bcp195", "bcp195-extended"},
             "the DICOM TLS profile (BCP 195 cipher suites and TLS versions)");
  if (!p.ok()) return;
  if (t.certificate.empty() != t.private_key.empty())
    p.fail(t.certificate.empty() ? "certificate" : "private_key",
           "missing (certificate and private_key go together)");
  for (std::size_t i = 0; i < t.trusted_cas.size() && p.ok(); ++i)
    if (t.trusted_cas[i].empty())
      p.fail("trusted_cas[" + std::to_string(i) + "]", "expected a path, got \"\"");
}

}  // namespace

void NodeTls::bind(OptionParser& p) {
  p.integer("port", port, Range::closed(0, 65535), "", "TCP port of the DICOM TLS listener; 0 = off");
  bind_tls_files(p, *this, true);
  p.boolean("require_client_certificate", require_client_certificate,
            "refuse clients that present no certificate signed by trusted_cas");
  if (!p.ok() || !enabled()) return;
  if (certificate.empty()) return p.fail("certificate", "missing (the TLS listener needs a certificate)");
  if (trusted_cas.empty())
    return p.fail("trusted_cas",
                  "missing (expected the CA files client certificates are checked against, e.g. [ca.pem])");
}

void DicomDestination::bind_dimse(OptionParser& p) {
  for (const char* k : kDimseKeys)
    if (!p.given(k)) return p.fail(k, "missing (a DICOM destination needs ae_title, host and port)");
  read_ae_title(p, "ae_title", ae_title, "the destination's AE title");
  p.string("host", host, "the destination's host name or address");
  if (p.ok() && host.empty()) p.fail("host", "expected a host name or address, got \"\"");
  p.integer("port", port, Range::closed(1, 65535), "", "the destination's TCP port");
}

void DicomDestination::bind_dicomweb(OptionParser& p) {
  if (!p.given("url")) return p.fail("url", "missing (a dicomweb destination needs the DICOMweb base url)");
  p.string("url", url, "the DICOMweb base URL, e.g. https://pacs.example.org/dicom-web");
  if (!p.ok()) return;
  const bool scheme = url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0;
  const auto host_at = url.find("://") + 3;
  if (!scheme || url.size() <= host_at || url[host_at] == '/' ||
      url.find_first_of(" \t\r\n?#") != std::string::npos)
    return p.fail("url",
                  "expected an http:// or https:// URL without query or fragment, got \"" + url + "\"");
  while (url.size() > host_at + 1 && url.back() == '/') url.pop_back();
  std::string a = "none";
  p.choice("auth", a, {"none", "basic", "bearer"}, "HTTP authentication");
  auth = a == "basic" ? WebAuth::basic : a == "bearer" ? WebAuth::bearer : WebAuth::none;
  p.string("username", username, "auth basic: the user name");
  p.string("password_file", password_file, "auth basic: a file holding the password");
  p.string("token_file", token_file, "auth bearer: a file holding the token");
  p.number("timeout_s", timeout_s, Range::closed(1, 3600), "s",
           "connect timeout, and the longest time a transfer may move no byte");
  if (!p.ok()) return;
  const bool basic = auth == WebAuth::basic, bearer = auth == WebAuth::bearer;
  if (basic && username.empty())
    return p.fail("username", "missing (auth: basic needs username and password_file)");
  if (basic && password_file.empty())
    return p.fail("password_file", "missing (auth: basic needs username and password_file)");
  if (bearer && token_file.empty()) return p.fail("token_file", "missing (auth: bearer needs token_file)");
  if (!basic && (!username.empty() || !password_file.empty()))
    return p.fail(username.empty() ? "password_file" : "username",
                  std::string("used only with auth: basic, got auth: ") + to_string(auth));
  if (!bearer && !token_file.empty())
    return p.fail("token_file", std::string("used only with auth: bearer, got auth: ") + to_string(auth));
  if (auth != WebAuth::none && url.rfind("http://", 0) == 0)
    log::warn(p.path_of("auth") + ": credentials go to " + url + " unencrypted (http, not https)");
}

void DicomDestination::bind_tls(OptionParser& p) {
  const nlohmann::json* given = p.given("tls");
  nlohmann::json section = nlohmann::json::object();
  p.json_value("tls", section, "mapping", "TLS: trusted_cas, certificate, private_key, ...");
  if (!p.ok() || !given) return;
  if (!section.is_object())
    return p.fail("tls", "expected a mapping {trusted_cas, certificate, private_key}, got " +
                             pipeline::format_value(section));
  OptionParser nested(section, p.path_of("tls"));
  nested.name_keys("key");
  const bool web = kind == DestinationKind::dicomweb;
  bind_tls_files(nested, tls, !web);
  if (!web)
    nested.boolean("verify_peer_name", tls.verify_peer_name,
                   "the peer's certificate must name host (subjectAltName or common name)");
  if (nested.ok() && !web && tls.trusted_cas.empty())
    nested.fail("trusted_cas", "missing (expected the CA files the peer's certificate is checked against)");
  p.add_error(nested.finish());
  tls.enabled = p.ok();
  if (p.ok() && web && url.rfind("http://", 0) == 0)
    p.fail("tls", "used only with an https:// url, got " + url);
}

void DicomDestination::bind(OptionParser& p) {
  std::string k = to_string(kind);
  p.choice("kind", k, {"dimse", "dicomweb"}, "dimse (C-STORE to a DICOM peer) or dicomweb (STOW-RS)");
  if (!p.ok()) return;
  kind = k == "dicomweb" ? DestinationKind::dicomweb : DestinationKind::dimse;
  const bool web = kind == DestinationKind::dicomweb;
  for (const char* key : web ? std::vector<const char*>(std::begin(kDimseKeys), std::end(kDimseKeys))
                             : std::vector<const char*>(std::begin(kWebKeys), std::end(kWebKeys)))
    if (p.given(key))
      return p.fail(key,
                    std::string("used only with kind: ") + (web ? "dimse" : "dicomweb") + ", got kind: " + k);
  if (web)
    bind_dicomweb(p);
  else
    bind_dimse(p);
  if (!p.ok()) return;
  bind_tls(p);
  p.number("retry_initial_s", retry_initial_s, Range::closed(0.01, 86400), "s",
           "delay before the first retry; doubles with each failed attempt");
  p.number("retry_max_s", retry_max_s, Range::closed(0.01, 86400), "s", "the longest delay between attempts");
  p.integer("max_attempts", max_attempts, Range::closed(1, 1000), "",
            "attempts before a send is marked failed");
  if (p.ok() && retry_max_s < retry_initial_s)
    p.fail("retry_max_s", "expected a number >= retry_initial_s (" + std::to_string(retry_initial_s) +
                              "), got " + std::to_string(retry_max_s));
}

void DicomSettings::bind(OptionParser& p) {
  p.integer("port", port, Range::closed(0, 65535), "", "TCP port of the DICOM listener; 0 = off");
  read_ae_title(p, "ae_title", ae_title, "our AE title (the called AE title peers use)");
  p.string("dataset", dataset, "dataset folder under data_root that received series go to");
  if (p.ok()) {
    const bool bad = dataset.empty() || dataset[0] == '.' || dataset.find('/') != std::string::npos ||
                     dataset.ends_with(".partial");
    if (bad)
      p.fail("dataset",
             "expected a folder name (no '/', not starting with '.', not ending in .partial), got \"" +
                 dataset + "\"");
  }
  p.string_list("allowed_calling_aes", allowed_calling_aes, false,
                "calling AE titles admitted; empty = any (only allowed on loopback)");
  if (p.ok())
    for (std::size_t i = 0; i < allowed_calling_aes.size(); ++i) {
      if (!is_valid_ae_title(allowed_calling_aes[i])) {
        p.fail("allowed_calling_aes[" + std::to_string(i) + "]",
               "expected an AE title of 1-16 printable characters without backslash, got \"" +
                   allowed_calling_aes[i] + "\"");
        break;
      }
      allowed_calling_aes[i] = trimmed(allowed_calling_aes[i]);
    }
  p.integer("max_associations", max_associations, Range::closed(1, 64), "",
            "associations served at once; more are rejected (local limit exceeded)");
  p.string("bind", bind_address, "IPv4 address to listen on");
  if (p.ok()) {
    in_addr a{};
    if (::inet_pton(AF_INET, bind_address.c_str(), &a) != 1)
      p.fail("bind", "expected an IPv4 address (127.0.0.1, 0.0.0.0, 10.1.2.3), got \"" + bind_address + "\"");
    else if (!is_loopback_ipv4(bind_address) && allowed_calling_aes.empty())
      p.fail("bind", bind_address +
                         " is not loopback: listening there requires a non-empty dicom.allowed_calling_aes");
  }
  p.integer("max_association_bytes", max_association_bytes,
            Range::closed(4096, double(std::int64_t{1} << 50)), "bytes",
            "data set bytes one association may send; past it the association is aborted");
  p.integer("idle_timeout_s", idle_timeout_s, Range::closed(1, 3600), "s",
            "ACSE and DIMSE timeout: a peer silent this long is cut off");
  p.section("tls", tls, "the DICOM TLS listener: port, certificate, private_key, trusted_cas, ...", "key");
  if (p.ok() && tls.enabled() && tls.port == port)
    p.fail("tls.port", "expected a port other than dicom.port (" + std::to_string(port) + ")");
  if (p.given("send_to"))
    p.section("send_to", send_to, "where `segflow ctl dicom send` delivers results (C-STORE or STOW-RS)",
              "key");
  bind_destinations(p);
}

/// A destination name: 1-64 letters, digits, '_', '-' or '.'.
static bool is_valid_destination_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (unsigned char c : name)
    if (!std::isalnum(c) && c != '_' && c != '-' && c != '.') return false;
  return true;
}

void DicomSettings::bind_destinations(OptionParser& p) {
  nlohmann::json dests = nlohmann::json::object();
  p.json_value("destinations", dests, "mapping",
               "named destinations: {NAME: {ae_title, host, port, ...} or {kind: dicomweb, url, ...}}");
  if (!p.ok()) return;
  if (!dests.is_object())
    return p.fail("destinations",
                  "expected a mapping {NAME: {ae_title, host, port}}, got " + pipeline::format_value(dests));
  destinations.clear();
  for (const auto& [name, value] : dests.items()) {
    const std::string key = "destinations." + name;
    if (!is_valid_destination_name(name))
      return p.fail(key, "expected a name of 1-64 letters, digits, '_', '-' or '.', got \"" + name + "\"");
    if (!value.is_object())
      return p.fail(key, "expected a mapping {ae_title, host, port}, got " + pipeline::format_value(value));
    OptionParser nested(value, p.path_of(key));
    nested.name_keys("key");
    DicomDestination d;
    d.bind(nested);
    p.add_error(nested.finish());
    if (!p.ok()) return;
    destinations[name] = d;
  }
}

const DicomDestination* DicomSettings::destination(const std::string& target) const {
  if (target.empty()) return send_to.enabled() ? &send_to : nullptr;
  auto it = destinations.find(target);
  return it == destinations.end() ? nullptr : &it->second;
}

Result<std::string> DicomSettings::resolve(const std::string& name) const {
  if (destinations.count(name)) return name;
  const bool send_to_ae = send_to.enabled() && send_to.kind == DestinationKind::dimse;
  if (send_to_ae && send_to.ae_title == name) return std::string();
  std::string known;
  for (const auto& [n, d] : destinations) known += (known.empty() ? "" : ", ") + n;
  if (send_to_ae) known += (known.empty() ? "" : ", ") + send_to.ae_title + " (dicom.send_to)";
  return invalid_argument(
      name + ": no such DICOM destination (expected " +
      (known.empty() ? std::string("a name of dicom.destinations; none is configured") : "one of " + known) +
      ")");
}

Result<const DicomDestination*> DicomSettings::web_source(const std::string& name) const {
  auto it = destinations.find(name);
  if (it != destinations.end() && it->second.kind == DestinationKind::dicomweb) return &it->second;
  std::string known;
  for (const auto& [n, d] : destinations)
    if (d.kind == DestinationKind::dicomweb) known += (known.empty() ? "" : ", ") + n;
  const std::string what =
      it == destinations.end() ? "no such DICOM destination" : "not a DICOMweb destination";
  return invalid_argument(name + ": " + what + " (expected " +
                          (known.empty() ? std::string("a destination of kind dicomweb; none is configured")
                                         : "one of " + known) +
                          ")");
}

std::string destination_text(const DicomDestination& d) {
  if (d.kind == DestinationKind::dicomweb) return d.url;
  return d.ae_title + "@" + d.host + ":" + std::to_string(d.port) + (d.tls.enabled ? " (TLS)" : "");
}

namespace {

/// A path made absolute against the working folder.
void make_absolute(std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  path = std::filesystem::absolute(path, ec).lexically_normal().string();
}

void make_absolute(TlsFiles& t) {
  make_absolute(t.certificate);
  make_absolute(t.private_key);
  for (auto& ca : t.trusted_cas) make_absolute(ca);
}

/// A secret file (password, token): readable and not empty.
Status check_secret_file(std::string& path, const std::string& key) {
  make_absolute(path);
  auto text = read_secret_file(path);
  if (!text.is_ok()) return invalid_config(key + ": " + text.status().message());
  return Status::ok();
}

Status check_destination(DicomDestination& d, const std::string& key) {
  make_absolute(d.tls);
  if (d.kind == DestinationKind::dicomweb) {
    if (d.auth == WebAuth::basic)
      SEGFLOW_RETURN_IF_ERROR(check_secret_file(d.password_file, key + ".password_file"));
    if (d.auth == WebAuth::bearer)
      SEGFLOW_RETURN_IF_ERROR(check_secret_file(d.token_file, key + ".token_file"));
    std::error_code ec;
    for (std::size_t i = 0; i < d.tls.trusted_cas.size(); ++i)
      if (std::filesystem::is_directory(d.tls.trusted_cas[i], ec))
        return invalid_config(key + ".tls.trusted_cas[" + std::to_string(i) + "]: " + d.tls.trusted_cas[i] +
                              ": expected a PEM file (folders of hashed CAs are taken for DIMSE TLS only)");
  }
  if (!d.tls.enabled) return Status::ok();
  // The files are loaded as a requestor's layer would load them: errors name the key.
  return make_tls_layer(d.tls, TlsRole::requestor, {}, key + ".tls").status();
}

}  // namespace

Result<std::string> read_secret_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot read the file");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return invalid_config(path + ": expected a secret, got an empty file");
  if (text.find_first_of("\r\n") != std::string::npos)
    return invalid_config(path + ": expected one line, got several");
  return text;
}

Status check_dicom_files(DicomSettings& s, const std::string& where) {
  const std::string at = where + "dicom.";
  make_absolute(s.tls);
  if (s.tls.enabled()) {
    TlsPeer peer;
    peer.require_certificate = s.tls.require_client_certificate;
    SEGFLOW_RETURN_IF_ERROR(make_tls_layer(s.tls, TlsRole::acceptor, peer, at + "tls").status());
  }
  if (s.send_to.enabled()) SEGFLOW_RETURN_IF_ERROR(check_destination(s.send_to, at + "send_to"));
  for (auto& [name, d] : s.destinations)
    SEGFLOW_RETURN_IF_ERROR(check_destination(d, at + "destinations." + name));
  return Status::ok();
}

}  // namespace segflow::daemon::dicom
