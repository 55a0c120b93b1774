#pragma once
// Sliding-window inference over 2D and 3D volumes (MONAI sliding_window_inference): windows
// of roi_size placed with the given overlap (the last window of each axis flush with the
// end), run through the predictor sw_batch_size at a time, blended with constant or
// Gaussian weights and divided by the summed weights. A volume smaller than the ROI is
// padded symmetrically with `padding_value` and the output cropped back.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// How overlapping windows are placed and weighted.
enum class BlendMode {
  constant,  ///< equal weights; MONAI's layout (a fixed interval, the last window flush with the end)
  gaussian,  ///< MONAI's Gaussian (centred at (roi - 1) / 2); MONAI's layout
  /// nnU-Net's predictor (nnunetv2 sliding_window_prediction): its Gaussian (centred at
  /// roi / 2, cut at 4 sigma, the rest at its smallest value) and its layout (windows spread
  /// evenly: ceil((size - roi) / (roi (1 - overlap))) + 1 of them, starts rounded half to even).
  nnunet,
};

/// The BlendMode of a `validation.mode` / `--blend` name: "gaussian", "nnunet", else constant.
BlendMode blend_mode(const std::string& name);

struct SlidingWindowOptions {
  std::vector<int64_t> roi_size;  ///< one per spatial dim (Z, Y, X) / (Y, X); <= 0 = whole axis
  double overlap = 0.25;          ///< fraction of the ROI shared by neighbours, in [0, 1)
  int64_t sw_batch_size = 1;      ///< windows per predictor call, >= 1
  BlendMode mode = BlendMode::constant;
  double sigma_scale = 0.125;  ///< Gaussian sigma = sigma_scale * roi_size per axis
  double padding_value = 0.0;  ///< value of the padding for volumes smaller than the ROI
  bool no_grad = true;         ///< run under NoGradGuard
  /// Where the windows are stitched: "" = the predictor's device; "cpu" = host memory (each
  /// window's prediction is copied back as it comes: a volume whose class maps do not fit
  /// the GPU's memory, as MONAI's sw_device / device split).
  std::string stitch_device;
  /// Applied to the blended output (N, C, *spatial), or to each finished slab of it in
  /// sliding_window_labels, before anything reads it: e.g. the softmax of blended logits.
  std::function<at::Tensor(const at::Tensor&)> finish;

  Status validate(int spatial_dims) const;
};

/// Model call on a batch of windows: (B, C_in, *roi) -> (B, C_out, *roi).
using Predictor = std::function<at::Tensor(const at::Tensor&)>;

/// Windows' start offsets per axis for an image of `image_size` (MONAI dense_patch_slices;
/// BlendMode::nnunet: nnU-Net's compute_steps_for_sliding_window, tile step 1 - overlap).
std::vector<std::vector<int64_t>> window_starts(const std::vector<int64_t>& image_size,
                                                const std::vector<int64_t>& roi, double overlap,
                                                BlendMode layout = BlendMode::constant);

/// Weights of one window (*roi) float32: ones, or the separable Gaussian (clamped at its
/// minimum, at least 1e-3), as MONAI compute_importance_map.
at::Tensor importance_map(const std::vector<int64_t>& roi_size, BlendMode mode, double sigma_scale,
                          const at::TensorOptions& options);

/// inputs (N, C_in, *spatial) -> (N, C_out, *spatial) float, on the predictor's device (or
/// on the CPU with stitch_device "cpu").
/// Throws c10::Error for bad options or a predictor output of the wrong spatial size.
at::Tensor sliding_window_inference(const at::Tensor& inputs, const SlidingWindowOptions& options,
                                    const Predictor& predictor);

/// The labels sliding_window_inference(inputs, options, predictor).argmax(1) gives, for one
/// input (1, C_in, *spatial) -> (1, *spatial) uint8 (int16 beyond 256 output channels), on
/// the CPU, equal to it voxel for voxel. The windows run in the same order; a slab of the
/// first spatial axis is divided and argmaxed as soon as no window left covers it, so only
/// roi[0] slices of the C_out class maps are held instead of the whole volume's.
at::Tensor sliding_window_labels(const at::Tensor& inputs, const SlidingWindowOptions& options,
                                 const Predictor& predictor);

}  // namespace segflow::models
