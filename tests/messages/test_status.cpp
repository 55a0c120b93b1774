// Status and Result<T> (messages/status.hpp): the codes and their names, context, the
// propagation macros, and the test macros built on them (tests/test_util.hpp).
#include <doctest/doctest.h>

#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "test_util.hpp"

using segflow::ErrorCode;
using segflow::Result;
using segflow::Status;

namespace {

// clang-format off
/// Every code, its documented name and its convenience constructor.
struct CodeRow {
  ErrorCode code;
  const char* name;
  Status (*make)(std::string);
};
const CodeRow kCodes[] = {
    {ErrorCode::invalid_argument, "invalid_argument", segflow::invalid_argument},
    {ErrorCode::not_found,        "not_found",        segflow::not_found},
    {ErrorCode::io_error,         "io_error",         segflow::io_error},
    {ErrorCode::corrupt_data,     "corrupt_data",     segflow::corrupt_data},
    {ErrorCode::unsupported,      "unsupported",      segflow::unsupported},
    {ErrorCode::invalid_config,   "invalid_config",   segflow::invalid_config},
    {ErrorCode::internal,         "internal",         segflow::internal_error},
};
// clang-format on

/// Reads `n` as a positive count (what a library function returning Result looks like).
Result<int> parse_count(int n) {
  if (n <= 0) return segflow::invalid_argument("count: expected a positive number, got " + std::to_string(n));
  return n;
}

/// Doubles a parsed count with SEGFLOW_ASSIGN_OR_RETURN; `reached` tells whether the line
/// after the macro ran.
Result<int> doubled(int n, bool& reached) {
  SEGFLOW_ASSIGN_OR_RETURN(const int count, parse_count(n));
  reached = true;
  return 2 * count;
}

/// Runs `steps` in order with SEGFLOW_RETURN_IF_ERROR, recording each one that ran.
Status run_all(const std::vector<Status>& steps, std::vector<std::size_t>& ran) {
  for (std::size_t i = 0; i < steps.size(); ++i) {
    ran.push_back(i);
    SEGFLOW_RETURN_IF_ERROR(steps[i]);
  }
  return Status::ok();
}

}  // namespace

TEST_CASE("every error code has its own documented name and a constructor that sets it") {
  std::set<std::string> names;
  for (const auto& row : kCodes) {
    CAPTURE(row.name);
    CHECK(std::string(segflow::to_string(row.code)) == row.name);
    names.insert(segflow::to_string(row.code));
    const Status st = row.make("job.yaml: train.epochs: expected a positive integer, got 0");
    CHECK_FALSE(st.is_ok());
    CHECK_FALSE(static_cast<bool>(st));
    CHECK(st.code() == row.code);
    CHECK(st.message() == "job.yaml: train.epochs: expected a positive integer, got 0");
    CHECK(st.to_string() ==
          std::string(row.name) + ": job.yaml: train.epochs: expected a positive integer, got 0");
  }
  CHECK(names.size() == std::size(kCodes));
  CHECK(std::string(segflow::to_string(ErrorCode::ok)) == "ok");
}

TEST_CASE("a default Status is ok, with an empty message, and prints as ok") {
  const Status st;
  CHECK(st.is_ok());
  CHECK(static_cast<bool>(st));
  CHECK(st.code() == ErrorCode::ok);
  CHECK(st.message().empty());
  CHECK(st.to_string() == "ok");
  CHECK(Status::ok().is_ok());
}

TEST_CASE("with_context puts the context before the message and keeps the code; an ok Status stays ok") {
  const Status st = segflow::corrupt_data("truncated after 12 bytes").with_context("case_003/image.nii.gz");
  CHECK(st.code() == ErrorCode::corrupt_data);
  CHECK(st.message() == "case_003/image.nii.gz: truncated after 12 bytes");
  CHECK(st.with_context("dataset").message() == "dataset: case_003/image.nii.gz: truncated after 12 bytes");
  const Status ok = Status::ok().with_context("case_003");
  CHECK(ok.is_ok());
  CHECK(ok.message().empty());
}

