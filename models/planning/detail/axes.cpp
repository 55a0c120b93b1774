#include "models/planning/detail/axes.hpp"

#include <algorithm>

#include "models/nets/res_enc_unet.hpp"

namespace segflow::models::planning::detail {

std::vector<int> array_axes(std::size_t n, const std::vector<int>& tf) {
  if (n == 3) return tf;
  std::vector<int> a{tf[1], tf[2]};
  if (std::find(a.begin(), a.end(), 0) != a.end()) a = {1, 2};
  return a;
}

std::vector<std::int64_t> tensor_order(const std::vector<std::int64_t>& v, const std::vector<int>& tf) {
  auto xyz = to_xyz(v, tf);
  std::reverse(xyz.begin(), xyz.end());
  return xyz;
}

nlohmann::json unet_json(const Topology& t, std::int64_t base_features, std::int64_t max_features,
                         std::int64_t in_channels, std::int64_t num_classes, const std::vector<int>& tf,
                         const NnunetConstants& k) {
  nlohmann::json strides = nlohmann::json::array(), kernels = nlohmann::json::array();
  for (const auto& p : t.pool_op_kernel_sizes) strides.push_back(to_xyz(p, tf));
  for (const auto& k : t.conv_kernel_sizes) kernels.push_back(to_xyz(k, tf));
  const std::int64_t dims = static_cast<std::int64_t>(t.patch_size.size());
  nlohmann::json m = {{"name", "plain_unet"},
                      {"spatial_dims", dims},
                      {"in_channels", in_channels},
                      {"out_channels", num_classes},
                      {"n_stages", t.n_stages()},
                      {"base_features", base_features},
                      {"max_features", max_features},
                      {"n_conv_per_stage", k.blocks_per_stage},
                      {"n_conv_per_stage_decoder", k.blocks_per_stage},
                      {"strides", strides},
                      {"kernel_sizes", kernels},
                      {"deep_supervision", true}};
  if (k.residual_encoder) {
    m["name"] = "res_enc_unet";
    m.erase("n_conv_per_stage");
    m["n_blocks_per_stage"] = nnunet_resenc_blocks(t.n_stages());
    m["n_conv_per_stage_decoder"] = 1;
  }
  return m;
}

}  // namespace segflow::models::planning::detail
