#pragma once
// The trainer: a plain class with a fixed sequence of hooks (epoch start, step, validate,
// checkpoint), driven by a BatchSource it pulls from. CAF-free; the trainer actor and
// `segflow train` wrap it. One Trainer per device; not thread-safe.
//
// Exact resume: a checkpoint holds the weights and buffers, the optimizer state, the loss
// scaler, the epoch and step counters, the global RNG state, the best metric and the
// resolved config. Data order and augmentation depend only on (seed, rank, epoch, index),
// so N epochs + resume for N more gives the same weights as 2N epochs in one go (CPU).
// Checkpoints are device-portable: they are read onto the CPU (map_location) and copied
// into the trainer's own tensors, so a checkpoint written on cuda:1 loads on a CPU-only
// machine or on cuda:0, and parameters keep their device, dtype and memory format. The
// format, save_checkpoint / load_checkpoint and load_for_inference are in checkpoint.cpp.
//
// Mixed precision (train.amp): bf16 autocast on CPU and CUDA, fp16 autocast with dynamic
// loss scaling on CUDA (GradScaler, models/training/optim.hpp). Every precision checks the
// gradients for inf/NaN; such a step is skipped on the device and counted (skipped_steps).
//
// No host syncs in a step: the loss is summed on the device and read, with the skipped-step
// count and the loss scale, every train.log_every steps and at the end of an epoch (the
// only device reads of the loop); the optimizer step, unscaling, clipping and the skip
// decision all stay on the device. On CUDA the trainer binds its device on every call
// (device guard) and sets float32 matmul precision "high" (TF32).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "models/fwd.hpp"
#include "models/nets/registry.hpp"
#include "models/training/amp.hpp"
#include "models/training/checkpoint.hpp"  // load_for_inference, for the callers of Trainer
#include "models/training/early_stopping.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/batch_source.hpp"

