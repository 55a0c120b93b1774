#pragma once
// A training job's configuration (YAML), read into typed option structs in one place, by the
// one option reader (pipeline/options.hpp), before any data is read. Every section has a
// struct with documented in-place defaults, units and ranges: the model (UNetOptions,
// PlainConvUNetOptions or SAM's, as ModelOptions), LossOptions, OptimizerOptions,
// ScheduleOptions, pipeline::SynthOptions (data.synth), TrainSettings, ValidationSettings.
// Unknown keys and bad values are errors naming the file, the key and what was expected:
//   "configs/job.yaml: train.epochs: expected an integer >= 1, got 0"
//   "configs/job.yaml: optimizer.lrr: unknown option; expected name, lr, momentum, ..."
// validate_job_config then builds what parsing cannot check alone (every stage factory, and
// the model, loss and optimizer on the CPU, constructed but not run); `segflow train`,
// `segflow bench` and the daemon's `start` call both before any data is read or made.
//
// Layout (every key optional except stages and model.name; see configs/*.yaml):
//   name: spleen-ct-unet3d        # run folder prefix
//   seed: 0                       # model init, data order, augmentation
//   data:   {root, synth: {cases, size, format, compress, seed}, val_fraction, val_cases,
//            num_classes, folds, fold}
//   stages: [...]                 # pipeline (pipeline/pipeline_spec.hpp)
//   model:  {name: unet|plain_unet|res_enc_unet|sam, ...options,    # models/nets/registry.hpp
//            weights: PATH | {path, names, skip, reinit_head, channels}}  # models/nets/pretrained.hpp
//   loss:   {name: dice_ce, ...}  # models/training/losses.hpp
//   optimizer: {name: sgd|adam|adamw, lr, ...}        # models/training/optim.hpp
//   schedule:  {name: constant|poly|cosine, warmup_steps, poly_exponent, min_lr}
//   train:  {epochs, batch_size, accumulate, grad_clip, amp, device, devices, val_interval,
//            checkpoint_interval, steps_per_epoch, loader, decode_workers, prefetch,
//            cache_rate, cache_bytes, disk_cache, cache_dtype, cache_device, threads,
//            cudnn_benchmark, channels_last, activation_checkpointing, log_every,
//            early_stopping: {metric, patience, min_delta, mode}, freeze, unfreeze_epoch}
//   validation: {roi_size, overlap, mode, sw_batch_size, save_predictions, save_probabilities}
//   output: {runs_dir}
//
// JobConfig::resolved is the whole config after overrides with every default filled in: run
// folders keep it as config.json and checkpoints hold it; job_config_from_json reads it back
// (and the shorter configs that older checkpoints hold).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/registry.hpp"
#include "models/training/losses.hpp"
#include "models/training/optim.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/synth.hpp"

namespace segflow::pipeline {
class OptionParser;
class StageRegistry;
struct SplitOptions;
}  // namespace segflow::pipeline

namespace segflow::models {

/// Where the data comes from (`data`).
struct DataSettings {
  std::string root = "data/phantoms";  ///< dataset folder (MSD, DICOM cases or MedSAM npy)
  /// When set and root is missing: the dataset `segflow synth` makes with these options
  /// (its `out` is root). Unset (null) = root must exist.
  std::optional<pipeline::SynthOptions> synth;
  double val_fraction = 0.2;     ///< fraction of cases held out for validation, [0, 1)
  std::int64_t val_cases = -1;   ///< >= 0 overrides val_fraction (count of cases); -1 = unset
  std::int64_t num_classes = 0;  ///< label values 0..n-1 incl. background, >= 0; 0 = model out_channels
  /// Cross-validation (nnU-Net's): the sorted case ids are shuffled by the job seed and cut
  /// into `folds` parts of near-equal size; fold k validates on part k and trains on the
  /// rest (pipeline/split.hpp cross_validation_folds). >= 2 and at most the case count.
  std::int64_t folds = 5;
  /// The fold this job trains, [0, folds - 1]; -1 = no cross-validation (the val_fraction /
  /// val_cases split). `segflow train --fold K` sets it.
  std::int64_t fold = -1;

