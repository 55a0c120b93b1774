#include "daemon/dicom/config.hpp"

#include <arpa/inet.h>

#include <cctype>

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

void DicomDestination::bind(OptionParser& p) {
  for (const char* k : {"ae_title", "host", "port"})
    if (!p.given(k)) return p.fail(k, "missing (send_to needs ae_title, host and port)");
  read_ae_title(p, "ae_title", ae_title, "the destination's AE title");
  p.string("host", host, "the destination's host name or address");
  if (p.ok() && host.empty()) p.fail("host", "expected a host name or address, got \"\"");
  p.integer("port", port, Range::closed(1, 65535), "", "the destination's TCP port");
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
  if (p.given("send_to")) p.section("send_to", send_to, "C-STORE destination of results", "key");
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
               "named C-STORE destinations: {NAME: {ae_title, host, port, retry_initial_s, ...}}");
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
  if (send_to.enabled() && send_to.ae_title == name) return std::string();
  std::string known;
  for (const auto& [n, d] : destinations) known += (known.empty() ? "" : ", ") + n;
  if (send_to.enabled()) known += (known.empty() ? "" : ", ") + send_to.ae_title + " (dicom.send_to)";
  return invalid_argument(
      name + ": no such DICOM destination (expected " +
      (known.empty() ? std::string("a name of dicom.destinations; none is configured") : "one of " + known) +
      ")");
}

std::string destination_text(const DicomDestination& d) {
  return d.ae_title + "@" + d.host + ":" + std::to_string(d.port);
}

}  // namespace segflow::daemon::dicom
