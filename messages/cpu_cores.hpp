#pragma once
// How many CPU cores this process may use, and how many of them other processes keep busy:
// what the intra-op thread rule (models/training/cpu_threads.hpp) decides from. Linux /proc
// and cgroup v2 files; elsewhere the readings are marked invalid and callers keep their team.

#include <string>

namespace segflow {

/// Cores this process may run on: the CPUs of its affinity mask, capped by its cgroup's CPU
/// quota (cgroup_cpu_quota, rounded up) when one is set. At least 1.
int usable_cores();

/// Cumulative CPU-time counters at one moment, in seconds: busy and total time summed over
/// the CPUs of this process's affinity mask (/proc/stat), this process's own CPU time
/// (/proc/self/stat, every thread), and a monotonic clock. `valid` is false where /proc could
/// not be read.
struct CpuTimes {
  double busy_s = 0;   ///< non-idle time of the CPUs this process may use (s, summed over CPUs)
  double total_s = 0;  ///< all time of those CPUs (s, summed over CPUs)
  double own_s = 0;    ///< user + system time of this process (s)
  double wall_s = 0;   ///< steady clock (s)
  bool valid = false;
};

/// Reads the counters now. Cheap (two small /proc reads); any thread.
CpuTimes read_cpu_times();

/// Cores kept busy by other processes between two readings (`later` after `earlier`): the
/// CPUs' busy time less this process's own, over the wall time between them; 0 when either
/// reading is invalid or no time passed. Never negative.
double others_busy_cores(const CpuTimes& earlier, const CpuTimes& later);

/// The CPU quota of the process's cgroup in cores, the tightest from its cgroup up to the
/// root: cgroup v2's cpu.max ("QUOTA PERIOD") or v1's cpu.cfs_quota_us / cpu.cfs_period_us;
/// 0 when none is set or no cgroup file system is mounted. `cgroup_root` is where cgroups are
/// mounted (tests point it at a folder of their own).
double cgroup_cpu_quota(const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace segflow
