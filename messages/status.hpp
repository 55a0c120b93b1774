#pragma once
// Status and Result<T>: the error currency of segflow's libraries (GCC 12 has no
// std::expected). Messages name the file, the field, what was expected and what was got:
//   "configs/job.yaml: stages[2].options.spacing: expected 3 positive numbers, got [1.5, 0]"

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace segflow {

/// Documented error kinds; converted to a CAF error at the actor boundary.
enum class ErrorCode : std::uint8_t {
  ok = 0,
  invalid_argument,  ///< a bad value from a caller or the command line
  not_found,         ///< a path, key or id that does not exist
  io_error,          ///< the operating system failed a read or a write
  corrupt_data,      ///< a file exists but its content is malformed or truncated
  unsupported,       ///< a valid input that segflow does not handle (e.g. JPEG 2000)
  invalid_config,    ///< a job or daemon config that fails validation
  internal,          ///< a bug or an unexpected exception (e.g. from LibTorch)
  /// A label map without foreground where the output needs some: a DICOM SEG holds at least
  /// one segment. Not a failure of the model: the daemon's auto_infer reports it as "empty".
  no_foreground,
};

/// Short stable name of an error code ("corrupt_data").
const char* to_string(ErrorCode code) noexcept;

/// The first line of an exception's message: LibTorch's errors carry a C++ stack trace after
/// it, which does not belong in a one-line error.
std::string first_line(const std::exception& e);

/// Outcome of an operation without a value. Cheap to copy when ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const noexcept { return code_ == ErrorCode::ok; }
  explicit operator bool() const noexcept { return is_ok(); }
  ErrorCode code() const noexcept { return code_; }
  /// The full message; empty when ok.
  const std::string& message() const noexcept { return message_; }
  /// A copy whose message is "prefix: message" (adds context, e.g. the file name).
  Status with_context(const std::string& prefix) const;
  /// "corrupt_data: <message>".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
};

/// Convenience constructors.
inline Status invalid_argument(std::string m) { return {ErrorCode::invalid_argument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::not_found, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::io_error, std::move(m)}; }
inline Status corrupt_data(std::string m) { return {ErrorCode::corrupt_data, std::move(m)}; }
inline Status unsupported(std::string m) { return {ErrorCode::unsupported, std::move(m)}; }
inline Status invalid_config(std::string m) { return {ErrorCode::invalid_config, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::internal, std::move(m)}; }

/// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit on purpose
  Result(ErrorCode code, std::string msg) : v_(Status(code, std::move(msg))) {}

  bool is_ok() const noexcept { return std::holds_alternative<T>(v_); }
  explicit operator bool() const noexcept { return is_ok(); }
  /// The status: ok() when a value is held.
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

/// The code named `text` (to_string's names); invalid_argument listing them otherwise.
Result<ErrorCode> parse_error_code(std::string_view text);

}  // namespace segflow

#define SEGFLOW_CONCAT_INNER(a, b) a##b
#define SEGFLOW_CONCAT(a, b) SEGFLOW_CONCAT_INNER(a, b)

/// Returns the Status of `expr` from the enclosing function when it is not ok.
#define SEGFLOW_RETURN_IF_ERROR(expr)             \
  do {                                            \
    ::segflow::Status _segflow_st = (expr);       \
    if (!_segflow_st.is_ok()) return _segflow_st; \
  } while (0)

/// `SEGFLOW_ASSIGN_OR_RETURN(auto x, make())`: binds the value or returns the error.
#define SEGFLOW_ASSIGN_OR_RETURN(lhs, expr) \
  SEGFLOW_ASSIGN_OR_RETURN_IMPL(SEGFLOW_CONCAT(_segflow_res_, __LINE__), lhs, expr)
#define SEGFLOW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.is_ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
