#pragma once
// segflow's PlainConvUNet tensor names <-> nnU-Net's (dynamic_network_architectures'
// PlainConvUNet, what nnU-Net v2 builds), both ways, in one place: what `segflow export --to
// pytorch|nnunet` writes, `segflow import --from nnunet` reads and `model.weights: {names:
// nnunet}` loads. "encoder_stages.S.K.conv.weight" <-> "encoder.stages.S.0.convs.K.conv.weight";
// nnU-Net's state_dict holds some tensors twice more (all_modules.0/1, decoder.encoder.*).

#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// segflow PlainConvUNet parameter/buffer name -> every name dynamic_network_architectures'
/// PlainConvUNet state_dict gives that tensor (its own first). invalid_argument for another name.
Result<std::vector<std::string>> nnunet_plain_names(const std::string& name);

/// The segflow PlainConvUNet name of a dynamic_network_architectures PlainConvUNet tensor;
/// "" for nnU-Net's duplicates (all_modules.*, decoder.encoder.*) and foreign names.
std::string segflow_name_nnunet(const std::string& name);

}  // namespace segflow::models
