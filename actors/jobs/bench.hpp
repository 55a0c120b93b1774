#pragma once
// `segflow bench`: how fast the real data path + trainer runs a job, against the pure
// compute step on batches already staged in memory (the limit), in the same process.
// Prints JSON lines; ratios, never absolute thresholds, are what to compare across runs.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/training/job_config.hpp"

namespace segflow::actors {

struct BenchOptions {
  double seconds = 60.0;             ///< measured time per loader (after the warm-up epoch)
  std::int64_t max_epochs = 0;       ///< 0: as many as fit in `seconds` (at least 1)
  std::vector<std::string> loaders;  ///< data paths to measure; empty = the config's
  /// When set: a per-op trace of the first loader's measured (end-to-end) epochs, written
  /// there in Chrome trace format (LibTorch's Kineto profiler; chrome://tracing, Perfetto).
  std::string profile_path;
};

/// One JSON object per measurement: {"bench": "e2e"|"compute"|"summary", ...}. Each e2e
/// line has samples_per_s, step_ms, data_wait_ms (mean per step), epochs, steps, the
/// first (cache-filling) epoch's seconds and its decode time (first_epoch_decode_s: decoder
/// time summed over the workers), the memory cache (cache_bytes, cached_voxels,
/// bytes_per_cached_voxel, cache_entries, cache_not_admitted, cache_disk_hits,
/// cache_dtype, cache_device) and the peak host (VmHWM) and device memory (MiB) of that
/// loader's run (peaks are reset after set-up); compute lines the same figures of speed on
/// staged batches; summary: pipeline_efficiency, samples_per_s and bytes_per_cached_voxel
/// per loader, loader ratios, peak_host_mb / peak_gpu_mb (the largest over the loaders)
/// and the same per loader. With options.profile_path, the summary line names the trace.
Result<std::vector<nlohmann::json>> bench_training(
    const models::JobConfig& cfg, const BenchOptions& options,
    const std::function<void(const nlohmann::json&)>& emit = {});

}  // namespace segflow::actors
