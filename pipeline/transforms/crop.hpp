#pragma once
// Foreground/background index precomputation and MONAI-style random crops by label.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/stage.hpp"

namespace segflow::pipeline {

/// Options of stage "fg_bg_indices" (MONAI FgBgToIndices). Stores "fg_indices" and
/// "bg_indices": flat indices into the spatial grid of `label_key` (row-major over
/// (Z, Y, X)), read by rand_crop_pos_neg. Spatial stages drop them (they go stale).
/// format int64: 1-D int64 lists (MONAI's form; the memory cache packs them unless
/// train.cache_dtype is none). format packed: packed index sets made straight from the
/// masks (pipeline/cache/compact.hpp; ~0.27 byte per voxel for both, and no int64 lists of
/// 8 bytes per voxel while a case is decoded); rand_crop_pos_neg draws the same centres.
struct FgBgIndicesOptions {
  std::string label_key = "label";  ///< foreground: label > 0 (any channel)
  std::string image_key;            ///< when set, background also needs image > image_threshold
  double image_threshold = 0.0;     ///< see image_key, image units
  std::int64_t max_per_class = 0;   ///< keep at most this many of each (even stride); 0 = all
  std::string format = "int64";     ///< int64 (index lists) | packed (packed index sets)
  void bind(OptionParser& p);
};

/// Flat fg and bg indices of `label` (C, ...); `image` may be undefined.
std::pair<at::Tensor, at::Tensor> fg_bg_indices(const at::Tensor& label, const at::Tensor& image,
                                                double image_threshold, std::int64_t max_per_class);

/// Options of stage "rand_crop_pos_neg" (MONAI RandCropByPosNegLabel).
struct RandCropPosNegOptions {
  std::vector<std::string> keys{"image", "label"};  ///< tensors cropped together
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  std::string label_key = "label";                  ///< foreground: label > 0
  std::array<std::int64_t, 3> spatial_size{96, 96, 96};  ///< crop size (x, y, z), voxels; <= 0: full extent
  double pos = 1.0;                                      ///< weight of crops centred on foreground, >= 0
  double neg = 1.0;              ///< weight of crops centred on background, >= 0 (pos + neg > 0)
  std::int64_t num_samples = 4;  ///< crops per input sample, [1, 1024]
  std::string image_key;  ///< background needs image > image_threshold (when indices are computed here)
  double image_threshold = 0.0;  ///< see image_key
  void bind(OptionParser& p);
};

/// Crops `num_samples` windows of `s` (see the options). Outputs are "<id>#<k>", with
/// geometry moved to the crop; volumes smaller than the crop are zero-padded (centred).
/// Uses "fg_indices"/"bg_indices" when present (int64 or int32 lists, or packed index sets,
/// which give the same centres). Centres are shifted so every crop fits. A compact sample
/// (pipeline/cache/compact.hpp) is cropped in its compact form and the crops are expanded;
/// with indices on the host and the other tensors on a CUDA device, no step reads the
/// device from the host.
Result<std::vector<Sample>> rand_crop_pos_neg(const Sample& s, const RandCropPosNegOptions& o, Rng& rng);

}  // namespace segflow::pipeline
