#include <torch/torch.h>

#include <charconv>
#include <string>

#include "pipeline/cache/compact.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/crop.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void FgBgIndicesOptions::bind(OptionParser& p) {
  p.string("label_key", label_key, "foreground: label > 0 (any channel)");
  p.string("image_key", image_key, "when set, background also needs image > image_threshold");
  p.number("image_threshold", image_threshold, Range::any(), "image units", "see image_key");
  p.integer("max_per_class", max_per_class, Range::non_negative(), "voxels",
            "keep at most this many indices of each class (even stride); 0 = all");
  p.choice("format", format, {"int64", "packed"},
           "int64 index lists (MONAI) or packed index sets (a bit per voxel; same crops)");
  p.boolean("per_class", per_class,
            "also fg_indices_<v>: the voxels of each label value v > 0 present (int64 lists; for "
            "rand_crop_pos_neg class_balanced)");
  if (label_key.empty()) p.fail("label_key", "expected a non-empty name");
}

namespace {
at::Tensor stride_subsample(const at::Tensor& idx, std::int64_t max) {
  const std::int64_t n = idx.numel();
  if (max <= 0 || n <= max) return idx;
  auto sel = (torch::arange(max, torch::TensorOptions(torch::kFloat64).device(idx.device())) *
              (static_cast<double>(n) / static_cast<double>(max)))
                 .floor()
                 .to(torch::kLong);
  return idx.index_select(0, sel);
}

/// Flat fg and bg masks of `label` (C, ...); `image` may be undefined.
std::pair<at::Tensor, at::Tensor> fg_bg_masks(const at::Tensor& label, const at::Tensor& image,
                                              double image_threshold) {
  const at::Tensor fg_mask = (label > 0).any(0).flatten();
  at::Tensor bg_mask = fg_mask.logical_not();
  if (image.defined()) bg_mask = bg_mask.logical_and((image > image_threshold).any(0).flatten());
  return {fg_mask, bg_mask};
}
}  // namespace

std::pair<at::Tensor, at::Tensor> fg_bg_indices(const at::Tensor& label, const at::Tensor& image,
                                                double image_threshold, std::int64_t max_per_class) {
  auto [fg_mask, bg_mask] = fg_bg_masks(label, image, image_threshold);
  at::Tensor fg = fg_mask.nonzero().flatten();
  at::Tensor bg = bg_mask.nonzero().flatten();
  return {stride_subsample(fg, max_per_class).contiguous(), stride_subsample(bg, max_per_class).contiguous()};
}

std::string class_indices_key(std::int64_t value) { return kClassIndicesPrefix + std::to_string(value); }

std::optional<std::int64_t> class_of_indices_key(const std::string& key) {
  const std::size_t n = std::char_traits<char>::length(kClassIndicesPrefix);
  if (key.size() <= n || key.compare(0, n, kClassIndicesPrefix) != 0) return std::nullopt;
  std::int64_t v = 0;
  const char* end = key.data() + key.size();
  auto [ptr, ec] = std::from_chars(key.data() + n, end, v);
  if (ec != std::errc() || ptr != end || key[n] == '-' || key[n] == '+') return std::nullopt;
  return v;
}

bool is_crop_index_key(const std::string& key) {
  return key == "fg_indices" || key == "bg_indices" || class_of_indices_key(key).has_value();
}

Result<std::vector<std::pair<std::int64_t, at::Tensor>>> class_indices(const at::Tensor& label,
                                                                       std::int64_t max_per_class) {
  if (label.dim() < 2 || label.size(0) != 1)
    return invalid_argument("per-class indices need a 1-channel label map (1, ...), got shape " +
                            detail::shape_string(label));
  at::Tensor flat = label[0].flatten();
  if (detail::is_floating(flat) && !flat.eq(flat.round()).all().item<bool>())
    return invalid_argument("per-class indices need integer label values, got non-integer ones in a " +
                            std::string(c10::toString(flat.scalar_type())) + " label map");
  flat = flat.to(torch::kLong);
  std::vector<std::pair<std::int64_t, at::Tensor>> out;
  const at::Tensor idx = flat.gt(0).nonzero().flatten();
  if (idx.numel() == 0) return out;
  // One pass over the foreground: a stable sort by value keeps each class's indices sorted.
  auto [values, order] = flat.index_select(0, idx).sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor sorted_idx = idx.index_select(0, order);
  auto [classes, inverse, counts] = torch::unique_consecutive(values, false, true);
  const at::Tensor classes_h = classes.cpu(), counts_h = counts.cpu();
  std::int64_t start = 0;
  for (std::int64_t i = 0; i < classes_h.numel(); ++i) {
    const std::int64_t n = counts_h[i].item<std::int64_t>();
    out.emplace_back(classes_h[i].item<std::int64_t>(),
                     stride_subsample(sorted_idx.narrow(0, start, n), max_per_class).contiguous());
    start += n;
  }
  return out;
}

namespace {
/// The packed form of one class: straight from the mask, or from the subsampled list.
at::Tensor packed_class(const at::Tensor& mask, std::int64_t max_per_class) {
  if (max_per_class <= 0) return pack_index_mask(mask);
  return pack_index_list(stride_subsample(mask.nonzero().flatten(), max_per_class), mask.numel());
}

class FgBgIndicesStage final : public MapStage {
 public:
  using Options = FgBgIndicesOptions;
  static constexpr const char* kName = "fg_bg_indices";
  static constexpr const char* kDoc = "precompute foreground/background voxel indices for rand_crop_pos_neg";
  static constexpr bool kDeterministic = true;

  FgBgIndicesStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), keys_of(o)), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, keys(), kName).status());
    detail::drop_indices(s);  // whatever an earlier run left, per-class lists too
    if (o_.per_class) {
      auto classes = class_indices(s.at(o_.label_key), o_.max_per_class);
      if (!classes.is_ok())
        return invalid_argument(std::string(kName) + ": sample '" + s.id + "': '" + o_.label_key +
                                "': " + classes.status().message() + " (option per_class)");
      for (auto& [value, list] : classes.value()) s.tensors[class_indices_key(value)] = std::move(list);
    }
    const at::Tensor image = o_.image_key.empty() ? at::Tensor() : s.at(o_.image_key);
    if (o_.format == "packed") {
      auto [fg_mask, bg_mask] = fg_bg_masks(s.at(o_.label_key), image, o_.image_threshold);
      put_packed_index_set(s, "fg_indices", packed_class(fg_mask, o_.max_per_class));
      put_packed_index_set(s, "bg_indices", packed_class(bg_mask, o_.max_per_class));
      return Status::ok();
    }
    auto [fg, bg] = fg_bg_indices(s.at(o_.label_key), image, o_.image_threshold, o_.max_per_class);
    s.tensors["fg_indices"] = fg;
    s.tensors["bg_indices"] = bg;
    s.tensors.erase(std::string(kCompactMarkerPrefix) + "fg_indices");  // lists now, whatever was there
    s.tensors.erase(std::string(kCompactMarkerPrefix) + "bg_indices");
    return Status::ok();
  }

 private:
  static std::vector<std::string> keys_of(const Options& o) {
    std::vector<std::string> k{o.label_key};
    if (!o.image_key.empty()) k.push_back(o.image_key);
    return k;
  }
  Options o_;
};

}  // namespace

Status register_fg_bg_indices_stage(StageRegistry& r) { return add_stage<FgBgIndicesStage>(r); }

}  // namespace segflow::pipeline
