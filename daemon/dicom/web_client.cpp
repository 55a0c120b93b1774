#include "daemon/dicom/web_client.hpp"

#include <curl/curl.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;

namespace {

/// libcurl's process-wide setup, once, before any handle (it is not thread-safe itself).
void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

/// Where a response body goes: a string, or an open file.
struct Sink {
  std::string* text = nullptr;
  std::FILE* file = nullptr;
};

std::size_t write_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t bytes = size * n;
  if (sink->file) return std::fwrite(data, 1, bytes, sink->file);
  sink->text->append(data, bytes);
  return bytes;
}

/// The PEM files of trusted_cas, concatenated (libcurl takes them as one blob).
Result<std::string> ca_bundle(const std::vector<std::string>& files) {
  std::string out;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return io_error(f + ": cannot read the CA file");
    std::stringstream ss;
    ss << in.rdbuf();
    out += ss.str() + "\n";
  }
  return out;
}

}  // namespace

std::string http_status_text(long status) {
  const char* reason = "";
  switch (status) {
    case 200:
      reason = "OK";
      break;
    case 202:
      reason = "Accepted";
      break;
    case 204:
      reason = "No Content";
      break;
    case 400:
      reason = "Bad Request";
      break;
    case 401:
      reason = "Unauthorized";
      break;
    case 403:
      reason = "Forbidden";
      break;
    case 404:
      reason = "Not Found";
      break;
    case 405:
      reason = "Method Not Allowed";
      break;
    case 406:
      reason = "Not Acceptable";
      break;
    case 408:
      reason = "Request Timeout";
      break;
    case 409:
      reason = "Conflict";
      break;
    case 413:
      reason = "Payload Too Large";
      break;
    case 415:
      reason = "Unsupported Media Type";
      break;
    case 429:
      reason = "Too Many Requests";
      break;
    case 500:
      reason = "Internal Server Error";
      break;
    case 502:
      reason = "Bad Gateway";
      break;
    case 503:
      reason = "Service Unavailable";
      break;
    case 504:
      reason = "Gateway Timeout";
      break;
    default:
      break;
  }
  return "HTTP " + std::to_string(status) + (*reason ? std::string(" (") + reason + ")" : std::string());
}

struct WebClient::Impl {
  const DicomDestination& d;
  CURL* curl = nullptr;
  std::string ca;  ///< the CA bundle (kept alive while the handle may use it)
  char error[CURL_ERROR_SIZE] = {0};

  explicit Impl(const DicomDestination& dest) : d(dest) {
    global_init();
    curl = curl_easy_init();
  }
  ~Impl() {
    if (curl) curl_easy_cleanup(curl);
  }

  /// The options every request shares: timeouts, TLS, authentication; the headers list is
  /// returned for the caller to extend and free.
  Result<curl_slist*> prepare(const std::string& url, const std::string& accept) {
    if (!curl) return internal_error("libcurl: cannot make a handle");
    curl_easy_reset(curl);
    error[0] = '\0';
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "segflowd");
    const long timeout = static_cast<long>(d.timeout_s);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(d.timeout_s * 1000));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, timeout < 1 ? 1L : timeout);
    curl_easy_setopt(curl, CURLOPT_SSLVERSION, static_cast<long>(CURL_SSLVERSION_TLSv1_2));
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!d.tls.trusted_cas.empty()) {
      if (ca.empty()) {
        SEGFLOW_ASSIGN_OR_RETURN(ca, ca_bundle(d.tls.trusted_cas));
      }
      curl_blob blob{ca.data(), ca.size(), CURL_BLOB_NOCOPY};
      curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &blob);
    }
    if (!d.tls.certificate.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, d.tls.certificate.c_str());
      curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
      curl_easy_setopt(curl, CURLOPT_SSLKEY, d.tls.private_key.c_str());
    }
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, ("Accept: " + accept).c_str());
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip before a body
    if (d.auth == WebAuth::basic) {
      auto password = read_secret_file(d.password_file);
      if (!password.is_ok()) {
        curl_slist_free_all(headers);
        return password.status().with_context("password_file");
      }
      curl_easy_setopt(curl, CURLOPT_HTTPAUTH, static_cast<long>(CURLAUTH_BASIC));
      curl_easy_setopt(curl, CURLOPT_USERNAME, d.username.c_str());
      curl_easy_setopt(curl, CURLOPT_PASSWORD, password->c_str());  // libcurl copies it
    } else if (d.auth == WebAuth::bearer) {
      auto token = read_secret_file(d.token_file);
      if (!token.is_ok()) {
        curl_slist_free_all(headers);
        return token.status().with_context("token_file");
      }
      headers = curl_slist_append(headers, ("Authorization: Bearer " + *token).c_str());
    }
    return headers;
  }

  /// Runs the prepared request; the answer, or the transport error naming the URL.
  Result<WebResponse> perform(const std::string& url, curl_slist* headers, Sink& sink, WebResponse& r) {
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    const CURLcode rc = curl_easy_perform(curl);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
    curl_slist_free_all(headers);
    r.url = url;
    if (rc != CURLE_OK)
      return io_error(url + ": " + (error[0] ? std::string(error) : std::string(curl_easy_strerror(rc))));
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
    char* type = nullptr;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
    if (type) r.content_type = type;
    return r;
  }
};

WebClient::WebClient(const DicomDestination& d) : impl_(std::make_unique<Impl>(d)) {}
WebClient::~WebClient() = default;

Result<WebResponse> WebClient::get(const std::string& path, const std::string& accept,
                                   const fs::path& to_file) {
  const std::string url = impl_->d.url + path;
  SEGFLOW_ASSIGN_OR_RETURN(curl_slist * headers, impl_->prepare(url, accept));
  WebResponse r;
  Sink sink{&r.body, nullptr};
  if (!to_file.empty()) {
    sink.file = std::fopen(to_file.c_str(), "wb");
    if (!sink.file) {
      curl_slist_free_all(headers);
      return io_error(to_file.string() + ": cannot write the response of " + url);
    }
  }
  curl_easy_setopt(impl_->curl, CURLOPT_HTTPGET, 1L);
  auto out = impl_->perform(url, headers, sink, r);
  if (sink.file && std::fclose(sink.file) != 0 && out.is_ok())
    return io_error(to_file.string() + ": cannot write the response of " + url);
  return out;
}

Result<WebResponse> WebClient::post(const std::string& path, const std::string& content_type,
                                    const std::string& body, const std::string& accept) {
  const std::string url = impl_->d.url + path;
  SEGFLOW_ASSIGN_OR_RETURN(curl_slist * headers, impl_->prepare(url, accept));
  headers = curl_slist_append(headers, ("Content-Type: " + content_type).c_str());
  WebResponse r;
  Sink sink{&r.body, nullptr};
  curl_easy_setopt(impl_->curl, CURLOPT_POST, 1L);
  curl_easy_setopt(impl_->curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(impl_->curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  return impl_->perform(url, headers, sink, r);
}

}  // namespace segflow::daemon::dicom
