#include "daemon/dicom/dicomweb.hpp"

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmnet/diutil.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kDicomJson = "application/dicom+json";

/// The first value of a DICOM JSON attribute `tag` of `item` (null when absent).
json first_value(const json& item, const char* tag) {
  if (!item.is_object()) return json();
  auto a = item.find(tag);
  if (a == item.end() || !a->is_object()) return json();
  auto v = a->find("Value");
  if (v == a->end() || !v->is_array() || v->empty()) return json();
  return v->front();
}

std::string value_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  return "";
}

/// A FailureReason value: a number, or its decimal text.
int reason_code(const json& v) {
  if (v.is_number_integer()) return v.get<int>();
  if (v.is_string()) {
    try {
      return std::stoi(v.get<std::string>());
    } catch (...) {
    }
  }
  return -1;
}

std::string hex4(int code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%04X", static_cast<unsigned>(code) & 0xFFFF);
  return buf;
}

/// The start of a body for an error message: text only, at most 200 characters.
std::string body_excerpt(const WebResponse& r) {
  if (r.body.empty()) return "";
  std::string s = r.body.substr(0, 200);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = ' ';
  return ": " + s + (r.body.size() > 200 ? "..." : "");
}

Result<std::string> read_whole(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return io_error(file.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// What the STOW-RS answer `r` says of instance `uid`.
StowOutcome read_stow_answer(const WebResponse& r, const std::string& uid) {
  const std::string http = http_status_text(r.status);
  json body = json::parse(r.body, nullptr, false);
  json failed = json::array();
  if (body.is_object())
    if (auto f = body.find("00081198"); f != body.end() && f->is_object())
      if (auto v = f->find("Value"); v != f->end() && v->is_array()) failed = *v;
  for (const auto& item : failed) {
    const std::string which = value_text(first_value(item, "00081155"));  // ReferencedSOPInstanceUID
    if (!which.empty() && which != uid && failed.size() > 1) continue;
    const int code = reason_code(first_value(item, "00081197"));  // FailureReason
    const std::string reason = code < 0 ? std::string("no FailureReason")
                                        : "FailureReason " + hex4(code) + " (" +
                                              DU_cstoreStatusString(static_cast<Uint16>(code)) + ")";
    const bool transient = code >= 0 && ((code & 0xFF00) == 0xA700 || code == 0x0213);
    return {transient ? StowResult::retry : StowResult::refused,
            http + ": FailedSOPSequence: " + (which.empty() ? uid : which) + ": " + reason};
  }
  if (r.status >= 200 && r.status < 300) {
    // A server that lists what it stored (ReferencedSOPSequence) but not this instance, nor
    // as failed, dropped it: Orthanc 1.10's DICOMweb plugin answers so for an instance its
    // Lua filter refuses. An answer without the sequence (or not JSON) cannot say: stored.
    if (body.is_object() && body.contains("00081199")) {
      bool listed = false;
      if (const auto& seq = body["00081199"];
          seq.is_object() && seq.contains("Value") && seq["Value"].is_array())
        for (const auto& item : seq["Value"])
          listed = listed || value_text(first_value(item, "00081155")) == uid;
      if (!listed)
        return {StowResult::refused, http + ": the answer lists " + uid +
                                         " neither as stored (ReferencedSOPSequence) nor as failed"};
    }
    return {StowResult::stored, http};
  }
  const bool again = r.status >= 500 || r.status == 401 || r.status == 403 || r.status == 404 ||
                     r.status == 408 || r.status == 429 || r.status < 200 ||
                     (r.status >= 300 && r.status < 400);
  return {again ? StowResult::retry : StowResult::refused, http + body_excerpt(r)};
}

}  // namespace

const char* to_string(StowResult r) {
  switch (r) {
    case StowResult::stored:
      return "stored";
    case StowResult::refused:
      return "refused";
    case StowResult::retry:
      return "retry";
  }
  return "?";
}

std::string multipart_body(std::string_view part, const std::string& type, std::string& boundary) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  do {
    char buf[40];
    std::snprintf(buf, sizeof buf, "segflow-%016llx%08llx", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(rng() & 0xffffffffull));
    boundary = buf;
  } while (part.find(boundary) != std::string_view::npos);
  std::string body;
  body.reserve(part.size() + 2 * boundary.size() + 64);
  body += "--" + boundary + "\r\nContent-Type: " + type + "\r\n\r\n";
  body.append(part.data(), part.size());
  body += "\r\n--" + boundary + "--\r\n";
  return body;
}

StowOutcome stow_instance(WebClient& client, const fs::path& file, const std::string& sop_instance_uid) {
  auto data = read_whole(file);
  if (!data.is_ok()) return {StowResult::retry, data.status().message()};
  std::string boundary;
  const std::string body = multipart_body(*data, "application/dicom", boundary);
  auto r = client.post("/studies", "multipart/related; type=\"application/dicom\"; boundary=" + boundary,
                       body, kDicomJson);
  if (!r.is_ok()) return {StowResult::retry, "STOW-RS: " + r.status().message()};
  StowOutcome out = read_stow_answer(*r, sop_instance_uid);
  out.detail = "STOW-RS " + r->url + ": " + out.detail;
  return out;
}

}  // namespace segflow::daemon::dicom
