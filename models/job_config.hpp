#pragma once
// A training job's configuration (YAML), parsed and validated in one place before any
// data is read. Every section's keys are checked: unknown keys and bad values are errors
// naming the file, the path and what was expected:
//   "configs/job.yaml: train.epochs: expected an integer >= 1, got 0"
//
// Layout (every key optional except stages and model; see configs/*.yaml):
//   name: spleen-ct-unet3d        # run folder prefix
//   seed: 0                       # model init, data order, augmentation
//   data:   {root, synth: {cases, size, format, seed}, val_fraction, val_cases, num_classes}
//   stages: [...]                 # pipeline (pipeline/pipeline_spec.hpp)
//   model:  {name: unet, ...options}
//   loss:   {name: dice_ce, ...}  # models/losses.hpp
//   optimizer: {name: sgd, lr: 0.2, ...}
//   schedule:  {name: constant|poly|cosine, warmup_steps, ...}
//   train:  {epochs, batch_size, accumulate, grad_clip, amp, device, val_interval,
//            checkpoint_interval, steps_per_epoch, loader, decode_workers, prefetch,
//            cache_rate, cache_bytes, disk_cache, threads, cudnn_benchmark, channels_last}
//   validation: {roi_size, overlap, mode, sw_batch_size}
//   output: {runs_dir}

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::models {

/// Where the data comes from.
struct DataSettings {
  std::string root = "data/phantoms";  ///< dataset folder (MSD, DICOM cases or MedSAM npy)
  nlohmann::json synth;                ///< when set and root is missing: `segflow synth` options
  double val_fraction = 0.2;           ///< fraction of cases held out for validation, [0, 1)
  std::int64_t val_cases = -1;         ///< >= 0 overrides val_fraction (count of cases)
  std::int64_t num_classes = 0;        ///< label values 0..n-1 incl. background; 0 = model out_channels
};

/// How to train.
struct TrainSettings {
  std::int64_t epochs = 10;     ///< >= 1
  std::int64_t batch_size = 2;  ///< samples per micro-batch (after crops), >= 1
  std::int64_t accumulate = 1;  ///< micro-batches per optimizer step, >= 1
  double grad_clip = 0.0;       ///< max global grad norm; 0 = off
  std::string amp = "none";     ///< none | bf16 | fp16 (fp16: CUDA only, dynamic loss scaling)
  std::string device = "auto";  ///< auto | cpu | cuda | cuda:N
  /// Data parallel in one process: one rank per entry ([cuda:0, cuda:1], or [cpu, cpu] for
  /// CPU ranks); empty or one entry = a single trainer on `device`. `segflow train
  /// --devices/--ranks` override it.
  std::vector<std::string> devices;
  std::int64_t val_interval = 1;         ///< validate every N epochs (and at the end); 0 = never
  std::int64_t checkpoint_interval = 1;  ///< write last.pt every N epochs (and at the end), >= 1
  std::int64_t steps_per_epoch = 0;      ///< > 0 caps the batches per epoch
  std::string loader = "actors";         ///< actors (CAF pipeline) | simple (synchronous baseline)
  std::int64_t decode_workers = 2;       ///< decode pool size, >= 1
  std::int64_t prefetch = 2;             ///< batches prepared ahead per trainer, >= 1
  double cache_rate = 1.0;               ///< fraction of cases cached in memory, [0, 1]
  std::int64_t cache_bytes = 8LL << 30;  ///< memory cache budget in bytes
  std::string disk_cache;                ///< persistent cache folder ("" = none)
  std::int64_t threads = 0;              ///< intra-op threads; 0 = LibTorch's default
  bool cudnn_benchmark = true;           ///< cuDNN autotuner on CUDA
  bool channels_last = false;            ///< channels-last memory format on CUDA
  std::int64_t log_every = 10;           ///< metrics.jsonl step records every N steps
};

/// Sliding-window validation and inference.
struct ValidationSettings {
  std::vector<std::int64_t> roi_size;  ///< window (x, y, z) or (x, y) in voxels; empty = whole volume
  double overlap = 0.25;               ///< [0, 1)
  std::string mode = "gaussian";       ///< gaussian | constant
  std::int64_t sw_batch_size = 1;      ///< >= 1
};

/// A whole job.
struct JobConfig {
  std::string file;          ///< where it came from ("" for inline configs)
  std::string name = "job";  ///< [A-Za-z0-9._-]+
  std::uint64_t seed = 0;
  DataSettings data;
  pipeline::PipelineSpec stages;
  std::string model_name = "unet";
  nlohmann::json model_options = nlohmann::json::object();
  nlohmann::json loss = {{"name", "dice_ce"}};
  nlohmann::json optimizer = {{"name", "adamw"}};
  nlohmann::json schedule = {{"name", "constant"}};
  TrainSettings train;
  ValidationSettings validation;
  std::string runs_dir = "runs";
  nlohmann::json resolved;  ///< the whole config as JSON after overrides and defaults
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

/// Deterministic run folder name: "<name>-s<seed>-<8 hex of the resolved config's hash>".
std::string run_name(const JobConfig& cfg);

}  // namespace segflow::models
