#pragma once
// Reading what Python's torch.save wrote (the zip archive, torch >= 1.6), from C++ without
// Python: a MONAI state dict, a MONAI bundle's models/model.pt, nnU-Net's checkpoint_final.pth.
//
// LibTorch's own torch::jit::pickle_load cannot read these: it turns every
// collections.OrderedDict (what state_dict() returns) into None. read_torch_save runs its
// own small unpickler over data.pkl instead, for the subset torch.save writes:
// clang-format off
//   dict, collections.OrderedDict        -> GenericDict (keys and values Any; BUILD state dropped)
//   list, tuple, set / frozenset         -> GenericList, Tuple, GenericList
//   str, bytes, int, float, bool, None   -> string (bytes too), int, double, bool, None
//   torch._utils._rebuild_tensor_v2, _rebuild_parameter(_with_state)
//                                        -> CPU tensor (storage read from data/<key>)
//   torch.device                         -> its string ("cuda:0")
//   any other class or function          -> None (numpy scalars in a trainer's log, a
//                                           scheduler's state...): the caller reads tensors
//                                           and plain values only
// clang-format on
// No Python code is run and no class is imported: nothing in the file can execute.

#include <ATen/core/ivalue.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// The object torch.save wrote to `path`. not_found when the file is missing; corrupt_data
/// naming the file for the legacy (non-zip) format, a truncated archive, an unknown pickle
/// opcode or a storage record that is missing or too short.
Result<c10::IValue> read_torch_save(const std::filesystem::path& path);

/// The tensors of a state dict in `value`, by name, in the file's order: `value` itself when
/// it is a dict holding tensors, else the dict under its first key among "state_dict",
/// "model", "network_weights" (a training checkpoint). Entries that are not tensors are left
/// out. invalid_argument "<where>: ..." when there is no such dict.
Result<std::vector<std::pair<std::string, at::Tensor>>> state_dict_tensors(const c10::IValue& value,
                                                                           const std::string& where);

}  // namespace segflow::models
