// The main of every test suite: doctest, with two guards against tests that cannot fail, and
// child-process entry points.
// - A run whose filters select no test case fails (CTest runs one case per process by name;
//   a renamed case must not pass by running nothing).
// - A test case that makes no assertion fails, unless it skipped itself (skip_case()).
// - A test that needs a second process (a data-parallel rank, say) re-runs its own
//   executable with SEGFLOW_TEST_CHILD=<name>; that run calls the function registered under
//   the name (test_util.hpp, ChildEntry) and exits with its value, running no test case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

struct RunRecord {
  std::mutex mutex;
  bool ran = false;
  unsigned selected = 0;
  std::vector<std::string> without_assertions;
};

RunRecord& record() {
  static RunRecord r;
  return r;
}

/// Watches the run: how many cases the filters selected, and which made no assertion.
struct AssertionGuard : doctest::IReporter {
  explicit AssertionGuard(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    std::lock_guard<std::mutex> l(record().mutex);
    record().ran = true;
    record().selected = s.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData& d) override {
    current_ = d.m_name;
    segflow::testing::case_skipped_flag() = false;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& s) override {
    if (s.numAssertsCurrentTest == 0 && !s.failure_flags && !segflow::testing::case_skipped_flag()) {
      std::lock_guard<std::mutex> l(record().mutex);
      record().without_assertions.push_back(current_);
    }
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

 private:
  std::string current_;
};

REGISTER_LISTENER("segflow_assertion_guard", 1, AssertionGuard);

}  // namespace

int main(int argc, char** argv) {
  if (const char* child = std::getenv("SEGFLOW_TEST_CHILD"); child && *child) {
    auto& entries = segflow::testing::child_entries();
    auto it = entries.find(child);
    if (it == entries.end()) {
      std::fprintf(stderr, "SEGFLOW_TEST_CHILD=%s: no child entry of that name in this suite\n", child);
      return 2;
    }
    return it->second();
  }
  doctest::Context context(argc, argv);
  int rc = context.run();
  if (context.shouldExit()) return rc;  // --list-test-cases, --help, ...
  const RunRecord& r = record();
  if (r.ran && r.selected == 0) {
    std::fprintf(stderr, "no test case matches the filters given: nothing was tested\n");
    return rc == 0 ? 3 : rc;
  }
  for (const auto& name : r.without_assertions) {
    std::fprintf(stderr, "test case \"%s\" made no assertion: a test that cannot fail\n", name.c_str());
    if (rc == 0) rc = 4;
  }
  return rc;
}
