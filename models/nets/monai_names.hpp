#pragma once
// segflow's UNet tensor names <-> MONAI's (monai.networks.nets.UNet), both ways, in one place:
// what `segflow export --to pytorch` writes, `segflow import --from monai` reads and
// `model.weights: {names: monai}` loads. segflow's UNet is MONAI's module for module, so only
// the names differ: "down.1.conv.0.norm.weight" <-> "1.submodule.0.conv.unit0.adn.N.weight"
// (MONAI's UNet module holds these under its "model." prefix).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// segflow UNet parameter/buffer name -> MONAI UNet name, without MONAI's "model." prefix (for
/// a UNet with `levels` = channels.size() - 1 down levels and `num_res_units`).
/// invalid_argument for a name that is not one of a segflow UNet's.
Result<std::string> monai_unet_name(const std::string& name, std::size_t levels, std::int64_t num_res_units);

/// The other way: MONAI state_dict name ("model." prefix included) -> segflow name, for the
/// tensors `segflow_names` of a UNet with `levels` and `num_res_units` (names that are no
/// segflow UNet tensor are left out).
std::map<std::string, std::string> segflow_names_from_monai(const std::vector<std::string>& segflow_names,
                                                            std::size_t levels, std::int64_t num_res_units);

}  // namespace segflow::models
