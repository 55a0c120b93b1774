// The readings the intra-op thread rule decides from (messages/cpu_cores.hpp): usable cores,
// cgroup quotas (v2 and v1 layouts in a folder of the test's own), and the cores other
// processes keep busy, with a real spinning process beside the test.
#include <doctest/doctest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "messages/cpu_cores.hpp"
#include "test_util.hpp"

namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

int affinity_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  return CPU_COUNT(&set);
}

/// A child process spinning on the CPU until destroyed.
struct Spinner {
  pid_t pid = fork();
  Spinner() {
    REQUIRE(pid >= 0);
    if (pid == 0)
      for (volatile unsigned long i = 0;; i = i + 1) {
      }
  }
  ~Spinner() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

}  // namespace

TEST_CASE("usable cores are the affinity mask's CPUs, capped by the cgroup quota") {
  const int n = segflow::usable_cores();
  CHECK(n >= 1);
  CHECK(n <= affinity_count());
  const double quota = segflow::cgroup_cpu_quota();
  if (quota > 0) CHECK(n <= static_cast<int>(quota) + 1);
}

TEST_CASE("a cgroup v2 cpu.max is read as cores, the tightest of the hierarchy, max as none") {
  segflow::testing::TempDir dir;
  const fs::path root = dir.path() / "v2";
  write(root / "cgroup.controllers", "cpu memory\n");
  write(root / "cpu.max", "150000 100000\n");
  CHECK(segflow::cgroup_cpu_quota(root.string()) == doctest::Approx(1.5));
  write(root / "cpu.max", "max 100000\n");
  CHECK(segflow::cgroup_cpu_quota(root.string()) == 0.0);
  write(root / "cpu.max", "garbage\n");
  CHECK(segflow::cgroup_cpu_quota(root.string()) == 0.0);
}

TEST_CASE("a cgroup v1 cfs quota is read as cores, -1 as none") {
  segflow::testing::TempDir dir;
  const fs::path root = dir.path() / "v1";
  write(root / "cpu" / "cpu.cfs_quota_us", "50000\n");
  write(root / "cpu" / "cpu.cfs_period_us", "100000\n");
  CHECK(segflow::cgroup_cpu_quota(root.string()) == doctest::Approx(0.5));
  write(root / "cpu" / "cpu.cfs_quota_us", "-1\n");
  CHECK(segflow::cgroup_cpu_quota(root.string()) == 0.0);
  CHECK(segflow::cgroup_cpu_quota((dir.path() / "nothing-mounted").string()) == 0.0);
}

TEST_CASE("this process's own work is its own time, another process's spinning is counted as others") {
  const auto a = segflow::read_cpu_times();
  REQUIRE(a.valid);
  CHECK(a.total_s >= a.busy_s);
  {
    // Half a second of this process spinning: counted as its own time.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    for (volatile unsigned long i = 0; std::chrono::steady_clock::now() < until; i = i + 1) {
    }
  }
  const auto b = segflow::read_cpu_times();
  REQUIRE(b.valid);
  CHECK(b.own_s - a.own_s >= 0.3);
  CHECK(b.wall_s > a.wall_s);
  {
    Spinner spinner;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto c = segflow::read_cpu_times();
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    const auto d = segflow::read_cpu_times();
    // The spinner holds (nearly) a core; whatever else runs beside the test only adds to it.
    CHECK(segflow::others_busy_cores(c, d) >= 0.7);
  }
  segflow::CpuTimes invalid;
  CHECK(segflow::others_busy_cores(invalid, b) == 0.0);
  CHECK(segflow::others_busy_cores(b, b) == 0.0);
}
