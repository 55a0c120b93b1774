// MedSAM's preprocessing as stages (issue 32 item 2): medsam_normalize (pre_CT_MR.py's CT
// window / MR percentile clip to 0-255), minmax_slices (per-slice min-max to [0, 1]),
// repeat_channels (three channels), resize_longest_side (LiteMedSAM's longest side + padding,
// the box mapped the same way) and remove_small_objects (cc3d.dust in 3D, then per slice).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "pipeline/connected_components.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/medsam.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

namespace F = torch::nn::functional;

// ------------------------------------------------------------------------------ kernels

at::Tensor medsam_normalize(const at::Tensor& x_in, const MedsamNormalizeOptions& o) {
  const at::Tensor x = x_in.to(torch::kFloat64);
  double lo = o.window_level - o.window_width / 2.0, hi = o.window_level + o.window_width / 2.0;
  if (o.modality == "mr") {
    const at::Tensor positive = x.masked_select(x > 0);
    if (positive.numel() == 0) return torch::zeros_like(x_in, torch::kFloat32);
    lo = percentile(positive, o.lower);
    hi = percentile(positive, o.upper);
  }
  at::Tensor y = x.clamp(lo, hi);
  const double mn = y.min().item<double>(), mx = y.max().item<double>();
  y = mx > mn ? (y - mn) / (mx - mn) * 255.0 : torch::zeros_like(y);
  if (o.modality == "mr") y = torch::where(x == 0, torch::zeros_like(y), y);
  if (o.quantize) y = y.floor();
  return y.to(torch::kFloat32);
}

at::Tensor minmax_slices(const at::Tensor& x_in, double eps) {
  const at::Tensor x = detail::is_floating(x_in) ? x_in : x_in.to(torch::kFloat32);
  if (x.dim() != 4) {
    const at::Tensor mn = x.min(), mx = x.max();
    return (x - mn) / (mx - mn).clamp_min(eps);
  }
  // (C, Z, Y, X): reduce over C, Y, X for each z.
  const at::Tensor per_z = x.transpose(0, 1).flatten(1);  // (Z, C*Y*X)
  const at::Tensor mn = std::get<0>(per_z.min(1)).view({1, -1, 1, 1});
  const at::Tensor mx = std::get<0>(per_z.max(1)).view({1, -1, 1, 1});
  return (x - mn) / (mx - mn).clamp_min(eps);
}

std::pair<std::int64_t, std::int64_t> longest_side_shape(std::int64_t h, std::int64_t w, std::int64_t size) {
  const double s = static_cast<double>(size) / static_cast<double>(std::max(h, w));
  return {static_cast<std::int64_t>(static_cast<double>(h) * s + 0.5),
          static_cast<std::int64_t>(static_cast<double>(w) * s + 0.5)};
}

namespace {
/// OpenCV's INTER_NEAREST along the last two axes: output i takes input floor(i * in / out).
at::Tensor resize_nearest_floor(const at::Tensor& t, std::int64_t nh, std::int64_t nw) {
  at::Tensor r = t;
  const std::int64_t sizes[2] = {nh, nw};
  for (int a = 0; a < 2; ++a) {
    const std::int64_t dim = t.dim() - 2 + a, n = t.size(dim), m = sizes[a];
    if (n == m) continue;
    const auto opts = torch::TensorOptions(torch::kFloat64).device(t.device());
    const at::Tensor idx = (torch::arange(m, opts) * (static_cast<double>(n) / static_cast<double>(m)))
                               .floor()
                               .clamp(0, n - 1)
                               .to(torch::kLong);
    r = r.index_select(dim, idx);
  }
  return r;
}
}  // namespace

at::Tensor resize_longest_side(const at::Tensor& t, std::int64_t size, bool nearest, bool pad) {
  const std::int64_t H = t.size(-2), W = t.size(-1);
  const auto [nh, nw] = longest_side_shape(H, W, size);
  std::vector<std::int64_t> out(t.sizes().begin() + 1, t.sizes().end());  // (Y, X) or (Z, Y, X)
  out[out.size() - 2] = nh, out[out.size() - 1] = nw;
  // A (C, Z, Y, X) tensor resized to (Z, nh, nw): the z axis keeps its size, so trilinear /
  // nearest along z is the identity and each slice is resized on its own.
  at::Tensor r = (nh == H && nw == W) ? t
                 : nearest            ? resize_nearest_floor(t, nh, nw)
                                      : detail::resize_linear(t, out);
  if (pad && (nh < size || nw < size)) {
    const auto dtype = r.scalar_type();
    const at::Tensor f = detail::is_floating(r) ? r : r.to(torch::kFloat32);
    r = F::pad(f, F::PadFuncOptions({0, size - nw, 0, size - nh})).to(dtype);
  }
  return r.contiguous();
}

