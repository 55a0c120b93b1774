#pragma once
// The measured memory model's trial step: a few forward/backward/SGD steps of a network
// (PlainConvUNet from a model section) with nnU-Net's loss (Dice + CE, deep supervision) on
// random data of a given patch and batch, on the target device, under mixed precision;
// peak memory and step time. Used by plan.cpp; no state between calls.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models::planning {

/// What one trial runs.
struct TrialSpec {
  nlohmann::json model;               ///< a job config's `model` section
  std::vector<std::int64_t> spatial;  ///< patch in tensor order ((Z, Y, X) or (Y, X))
  std::int64_t batch = 2;             ///< >= 1
  std::int64_t in_channels = 1;
  std::int64_t num_classes = 2;
  std::string device = "cpu";  ///< cpu | cuda | cuda:N
  std::string amp = "none";    ///< none | bf16 | fp16 (autocast; no loss scaling needed here)
  std::int64_t steps = 2;      ///< timed steps after one warm-up, >= 1
};

/// What it measured.
struct TrialMeasurement {
  double peak_mb = 0;  ///< CUDA: caching allocator peak; CPU: resident-set growth (VmHWM - VmRSS before), MiB
  double step_s = 0;   ///< median seconds of the timed steps
  bool out_of_memory = false;
};

/// Runs the trial. Out of memory is a measurement (out_of_memory), not an error; a model
/// that cannot be built, or another exception, is.
Result<TrialMeasurement> run_trial(const TrialSpec& spec);

/// "none", "bf16" or "fp16" for `setting` (none | bf16 | fp16 | auto) on `device`: auto is
/// bf16 on CUDA and none on a CPU (emulated bf16 is slower than float32 on most CPUs).
Result<std::string> resolve_trial_amp(const std::string& setting, const std::string& device);

}  // namespace segflow::models::planning
