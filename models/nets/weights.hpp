#pragma once
// Named-tensor files ("segflow tensor archive", .sfta) and loading them into modules.
//
// Format, version 1; every integer little-endian; written by write_tensor_archive and by
// scripts/convert_sam_weights.py (which turns PyTorch SAM/MedSAM checkpoints into it):
// clang-format off
//   bytes [0, 8)     magic "SFTARCH1"
//   bytes [8, 16)    uint64 H: length of the JSON header in bytes
//   bytes [16, 16+H) UTF-8 JSON object:
//                      {"format": "segflow-tensor-archive", "version": 1,
//                       "tensors": [{"name": "image_encoder.pos_embed", "dtype": "float32",
//                                    "shape": [1, 64, 64, 768], "offset": 0, "nbytes": 12582912},
//                                   ...],
//                       "metadata": {"source": "...", ...}}          (metadata optional)
//   bytes [16+H, end) data: tensor i occupies [16+H+offset_i, 16+H+offset_i+nbytes_i), raw
//                     C-contiguous little-endian elements. Writers align offsets to 64 bytes
//                     and pad with zeros; readers use the offsets and ignore the padding.
// clang-format on
// dtype is one of float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8,
// bool; nbytes = product(shape) * element size (a scalar has shape []). Names are unique.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>

#include "messages/status.hpp"

namespace torch::nn {
class Module;
}
namespace torch::serialize {
class InputArchive;
}

namespace segflow::models {

/// Named tensors, e.g. a module's parameters and buffers.
using TensorMap = std::map<std::string, at::Tensor>;

/// Reads an archive into CPU tensors. corrupt_data for a bad magic, header, dtype, shape or
/// a truncated file; io_error when it cannot be read. Thread-safe (no shared state).
Result<TensorMap> read_tensor_archive(const std::filesystem::path& path);

/// Writes tensors (any device; copied to CPU, contiguous) as an archive, through a temporary
/// file renamed into place. invalid_argument for an unsupported dtype.
Status write_tensor_archive(const std::filesystem::path& path, const TensorMap& tensors);

/// The module's parameters and buffers by dotted name (detached, sharing storage).
TensorMap named_tensors(const torch::nn::Module& module);

/// The parameters and buffers that torch::nn::Module::save wrote into `archive` (one nested
/// archive per submodule), by the dotted names named_tensors() uses; found by walking
/// `module`'s own tree, so only names the module has are looked up (what is absent is left
/// for load_into to report). Tensors stay where the archive was loaded (LibTorch's
/// map_location); nothing is copied into the module.
TensorMap read_module_archive(torch::serialize::InputArchive& archive, const torch::nn::Module& module);

/// Copies `tensors` into the module's same-named parameters and buffers (converting dtype
/// and device; each target keeps its device, dtype and memory format). Shape mismatches are always an error;
/// with `strict`, model entries missing from `tensors` and entries of `tensors` unknown to the model are
/// errors too. The error (invalid_argument) names the keys of each kind; on error nothing is copied.
Status load_into(torch::nn::Module& module, const TensorMap& tensors, bool strict = true);

}  // namespace segflow::models
