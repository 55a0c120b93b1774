#pragma once
// The trainer: a plain class with a fixed sequence of hooks (epoch start, step, validate,
// checkpoint), driven by a BatchSource it pulls from. CAF-free; the trainer actor and
// `segflow train` wrap it. One Trainer per device; not thread-safe.
//
// Exact resume: a checkpoint holds the weights and buffers, the optimizer state, the loss
// scaler, the epoch and step counters, the global RNG state, the best metric and the
// resolved config. Data order and augmentation depend only on (seed, rank, epoch, index),
// so N epochs + resume for N more gives the same weights as 2N epochs in one go (CPU).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "models/job_config.hpp"
#include "models/registry.hpp"
#include "pipeline/batch_source.hpp"

namespace torch::optim {
class Optimizer;
}

namespace segflow::models {

/// One optimizer step as the observers see it.
struct StepInfo {
  std::int64_t epoch = 0;          ///< 0-based
  std::int64_t step = 0;           ///< global optimizer step, 1-based after the step
  std::int64_t step_in_epoch = 0;  ///< 1-based
  double loss = 0.0;               ///< mean loss over the step's micro-batches
  double lr = 0.0;
  double step_s = 0.0;       ///< wall time of the step (compute + data wait)
  double data_wait_s = 0.0;  ///< time spent waiting for batches
  std::int64_t samples = 0;  ///< samples in the step
  bool skipped = false;      ///< fp16: inf/NaN gradients, step skipped
};

/// One epoch as the observers see it.
struct EpochInfo {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;
  double loss = 0.0;  ///< mean over steps
  double seconds = 0.0;
  double samples_per_s = 0.0;
  double data_wait_s = 0.0;  ///< total over the epoch
  double lr = 0.0;           ///< at the end of the epoch
};

/// A validation result.
struct ValidationInfo {
  std::int64_t epoch = 0;
  std::vector<double> dice_per_class;  ///< classes 1..K-1 (NaN: never present)
  double mean_dice = 0.0;              ///< MONAI "mean" reduction
  std::int64_t cases = 0;
  double seconds = 0.0;
  bool best = false;  ///< a new best (best.pt written)
};

/// Receives the trainer's events. Default methods do nothing.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_epoch_start(std::int64_t epoch, std::int64_t total_epochs) {}
  virtual void on_step(const StepInfo& info) {}
  virtual void on_epoch_end(const EpochInfo& info) {}
  virtual void on_validation(const ValidationInfo& info) {}
  virtual void on_checkpoint(const std::filesystem::path& path, const std::string& kind) {}
  virtual void on_case_failure(const pipeline::CaseFailure& failure) {}
  /// Polled between steps: true stops training after writing a checkpoint.
  virtual bool should_stop() { return false; }
};

/// Gradient synchronisation across data-parallel ranks (models/parallel/). Per micro-batch
/// the trainer first asks all_have(): every rank says whether it has a batch, and the step
/// (and the epoch) ends on every rank as soon as one has none, so uneven shards never hang
/// a collective. before_backward(loss, sync) comes before each backward, sync=true only on
/// the last micro-batch of a step (no all-reduce while accumulating, as DDP's no_sync);
/// after_backward(synced) once the step's gradients are complete, before clipping and the
/// optimizer step; synced=false when the step ended early and nothing was reduced yet.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual bool all_have(bool have_batch) = 0;
  virtual void before_backward(const at::Tensor& loss, bool sync) = 0;
  virtual void after_backward(bool synced) = 0;
};

/// Resolves "auto" / "cpu" / "cuda" / "cuda:N"; "auto" is cuda:0 when available.
Result<c10::Device> resolve_device(const std::string& text);

/// Trainer state that a checkpoint restores.
struct TrainState {
  std::int64_t epoch = 0;     ///< next epoch to run (0-based)
  std::int64_t step = 0;      ///< optimizer steps done
  double best_metric = -1.0;  ///< best validation mean Dice so far (-1: none)
  std::int64_t best_epoch = -1;
  double loss_scale = 65536.0;  ///< fp16 dynamic loss scale
  std::int64_t good_steps = 0;  ///< fp16 steps since the last scale change
};

class Trainer {
 public:
  /// Builds the model, loss, optimizer and schedule from `cfg` on `device` (seeding the
  /// global RNG with cfg.seed first so initial weights depend on the seed only).
  static Result<std::unique_ptr<Trainer>> create(const JobConfig& cfg, const c10::Device& device);
  ~Trainer();

  /// Restores a checkpoint written by save_checkpoint (errors name the file and the part).
  Status load_checkpoint(const std::filesystem::path& path);
  /// Writes a checkpoint atomically (temp file + rename).
  Status save_checkpoint(const std::filesystem::path& path) const;

  /// One epoch from `source` (start_epoch is called here). `steps_per_epoch` is used for the
  /// schedule (total steps = epochs * steps_per_epoch).
  Result<EpochInfo> train_epoch(pipeline::BatchSource& source, std::int64_t steps_per_epoch,
                                TrainObserver& observer);
  /// Sliding-window validation over whole preprocessed samples ("image", "label").
  Result<ValidationInfo> validate(const std::vector<Sample>& samples);

  /// The whole loop: epochs from state().epoch to cfg.train.epochs with validation every
  /// val_interval and checkpoints every checkpoint_interval into `run_dir` (last.pt,
  /// best.pt), honouring observer.should_stop().
  Status fit(pipeline::BatchSource& source, std::int64_t steps_per_epoch, const std::vector<Sample>& val,
             const std::filesystem::path& run_dir, TrainObserver& observer);

  /// Logits for one preprocessed image (C, *spatial) -> (K, *spatial), sliding window for
  /// UNets (slice by slice for 2D models on volumes), direct for box-prompted models.
  at::Tensor predict(const at::Tensor& image, const at::Tensor& box = {}) const;

  /// Attaches a data-parallel gradient synchroniser (null: single rank). Attach before
  /// training; the synchroniser owns broadcasting the initial weights.
  void set_gradient_sync(std::shared_ptr<GradientSync> sync) { sync_ = std::move(sync); }
  /// The parameters the optimizer updates, in a fixed order (what a synchroniser reduces).
  const std::vector<at::Tensor>& parameters() const;

  const TrainState& state() const { return state_; }
  const JobConfig& config() const { return cfg_; }
  const ModelHandle& model() const { return model_; }
  c10::Device device() const { return device_; }
  std::int64_t num_classes() const { return num_classes_; }

 private:
  Trainer(JobConfig cfg, c10::Device device, ModelHandle model);
  struct Impl;
  JobConfig cfg_;
  c10::Device device_;
  ModelHandle model_;
  std::int64_t num_classes_ = 2;
  TrainState state_;
  std::shared_ptr<GradientSync> sync_;
  std::unique_ptr<Impl> impl_;
};

/// A model with its config, restored from a checkpoint for inference.
Result<std::unique_ptr<Trainer>> load_for_inference(const std::filesystem::path& checkpoint,
                                                    const std::string& device = "auto");

}  // namespace segflow::models
