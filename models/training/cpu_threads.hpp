#pragma once
// The intra-op thread team of a trainer or an inference run on the CPU: how many OpenMP
// threads the LibTorch ops of the calling thread use, fitted to the cores other processes
// leave free (train.threads: auto) or fixed. The rule and its measurements:
// docs/explanation/threads.md.

#include <cstdint>
#include <string>

#include "messages/cpu_cores.hpp"

namespace segflow::models {

/// The team for `usable` cores of which other processes keep `others_busy` (in cores) busy:
/// the free cores rounded, at least 1, at most `usable`. With `current` > 0 (a team already
/// running) it moves only when the free cores are more than 0.6 of a core past the current
/// team, so that a noisy reading does not flip it back and forth.
int team_for_load(int usable, double others_busy, int current);

/// Keeps the calling thread's intra-op team fitted to the machine, or fixed. One per trainer
/// or inference run, used only on the thread that runs its ops (OpenMP's team size is a
/// per-thread setting; at::set_num_threads also sets LibTorch's process default).
class IntraOpTeam {
 public:
  /// `fixed` > 0: that many threads, set once. 0 (auto): decides now from a reading of
  /// `first_window_s` seconds, and again from the load since the last decision whenever
  /// update() is called long enough after it: 0.25 s, then twice as long each time up to
  /// `interval_s`; never more threads than the usable
  /// cores (messages/cpu_cores.hpp) or OMP_NUM_THREADS when that is set.
  explicit IntraOpTeam(std::int64_t fixed, double interval_s = 2.0, double first_window_s = 0.1);

  /// Sets the team on the calling thread if it differs there, and re-decides an auto team
  /// when `interval_s` has passed since the last decision; otherwise only reads the clock.
  /// Call between steps or windows, on the thread that runs the ops. True when the team
  /// size changed.
  bool update();

  int threads() const { return threads_; }
  bool is_auto() const { return auto_; }
  /// Why the team has its size: "auto: 2 of 2 cores free" or "train.threads 3".
  std::string reason() const;

 private:
  void apply(int n);

  bool auto_ = true;
  int usable_ = 1;
  int threads_ = 0;
  double interval_s_ = 2.0;
  double wait_s_ = 0.25;  ///< until the next decision: doubles from 0.25 s up to interval_s_
  double others_ = 0;     ///< cores other processes kept busy at the last decision
  CpuTimes last_;
};

}  // namespace segflow::models
