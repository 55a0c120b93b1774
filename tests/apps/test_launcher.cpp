// segflow and segflowd start libgomp with the settings the user gave, or with libgomp's own
// default: no re-execution, no policy forced on the user (docs/explanation/threads.md has the
// measurements behind that). Checked through libgomp itself: OMP_DISPLAY_ENV=verbose makes it
// print the settings it read when it was loaded, once per load, and GOMP_SPINCOUNT tells the
// policies apart (default: throttled spinning, 300000; passive: 0; active: 30000000000).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

namespace st = segflow::testing;

/// Every GOMP_SPINCOUNT value libgomp printed while `program --help` ran under `env`.
std::vector<std::string> spincounts(const std::string& program, const std::string& env) {
  const auto r = st::run_command("env " + env + " OMP_DISPLAY_ENV=verbose " + st::shell_quote(program) +
                                 " --help 2>&1 >/dev/null");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  std::vector<std::string> out;
  const std::string key = "GOMP_SPINCOUNT = '";
  for (std::size_t at = r.out.find(key); at != std::string::npos; at = r.out.find(key, at + 1)) {
    const std::size_t from = at + key.size();
    out.push_back(r.out.substr(from, r.out.find('\'', from) - from));
  }
  return out;
}

std::string segflowd_bin() {
  return (std::filesystem::path(st::segflow_bin()).parent_path() / "segflowd").string();
}

}  // namespace

TEST_CASE(
    "segflow and segflowd load libgomp once, with its default wait policy, when OMP_WAIT_POLICY is unset") {
  for (const std::string& program : {st::segflow_bin(), segflowd_bin()}) {
    CAPTURE(program);
    // The test harness sets a passive policy for the suites; -u takes it away as a user's shell would.
    const auto counts = spincounts(program, "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT");
    REQUIRE(counts.size() == 1);
    CHECK(counts[0] == "300000");
  }
}

TEST_CASE("a wait policy the user set is the one libgomp uses, loaded once") {
  for (const std::string& program : {st::segflow_bin(), segflowd_bin()}) {
    CAPTURE(program);
    const auto active = spincounts(program, "OMP_WAIT_POLICY=active");
    REQUIRE(active.size() == 1);
    CHECK(active[0] == "30000000000");
    const auto passive = spincounts(program, "OMP_WAIT_POLICY=passive");
    REQUIRE(passive.size() == 1);
    CHECK(passive[0] == "0");
  }
}
