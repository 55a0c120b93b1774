#pragma once
// Foreground/background index precomputation and MONAI-style random crops by label.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
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
/// per_class: also "fg_indices_<v>" for each label value v > 0 present in the (1-channel)
/// label map: int64 lists, sorted, in either format (the cache compacts them like the others),
/// read by rand_crop_pos_neg's class_balanced.
struct FgBgIndicesOptions {
  std::string label_key = "label";  ///< foreground: label > 0 (any channel)
  std::string image_key;            ///< when set, background also needs image > image_threshold
  double image_threshold = 0.0;     ///< see image_key, image units
  std::int64_t max_per_class = 0;   ///< keep at most this many of each (even stride); 0 = all
  std::string format = "int64";     ///< int64 (index lists) | packed (packed index sets)
  bool per_class = false;           ///< also one index list per label value present
  void bind(OptionParser& p);
};

/// Flat fg and bg indices of `label` (C, ...); `image` may be undefined.
std::pair<at::Tensor, at::Tensor> fg_bg_indices(const at::Tensor& label, const at::Tensor& image,
                                                double image_threshold, std::int64_t max_per_class);

/// Prefix of the per-class index keys: "fg_indices_2" holds the voxels of label 2.
inline constexpr const char* kClassIndicesPrefix = "fg_indices_";
/// "fg_indices_<value>".
std::string class_indices_key(std::int64_t value);
/// The label value of a per-class index key ("fg_indices_2" -> 2); nullopt for other keys.
std::optional<std::int64_t> class_of_indices_key(const std::string& key);
/// True for the keys fg_bg_indices stores (fg_indices, bg_indices, fg_indices_<v>): crop
/// centre sets, host-resident in caches, dropped by spatial stages and by crops, not collated.
bool is_crop_index_key(const std::string& key);

/// Per label value v > 0 present in a 1-channel integer-valued `label` (1, ...): its flat
/// indices, sorted, each list thinned to max_per_class (even stride; 0 = all). Errors
/// (invalid_argument) for more than one channel or non-integer values.
Result<std::vector<std::pair<std::int64_t, at::Tensor>>> class_indices(const at::Tensor& label,
                                                                       std::int64_t max_per_class);

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
  /// a positive crop picks a class present in the case uniformly, then a voxel of it
  /// (nnU-Net's oversampling); else a voxel of any class
  bool class_balanced = false;
  void bind(OptionParser& p);
};

/// Crops `num_samples` windows of `s` (see the options). Outputs are "<id>#<k>", with
/// geometry moved to the crop; volumes smaller than the crop are zero-padded (centred).
/// Uses "fg_indices"/"bg_indices" when present (int64 or int32 lists, or packed index sets,
/// which give the same centres), with class_balanced also "fg_indices_<v>" (when the sample
/// has fg_indices but no per-class lists and some foreground, they are computed here). Centres are shifted so
/// every crop fits. A compact sample (pipeline/cache/compact.hpp) is cropped in its compact form and the
/// crops are expanded; with indices on the host and the other tensors on a CUDA device, no step reads the
/// device from the host.
Result<std::vector<Sample>> rand_crop_pos_neg(const Sample& s, const RandCropPosNegOptions& o, Rng& rng);

}  // namespace segflow::pipeline
