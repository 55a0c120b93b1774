#include <torch/torch.h>

#include <algorithm>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/medsam.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void MedsamBoxOptions::bind(OptionParser& p) {
  p.string("image_key", image_key, "(C, Z, Y, X) image, C = 1 or 3");
  p.string("label_key", label_key, "(1, Z, Y, X) integer label map");
  p.integer("image_size", image_size, Range::closed(0, 4096), "pixels",
            "output side S; 0 = the slice's own size (resize_longest_side after)");
  if (p.ok() && image_size > 0 && image_size < 16)
    p.fail("image_size", "expected 0 or a side in [16, 4096], got " + std::to_string(image_size));
  p.integer("bbox_shift", bbox_shift, Range::closed(0, 4096), "pixels",
            "maximum outward jitter per box side");
  p.integer("label", label, Range::non_negative(), "",
            "the label to segment; 0 = a random label present in the slice");
  p.integer("num_samples", num_samples, Range::closed(1, 1024), "",
            "2-D samples drawn per volume, each with its own slice, label and box");
}

namespace {
// [lo, hi] of the true entries of a 1-D bool tensor (at least one true).
std::pair<std::int64_t, std::int64_t> extent(const at::Tensor& any) {
  const at::Tensor nz = any.nonzero().flatten().cpu();
  return {nz.min().item<std::int64_t>(), nz.max().item<std::int64_t>()};
}
}  // namespace

Result<Sample> medsam_box(const Sample& s, const MedsamBoxOptions& o, Rng& rng) {
  static constexpr const char* kStage = "medsam_box";
  SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, {o.image_key, o.label_key}, kStage).status());
  at::Tensor image = s.at(o.image_key), label = s.at(o.label_key);
  if (image.dim() == 3) image = image.unsqueeze(1), label = label.unsqueeze(1);  // (C, Y, X) -> one slice
  if (image.size(0) != 1 && image.size(0) != 3)
    return invalid_argument(std::string(kStage) + ": sample '" + s.id + "': '" + o.image_key +
                            "' must have 1 or 3 channels, got " + detail::shape_string(s.at(o.image_key)));
  if (label.size(0) != 1 || detail::is_floating(label))
    return invalid_argument(std::string(kStage) + ": sample '" + s.id + "': '" + o.label_key +
                            "' must be a 1-channel integer label map, got " + detail::shape_string(label) +
                            " " + std::string(c10::toString(label.scalar_type())));

  // A slice with the wanted foreground.
  const at::Tensor lab = label[0];  // (Z, Y, X)
  const at::Tensor fg = o.label > 0 ? lab == o.label : lab > 0;
  const at::Tensor slices = fg.flatten(1).any(1).nonzero().flatten().cpu();
  if (slices.numel() == 0)
    return invalid_argument(
        std::string(kStage) + ": sample '" + s.id + "' has no " +
        (o.label > 0 ? "voxel of label " + std::to_string(o.label) : std::string("foreground")));
  const std::int64_t z = slices[rng.integer(0, slices.numel() - 1)].item<std::int64_t>();

  // The label to segment in that slice.
  const at::Tensor lab2d = lab[z];
  std::int64_t value = o.label;
  if (value == 0) {
    const at::Tensor present =
        std::get<0>(at::_unique(lab2d.masked_select(lab2d > 0), /*sorted=*/true)).cpu();
    value = present[rng.integer(0, present.numel() - 1)].item<std::int64_t>();
  }
  const at::Tensor mask = (lab2d == value).unsqueeze(0).to(label.scalar_type());  // (1, H, W)

  const std::int64_t H = lab2d.size(0), W = lab2d.size(1);
  const std::int64_t SY = o.image_size > 0 ? o.image_size : H, SX = o.image_size > 0 ? o.image_size : W;
  at::Tensor img2d = image.select(1, z).to(torch::kFloat32);  // (C, H, W)
  if (img2d.size(0) == 1) img2d = img2d.repeat({3, 1, 1});
  at::Tensor img_out =
      (H == SY && W == SX) ? img2d.contiguous() : detail::resize_linear(img2d, {SY, SX}).contiguous();
  at::Tensor mask_out =
      (H == SY && W == SX) ? mask.contiguous() : detail::resize_nearest(mask, {SY, SX}).contiguous();

  // Box of the resized mask (or of the original one scaled, if resizing lost it).
  std::int64_t x0, x1, y0, y1;
  const at::Tensor m = mask_out[0] > 0;
  if (m.any().item<bool>()) {
    std::tie(y0, y1) = extent(m.any(1));
    std::tie(x0, x1) = extent(m.any(0));
  } else {
    const at::Tensor m0 = mask[0] > 0;
    auto [oy0, oy1] = extent(m0.any(1));
    auto [ox0, ox1] = extent(m0.any(0));
    y0 = oy0 * SY / H, y1 = std::min(SY - 1, (oy1 + 1) * SY / H), x0 = ox0 * SX / W,
    x1 = std::min(SX - 1, (ox1 + 1) * SX / W);
  }
  x0 = std::max<std::int64_t>(0, x0 - rng.integer(0, o.bbox_shift));
  x1 = std::min<std::int64_t>(SX - 1, x1 + rng.integer(0, o.bbox_shift));
  y0 = std::max<std::int64_t>(0, y0 - rng.integer(0, o.bbox_shift));
  y1 = std::min<std::int64_t>(SY - 1, y1 + rng.integer(0, o.bbox_shift));

  Sample out;
  out.id = s.id + "#z" + std::to_string(z);
  out.geometry = s.geometry;
  const double rx = static_cast<double>(W) / static_cast<double>(SX),
               ry = static_cast<double>(H) / static_cast<double>(SY);
  out.geometry.spacing[0] *= rx;
  out.geometry.spacing[1] *= ry;
  out.geometry.origin =
      index_to_physical(s.geometry, {0.5 * rx - 0.5, 0.5 * ry - 0.5, static_cast<double>(z)});
  out.tensors[o.image_key] = img_out;
  out.tensors[o.label_key] = mask_out;
  out.tensors["box"] = torch::tensor({static_cast<float>(x0), static_cast<float>(y0), static_cast<float>(x1),
                                      static_cast<float>(y1)},
                                     torch::TensorOptions().dtype(torch::kFloat32))
                           .to(image.device());
  return out;
}

namespace {

class MedsamBoxStage final : public Stage {
 public:
  using Options = MedsamBoxOptions;
  static constexpr const char* kName = "medsam_box";
  static constexpr const char* kDoc =
      "MedSAM 2-D samples: foreground slices, binary masks and jittered box prompts";
  static constexpr bool kDeterministic = false;

  MedsamBoxStage(Options o, nlohmann::json resolved)
      : Stage(kName, std::move(resolved), {o.image_key, o.label_key}), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  Status apply(std::vector<Sample>& samples, Rng& rng) const override {
    std::vector<Sample> out;
    out.reserve(samples.size() * static_cast<std::size_t>(o_.num_samples));
    for (const Sample& s : samples)
      for (std::int64_t k = 0; k < o_.num_samples; ++k) {
        SEGFLOW_ASSIGN_OR_RETURN(Sample one, medsam_box(s, o_, rng));
        if (o_.num_samples > 1)
          one.id.append("#").append(std::to_string(k));  // not "#" + ...: gcc 12 -Wstringop-overflow
        out.push_back(std::move(one));
      }
    samples = std::move(out);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_medsam_box_stage(StageRegistry& r) { return add_stage<MedsamBoxStage>(r); }

}  // namespace segflow::pipeline
