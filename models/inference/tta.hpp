#pragma once
// Test-time augmentation: nnU-Net's mirroring. Which axes a checkpoint mirrors (the axes its
// training flipped, or all), and a window's class probabilities averaged over every
// combination of flips of those axes, each prediction flipped back first.

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// Test-time augmentation: the softmax averaged over every combination of flips of a set of
/// spatial axes, window by window (nnU-Net's mirroring).
enum class TtaMode {
  none,
  /// The axes the checkpoint's training pipeline flips (its rand_flip stages), as nnU-Net
  /// mirrors its inference_allowed_mirroring_axes; none when the training never flipped.
  mirror,
  mirror_all,  ///< every spatial axis (8 passes in 3D, 4 in 2D)
};

/// "none" | "mirror" | "mirror-all".
Result<TtaMode> parse_tta(const std::string& text);

/// The axes (0 = x, 1 = y, 2 = z) `tta` mirrors for a model with `spatial_dims` trained
/// through `training_stages` (a built pipeline's to_json(): [{name, options}], options
/// resolved). Ascending.
std::vector<int> tta_mirror_axes(TtaMode tta, const nlohmann::json& training_stages, int spatial_dims);

/// "none" | "mirror" | "mirror-all": parse_tta's names.
const char* to_string(TtaMode tta);

/// The mean of `probabilities` over every combination of flips of the tensor dims `dims` of
/// `window` (the empty combination included: 2^n passes), each result flipped back before
/// averaging. `dims` empty: one pass.
at::Tensor mirror_averaged(const std::function<at::Tensor(const at::Tensor&)>& probabilities,
                           const at::Tensor& window, const std::vector<std::int64_t>& dims);

}  // namespace segflow::models
