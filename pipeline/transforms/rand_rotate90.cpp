#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::pipeline {

void RandRotate90Options::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to rotate together");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of rotating");
  p.integer("max_k", max_k, Range::closed(1, 3), "quarter turns", "k uniform in [1, max_k]");
  p.integer_list("spatial_axes", spatial_axes, Range::closed(0, 2), true,
                 "the plane of rotation, 2 axes, 0 = x");
  if (spatial_axes.size() != 2)
    p.fail("spatial_axes",
           "expected 2 distinct axes in [0, 2], got " + format_value(nlohmann::json(spatial_axes)));
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

at::Tensor rotate90_tensor(const at::Tensor& t, int k, int a0, int a1) {
  const std::int64_t nsp = t.dim() - 1;
  return torch::rot90(t, k, {detail::tensor_dim(a0, nsp), detail::tensor_dim(a1, nsp)});
}

namespace {

class RandRotate90Stage final : public MapStage {
 public:
  using Options = RandRotate90Options;
  static constexpr const char* kName = "rand_rotate90";
  static constexpr const char* kDoc = "rotate by k quarter turns in a plane with probability prob";
  static constexpr bool kDeterministic = false;

  RandRotate90Stage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  Status apply_sample(Sample& s, Rng& rng) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    if (keys.empty()) return Status::ok();
    SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t nsp, detail::check_keys(s, keys, kName));
    const int a0 = static_cast<int>(o_.spatial_axes[0]), a1 = static_cast<int>(o_.spatial_axes[1]);
    if (a0 >= nsp || a1 >= nsp)
      return invalid_argument(std::string(kName) + ": sample '" + s.id + "' has " + std::to_string(nsp) +
                              " spatial axes; spatial_axes [" + std::to_string(a0) + ", " +
                              std::to_string(a1) + "] do not exist");
    if (!rng.bernoulli(o_.prob)) return Status::ok();
    const int k = static_cast<int>(rng.integer(1, o_.max_k));
    for (const auto& key : keys) s.at(key) = rotate90_tensor(s.at(key), k, a0, a1).contiguous();
    // Geometry: torch::rot90 is flip(a1) + swap for k = 1, flip(a0) + swap for k = 3.
    Size3 size = detail::spatial_size_xyz(s.at(keys.front()));
    if (k != 2) std::swap(size[a0], size[a1]);  // the size before the rotation
    Geometry g = s.geometry;
    if (k == 2) {
      g = detail::flip_geometry(detail::flip_geometry(g, size, a0), size, a1);
    } else {
      g = detail::flip_geometry(g, size, k == 1 ? a1 : a0);
      g = detail::swap_geometry(g, a0, a1);
    }
    s.geometry = g;
    detail::drop_indices(s);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_rand_rotate90_stage(StageRegistry& r) { return add_stage<RandRotate90Stage>(r); }

}  // namespace segflow::pipeline
