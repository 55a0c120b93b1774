#include "pipeline/io/image.hpp"

#include <torch/torch.h>

namespace segflow::pipeline {

Size3 Image::size() const {
  if (!voxels.defined() || voxels.dim() != 4) return {0, 0, 0};
  return {voxels.size(3), voxels.size(2), voxels.size(1)};
}

std::int64_t Image::channels() const { return voxels.defined() && voxels.dim() == 4 ? voxels.size(0) : 0; }

std::string dtype_name(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kByte:
      return "uint8";
    case at::kChar:
      return "int8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kUInt16:
      return "uint16";
    case at::kUInt32:
      return "uint32";
    case at::kUInt64:
      return "uint64";
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kBool:
      return "bool";
    default:
      return std::string(c10::toString(t.scalar_type()));
  }
}

}  // namespace segflow::pipeline
