#pragma once
// Models out (`segflow export`): a trained checkpoint written as a PyTorch state dict that
// loads into the reference implementation segflow's network mirrors, with the arguments to
// build it:
// clang-format off
//   unet -> monai.networks.nets.UNet: segflow's UNet is MONAI's module for module, so only
//           the names change ("down.1.conv.0.norm.weight" <-> "model.1.submodule.0.conv.
//           unit0.adn.N.weight"); norm, act, dropout and bias become MONAI's arguments,
//           per-axis strides and kernel sizes MONAI's sequences in array order (z, y, x).
//   sam  -> segment_anything's Sam (image_encoder, prompt_encoder, mask_decoder): the names
//           are segment_anything's already; the JSON holds the three modules' arguments.
//   plain_unet -> dynamic_network_architectures' PlainConvUNet (what nnU-Net v2 builds):
//           "encoder_stages.S.K.conv.weight" <-> "encoder.stages.S.0.convs.K.conv.weight", with
//           the duplicates its state_dict holds (all_modules.0/1, decoder.encoder.*); norm
//           instance or batch (eps 1e-5, affine), LeakyReLU; sizes in array order (z, y, x).
//   A SAM trained without an IoU head (the tiny preset) gets segment_anything's IoU head as
//   zeros: the same masks, IoU predictions 0.
// clang-format on
// The state dict is torch.save's zip archive of a plain dict, which Python's torch.load reads
// with its default weights_only unpickler; tensors as trained (float32), on the CPU.

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"
#include "models/fwd.hpp"
#include "models/nets/network.hpp"

namespace segflow::models {

/// The network `module` built from `options` (a job config's model section), as the reference
/// implementation names it: the network's `pytorch` hook (models/nets/network.hpp).
/// unsupported naming the network for a network without one; invalid_argument for a
/// plain_unet without norm.
Result<ExportedModel> export_model(const ModelOptions& options, const torch::nn::Module& module);

/// `tensors` as the bytes of a file Python's torch.load reads (weights_only included) as a
/// dict {name: tensor}, on the CPU: torch.save's zip archive.
std::vector<char> pytorch_state_dict_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

/// `value` as the bytes of torch.save's zip archive: dicts (string keys), lists, tuples,
/// strings, numbers, bools, None and CPU tensors, nested; torch.load reads it with its
/// default weights_only unpickler. The nnU-Net checkpoint (models/interop/nnunet_export.hpp) is one.
std::vector<char> torch_save_bytes(const c10::IValue& value);

/// `tensors` (detached, contiguous copies on the CPU) as a typed dict, in the given order.
c10::Dict<std::string, at::Tensor> cpu_tensor_dict(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors);

/// Writes `model` to `out` (a .pt file torch.load reads: {name: tensor}) and its spec to
/// `out` with the extension replaced by .json, each through a temporary and a rename.
Status write_pytorch_export(const ExportedModel& model, const std::filesystem::path& out);

}  // namespace segflow::models