namespace {
/// `label` with the components of each label value smaller than min_size removed (in place).
Status dust_values(at::Tensor label, std::int64_t min_size, int connectivity) {
  const at::Tensor values = std::get<0>(at::_unique(label.masked_select(label > 0), /*sorted=*/true));
  for (std::int64_t i = 0; i < values.numel(); ++i) {
    const at::Tensor mask = label == values[i];
    SEGFLOW_ASSIGN_OR_RETURN(at::Tensor kept, remove_small_components(mask, min_size, connectivity));
    label.masked_fill_(mask.logical_and(kept.logical_not()), 0);
  }
  return Status::ok();
}
}  // namespace

Result<at::Tensor> remove_small_objects(const at::Tensor& label, std::int64_t min_size_3d,
                                        int connectivity_3d, std::int64_t min_size_2d, int connectivity_2d) {
  if (label.size(0) != 1 || detail::is_floating(label) || (label.dim() != 3 && label.dim() != 4))
    return invalid_argument("expected a (1, Z, Y, X) or (1, Y, X) integer label map, got " +
                            detail::shape_string(label) + " " +
                            std::string(c10::toString(label.scalar_type())));
  at::Tensor out = label.cpu().clone();
  at::Tensor lab = out[0];  // (Z, Y, X) or (Y, X), a view
  if (lab.dim() == 3 && min_size_3d > 0)
    SEGFLOW_RETURN_IF_ERROR(dust_values(lab, min_size_3d, connectivity_3d));
  if (min_size_2d > 0) {
    if (lab.dim() == 2) SEGFLOW_RETURN_IF_ERROR(dust_values(lab, min_size_2d, connectivity_2d));
    for (std::int64_t z = 0; lab.dim() == 3 && z < lab.size(0); ++z)
      SEGFLOW_RETURN_IF_ERROR(dust_values(lab[z], min_size_2d, connectivity_2d));
  }
  return out.to(label.device());
}

// ------------------------------------------------------------------------------ options

void MedsamNormalizeOptions::bind(OptionParser& p) {
  p.string("key", key, "the image tensor");
  p.choice("modality", modality, {"ct", "mr"},
           "ct: clip to the window; mr: clip to the percentiles of the voxels > 0 (zeros stay 0)");
  p.number("window_level", window_level, Range::any(), "HU", "CT window centre (MedSAM: 40)");
  p.number("window_width", window_width, Range::positive(), "HU", "CT window width (MedSAM: 400)");
  p.number("lower", lower, Range::closed(0, 100), "percent", "MR lower percentile");
  p.number("upper", upper, Range::closed(0, 100), "percent", "MR upper percentile, >= lower");
  if (p.ok() && lower > upper)
    p.fail("upper",
           "expected upper >= lower, got lower " + format_value(lower) + " and upper " + format_value(upper));
  p.boolean("quantize", quantize, "truncate to the integers 0..255 (MedSAM's uint8)");
}

