#include "pipeline/stage.hpp"

namespace segflow::pipeline {

Result<Sample> apply_one(const Stage& stage, Sample sample, Rng& rng) {
  std::vector<Sample> v;
  v.push_back(std::move(sample));
  SEGFLOW_RETURN_IF_ERROR(stage.apply(v, rng));
  if (v.size() != 1)
    return invalid_argument("stage '" + stage.name() + "' made " + std::to_string(v.size()) +
                            " samples from one; expected exactly one here");
  return std::move(v.front());
}

}  // namespace segflow::pipeline
