#pragma once
// NumPy .npy reader and writer (format versions 1.0, 2.0, 3.0; C and Fortran order;
// little and big endian; bool, int8..int64, uint8..uint64, float16/32/64).

#include <ATen/core/Tensor.h>

#include <filesystem>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// Reads an .npy file into a tensor of the same shape and dtype (C-contiguous).
Result<at::Tensor> read_npy(const std::filesystem::path& path);

/// Writes a tensor as .npy (version 1.0, little endian, C order), temp file + rename.
Status write_npy(const std::filesystem::path& path, const at::Tensor& tensor);

/// Reads an .npy as an Image with unit spacing and identity direction (npy carries no
/// geometry). (H, W) -> (1, 1, H, W); (H, W, 3) -> (3, 1, H, W) (MedSAM RGB slices);
/// (Z, Y, X) -> (1, Z, Y, X); 4D is taken as (C, Z, Y, X).
Result<Image> read_npy_image(const std::filesystem::path& path);

}  // namespace segflow::pipeline