namespace segflow::models {

/// One optimizer step as the observers see it. The device is read only on logged steps
/// (global step a multiple of train.log_every): there `loss`, `skipped_steps` and
/// `loss_scale` are fresh; on other steps they repeat the last logged values (NaN loss
/// before the first) and skipped_steps is 0.
struct StepInfo {
  std::int64_t epoch = 0;          ///< 0-based
  std::int64_t step = 0;           ///< global optimizer step, 1-based after the step
  std::int64_t step_in_epoch = 0;  ///< 1-based
  bool logged = false;             ///< statistics read from the device at this step
  double loss = 0.0;               ///< mean loss per step since the previous logged step
  double lr = 0.0;
  double step_s = 0.0;             ///< host wall time of the step (data wait + launching the work; on
                                   ///< CUDA the device may still be running it)
  double data_wait_s = 0.0;        ///< time spent waiting for batches
  std::int64_t samples = 0;        ///< samples in the step
  std::int64_t skipped_steps = 0;  ///< steps with inf/NaN gradients since the previous logged step
  bool skipped = false;            ///< skipped_steps > 0
  double loss_scale = 1.0;         ///< fp16: the dynamic loss scale after this step; else 1
  /// Micro-batches the step used: train.accumulate, fewer when the data ran out during the
  /// step (on any rank), 0 when there was no batch at all (then nothing was done).
  std::int64_t micro_batches = 0;
  bool data_ended = false;  ///< the data ran out during this step: the epoch has no more steps
};

/// One epoch as the observers see it.
struct EpochInfo {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;
  double loss = 0.0;  ///< mean over steps
  double seconds = 0.0;
  double samples_per_s = 0.0;
  double data_wait_s = 0.0;        ///< total over the epoch
  double lr = 0.0;                 ///< at the end of the epoch
  std::int64_t skipped_steps = 0;  ///< steps skipped for inf/NaN gradients in the epoch
};

/// A validation result.
struct ValidationInfo {
  std::int64_t epoch = 0;
  std::vector<double> dice_per_class;  ///< classes 1..K-1 (NaN: never present)
  double mean_dice = 0.0;              ///< MONAI "mean" reduction
  std::int64_t cases = 0;
  double seconds = 0.0;
  bool best = false;  ///< a new best (best.pt written)
  /// Names of the classes 0..K-1, background first (Trainer::set_class_names); empty = unnamed.
  std::vector<std::string> class_names;
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
  /// train.early_stopping ended the run after the epoch's validation (before its last.pt is
  /// written), or had ended it before this attempt (info.earlier: a resume trains nothing).
  virtual void on_early_stop(const EarlyStopInfo& info) {}
  /// Polled between steps: true stops training after writing a checkpoint. Must answer
  /// from host state (a flag), never by reading the device.
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
  /// True on every rank when `flag` is true on any (a collective; every rank calls it at the
  /// same point): the early-stopping decision of the rank that validates. One rank: `flag`.
  virtual bool any(bool flag) { return flag; }
};

/// Resolves "auto" / "cpu" / "cuda" / "cuda:N"; "auto" is cuda:0 when available.
Result<c10::Device> resolve_device(const std::string& text);

/// Trainer state that a checkpoint restores.
struct TrainState {
  std::int64_t epoch = 0;     ///< next epoch to run (0-based)
  std::int64_t step = 0;      ///< optimizer steps done
  double best_metric = -1.0;  ///< best validation mean Dice so far (-1: none)
  std::int64_t best_epoch = -1;
  double loss_scale = 65536.0;     ///< fp16 dynamic loss scale (as of the last read)
  std::int64_t good_steps = 0;     ///< fp16 steps since the last scale change (idem)
  std::int64_t skipped_steps = 0;  ///< steps skipped for inf/NaN gradients (idem)
  EarlyStopState early_stop;  ///< train.early_stopping's best and count (models/training/early_stopping.hpp)
};

class Trainer {
 public:
  /// Builds the model, loss, optimizer and schedule from `cfg` on `device` (seeding the
  /// global RNG with cfg.seed first so initial weights depend on the seed only).
  static Result<std::unique_ptr<Trainer>> create(const JobConfig& cfg, const c10::Device& device);
  ~Trainer();

  /// Restores a checkpoint (models/training/checkpoint.hpp) written by save_checkpoint on any device (or by
  /// an earlier segflow, format 1): the file is read onto the CPU and every tensor is copied into the
  /// trainer's own parameters, buffers, optimizer state and loss scaler on device(); shapes
  /// are checked first and nothing depends on the device it was saved from. Errors name the
  /// file and the part.
  Status load_checkpoint(const std::filesystem::path& path);
  /// Writes a checkpoint atomically (temp file + rename). Reads the loss scaler's state
  /// from the device.
  Status save_checkpoint(const std::filesystem::path& path) const;

  /// One epoch from `source` (start_epoch is called here): train_step until the data ends,
  /// train.steps_per_epoch steps are done or observer.should_stop(), then one device read for
  /// the epoch's figures. `steps_per_epoch` is used for the schedule (total steps = epochs *
  /// steps_per_epoch).
  Result<EpochInfo> train_epoch(pipeline::BatchSource& source, std::int64_t steps_per_epoch,
                                TrainObserver& observer);
  /// One optimizer step from `source` (whose epoch the caller has started): up to
  /// train.accumulate micro-batches, each asking the gradient synchroniser (if any) whether
  /// every rank has one, with its forward, loss and backward (gradients all-reduced on the
  /// last micro-batch only); a step cut short by the end of the data is rescaled to a full
  /// mean; then unscaling (fp16), the inf/NaN check that skips the update on the device,
  /// clipping, the optimizer step and the learning rate of the schedule at this step of
  /// `total_steps`. Reads the device only on logged steps. Failed cases and the step go to
  /// `observer` (on_case_failure, on_step). info.micro_batches == 0: no batch, no step;
  /// info.data_ended: no further step this epoch. Call on the trainer's thread.
  Result<StepInfo> train_step(pipeline::BatchSource& source, std::int64_t total_steps,
                              TrainObserver& observer);
  /// Sliding-window validation over whole preprocessed samples ("image", "label").
  Result<ValidationInfo> validate(const std::vector<Sample>& samples);