TEST_CASE("a Result holds a value to read and take, or the Status that explains why there is none") {
  Result<std::string> good(std::string("spleen"));
  REQUIRE(good.is_ok());
  CHECK(static_cast<bool>(good));
  CHECK(good.status().is_ok());
  CHECK(*good == "spleen");
  CHECK(good->size() == 6);
  good.value() += "_2";
  CHECK(good.value() == "spleen_2");
  const std::string taken = std::move(good).value();
  CHECK(taken == "spleen_2");

  Result<std::string> bad = segflow::not_found("labelsTr/case_001.nii.gz: no such file");
  CHECK_FALSE(bad.is_ok());
  CHECK_FALSE(static_cast<bool>(bad));
  CHECK(bad.status().code() == ErrorCode::not_found);
  CHECK(bad.status().message() == "labelsTr/case_001.nii.gz: no such file");

  const Result<int> from_code(ErrorCode::unsupported, "JPEG 2000 Part 2");
  CHECK(from_code.status().to_string() == "unsupported: JPEG 2000 Part 2");
}

TEST_CASE("SEGFLOW_ASSIGN_OR_RETURN binds the value, or returns the error before the next line") {
  bool reached = false;
  auto two = doubled(21, reached);
  REQUIRE_OK(two);
  CHECK(*two == 42);
  CHECK(reached);

  reached = false;
  auto none = doubled(-1, reached);
  CHECK_FALSE(reached);
  REQUIRE_FALSE(none.is_ok());
  CHECK(none.status().code() == ErrorCode::invalid_argument);
  CHECK(none.status().message() == "count: expected a positive number, got -1");
}

TEST_CASE("SEGFLOW_RETURN_IF_ERROR returns the first error and runs nothing after it") {
  std::vector<std::size_t> ran;
  CHECK(run_all({Status::ok(), Status::ok()}, ran).is_ok());
  CHECK(ran == std::vector<std::size_t>{0, 1});

  ran.clear();
  const Status st =
      run_all({Status::ok(), segflow::io_error("disk full"), segflow::internal_error("never")}, ran);
  CHECK(st.code() == ErrorCode::io_error);
  CHECK(st.message() == "disk full");
  CHECK(ran == std::vector<std::size_t>{0, 1});
}

TEST_CASE("REQUIRE_OK_AND_ASSIGN moves the value out, also of a move-only type") {
  REQUIRE_OK_AND_ASSIGN(auto p, Result<std::unique_ptr<int>>(std::make_unique<int>(7)));
  REQUIRE(p != nullptr);
  CHECK(*p == 7);
  REQUIRE_OK_AND_ASSIGN(const int n, parse_count(3));
  CHECK(n == 3);
  CHECK_OK(Status::ok());
  CHECK_OK(parse_count(1));
}

// The two cases below pass only when their one assertion fails (doctest::should_fail): an
// error must not get through the macros.
TEST_CASE("REQUIRE_OK fails on an error Status" * doctest::should_fail()) {
  REQUIRE_OK(segflow::invalid_config("job.yaml: model.name: expected one of unet, sam, got \"vnet\""));
}

TEST_CASE("REQUIRE_OK_AND_ASSIGN fails on an error Result" * doctest::should_fail()) {
  REQUIRE_OK_AND_ASSIGN(const int n, parse_count(0));
  (void)n;
}

TEST_CASE("first_line keeps the first line of an exception's message, without LibTorch's stack trace") {
  const std::runtime_error torch_like(
      "shape '[2, 3]' is invalid for input of size 5\nException raised from ...\nframe #0");
  CHECK(segflow::first_line(torch_like) == "shape '[2, 3]' is invalid for input of size 5");
  CHECK(segflow::first_line(std::runtime_error("one line")) == "one line");
  CHECK(segflow::first_line(std::runtime_error("")).empty());
}