namespace {

struct MinmaxSlicesOptions {
  std::vector<std::string> keys{"image"};
  double eps = 1e-8;
  bool allow_missing_keys = false;
  void bind(OptionParser& p) {
    p.strings("keys", keys, true, "tensors to normalise");
    p.number("eps", eps, Range::positive(), "", "smallest max - min divided by (MedSAM: 1e-8)");
    p.boolean("allow_missing_keys", allow_missing_keys, "skip keys a sample lacks");
  }
};

struct RepeatChannelsOptions {
  std::string key = "image";
  std::int64_t channels = 3;
  void bind(OptionParser& p) {
    p.string("key", key, "the image tensor, (C, ...)");
    p.integer("channels", channels, Range::closed(1, 64), "channels",
              "channels wanted; a 1-channel image is repeated");
  }
};

struct ResizeLongestSideOptions {
  std::int64_t size = 1024;
  std::vector<std::string> image_keys{"image"};
  std::vector<std::string> label_keys{"label"};
  std::string box_key = "box";
  bool pad = true;
  void bind(OptionParser& p) {
    p.integer("size", size, Range::closed(16, 8192), "pixels",
              "longest side after resizing (and padded side)");
    p.strings("image_keys", image_keys, false, "resized bilinearly (absent keys are skipped)");
    p.strings("label_keys", label_keys, false, "resized by nearest neighbour (absent keys are skipped)");
    p.string("box_key", box_key, "(4,) x0, y0, x1, y1 box scaled by size / longest side, if present");
    p.boolean("pad", pad, "zero-pad bottom and right to size x size");
  }
};

struct RemoveSmallObjectsOptions {
  std::string key = "label";
  std::int64_t min_size_3d = 1000;
  std::int64_t min_size_2d = 100;
  std::int64_t connectivity_3d = 26;
  std::int64_t connectivity_2d = 8;
  void bind(OptionParser& p) {
    p.string("key", key, "the label map, (1, Z, Y, X) or (1, Y, X)");
    p.integer("min_size_3d", min_size_3d, Range::non_negative(), "voxels",
              "3D components (per label) smaller than this are removed; 0 = no 3D pass");
    p.integer("min_size_2d", min_size_2d, Range::non_negative(), "pixels",
              "then per slice, 2D components smaller than this; 0 = no 2D pass");
    p.integer("connectivity_3d", connectivity_3d, Range::closed(6, 26), "", "6, 18 or 26");
    if (p.ok() && connectivity_3d != 6 && connectivity_3d != 18 && connectivity_3d != 26)
      p.fail("connectivity_3d", "expected 6, 18 or 26, got " + std::to_string(connectivity_3d));
    p.integer("connectivity_2d", connectivity_2d, Range::closed(4, 8), "", "4 or 8");
    if (p.ok() && connectivity_2d != 4 && connectivity_2d != 8)
      p.fail("connectivity_2d", "expected 4 or 8, got " + std::to_string(connectivity_2d));
  }
};

/// "stage: sample 'id': message".
Status sample_error(const char* stage, const Sample& s, const std::string& message) {
  return invalid_argument(std::string(stage) + ": sample '" + s.id + "': " + message);
}

// ------------------------------------------------------------------------------- stages

class MedsamNormalizeStage final : public MapStage {
 public:
  using Options = MedsamNormalizeOptions;
  static constexpr const char* kName = "medsam_normalize";
  static constexpr const char* kDoc =
      "MedSAM's intensities: CT window or MR non-zero percentile clip, scaled to 0-255 over the image";
  static constexpr bool kDeterministic = true;
  MedsamNormalizeStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), {o.key}), o_(std::move(o)) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample& s, Rng&) const override {
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, {o_.key}, kName).status());
    s.at(o_.key) = medsam_normalize(s.at(o_.key), o_);
    return Status::ok();
  }

 private:
  Options o_;
};

