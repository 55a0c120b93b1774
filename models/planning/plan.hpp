#pragma once
// `segflow plan`: from a dataset fingerprint to training recipes, by nnU-Net v2's planning
// rules (target spacing with the anisotropy rule, topology from get_pool_and_conv_props, the
// patch shrunk from the median shape until it fits, the batch size from the headroom, a 2D
// configuration, and a 3D low-resolution one when the full-resolution patch covers less
// than a quarter of the median image). What "fits" means is the memory model:
//   nnunet    nnU-Net's estimate (feature-map voxels against its reference constants for a
//             memory target), so a plan compares one to one with nnU-Net's own;
//   measured  a few forward/backward trial steps of each candidate (patch, batch) of
//             PlainConvUNet + Dice/CE on the target device, under its mixed precision: the
//             largest candidate whose measured peak memory fits the target and whose step
//             time fits --max-step-s (on a CPU the time decides); peaks and step times are
//             recorded in the plan, with where and why it differs from nnU-Net's estimate.
// plan_dataset writes, into the output folder, fingerprint.json, plans.json (nnU-Net v2's
// field names, its axis order) and one runnable job YAML per configuration (segflow's
// (x, y, z) order, each choice with a comment naming the fingerprint figure behind it).
//
// Thread safety: no global state; concurrent calls on different folders are safe. The
// measured model resets the device's peak-memory statistics while it runs its trials, which
// a job training on the same device at the same time would disturb (and be disturbed by).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/planning/nnunet_rules.hpp"
#include "pipeline/fingerprint.hpp"

namespace segflow::models::planning {

/// nnU-Net's configurations.
enum class ConfigurationKind { two_d, fullres_3d, lowres_3d };
/// "2d", "3d_fullres", "3d_lowres".
const char* to_string(ConfigurationKind k);
/// The kind named `name`; invalid_argument listing the names otherwise.
Result<ConfigurationKind> parse_configuration(const std::string& name);

/// How a candidate's memory is judged.
enum class MemoryModel { nnunet, measured };
/// "nnunet", "measured".
const char* to_string(MemoryModel m);
Result<MemoryModel> parse_memory_model(const std::string& name);

/// Options of plan_dataset (`segflow plan` flags).
struct PlanOptions {
  std::vector<ConfigurationKind> configurations{ConfigurationKind::two_d, ConfigurationKind::fullres_3d,
                                                ConfigurationKind::lowres_3d};
  std::string device = "cpu";  ///< cpu | cuda | cuda:N: where trials run and jobs train
  double memory_gb = 8.0;      ///< memory target, GB (nnU-Net's default 8), > 0
  MemoryModel memory_model = MemoryModel::measured;
  /// Step-time budget of the measured model, seconds; 0 = none on CUDA and 2 s on a CPU.
  double max_step_s = 0.0;
  std::int64_t trial_steps = 2;  ///< timed trial steps per candidate (after one warm-up), >= 1
  std::string amp = "auto";      ///< mixed precision of the trials and the recipe (models/training/amp.hpp)
  pipeline::FingerprintOptions fingerprint;
  /// Which of nnU-Net's planners (`--preset`): default (PlainConvUNet), resenc-m, resenc-l,
  /// resenc-xl (ResidualEncoderUNet); `constants` are its own (set_preset).
  std::string preset = "default";
  NnunetConstants constants;
  std::string name;  ///< job name prefix; "" = the dataset folder's name
};

/// Sets `o.preset` and its constants, and the preset's memory target unless `keep_memory_gb`
/// (a --memory-gb given); invalid_argument listing the presets for another name.
Status set_preset(PlanOptions& o, const std::string& preset, bool keep_memory_gb);

/// One trial step measurement of the measured model.
struct Trial {
  std::vector<std::int64_t> patch_size;  ///< nnU-Net axis order
  std::int64_t batch_size = 0;
  double peak_mb = 0;  ///< peak device memory (CUDA) or host resident-set growth (CPU), MiB
  double step_s = 0;   ///< median seconds per step
  bool fits = false;   ///< within the memory target and the step budget
  std::string why;     ///< what did not fit ("peak 9123 MiB > 8192 MiB", "out of memory", ...)
};

/// One planned configuration, in nnU-Net's axis order (array order after transpose_forward).
struct ConfigurationPlan {
  ConfigurationKind kind = ConfigurationKind::fullres_3d;
  std::vector<double> spacing;       ///< mm
  std::vector<double> median_shape;  ///< median image size after resampling, voxels
  Topology topology;                 ///< patch, pools, kernels
  std::vector<std::int64_t> features_per_stage;
  std::int64_t batch_size = 2;
  bool batch_dice = false;
  std::vector<std::string> normalization_schemes;  ///< per channel: CTNormalization, ...
  std::vector<bool> use_mask_for_norm;
  MemoryModel memory_model = MemoryModel::nnunet;
  double vram_estimate = 0;   ///< nnU-Net's feature-map voxels of the chosen topology
  double vram_reference = 0;  ///< what the estimate is compared with (for batch 2 / ref batch)
  std::vector<Trial> trials;  ///< measured model: every trial run, in order
  /// nnU-Net's own choice (the nnunet model) when the measured one differs: patch and batch.
  std::vector<std::int64_t> nnunet_patch_size;
  std::int64_t nnunet_batch_size = 0;
  std::vector<std::string> notes;  ///< why each choice was made (YAML comments, plans.json)
};

/// The whole plan.
struct PlanResult {
  pipeline::DatasetFingerprint fingerprint;
  std::string dataset_name;
  std::vector<int> transpose_forward, transpose_backward;  ///< array axes (z, y, x) = 0, 1, 2
  std::vector<double> fullres_spacing;                     ///< array order, before transposing
  std::string device;                                      ///< where the trials ran
  std::string amp;                                         ///< resolved mixed precision
  std::string preset = "default";                          ///< PlanOptions::preset
  NnunetConstants constants;                               ///< the preset's
  std::vector<ConfigurationPlan> configurations;           ///< in PlanOptions order, planned ones only
  std::vector<std::string> notes;                          ///< dataset-level notes (dropped configurations)

