#include "models/training/cpu_threads.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace segflow::models {

int team_for_load(int usable, double others_busy, int current) {
  usable = std::max(1, usable);
  const double free = static_cast<double>(usable) - std::max(0.0, others_busy);
  const int target = std::clamp(static_cast<int>(std::lround(free)), 1, usable);
  if (current <= 0 || current > usable) return target;
  // Hysteresis: leave the current team until the free cores are clearly past it.
  constexpr double kMargin = 0.6;
  if (target < current && free > static_cast<double>(current) - kMargin) return current;
  if (target > current && free < static_cast<double>(current) + kMargin) return current;
  return target;
}

namespace {

/// The usable cores, capped by OMP_NUM_THREADS when the user set it (a count they chose for
/// the whole process, as PyTorch honours it).
int usable_for_team() {
  int n = usable_cores();
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long cap = std::strtol(env, &end, 10);
    if (end != env && cap > 0) n = std::min<long>(n, cap);
  }
  return n;
}

}  // namespace

IntraOpTeam::IntraOpTeam(std::int64_t fixed, double interval_s, double first_window_s)
    : auto_(fixed <= 0),
      usable_(usable_for_team()),
      interval_s_(interval_s),
      wait_s_(std::min(0.25, interval_s)) {
  if (!auto_) {
    apply(static_cast<int>(fixed));
    return;
  }
  last_ = read_cpu_times();
  if (first_window_s > 0 && usable_ > 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(first_window_s));
    const CpuTimes now = read_cpu_times();
    others_ = others_busy_cores(last_, now);
    last_ = now;
  }
  apply(team_for_load(usable_, others_, 0));
}

bool IntraOpTeam::update() {
  // The team is a per-thread setting: a run created on one thread and stepped on another
  // gets it on the first call here.
  if (at::get_num_threads() != threads_) at::set_num_threads(threads_);
  if (!auto_ || usable_ <= 1) return false;
  const double now_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now_s - last_.wall_s < wait_s_) return false;
  const CpuTimes now = read_cpu_times();
  if (!now.valid) return false;
  // The first readings come sooner (0.25, 0.5, 1 s, ...): a start-up reading spoilt by the
  // machine loading the program's libraries is corrected within a fraction of a second.
  wait_s_ = std::min(interval_s_, 2 * wait_s_);
  others_ = others_busy_cores(last_, now);
  last_ = now;
  const int n = team_for_load(usable_, others_, threads_);
  if (n == threads_) return false;
  apply(n);
  return true;
}

std::string IntraOpTeam::reason() const {
  if (!auto_) return "train.threads " + std::to_string(threads_);
  char others[32];
  std::snprintf(others, sizeof(others), "%.1f", others_);
  return "auto: " + std::to_string(threads_) + " of " + std::to_string(usable_) +
         " cores (other processes busy on " + others + ")";
}

void IntraOpTeam::apply(int n) {
  threads_ = n;
  if (at::get_num_threads() != n) at::set_num_threads(n);
}

}  // namespace segflow::models
