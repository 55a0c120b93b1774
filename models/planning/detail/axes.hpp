#pragma once
// Axis orders of a plan: nnU-Net's (array order (z, y, x) after transpose_forward, the
// largest-spacing axis first; its 2D configuration is axes 1 and 2 of that) and segflow's
// (x, y, z) / (x, y) config order, with tensors laid out (Z, Y, X) / (Y, X).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "models/planning/nnunet_rules.hpp"

namespace segflow::models::planning::detail {

/// The array axis (0 = z, 1 = y, 2 = x) of each axis of a 3- or 2-entry list in nnU-Net
/// order. A 2D list whose axes are not y and x (the largest spacing is not along z) is
/// taken as (y, x): segflow's 2D recipes slice along z.
std::vector<int> array_axes(std::size_t n, const std::vector<int>& transpose_forward);

/// A per-axis list in nnU-Net order in segflow's (x, y, z) or (x, y) order.
template <class T>
std::vector<T> to_xyz(const std::vector<T>& v, const std::vector<int>& transpose_forward) {
  const auto axes = array_axes(v.size(), transpose_forward);
  std::vector<T> out(v.size());
  // Array axis a is segflow axis 2 - a (x = array 2); in 2D the axes are 1 and 2.
  for (std::size_t i = 0; i < v.size(); ++i) out[static_cast<std::size_t>(2 - axes[i])] = v[i];
  return out;
}

/// A per-axis list in nnU-Net order in tensor order ((Z, Y, X) or (Y, X)).
std::vector<std::int64_t> tensor_order(const std::vector<std::int64_t>& v,
                                       const std::vector<int>& transpose_forward);

/// The `model` section of a job config for the network of `k` (PlainConvUNet, or
/// ResidualEncoderUNet when k.residual_encoder) with topology `t` (strides and kernel sizes
/// per stage in segflow's axis order), features min(base * 2^s, max_features), deep
/// supervision on.
nlohmann::json unet_json(const Topology& t, std::int64_t base_features, std::int64_t max_features,
                         std::int64_t in_channels, std::int64_t num_classes,
                         const std::vector<int>& transpose_forward, const NnunetConstants& k);

}  // namespace segflow::models::planning::detail
