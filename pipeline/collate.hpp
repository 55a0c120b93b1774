#pragma once
// Collation: stacks samples into a Batch (tensors along a new dim 0).

#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"

namespace segflow::pipeline {

/// What to stack.
struct CollateOptions {
  /// Keys to stack; empty: every key of the first sample except those in `skip`.
  std::vector<std::string> keys;
  /// Keys left out when `keys` is empty (variable-length per-sample data).
  std::vector<std::string> skip{"fg_indices", "bg_indices"};
};

/// Stacks each key over the samples, ids in order. Errors name the key and the samples:
/// "collate: 'image' shapes differ: sample 'a#0' is (1, 96, 96, 96), sample 'b#1' is (1, 64, 96, 96)";
/// likewise for a missing key, differing dtypes or devices, and an empty list.
Result<Batch> collate(const std::vector<Sample>& samples, const CollateOptions& options = {});

}  // namespace segflow::pipeline
