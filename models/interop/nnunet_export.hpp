#pragma once
// A segflow plain_unet or res_enc_unet as an nnU-Net v2 results folder (`segflow export --to
// nnunet`):
//   RESULTS_DIR/dataset.json          channel_names, labels (the job's class names), file_ending
//   RESULTS_DIR/plans.json            one configuration (3d_fullres, or 2d for a 2D network)
//                                     with the PlainConvUNet's or ResidualEncoderUNet's
//                                     arguments, patch size,
//                                     spacing, normalisation, resampling
//   RESULTS_DIR/fold_K/checkpoint_final.pth
//                                     {network_weights, init_args: {configuration, fold},
//                                      trainer_name: nnUNetTrainer,
//                                      inference_allowed_mirroring_axes}
// what nnunetv2's nnUNetPredictor.initialize_from_trained_model_folder (and nnUNetv2_predict)
// reads. The job's inference preprocessing is translated stage by stage (array order z, y, x):
// clang-format off
//   resample {spacing, grid keep_extent}    -> configuration spacing; data and probabilities
//                                              resampled with order 1 (segflow: trilinear),
//                                              force_separate_z false
//   zscore {nonzero}                        -> ZScoreNormalization, use_mask_for_norm = nonzero
//   normalize_intensity {nonzero false}     -> ZScoreNormalization (same values for std > 1e-8)
//   normalize_ct {lower, upper, mean, std}  -> CTNormalization with those statistics
//   scale_intensity_range {clip true}       -> CTNormalization, lower a_min, upper a_max,
//                                              mean a_min - b_min s, std s, s = (a_max - a_min) / (b_max - b_min)
//   rand_* , fg_bg_indices, load            -> nothing (training only / reading)
//   validation.roi_size                     -> patch_size (else the rand_crop_pos_neg size)
//   rand_flip spatial_axis                  -> inference_allowed_mirroring_axes (none: null)
// clang-format on
// A 2D plain_unet becomes the "2d" configuration: patch_size and spacing (y, x), mirroring
// axes 0 = y, 1 = x; both nnU-Net and segflow run it slice by slice along array axis 0 (z),
// but nnU-Net keeps each case's z spacing where the job resamples z (a note says so).
// Any other stage that runs at inference is refused, naming it; so are unet/sam models,
// norm none and a resample on MONAI's exact_spacing grid. What nnU-Net always does
// and segflow does not (cropping to the non-zero box, normalising before resampling) is in
// the notes.

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/fwd.hpp"

namespace segflow::models {

struct NnunetExportOptions {
  std::int64_t fold = 0;  ///< fold_K folder, >= 0
  /// Target spacing (x, y, z) in mm for a job without a resample stage (nnU-Net always
  /// resamples to its configuration's spacing); ignored when the job resamples.
  std::optional<std::array<double, 3>> spacing;
  std::string checkpoint;  ///< recorded in plans.json's "segflow" section
};

/// An nnU-Net v2 results folder's contents.
struct NnunetResults {
  nlohmann::json dataset;     ///< dataset.json
  nlohmann::json plans;       ///< plans.json
  std::string configuration;  ///< "3d_fullres" | "2d"
  std::int64_t fold = 0;
  c10::IValue checkpoint;          ///< checkpoint_final.pth's dict
  std::vector<std::string> notes;  ///< where nnU-Net's inference differs from segflow's
};

/// The results folder of the trained `module` built from `cfg`. invalid_argument naming the
/// model name, stage (index and name) or key nnU-Net cannot express.
Result<NnunetResults> nnunet_results(const JobConfig& cfg, const std::vector<std::string>& class_names,
                                     const torch::nn::Module& module, const NnunetExportOptions& options);

/// Writes `results` as the folder `out` (which must not exist): everything goes to a
/// temporary folder beside it first, renamed onto `out` at the end; nothing is left on error.
Status write_nnunet_results(const NnunetResults& results, const std::filesystem::path& out);

}  // namespace segflow::models
