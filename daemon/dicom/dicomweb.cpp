#include "daemon/dicom/dicomweb.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmnet/diutil.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
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

/// The Content-Type parameter `name` (quotes removed); "" when absent.
std::string content_type_param(const std::string& type, const std::string& name) {
  std::size_t pos = type.find(';');
  while (pos != std::string::npos) {
    const std::size_t next = type.find(';', pos + 1);
    std::string item = type.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    const auto eq = item.find('=');
    if (eq != std::string::npos) {
      std::string key = item.substr(0, eq), value = item.substr(eq + 1);
      auto trim = [](std::string& s) {
        const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
        s = b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
      };
      trim(key);
      trim(value);
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
        value = value.substr(1, value.size() - 2);
      for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (key == name) return value;
    }
    pos = next;
  }
  return "";
}

/// The error of an answer that is not success, coded for the caller: io_error (retry:
/// 5xx, 401, 403, 408, 429), not_found (404), invalid_argument (other refusals).
Status http_error(const WebResponse& r, const std::string& what) {
  const std::string m = what + ": " + r.url + ": " + http_status_text(r.status) + body_excerpt(r);
  if (r.status == 404) return not_found(m);
  if (r.status >= 500 || r.status == 401 || r.status == 403 || r.status == 408 || r.status == 429)
    return io_error(m);
  return invalid_argument(m);
}

Result<std::string> read_whole(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return io_error(file.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A read-only mapping of a file (unmapped on destruction).
class MappedFile {
 public:
  ~MappedFile() {
    if (data_ && data_ != MAP_FAILED) ::munmap(data_, size_);
  }
  Status open(const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error(file.string() + ": cannot read");
    struct stat st {};
    ::fstat(fd, &st);
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (size_ > 0 && data_ == MAP_FAILED) return io_error(file.string() + ": cannot map");
    return Status::ok();
  }
  std::string_view view() const {
    return size_ ? std::string_view(static_cast<const char*>(data_), size_) : std::string_view();
  }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

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

Result<std::vector<std::string_view>> multipart_parts(std::string_view body,
                                                      const std::string& content_type) {
  const std::string boundary = content_type_param(content_type, "boundary");
  if (content_type.rfind("multipart/", 0) != 0 || boundary.empty())
    return corrupt_data("expected a multipart/related body with a boundary, got Content-Type \"" +
                        content_type + "\"");
  const std::string delimiter = "--" + boundary;
  std::vector<std::string_view> parts;
  std::size_t pos = body.find(delimiter);
  if (pos == std::string_view::npos) return corrupt_data("multipart body without its boundary " + boundary);
  for (;;) {
    pos += delimiter.size();
    if (body.substr(pos, 2) == "--") break;  // the closing delimiter
    // The rest of the delimiter line, then header lines up to an empty one.
    std::size_t eol = body.find('\n', pos);
    std::size_t start = std::string_view::npos;
    while (eol != std::string_view::npos) {
      const std::size_t from = eol + 1;
      eol = body.find('\n', from);
      if (eol == std::string_view::npos) break;
      if (eol == from || (eol == from + 1 && body[from] == '\r')) {
        start = eol + 1;
        break;
      }
    }
    if (start == std::string_view::npos)
      return corrupt_data("multipart part " + std::to_string(parts.size() + 1) +
                          " has no end of its headers");
    std::size_t end = body.find("\r\n" + delimiter, start);
    std::size_t next = end == std::string_view::npos ? end : end + 2;
    if (end == std::string_view::npos) {
      end = body.find("\n" + delimiter, start);
      next = end == std::string_view::npos ? end : end + 1;
    }
    if (end == std::string_view::npos)
      return corrupt_data("multipart part " + std::to_string(parts.size() + 1) +
                          " is not closed by its boundary");
    parts.push_back(body.substr(start, end - start));
    pos = next;
  }
  return parts;
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

Result<std::vector<WebSeries>> qido_series(WebClient& client, const std::string& study,
                                           const std::string& series) {
  std::string path = "/studies/" + study + "/series";
  if (!series.empty()) path += "?SeriesInstanceUID=" + series;
  SEGFLOW_ASSIGN_OR_RETURN(WebResponse r, client.get(path, kDicomJson));
  if (r.status == 204) return std::vector<WebSeries>{};
  if (r.status != 200) return http_error(r, "QIDO-RS");
  const json list = json::parse(r.body, nullptr, false);
  if (!list.is_array())
    return corrupt_data("QIDO-RS: " + r.url + ": expected a DICOM JSON array, got" + body_excerpt(r));
  std::vector<WebSeries> out;
  for (const auto& item : list) {
    WebSeries s;
    s.uid = value_text(first_value(item, "0020000E"));
    s.modality = value_text(first_value(item, "00080060"));
    const std::string n = value_text(first_value(item, "00201209"));
    if (!n.empty()) s.instances = std::atoll(n.c_str());
    if (s.uid.empty()) continue;
    if (!series.empty() && s.uid != series) continue;  // a server that ignores the filter
    out.push_back(std::move(s));
  }
  return out;
}

Result<std::int64_t> wado_series(WebClient& client, const std::string& study, const std::string& series,
                                 const fs::path& body_file,
                                 const std::function<Status(std::string_view part)>& on_part) {
  SEGFLOW_ASSIGN_OR_RETURN(
      WebResponse r,
      client.get("/studies/" + study + "/series/" + series,
                 "multipart/related; type=\"application/dicom\"; transfer-syntax=*", body_file));
  if (r.status != 200) {
    // The error body went to the file: read its start for the message.
    auto text = read_whole(body_file);
    if (text.is_ok()) r.body = text->substr(0, 400);
    return http_error(r, "WADO-RS");
  }
  MappedFile mapped;
  SEGFLOW_RETURN_IF_ERROR(mapped.open(body_file));
  auto parts = multipart_parts(mapped.view(), r.content_type);
  if (!parts.is_ok()) return corrupt_data("WADO-RS: " + r.url + ": " + parts.status().message());
  for (const auto& p : *parts) SEGFLOW_RETURN_IF_ERROR(on_part(p));
  return static_cast<std::int64_t>(parts->size());
}

}  // namespace segflow::daemon::dicom