  /// The configuration of kind `k`, or null when it was not planned.
  const ConfigurationPlan* find(ConfigurationKind k) const;
  /// plans.json: nnU-Net v2's nnUNetPlans.json fields (and a "segflow" section per
  /// configuration with the memory model's figures).
  nlohmann::json plans_json() const;
  /// The runnable job YAML of configuration `c` (data.root: the dataset folder).
  std::string job_yaml(const ConfigurationPlan& c) const;
};

/// Plans from a fingerprint (no files read or written besides the trials' device).
Result<PlanResult> plan_from_fingerprint(pipeline::DatasetFingerprint fp, const PlanOptions& options);

/// Fingerprints `dataset` and plans it (what the daemon and `segflow plan` call).
Result<PlanResult> plan_dataset(const std::filesystem::path& dataset, const PlanOptions& options);

/// File name of a configuration's YAML in a plan folder ("3d_fullres.yaml").
std::string yaml_file_name(ConfigurationKind k);

/// Writes fingerprint.json, one YAML per configuration, then plans.json into `out`
/// (created), each through a temporary and a rename; a failure leaves no temporary.
Status write_plan(const PlanResult& plan, const std::filesystem::path& out);

/// True when `out` holds a complete plan (plans.json and fingerprint.json) whose fingerprint
/// was made from the files `dataset` has now (pipeline::dataset_signature), which planned
/// configuration `k` with preset `preset`. The reason it is not reusable otherwise.
Status plan_is_current(const std::filesystem::path& out, const std::filesystem::path& dataset,
                       ConfigurationKind k, const std::string& preset = "default");

/// Copies the plan a run trains, `plan_yaml` with the plans.json and fingerprint.json beside
/// it, into the run folder's plan/ (RunLayout::plan(), created): what `segflow train DATASET`
/// and the daemon's training jobs keep. io_error naming the file that cannot be copied.
Status copy_plan_into_run(const std::filesystem::path& plan_yaml, const std::filesystem::path& run_dir);

/// "cuda:0" when a CUDA device is visible, else "cpu" (the default device of a plan).
std::string default_plan_device();

/// Called with one line before a plan is reused or made ("reusing the plan in DIR (...)",
/// "planning DATASET into DIR (why the old one is not current)").
using PlanNoteFn = std::function<void(const std::string& line)>;

/// What plan_or_reuse found or made.
struct EnsuredPlan {
  std::filesystem::path yaml;      ///< the YAML of the configuration asked for
  bool reused = false;             ///< the folder's plan was current and is used as it is
  std::optional<PlanResult> plan;  ///< the plan made and written (not reused)
};

/// Fingerprints and plans `dataset`, then writes the plan into `out` (write_plan) holding
/// `out`/.plan.lock: what `segflow plan` and the daemon's `plan` command do. On a planning
/// error nothing is written.
Result<PlanResult> plan_into_folder(const std::filesystem::path& dataset, const std::filesystem::path& out,
                                    const PlanOptions& options);

/// The YAML of configuration `kind` in plan folder `out`: the plan there when it is current
/// for `dataset` (plan_is_current), else a new plan of `kind` (with 3d_fullres for
/// 3d_lowres) written there first. Holds a lock on the folder while it checks and plans (one
/// planner per folder: ranks of one job, two jobs on one dataset). What `segflow train
/// DATASET` and the daemon's auto_train call.
Result<EnsuredPlan> plan_or_reuse(const std::filesystem::path& dataset, const std::filesystem::path& out,
                                  ConfigurationKind kind, PlanOptions options, const PlanNoteFn& note = {});

}  // namespace segflow::models::planning
