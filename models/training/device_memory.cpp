#include "models/training/device_memory.hpp"

#include <c10/cuda/CUDACachingAllocator.h>

#include <fstream>
#include <string>

namespace segflow::models {

double peak_device_memory_mb(const c10::Device& device) {
  if (!device.is_cuda()) return 0.0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
  const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(stats.allocated_bytes[agg].peak) / (1024.0 * 1024.0);
}

double peak_host_memory_mb() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  return 0.0;
}

}  // namespace segflow::models
