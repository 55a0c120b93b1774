#include "messages/cpu_cores.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace segflow {

namespace {

/// The CPUs of this process's affinity mask; empty when it cannot be read.
std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

/// The process's cgroup path relative to its hierarchy's mount point: the cgroup v2 line
/// ("0::/a/b") when `v1_controller` is empty, else the v1 line naming that controller
/// ("4:cpu,cpuacct:/a/b"); empty when there is none.
std::string own_cgroup(const std::string& v1_controller = "") {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (v1_controller.empty() ? controllers == ",,"
                              : controllers.find("," + v1_controller + ",") != std::string::npos)
      return line.substr(b + 1);
  }
  return "";
}

/// One cgroup folder's CPU quota in cores: cgroup v2's cpu.max ("QUOTA PERIOD", "max" for
/// none) or v1's cpu.cfs_quota_us / cpu.cfs_period_us (-1 for none); 0 when none is set.
double quota_of(const std::filesystem::path& dir) {
  auto read_two = [](const std::filesystem::path& f1, const std::filesystem::path& f2, std::string& a,
                     double& b) {
    std::ifstream in1(f1);
    if (f2.empty()) return static_cast<bool>(in1 >> a >> b);
    std::ifstream in2(f2);
    return static_cast<bool>(in1 >> a) && static_cast<bool>(in2 >> b);
  };
  std::string quota;
  double period = 0;
  if (!read_two(dir / "cpu.max", {}, quota, period) &&
      !read_two(dir / "cpu.cfs_quota_us", dir / "cpu.cfs_period_us", quota, period))
    return 0;
  if (quota == "max" || quota == "-1" || period <= 0) return 0;
  try {
    return std::stod(quota) / period;
  } catch (...) {
    return 0;
  }
}

/// The tightest quota from `dir` up to `root`: a parent's limit binds too.
double tightest_quota(const std::filesystem::path& root, const std::string& rel) {
  double best = 0;
  for (std::filesystem::path p = root / std::filesystem::path(rel).relative_path();; p = p.parent_path()) {
    const double q = quota_of(p);
    if (q > 0 && (best == 0 || q < best)) best = q;
    if (p.string().size() <= root.string().size() || p == p.parent_path()) break;
  }
  return best;
}

}  // namespace

double cgroup_cpu_quota(const std::string& cgroup_root) {
  const std::filesystem::path root(cgroup_root);
  // cgroup v2 (unified, or the unified part of a hybrid mount), else v1's cpu controller.
  if (std::filesystem::exists(root / "cgroup.controllers")) return tightest_quota(root, own_cgroup());
  if (std::filesystem::exists(root / "unified" / "cgroup.controllers")) {
    if (const double q = tightest_quota(root / "unified", own_cgroup()); q > 0) return q;
  }
  for (const char* mount : {"cpu", "cpu,cpuacct", "cpuacct,cpu"})
    if (std::filesystem::exists(root / mount)) return tightest_quota(root / mount, own_cgroup("cpu"));
  return 0;
}

int usable_cores() {
  const auto cpus = affinity_cpus();
  int n = cpus.empty() ? static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)))
                       : static_cast<int>(cpus.size());
  const double quota = cgroup_cpu_quota();
  if (quota > 0) n = std::min(n, static_cast<int>(std::ceil(quota - 1e-9)));
  return std::max(1, n);
}

CpuTimes read_cpu_times() {
  CpuTimes t;
  t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (tick <= 0) return t;
  const auto cpus = affinity_cpus();
  std::ifstream stat("/proc/stat");
  bool any = false;
  for (std::string line; std::getline(stat, line);) {
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice"; the summary
    // line "cpu " has no number and is skipped.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] == ' ') continue;
    std::istringstream in(line.substr(3));
    int id = -1;
    in >> id;
    if (!cpus.empty() && !std::binary_search(cpus.begin(), cpus.end(), id)) continue;
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (double& x : v) in >> x;
    const double idle = v[3] + v[4];  // idle + iowait
    double total = 0;
    for (double x : v) total += x;  // guest time is already counted in user
    t.total_s += total / tick;
    t.busy_s += (total - idle) / tick;
    any = true;
  }
  std::ifstream self("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start at the last ')': state is
  // field 3, utime 14, stime 15.
  const auto close = text.rfind(')');
  if (!any || close == std::string::npos) return t;
  std::istringstream in(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int f = 3; f <= 15 && in >> field; ++f) {
    if (f == 14) utime = std::stod(field);
    if (f == 15) stime = std::stod(field);
  }
  t.own_s = (utime + stime) / tick;
  t.valid = true;
  return t;
}

double others_busy_cores(const CpuTimes& earlier, const CpuTimes& later) {
  if (!earlier.valid || !later.valid) return 0;
  const double wall = later.wall_s - earlier.wall_s;
  if (wall <= 0) return 0;
  const double busy = later.busy_s - earlier.busy_s, own = later.own_s - earlier.own_s;
  return std::max(0.0, (busy - own) / wall);
}

}  // namespace segflow
