#include "pipeline/collate.hpp"

#include <torch/torch.h>

#include <algorithm>

#include "pipeline/transforms/crop.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"

namespace segflow::pipeline {

Result<Batch> collate(const std::vector<Sample>& samples, const CollateOptions& options) {
  if (samples.empty()) return invalid_argument("collate: no samples");
  std::vector<std::string> keys = options.keys;
  if (keys.empty())
    for (const auto& [k, t] : samples.front().tensors)
      if (std::find(options.skip.begin(), options.skip.end(), k) == options.skip.end() &&
          !class_of_indices_key(k))  // per-class crop centre lists (fg_bg_indices per_class)
        keys.push_back(k);
  Batch b;
  for (const auto& s : samples) b.ids.push_back(s.id);
  const Sample& first = samples.front();
  for (const auto& key : keys) {
    std::vector<at::Tensor> ts;
    ts.reserve(samples.size());
    for (const auto& s : samples) {
      if (!s.has(key))
        return invalid_argument("collate: sample '" + s.id + "' has no '" + key + "'" +
                                (first.has(key) ? " (sample '" + first.id + "' has)" : std::string()));
      const at::Tensor& t = s.at(key);
      if (!ts.empty()) {
        const at::Tensor& t0 = ts.front();
        auto desc = [&](const std::string& what, const std::string& a, const std::string& b2) {
          return invalid_argument("collate: '" + key + "' " + what + " differ: sample '" + first.id +
                                  "' is " + a + ", sample '" + s.id + "' is " + b2);
        };
        if (t.sizes() != t0.sizes()) return desc("shapes", detail::shape_string(t0), detail::shape_string(t));
        if (t.scalar_type() != t0.scalar_type())
          return desc("dtypes", c10::toString(t0.scalar_type()), c10::toString(t.scalar_type()));
        if (t.device() != t0.device()) return desc("devices", t0.device().str(), t.device().str());
      }
      ts.push_back(t);
    }
    b.tensors[key] = torch::stack(ts, 0);
  }
  return b;
}

}  // namespace segflow::pipeline
