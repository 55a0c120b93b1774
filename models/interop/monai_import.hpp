#pragma once
// MONAI in (`segflow import --from monai MODEL.pt|BUNDLE_DIR --out DIR`): the weights of a
// monai.networks.nets.UNet as a segflow `unet` checkpoint and job config, the same outputs
// as import_nnunet (models/interop/nnunet_import.hpp): DIR/job.yaml, DIR/model.pt (a segflow
// checkpoint: `segflow infer --checkpoint`), DIR/weights.sfta (segflow names: `model.weights`
// for fine-tuning) and DIR/import.json (what was read and what was assumed), written through
// a temporary folder renamed onto DIR; DIR must not exist and nothing is left on error.
//
// The network's arguments (MONAI's own names and defaults: kernel_size 3, num_res_units 0,
// act PRELU, norm INSTANCE (not affine), dropout 0, bias true) come from
// clang-format off
//   BUNDLE_DIR   configs/inference.json (or .yaml/.yml): network_def {_target_: UNet | monai.
//                networks.nets.UNet, spatial_dims, in_channels, ...}; weights models/model.pt
//   MODEL.pt     `args` (the command line's --spatial-dims, --channels, ...); a state dict, or
//                a dict holding one under state_dict / model
// clang-format on
// The tensor names are mapped by the MONAI name table (models/nets/monai_names.hpp); every shape is checked
// against the network the arguments build, and a tensor that does not fit, is missing or left over is an
// error naming it (with both shapes). A non-affine instance norm (MONAI's default) has no weights: segflow's
// affine one gets weight 1 and bias 0, the same function.
//
// Axes: MONAI reads a NIfTI as (C, x, y, z), segflow as (C, z, y, x). With layout `monai`
// (the default: weights trained by MONAI) every convolution kernel's spatial axes are
// reversed, and per-axis sizes (strides, kernels, Spacingd pixdim, the inferer's roi_size)
// are read in (x, y, z) order, so segflow's prediction on a volume is MONAI's. With layout
// `segflow` (what `segflow export --to pytorch` wrote: MONAI's module applied to segflow's
// (z, y, x) arrays) the tensors are copied as they are and per-axis sizes are (z, y, x).
//
// A bundle's preprocessing (inference.json `preprocessing.transforms`) becomes segflow
// stages where the two agree exactly:
// clang-format off
//   LoadImaged                          -> load
//   EnsureChannelFirstd, EnsureTyped, ToTensord, AddChanneld
//                                       -> nothing
//   Orientationd {axcodes}              -> reorient {axcodes}
//   Spacingd {pixdim, mode}             -> resample {spacing: pixdim, grid: exact_spacing,
//                                          mode: trilinear (bilinear) | nearest}
//   ScaleIntensityRanged {a_min, a_max, b_min, b_max, clip}
//                                       -> scale_intensity_range, the same values
//   inferer SlidingWindowInferer {roi_size, overlap, sw_batch_size, mode}
//                                       -> validation {roi_size, overlap, sw_batch_size, mode}
// clang-format on
// Any other transform, or a value given as a bundle reference ("@x", "$expr"), and a bare
// MODEL.pt, get the default (load only), and import.json / the command's JSON say so
// ("preprocessing": "default", with the reason): set the stages by hand.

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// What import_monai wrote and assumed (also DIR/import.json).
struct MonaiImport {
  std::filesystem::path checkpoint;  ///< DIR/model.pt
  std::filesystem::path config;      ///< DIR/job.yaml
  nlohmann::json network;            ///< the UNet arguments used (MONAI's names)
  std::string preprocessing;         ///< "bundle" (mapped stage by stage) | "default" (load only)
  std::vector<std::string> notes;    ///< what was assumed or left out
  std::size_t tensors = 0;           ///< tensors copied

  nlohmann::json to_json() const;
};

/// The layouts import_monai accepts: "monai" (default) and "segflow".
const std::vector<std::string>& monai_layouts();

/// Imports `source` (a bundle folder or a torch.save file) into the new folder `out`.
/// `args` holds the UNet's arguments for a bare file (MONAI's names; must be empty for a
/// bundle). not_found naming a missing file; invalid_argument naming the config field, the
/// argument or the tensors that do not fit; corrupt_data for an unreadable file.
Result<MonaiImport> import_monai(const std::filesystem::path& source, const nlohmann::json& args,
                                 const std::string& layout, const std::filesystem::path& out);

}  // namespace segflow::models
