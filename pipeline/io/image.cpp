#include "pipeline/io/image.hpp"

#include <torch/torch.h>

namespace segflow::pipeline {

Size3 Image::size() const {
  if (!voxels.defined() || voxels.dim() != 4) return {0, 0, 0};
  return {voxels.size(3), voxels.size(2), voxels.size(1)};
}

std::int64_t Image::channels() const { return voxels.defined() && voxels.dim() == 4 ? voxels.size(0) : 0; }

namespace {

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
};
// clang-format off
constexpr DtypeEntry kDtypes[] = {
    {"uint8", at::kByte},     {"int8", at::kChar},       {"int16", at::kShort},     {"int32", at::kInt},
    {"int64", at::kLong},     {"uint16", at::kUInt16},   {"uint32", at::kUInt32},   {"uint64", at::kUInt64},
    {"float32", at::kFloat},  {"float64", at::kDouble},  {"float16", at::kHalf},    {"bfloat16", at::kBFloat16},
    {"bool", at::kBool},
};
// clang-format on

}  // namespace

const char* dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  return nullptr;
}

std::optional<at::ScalarType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  return std::nullopt;
}

std::string dtype_name(const at::Tensor& t) {
  const char* name = dtype_name(t.scalar_type());
  return name ? std::string(name) : std::string(c10::toString(t.scalar_type()));
}

}  // namespace segflow::pipeline
