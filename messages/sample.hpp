#pragma once
// A sample: a dictionary of named tensors ("image", "label", "box", ...) plus geometry and
// an id. It flows from the cache through the augmenters to the trainers (in-process only).

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "messages/geometry.hpp"

namespace segflow {

/// One training or validation sample. Tensors are (C, Z, Y, X) for 3D, (C, Y, X) for 2D;
/// "label" holds integer class values, "box" a float tensor (4,) x0, y0, x1, y1 in voxels.
struct Sample {
  std::string id;                             ///< case id (plus crop index after random crops)
  std::map<std::string, at::Tensor> tensors;  ///< named tensors
  Geometry geometry;                          ///< geometry of "image" (updated by spatial stages)

  bool has(const std::string& key) const { return tensors.count(key) != 0; }
  at::Tensor& at(const std::string& key) { return tensors.at(key); }
  const at::Tensor& at(const std::string& key) const { return tensors.at(key); }
};

/// A collated batch: tensors stacked along a new dim 0, ids in order.
struct Batch {
  std::vector<std::string> ids;
  std::map<std::string, at::Tensor> tensors;  ///< (N, C, ...) each
  /// Set when the tensors are still being made on a producer's CUDA side stream: makes the
  /// calling thread's current stream wait for them (no host wait). Whoever hands the batch
  /// to its consumer calls it once, on the consumer's thread; empty: ready as it is.
  std::function<void()> ready;
};

}  // namespace segflow
