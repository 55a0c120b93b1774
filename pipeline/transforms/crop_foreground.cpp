#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::pipeline {

void CropForegroundOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to crop (same grid)");
  p.string("source_key", source_key, "tensor whose foreground (> threshold, any channel) is kept");
  p.number("threshold", threshold, Range::any(), "source units", "foreground: source > threshold");
  p.integers("margin", margin, Range::non_negative(), true, "voxels", "added on each side (x, y, z)");
  if (source_key.empty()) p.fail("source_key", "expected a non-empty name");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

Box3 foreground_box(const at::Tensor& mask, const std::array<std::int64_t, 3>& margin) {
  const std::int64_t nsp = mask.dim() - 1;
  const at::Tensor m = mask.dim() > 0 ? mask.to(torch::kBool).any(0) : mask;
  Box3 box;
  box.empty = !m.any().item<bool>();
  for (int a = 0; a < 3; ++a) {
    box.start[a] = 0;
    box.end[a] = a < nsp ? m.size(nsp - 1 - a) : 1;
  }
  if (box.empty) return box;
  for (int a = 0; a < nsp; ++a) {
    const std::int64_t d = nsp - 1 - a;  // dim of axis a in m
    at::Tensor p = m;
    for (std::int64_t o = nsp - 1; o >= 0; --o)
      if (o != d) p = p.any(o);
    const at::Tensor nz = p.nonzero().flatten().cpu();
    const std::int64_t lo = nz.min().item<std::int64_t>(), hi = nz.max().item<std::int64_t>();
    const std::int64_t n = m.size(d);
    box.start[a] = std::max<std::int64_t>(0, lo - margin[a]);
    box.end[a] = std::min<std::int64_t>(n, hi + 1 + margin[a]);
  }
  return box;
}

at::Tensor crop_tensor(const at::Tensor& t, const Box3& box) {
  const std::int64_t nsp = t.dim() - 1;
  at::Tensor r = t;
  for (int a = 0; a < nsp; ++a)
    r = r.narrow(detail::tensor_dim(a, nsp), box.start[a], box.end[a] - box.start[a]);
  return r;
}

namespace {

class CropForegroundStage final : public MapStage {
 public:
  using Options = CropForegroundOptions;
  static constexpr const char* kName = "crop_foreground";
  static constexpr const char* kDoc = "crop to the bounding box of source > threshold, plus a margin";
  static constexpr bool kDeterministic = true;

  CropForegroundStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    std::vector<std::string> all = keys;
    all.push_back(o_.source_key);
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, all, kName).status());
    const at::Tensor& src = s.at(o_.source_key);
    const Box3 box = foreground_box(src > o_.threshold, o_.margin);
    if (box.empty) return Status::ok();  // nothing above threshold: keep the whole grid
    const Size3 size = detail::spatial_size_xyz(src);
    bool whole = true;
    for (int a = 0; a < 3; ++a) whole = whole && box.start[a] == 0 && box.end[a] == size[a];
    if (whole) return Status::ok();
    for (const auto& k : keys) s.at(k) = crop_tensor(s.at(k), box).contiguous();
    s.geometry = detail::crop_geometry(s.geometry, box.start);
    detail::drop_indices(s);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_crop_foreground_stage(StageRegistry& r) { return add_stage<CropForegroundStage>(r); }

}  // namespace segflow::pipeline
