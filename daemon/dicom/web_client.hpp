#pragma once
// HTTP for DICOMweb (PS3.18) on libcurl: one client per DICOMweb destination and thread,
// its connection kept alive from one request to the next. The destination gives the base
// URL, the authentication (none; basic with the password of password_file; bearer with the
// token of token_file, read again for each request so that a renewed token is used) and,
// for https, the trusted CAs and a client certificate (`tls`); TLS 1.2 at least, the server's
// certificate and name always checked.
//
// A request that reaches no answer (connection refused, DNS, TLS, nothing moved for
// timeout_s) is an error naming the URL; an answer with any HTTP status is a WebResponse for
// the caller to read. Threading: not thread-safe; one client per thread.

#include <filesystem>
#include <memory>
#include <string>

#include "daemon/dicom/config.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

/// One HTTP answer.
struct WebResponse {
  long status = 0;           ///< the HTTP status code
  std::string content_type;  ///< its Content-Type ("" when none)
  std::string body;          ///< the body (empty when it went to a file)
  std::string url;           ///< the URL asked
};

class WebClient {
 public:
  /// A client of the DICOMweb destination `d` (kind dicomweb), which must outlive it.
  explicit WebClient(const DicomDestination& d);
  ~WebClient();
  WebClient(const WebClient&) = delete;
  WebClient& operator=(const WebClient&) = delete;

  /// GET url + `path` ("/studies/1.2.3/series"), Accept: `accept`. The body goes to
  /// `to_file` when one is given (created or truncated), else into the response.
  Result<WebResponse> get(const std::string& path, const std::string& accept,
                          const std::filesystem::path& to_file = {});
  /// POST `body` (of `content_type`) to url + `path`, Accept: `accept`.
  Result<WebResponse> post(const std::string& path, const std::string& content_type, const std::string& body,
                           const std::string& accept);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// "404 Not Found"-style text of an HTTP status ("HTTP 404 (Not Found)").
std::string http_status_text(long status);

}  // namespace segflow::daemon::dicom
