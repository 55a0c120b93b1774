#pragma once
// The trainer's private state (Trainer::Impl) and the helpers its two source files share:
// trainer.cpp (building, the training loop, validation) and checkpoint.cpp (save and load).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/nets/pretrained.hpp"
#include "models/training/cpu_threads.hpp"
#include "models/training/losses.hpp"
#include "models/training/optim.hpp"
#include "models/training/trainer.hpp"

namespace segflow::models {

namespace detail {

/// Binds `device` as the current CUDA device for the guard's lifetime (nothing on a CPU).
class BindDevice {
 public:
  explicit BindDevice(const c10::Device& device) {
    if (device.is_cuda()) guard_.reset_device(device);
  }

 private:
  c10::OptionalDeviceGuard guard_;
};

/// The first line of an exception's message (LibTorch's carry a backtrace after it).
using ::segflow::first_line;

}  // namespace detail

struct Trainer::Impl {
  LossFn loss;
  std::optional<DeepSupervisionLoss> ds_loss;
  std::unique_ptr<FusedOptimizer> optimizer;
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<LrSchedule> schedule;
  double base_lr = 1e-3;
  std::vector<at::Tensor> params;
  /// On the device, double: [loss sum since the last read, loss sum of the epoch].
  at::Tensor loss_sums;
  std::int64_t host_reads = 0;
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  double last_scale = 1.0;
  std::int64_t window_steps = 0;  ///< steps since the last logged read
  std::int64_t epoch_steps = 0;   ///< steps of the current epoch
  /// What model.weights loaded and train.freeze froze (weights_report.json).
  WeightsReport weights_report;
  /// The parameters train.freeze matches (no gradient before train.unfreeze_epoch).
  std::vector<at::Tensor> frozen;
  /// The intra-op team of the thread that runs the steps (train.threads), re-fitted between
  /// steps.
  std::unique_ptr<IntraOpTeam> threads;

  /// What one device read of the training loop returns.
  struct StatsRead {
    double window_loss_sum = 0.0;
    double epoch_loss_sum = 0.0;
    std::int64_t skipped_total = 0;
    double loss_scale = 1.0;
  };
  /// The one place the loop reads the device (every log_every steps and at the epoch's end);
  /// starts a new logging window.
  StatsRead read_stats();
};

}  // namespace segflow::models
