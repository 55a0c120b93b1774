#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::pipeline {

void RandFlipOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to flip together");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of flipping each axis");
  p.integer_list("spatial_axis", spatial_axis, Range::closed(0, 2), true,
                 "axes that may flip, 0 = x (axes a sample lacks are skipped)");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

at::Tensor flip_tensor(const at::Tensor& t, const std::vector<int>& axes) {
  if (axes.empty()) return t;
  const std::int64_t nsp = t.dim() - 1;
  std::vector<std::int64_t> dims;
  for (int a : axes) dims.push_back(detail::tensor_dim(a, nsp));
  return t.flip(dims);
}

namespace {

class RandFlipStage final : public MapStage {
 public:
  using Options = RandFlipOptions;
  static constexpr const char* kName = "rand_flip";
  static constexpr const char* kDoc = "flip each listed axis with probability prob";
  static constexpr bool kDeterministic = false;

  RandFlipStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  Status apply_sample(Sample& s, Rng& rng) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    if (keys.empty()) return Status::ok();
    SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t nsp, detail::check_keys(s, keys, kName));
    std::vector<int> axes;
    for (std::int64_t a : o_.spatial_axis)
      if (rng.bernoulli(o_.prob) && a < nsp) axes.push_back(static_cast<int>(a));
    if (axes.empty()) return Status::ok();
    const Size3 size = detail::spatial_size_xyz(s.at(keys.front()));
    for (const auto& k : keys) s.at(k) = flip_tensor(s.at(k), axes);
    for (int a : axes) s.geometry = detail::flip_geometry(s.geometry, size, a);
    detail::drop_indices(s);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_rand_flip_stage(StageRegistry& r) { return add_stage<RandFlipStage>(r); }

}  // namespace segflow::pipeline
