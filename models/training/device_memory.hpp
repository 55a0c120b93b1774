#pragma once
// Accelerator memory figures for metrics and benchmarks.

#include <c10/core/Device.h>

namespace segflow::models {

/// Peak bytes allocated by LibTorch's caching allocator on `device` since the process
/// started (or the last reset), in MiB; 0 for CPU devices.
double peak_device_memory_mb(const c10::Device& device);

/// Peak resident set size of this process (VmHWM), in MiB.
double peak_host_memory_mb();

}  // namespace segflow::models
