#include "pipeline/sampler.hpp"

#include <numeric>
#include <string>

#include "pipeline/stage.hpp"

namespace segflow::pipeline {

Result<EpochSampler> EpochSampler::make(const SamplerOptions& o) {
  if (o.dataset_size < 1)
    return invalid_argument("sampler: dataset_size: expected an integer >= 1, got " +
                            std::to_string(o.dataset_size));
  if (o.world_size < 1)
    return invalid_argument("sampler: world_size: expected an integer >= 1, got " +
                            std::to_string(o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    return invalid_argument("sampler: rank: expected an integer in [0, " + std::to_string(o.world_size - 1) +
                            "], got " + std::to_string(o.rank));
  if (o.drop_last && o.dataset_size < o.world_size)
    return invalid_argument("sampler: drop_last with " + std::to_string(o.dataset_size) + " cases and " +
                            std::to_string(o.world_size) + " ranks leaves every rank empty");
  return EpochSampler(o);
}

EpochSampler::EpochSampler(const SamplerOptions& o) : o_(o) {
  per_rank_ =
      o.drop_last ? o.dataset_size / o.world_size : (o.dataset_size + o.world_size - 1) / o.world_size;
}

std::vector<std::int64_t> EpochSampler::epoch_order(std::int64_t epoch) const {
  const std::int64_t n = o_.dataset_size;
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (o_.shuffle) {
    Rng rng(mix_seed({o_.seed, static_cast<std::uint64_t>(epoch), 0x5A3D1E5ull}));
    for (std::int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.integer(0, i)]);  // Fisher-Yates
  }
  const std::int64_t total = per_rank_ * o_.world_size;
  if (total <= n) {
    order.resize(static_cast<std::size_t>(total));
  } else {
    for (std::int64_t i = n; i < total; ++i) order.push_back(order[static_cast<std::size_t>((i - n) % n)]);
  }
  return order;
}

std::vector<std::int64_t> EpochSampler::indices(std::int64_t epoch) const {
  const std::vector<std::int64_t> order = epoch_order(epoch);
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(per_rank_));
  for (std::size_t i = static_cast<std::size_t>(o_.rank); i < order.size();
       i += static_cast<std::size_t>(o_.world_size))
    mine.push_back(order[i]);
  return mine;
}

}  // namespace segflow::pipeline
