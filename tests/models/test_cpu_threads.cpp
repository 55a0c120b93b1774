// The trainer's intra-op team (models/training/cpu_threads.hpp): the rule's decisions on
// given loads, what a real team sets in LibTorch (on the thread that runs the ops), and what
// train.threads accepts. Decisions only; the speed they buy is bench/cpu-threads.sh's.
#include <ATen/Parallel.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "job_yaml.hpp"
#include "messages/cpu_cores.hpp"
#include "models/training/cpu_threads.hpp"
#include "models/training/job_config.hpp"
#include "test_util.hpp"

namespace sm = segflow::models;

TEST_CASE("the team is the cores other processes leave free, rounded, between 1 and the usable cores") {
  CHECK(sm::team_for_load(2, 0.0, 0) == 2);
  CHECK(sm::team_for_load(2, 0.3, 0) == 2);
  CHECK(sm::team_for_load(2, 1.0, 0) == 1);
  CHECK(sm::team_for_load(2, 2.0, 0) == 1);
  CHECK(sm::team_for_load(2, 5.0, 0) == 1);
  CHECK(sm::team_for_load(1, 0.0, 0) == 1);
  CHECK(sm::team_for_load(8, 1.2, 0) == 7);
  CHECK(sm::team_for_load(8, 2.7, 0) == 5);
  CHECK(sm::team_for_load(0, 0.0, 0) == 1);
  CHECK(sm::team_for_load(4, -1.0, 0) == 4);
}

TEST_CASE("a running team moves only when the free cores are more than 0.6 of a core past it") {
  // 2 threads running: 1.5 free cores keep them, 1.3 drop to one.
  CHECK(sm::team_for_load(2, 0.5, 2) == 2);
  CHECK(sm::team_for_load(2, 0.7, 2) == 1);
  // 1 thread running: 1.5 free cores keep it, 1.7 take the second core back.
  CHECK(sm::team_for_load(2, 0.5, 1) == 1);
  CHECK(sm::team_for_load(2, 0.3, 1) == 2);
  CHECK(sm::team_for_load(8, 3.0, 8) == 5);
  // A current team larger than the machine (a changed affinity) is decided afresh.
  CHECK(sm::team_for_load(2, 0.0, 6) == 2);
}

TEST_CASE("a fixed train.threads sets LibTorch's team on the thread that runs the ops") {
  const int before = at::get_num_threads();
  {
    sm::IntraOpTeam team(3);
    CHECK_FALSE(team.is_auto());
    CHECK(team.threads() == 3);
    CHECK(at::get_num_threads() == 3);
    CHECK(team.reason() == "train.threads 3");
    // Stepped on another thread: the first update() there sets that thread's team too.
    int seen = 0;
    std::thread other([&] {
      team.update();
      seen = at::get_num_threads();
    });
    other.join();
    CHECK(seen == 3);
    CHECK_FALSE(team.update());
  }
  at::set_num_threads(before);
}

namespace {

/// Unsets OMP_NUM_THREADS (CTest sets it to 1 for every case) while it lives.
class WithoutOmpNumThreads {
 public:
  WithoutOmpNumThreads() {
    if (const char* v = std::getenv("OMP_NUM_THREADS")) saved_ = v;
    unsetenv("OMP_NUM_THREADS");
  }
  ~WithoutOmpNumThreads() {
    if (!saved_.empty()) setenv("OMP_NUM_THREADS", saved_.c_str(), 1);
  }

 private:
  std::string saved_;
};

}  // namespace

TEST_CASE("an auto team never takes more threads than OMP_NUM_THREADS when it is set") {
  const int before = at::get_num_threads();
  WithoutOmpNumThreads clean;
  setenv("OMP_NUM_THREADS", "1", 1);
  {
    sm::IntraOpTeam team(0);
    CHECK(team.threads() == 1);
    CHECK(at::get_num_threads() == 1);
  }
  unsetenv("OMP_NUM_THREADS");
  at::set_num_threads(before);
}

TEST_CASE("an auto team fits the usable cores, and leaves a core to a process spinning beside it") {
  const int before = at::get_num_threads();
  WithoutOmpNumThreads clean;
  const int usable = segflow::usable_cores();
  {
    sm::IntraOpTeam team(0);
    CHECK(team.is_auto());
    CHECK(team.threads() >= 1);
    CHECK(team.threads() <= usable);
    CHECK(at::get_num_threads() == team.threads());
    CHECK(team.reason().rfind("auto: ", 0) == 0);
  }
  if (usable < 2) {
    at::set_num_threads(before);
    segflow::testing::skip_case("one usable core: no team to shrink");
    return;
  }
  const pid_t spinner = fork();
  REQUIRE(spinner >= 0);
  if (spinner == 0)
    for (volatile unsigned long i = 0;; i = i + 1) {
    }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int first = 0, later = 0;
  {
    // A 0.5 s first reading and re-decisions every 0.2 s: the spinner holds a core throughout.
    sm::IntraOpTeam team(0, 0.2, 0.5);
    first = team.threads();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    team.update();
    later = team.threads();
    INFO(team.reason());
  }
  kill(spinner, SIGKILL);
  waitpid(spinner, nullptr, 0);
  at::set_num_threads(before);
  CHECK(first <= usable - 1);
  CHECK(later <= usable - 1);
  CHECK(later >= 1);
}

TEST_CASE("train.threads takes auto, 0 (read as auto) or a count, and names what it expected otherwise") {
  segflow::testing::JobYaml job;
  job.root = "/nonexistent/data";  // parsing reads no data
  const std::string yaml = job.yaml();
  auto parse_threads = [&](const std::string& value) {
    return sm::parse_job_config(yaml, "job.yaml", {"train.threads=" + value});
  };
  for (const char* v : {"auto", "0"}) {
    REQUIRE_OK_AND_ASSIGN(auto cfg, parse_threads(v));
    CHECK(cfg.train.threads == 0);
  }
  REQUIRE_OK_AND_ASSIGN(auto three, parse_threads("3"));
  CHECK(three.train.threads == 3);
  for (const char* bad : {"many", "-1", "1.5", "2000"}) {
    CAPTURE(bad);
    auto r = parse_threads(bad);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("job.yaml: train.threads: expected auto or an integer in [0, 1024]") !=
          std::string::npos);
  }
}