  void bind(pipeline::OptionParser& p);
};

/// Early stopping on the full-volume validation the trainer runs (`train.early_stopping`;
/// absent = off), as MONAI's EarlyStopHandler: after `patience` validations in a row
/// without an improvement larger than `min_delta` over the best so far, training stops
/// after that epoch (models/training/early_stopping.hpp).
struct EarlyStoppingSettings {
  std::string metric = "val/dice_mean";  ///< the watched figure: one of early_stopping_metrics()
  std::int64_t patience = 0;             ///< validations without improvement, >= 1 (required)
  double min_delta = 0.0;                ///< an improvement must exceed it, >= 0 (units of the metric)
  std::string mode = "max";              ///< max (higher is better) | min

  void bind(pipeline::OptionParser& p);
};

/// The figures early stopping can watch: what Trainer::validate computes ("val/dice_mean").
const std::vector<std::string>& early_stopping_metrics();

/// How to train (`train`).
struct TrainSettings {
  std::int64_t epochs = 10;     ///< >= 1
  std::int64_t batch_size = 2;  ///< samples per micro-batch (after crops), >= 1
  std::int64_t accumulate = 1;  ///< micro-batches per optimizer step, >= 1
  double grad_clip = 0.0;       ///< max global grad norm, >= 0; 0 = off
  std::string amp =
      "none";  ///< none | bf16 | fp16 | auto (models/training/amp.hpp; fp16: CUDA only, loss scaling)
  std::string device = "auto";  ///< auto | cpu | cuda | cuda:N
  /// Data parallel in one process: one rank per entry ([cuda:0, cuda:1], or [cpu, cpu] for
  /// CPU ranks; each CUDA device at most once); empty or one entry = a single trainer on
  /// `device`. `segflow train --devices/--ranks` override it.
  std::vector<std::string> devices;
  std::int64_t val_interval = 1;         ///< validate every N epochs (and at the end), >= 0; 0 = never
  std::int64_t checkpoint_interval = 1;  ///< write last.pt every N epochs (and at the end), >= 1
  std::int64_t steps_per_epoch = 0;      ///< > 0 caps the batches per epoch; 0 = all
  std::string loader = "actors";         ///< actors (CAF pipeline) | simple (synchronous baseline)
  std::int64_t decode_workers = 2;       ///< decode pool size, [1, 256]
  std::int64_t prefetch = 2;             ///< batches prepared ahead per trainer, [1, 1024]
  double cache_rate = 1.0;               ///< fraction of cases cached in memory, [0, 1]
  std::int64_t cache_bytes = 8LL << 30;  ///< memory cache budget in bytes, >= 0
  std::string disk_cache;                ///< persistent cache folder ("" = none)
  /// Form of cached samples (pipeline/cache/compact.hpp): exact (lossless: narrow integer
  /// types, palettes, packed crop-centre sets) | float16 | bfloat16 (non-integer images
  /// rounded) | none (as decoded: float32 image, int64 indices).
  std::string cache_dtype = "exact";
  /// Where the memory cache lives: cpu | cuda (the training GPU itself; needs a CUDA
  /// device, crops then read device memory only). cache_bytes is the budget either way.
  std::string cache_device = "cpu";
  /// Intra-op threads of the trainer, [1, 1024], or 0 = auto (written "auto"; 0 is read as
  /// auto too, as older configs wrote it): the cores
  /// other processes leave free, re-decided while training (models/training/cpu_threads.hpp).
  std::int64_t threads = 0;
  bool cudnn_benchmark = true;  ///< cuDNN autotuner on CUDA
  bool channels_last = false;   ///< channels-last memory format on CUDA
  /// Keep only each network stage's input for backward and recompute the stage there
  /// (models/nets/recompute.hpp): less memory per step for one more forward of the stages.
  bool activation_checkpointing = false;
  std::int64_t log_every = 10;  ///< metrics.jsonl step records every N steps, >= 1
  /// Early stopping on validation; unset (absent or null) = off. Needs val_interval > 0.
  std::optional<EarlyStoppingSettings> early_stopping;
  /// Parameters that get no gradient (fine-tuning): regexes (ECMAScript) matched against
  /// whole parameter names (YAML: ['^down\.0\.', '^encoder_stages\.[01]\.']); each must match one.
  std::vector<std::string> freeze;
  /// The epoch (0-based) from which the frozen parameters train too; 0 = frozen for the
  /// whole run. > 0 needs freeze rules.
  std::int64_t unfreeze_epoch = 0;

  void bind(pipeline::OptionParser& p);