class MinmaxSlicesStage final : public MapStage {
 public:
  using Options = MinmaxSlicesOptions;
  static constexpr const char* kName = "minmax_slices";
  static constexpr const char* kDoc = "per slice (x - min) / max(max - min, eps): [0, 1] (MedSAM)";
  static constexpr bool kDeterministic = true;
  MinmaxSlicesStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample& s, Rng&) const override {
    for (const auto& k : detail::present_keys(s, o_.keys, o_.allow_missing_keys)) {
      if (!s.has(k)) return detail::check_keys(s, {k}, kName).status();
      if (s.at(k).dim() < 3) return sample_error(kName, s, "'" + k + "' must be (C, Y, X) or (C, Z, Y, X)");
      s.at(k) = minmax_slices(s.at(k), o_.eps);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

class RepeatChannelsStage final : public MapStage {
 public:
  using Options = RepeatChannelsOptions;
  static constexpr const char* kName = "repeat_channels";
  static constexpr const char* kDoc = "a 1-channel image repeated to `channels` (MedSAM's three channels)";
  static constexpr bool kDeterministic = true;
  RepeatChannelsStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), {o.key}), o_(std::move(o)) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample& s, Rng&) const override {
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, {o_.key}, kName).status());
    at::Tensor& t = s.at(o_.key);
    if (t.dim() < 1 || (t.size(0) != 1 && t.size(0) != o_.channels))
      return sample_error(kName, s,
                          "'" + o_.key + "' must have 1 or " + std::to_string(o_.channels) +
                              " channels, got " + detail::shape_string(t));
    if (t.size(0) == 1 && o_.channels > 1) {
      std::vector<std::int64_t> reps(static_cast<std::size_t>(t.dim()), 1);
      reps[0] = o_.channels;
      t = t.repeat(reps);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

class ResizeLongestSideStage final : public MapStage {
 public:
  using Options = ResizeLongestSideOptions;
  static constexpr const char* kName = "resize_longest_side";
  static constexpr const char* kDoc =
      "longest in-plane side to `size` (bilinear images, nearest labels, the box scaled alike), zero-padded "
      "bottom/right to size x size (LiteMedSAM)";
  static constexpr bool kDeterministic = true;
  ResizeLongestSideStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.image_keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    std::int64_t H = -1, W = -1;
    auto resize = [&](const std::string& k, bool nearest) -> Status {
      if (!s.has(k)) return Status::ok();
      at::Tensor& t = s.at(k);
      if (t.dim() != 3 && t.dim() != 4)
        return sample_error(kName, s, "'" + k + "' must be (C, Y, X) or (C, Z, Y, X)");
      if (H >= 0 && (t.size(-2) != H || t.size(-1) != W))
        return sample_error(kName, s, "'" + k + "' has another in-plane size: " + detail::shape_string(t));
      H = t.size(-2), W = t.size(-1);
      t = resize_longest_side(t, o_.size, nearest, o_.pad);
      return Status::ok();
    };
    for (const auto& k : o_.image_keys) SEGFLOW_RETURN_IF_ERROR(resize(k, false));
    for (const auto& k : o_.label_keys) SEGFLOW_RETURN_IF_ERROR(resize(k, true));
    if (H < 0) return sample_error(kName, s, "none of the image_keys or label_keys is present");
    const double scale = static_cast<double>(o_.size) / static_cast<double>(std::max(H, W));
    if (!o_.box_key.empty() && s.has(o_.box_key)) {
      if (s.at(o_.box_key).numel() != 4)
        return sample_error(kName, s, "'" + o_.box_key + "' must hold 4 numbers");
      s.at(o_.box_key) = s.at(o_.box_key).to(torch::kFloat32) * scale;
    }
    const auto [nh, nw] = longest_side_shape(H, W, o_.size);
    const double rx = static_cast<double>(W) / static_cast<double>(nw),
                 ry = static_cast<double>(H) / static_cast<double>(nh);
    s.geometry.origin = index_to_physical(s.geometry, {0.5 * rx - 0.5, 0.5 * ry - 0.5, 0.0});
    s.geometry.spacing[0] *= rx;
    s.geometry.spacing[1] *= ry;
    return Status::ok();
  }

 private:
  Options o_;
};

class RemoveSmallObjectsStage final : public MapStage {
 public:
  using Options = RemoveSmallObjectsOptions;
  static constexpr const char* kName = "remove_small_objects";
  static constexpr const char* kDoc =
      "per label value, drop 3D components under min_size_3d voxels, then 2D ones under min_size_2d per "
      "slice (MedSAM's cc3d.dust)";
  static constexpr bool kDeterministic = true;
  RemoveSmallObjectsStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), {o.key}), o_(std::move(o)) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample& s, Rng&) const override {
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, {o_.key}, kName).status());
    auto r = remove_small_objects(s.at(o_.key), o_.min_size_3d, static_cast<int>(o_.connectivity_3d),
                                  o_.min_size_2d, static_cast<int>(o_.connectivity_2d));
    if (!r.is_ok()) return sample_error(kName, s, "'" + o_.key + "': " + r.status().message());
    s.at(o_.key) = *r;
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_medsam_preprocess_stages(StageRegistry& r) {
  SEGFLOW_RETURN_IF_ERROR(add_stage<MedsamNormalizeStage>(r));
  SEGFLOW_RETURN_IF_ERROR(add_stage<MinmaxSlicesStage>(r));
  SEGFLOW_RETURN_IF_ERROR(add_stage<RepeatChannelsStage>(r));
  SEGFLOW_RETURN_IF_ERROR(add_stage<ResizeLongestSideStage>(r));
  return add_stage<RemoveSmallObjectsStage>(r);
}

}  // namespace segflow::pipeline
