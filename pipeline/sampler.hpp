#pragma once
// Epoch sampling: which dataset indices a rank visits in an epoch (PyTorch's
// DistributedSampler semantics).

#include <cstdint>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline {

/// Options of an EpochSampler.
struct SamplerOptions {
  std::int64_t dataset_size = 0;  ///< number of cases, >= 1
  std::int64_t rank = 0;          ///< this rank, [0, world_size)
  std::int64_t world_size = 1;    ///< number of ranks, >= 1
  std::uint64_t seed = 0;         ///< job seed; epoch e shuffles with mix_seed(seed, e)
  bool shuffle = true;            ///< shuffle every epoch (else 0, 1, 2, ...)
  bool drop_last = false;         ///< drop the tail instead of padding it
};

/// Deterministic, sharded epoch order. Every rank computes the same permutation of the
/// dataset for an epoch (from the seed and the epoch only), pads it by wrapping around to
/// a multiple of world_size (or drops the tail with drop_last), and takes every
/// world_size-th index starting at its rank: shards are disjoint (apart from the padding)
/// and cover the dataset, and all ranks get the same count. Thread-safe (const).
class EpochSampler {
 public:
  /// Validates the options (invalid_argument naming the field).
  static Result<EpochSampler> make(const SamplerOptions& options);

  /// Indices per rank and epoch: ceil(n / w), or floor(n / w) with drop_last.
  std::int64_t num_samples() const { return per_rank_; }
  /// The dataset indices this rank visits in `epoch`, in order.
  std::vector<std::int64_t> indices(std::int64_t epoch) const;
  /// The whole epoch order before sharding (size per_rank * world_size).
  std::vector<std::int64_t> epoch_order(std::int64_t epoch) const;
  const SamplerOptions& options() const { return o_; }

 private:
  explicit EpochSampler(const SamplerOptions& o);
  SamplerOptions o_;
  std::int64_t per_rank_ = 0;
};

}  // namespace segflow::pipeline