  /// The whole loop: epochs from state().epoch to cfg.train.epochs with validation every
  /// val_interval and checkpoints every checkpoint_interval into `run_dir` (last.pt,
  /// best.pt), honouring observer.should_stop() and train.early_stopping (which stops after
  /// the epoch whose validation reached the patience, with last.pt written; a run resumed
  /// after such a stop trains nothing unless the patience was raised).
  Status fit(pipeline::BatchSource& source, std::int64_t steps_per_epoch, const std::vector<Sample>& val,
             const std::filesystem::path& run_dir, TrainObserver& observer);

  /// Logits for one preprocessed image (C, *spatial) -> (K, *spatial), sliding window for
  /// UNets (slice by slice for 2D models on volumes), direct for box-prompted models.
  at::Tensor predict(const at::Tensor& image, const at::Tensor& box = {}) const;

  /// Attaches a data-parallel gradient synchroniser (null: single rank). Attach before
  /// training; the synchroniser owns broadcasting the initial weights.
  void set_gradient_sync(std::shared_ptr<GradientSync> sync) { sync_ = std::move(sync); }
  /// Names of the classes 0..K-1 (background first) that validation results carry.
  void set_class_names(std::vector<std::string> names) { class_names_ = std::move(names); }
  /// The class names set above or read back from a checkpoint's meta (empty = unnamed).
  const std::vector<std::string>& class_names() const { return class_names_; }
  /// The parameters the optimizer updates, in a fixed order (what a synchroniser reduces).
  const std::vector<at::Tensor>& parameters() const;

  /// The optimizer and loss scaler (tests, tools).
  FusedOptimizer& optimizer();
  GradScaler& scaler();
  /// How many times the training loop has read the device (for tests of the no-sync rule).
  std::int64_t host_reads() const;
  /// The intra-op team of the stepping thread (train.threads; models/training/cpu_threads.hpp).
  const IntraOpTeam& intra_op_team() const;
  /// Fits the calling thread's intra-op team to the cores other processes leave free now
  /// (train.threads: auto; a fixed team is only applied). Cheap: reads the machine at most
  /// every 2 s. Inference calls it between window batches and slices, as train_step does
  /// between steps. Const: it changes the thread's OpenMP setting, not the model.
  void fit_intra_op_team() const;

  const TrainState& state() const { return state_; }
  /// The job's config as this trainer runs it: train.amp is the resolved mode (none, bf16
  /// or fp16; "auto" chosen for the device, models/training/amp.hpp), the rest as given.
  const JobConfig& config() const { return cfg_; }
  /// Why train.amp is what config() says ("auto: CPU with native bf16 (AMX-BF16)").
  const std::string& amp_reason() const { return amp_reason_; }
  const ModelHandle& model() const { return model_; }
  c10::Device device() const { return device_; }
  std::int64_t num_classes() const { return num_classes_; }

 private:
  Trainer(JobConfig cfg, c10::Device device, ModelHandle model);
  /// fit's validation of the epoch just trained: best.pt, on_validation, and early stopping
  /// agreed by all ranks (its report when the run stops here).
  Result<std::optional<EarlyStopInfo>> validate_epoch(const std::vector<Sample>& val,
                                                      const std::filesystem::path& run_dir,
                                                      TrainObserver& observer);
  /// True when train.early_stopping had already stopped the run a checkpoint resumed.
  bool stopped_early_before(TrainObserver& observer);
  struct Impl;
  JobConfig cfg_;
  c10::Device device_;
  ModelHandle model_;
  std::int64_t num_classes_ = 2;
  TrainState state_;
  std::shared_ptr<GradientSync> sync_;
  std::vector<std::string> class_names_;
  std::string amp_reason_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace segflow::models
