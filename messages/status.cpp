#include "messages/status.hpp"

namespace segflow {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok:
      return "ok";
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::not_found:
      return "not_found";
    case ErrorCode::io_error:
      return "io_error";
    case ErrorCode::corrupt_data:
      return "corrupt_data";
    case ErrorCode::unsupported:
      return "unsupported";
    case ErrorCode::invalid_config:
      return "invalid_config";
    case ErrorCode::internal:
      return "internal";
    case ErrorCode::no_foreground:
      return "no_foreground";
  }
  return "unknown";
}

Result<ErrorCode> parse_error_code(std::string_view text) {
  std::string names;
  for (auto c = static_cast<int>(ErrorCode::ok); c <= static_cast<int>(ErrorCode::no_foreground); ++c) {
    const auto code = static_cast<ErrorCode>(c);
    if (text == to_string(code)) return code;
    names += (names.empty() ? "" : ", ") + std::string(to_string(code));
  }
  return invalid_argument("error code: expected one of " + names + ", got '" + std::string(text) + "'");
}

Status Status::with_context(const std::string& prefix) const {
  if (is_ok()) return *this;
  return {code_, prefix + ": " + message_};
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(segflow::to_string(code_)) + ": " + message_;
}

std::string first_line(const std::exception& e) {
  std::string what = e.what();
  if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  return what;
}

}  // namespace segflow