 private:
  void bind_early_stopping(pipeline::OptionParser& p);
};

/// Sliding-window validation and inference (`validation`).
struct ValidationSettings {
  /// Window (x, y, z) or (x, y) in voxels, each >= 1; empty = the whole volume.
  std::vector<std::int64_t> roi_size;
  double overlap = 0.25;           ///< fraction of the window shared by neighbours, [0, 1)
  std::string mode = "gaussian";   ///< blending: gaussian | constant | nnunet (sliding_window.hpp BlendMode)
  std::int64_t sw_batch_size = 1;  ///< windows per forward pass, >= 1
  /// At the end of training, predict the validation cases with the final model (sliding
  /// window, on each case's own grid) into the run's validation/ folder and score them:
  /// the out-of-fold predictions `segflow cv` collects.
  bool save_predictions = true;
  /// With save_predictions: also write each validation case's class probabilities on its
  /// own grid ("<case id>_probabilities.nii.gz", as `segflow infer --save-probabilities`);
  /// what `segflow select` averages for ensembles.
  bool save_probabilities = false;

  void bind(pipeline::OptionParser& p);
};

/// A whole job.
struct JobConfig {
  std::string file;          ///< where it came from ("" for inline configs)
  std::string name = "job";  ///< [A-Za-z0-9._-]+
  std::uint64_t seed = 0;    ///< >= 0
  DataSettings data;
  pipeline::PipelineSpec stages;  ///< validated by building it (validate_job_config)
  ModelOptions model;             ///< `model` (name required)
  LossOptions loss;               ///< `loss`; default dice_ce with softmax
  OptimizerOptions optimizer;     ///< `optimizer`; default adamw, lr 1e-3
  /// `schedule`; default constant (a section without a name is poly, as parse_schedule_options)
  ScheduleOptions schedule{ScheduleKind::constant};
  TrainSettings train;
  ValidationSettings validation;
  std::string runs_dir = "runs";  ///< `output.runs_dir`: parent of the run folders
  nlohmann::json resolved;        ///< the whole config as JSON after overrides, defaults filled in
};

/// Reads a YAML job config from a file, applying `--set key=value` overrides first
/// (dotted paths, sequence indices allowed: "train.epochs=4", "stages.3.options.prob=0").
Result<JobConfig> load_job_config(const std::filesystem::path& file,
                                  const std::vector<std::string>& overrides = {});
/// The same from YAML text (`file` names it in messages).
Result<JobConfig> parse_job_config(const std::string& yaml_text, const std::string& file,
                                   const std::vector<std::string>& overrides = {});
/// From JSON (a checkpoint's resolved config).
Result<JobConfig> job_config_from_json(const nlohmann::json& j, const std::string& file);

/// The checks parsing cannot make alone, without reading data: builds every stage of the
/// pipeline through `registry` (factories validate their options), the model on the CPU
/// (constructed, not run; `model.weights` must exist but is not read), the loss, and the
/// optimizer over the model's parameters; refuses train.amp fp16 with a CPU train.device.
/// Errors name the file and the key ("configs/job.yaml: model: ..."). Model construction
/// draws from LibTorch's default CPU generator (the trainer seeds it again before its own).
Status validate_job_config(const JobConfig& cfg, const pipeline::StageRegistry& registry);

/// Where the options of stage i of the job are written, for messages:
/// "configs/job.yaml: stages[3].options" ("stages[3].options" for an inline config).
std::string stage_options_where(const JobConfig& cfg, std::size_t i);

/// Classes the model predicts, background included: data.num_classes when > 0, else the
/// model's out_channels (2 for a single sigmoid output); 0 when the config does not say.
std::int64_t configured_num_classes(const JobConfig& cfg);

/// Checks each map_labels stage of the job (its options as the stage reads them) against
/// configured_num_classes: every target must lie in 0..K-1. Errors name the file, the stage
/// and the option: "job.yaml: stages[1].options.keep: expected at most 3 labels (targets 1..3
/// of num_classes 4, from model.out_channels), got 4". Ok when K is unknown.
Status check_label_mapping(const JobConfig& cfg);

/// Deterministic run folder name: "<name>-s<seed>-<8 hex of the resolved config's hash>",
/// and "-fold<K>" after it for a cross-validation fold (the folds of one config share the
/// rest of the name; data.fold is left out of the hash, data.folds is in it).
std::string run_name(const JobConfig& cfg);

/// The split a job trains on: its seed and data.{val_fraction, val_cases, folds, fold}, with
/// the config file and data.root for error messages (include pipeline/split.hpp to use it).
pipeline::SplitOptions split_options(const JobConfig& cfg);

}  // namespace segflow::models
