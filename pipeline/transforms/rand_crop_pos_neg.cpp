#include <torch/torch.h>

#include <algorithm>
#include <optional>

#include "pipeline/cache/compact.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/crop.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void RandCropPosNegOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors cropped together");
  p.string("label_key", label_key, "foreground: label > 0");
  p.integers("spatial_size", spatial_size, Range::any(), true, "voxels",
             "crop size (x, y, z); <= 0: full extent");
  p.number("pos", pos, Range::non_negative(), "", "weight of crops centred on foreground");
  p.number("neg", neg, Range::non_negative(), "", "weight of crops centred on background");
  p.integer("num_samples", num_samples, Range::closed(1, 1024), "crops", "crops per input sample");
  p.string("image_key", image_key, "background needs image > image_threshold (indices computed here)");
  p.number("image_threshold", image_threshold, Range::any(), "image units", "see image_key");
  if (p.ok() && pos + neg <= 0) p.fail("neg", "expected pos + neg > 0, got pos 0 and neg 0");
  if (label_key.empty()) p.fail("label_key", "expected a non-empty name");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

namespace {

/// Candidate centres of one class: an index list (int64/int32, host or device) or a packed
/// index set (host).
struct Candidates {
  at::Tensor list;
  std::optional<PackedIndexSet> set;

  std::int64_t size() const { return set ? set->size() : list.numel(); }
  /// One past the largest index (0 when empty).
  std::int64_t extent() const {
    if (set) return set->extent();
    return list.numel() ? list.max().item<std::int64_t>() + 1 : 0;
  }
  /// The indices at positions `picks`, read on the host.
  std::vector<std::int64_t> gather(const std::vector<std::int64_t>& picks) const {
    if (picks.empty()) return {};
    if (set) {
      std::vector<std::int64_t> v;
      v.reserve(picks.size());
      for (std::int64_t k : picks) v.push_back(set->select(k));
      return v;
    }
    auto sel = torch::tensor(picks, torch::kLong).to(list.device());
    at::Tensor v = list.index_select(0, sel).to(torch::kLong).cpu().contiguous();
    return std::vector<std::int64_t>(v.data_ptr<std::int64_t>(), v.data_ptr<std::int64_t>() + v.numel());
  }
};

Result<Candidates> candidates_of(const Sample& s, const std::string& key) {
  Candidates c;
  if (is_packed_index_set(s, key)) {
    SEGFLOW_ASSIGN_OR_RETURN(c.set,
                             PackedIndexSet::view(s.at(key), "'" + key + "' of sample '" + s.id + "'"));
  } else {
    c.list = s.at(key);
  }
  return c;
}

}  // namespace

Result<std::vector<Sample>> rand_crop_pos_neg(const Sample& input, const RandCropPosNegOptions& o, Rng& rng) {
  static constexpr const char* kStage = "rand_crop_pos_neg";
  const auto keys = detail::present_keys(input, o.keys, o.allow_missing_keys);
  std::vector<std::string> all = keys;
  all.push_back(o.label_key);
  if (!o.image_key.empty()) all.push_back(o.image_key);
  SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t nsp, detail::check_keys(input, all, kStage));

  // Spatial sizes in tensor order (d = 0 is the first spatial dim: z for 3-D).
  const auto label_sizes = input.at(o.label_key).sizes();  // the same in the compact form
  std::vector<std::int64_t> shape(label_sizes.begin() + 1, label_sizes.end());
  std::vector<std::int64_t> crop(nsp), padded(nsp), before(nsp);
  std::int64_t numel = 1;
  for (std::int64_t d = 0; d < nsp; ++d) {
    const std::int64_t want = o.spatial_size[nsp - 1 - d];
    crop[d] = want <= 0 ? shape[d] : want;
    padded[d] = std::max(shape[d], crop[d]);
    before[d] = (padded[d] - shape[d]) / 2;
    numel *= shape[d];
  }
  bool pad = false;
  for (std::int64_t d = 0; d < nsp; ++d) pad = pad || padded[d] != shape[d];

  // A compact sample (pipeline/cache/compact.hpp) is cropped as it is and the crops are
  // expanded; when the volume needs padding or the indices must be computed from the
  // values, it is expanded first.
  const bool precomputed = input.has("fg_indices") && input.has("bg_indices");
  bool compact = is_compact(input);
  std::optional<Sample> expanded;
  if (compact && (pad || !precomputed)) {
    SEGFLOW_ASSIGN_OR_RETURN(expanded, expand_sample(input));
    compact = false;
  }
  const Sample& s = expanded ? *expanded : input;
  const at::Tensor& label = s.at(o.label_key);

  // Candidate centres: precomputed indices when they fit this grid, else computed now.
  Candidates fg, bg;
  if (precomputed) {
    SEGFLOW_ASSIGN_OR_RETURN(fg, candidates_of(s, "fg_indices"));
    SEGFLOW_ASSIGN_OR_RETURN(bg, candidates_of(s, "bg_indices"));
    if (std::max(fg.extent(), bg.extent()) > numel)
      return invalid_argument(std::string(kStage) + ": sample '" + s.id +
                              "': fg_indices/bg_indices do not fit the label grid " +
                              detail::shape_string(label) + " (a spatial stage ran after fg_bg_indices?)");
  } else {
    std::tie(fg.list, bg.list) =
        fg_bg_indices(label, o.image_key.empty() ? at::Tensor() : s.at(o.image_key), o.image_threshold, 0);
  }
  const std::int64_t n_fg = fg.size(), n_bg = bg.size();
  const double ratio = o.pos / (o.pos + o.neg);

  // Draws: per crop, one uniform (pos or neg) and one integer (which voxel).
  std::vector<int> kind(o.num_samples);  // 1 fg, 0 bg, -1 anywhere
  std::vector<std::int64_t> fg_pick, bg_pick;
  std::vector<std::array<std::int64_t, 3>> any_centre;
  for (std::int64_t k = 0; k < o.num_samples; ++k) {
    bool want_pos = rng.uniform() < ratio;
    if (n_fg == 0) want_pos = false;
    if (n_bg == 0) want_pos = true;
    if (n_fg == 0 && n_bg == 0) {
      kind[k] = -1;
      std::array<std::int64_t, 3> c{0, 0, 0};
      for (std::int64_t d = 0; d < nsp; ++d) c[d] = rng.integer(0, shape[d] - 1);
      any_centre.push_back(c);
    } else if (want_pos) {
      kind[k] = 1;
      fg_pick.push_back(rng.integer(0, n_fg - 1));
    } else {
      kind[k] = 0;
      bg_pick.push_back(rng.integer(0, n_bg - 1));
    }
  }
  const std::vector<std::int64_t> fg_flat = fg.gather(fg_pick), bg_flat = bg.gather(bg_pick);

  // Pad (centred, zeros) when the volume is smaller than the crop.
  std::map<std::string, at::Tensor> src;
  for (const auto& key : keys) {
    at::Tensor t = s.at(key);
    if (pad) {
      std::vector<std::int64_t> p;  // last dim first, (before, after) pairs
      for (std::int64_t d = nsp - 1; d >= 0; --d) {
        p.push_back(before[d]);
        p.push_back(padded[d] - shape[d] - before[d]);
      }
      t = torch::constant_pad_nd(t, p, 0);
    }
    src[key] = t;
  }

  std::vector<Sample> out;
  out.reserve(o.num_samples);
  std::size_t fi = 0, bi = 0, ai = 0;
  for (std::int64_t k = 0; k < o.num_samples; ++k) {
    std::array<std::int64_t, 3> c{0, 0, 0};
    if (kind[k] == -1) {
      c = any_centre[ai++];
    } else {
      std::int64_t flat = kind[k] == 1 ? fg_flat[fi++] : bg_flat[bi++];
      for (std::int64_t d = nsp - 1; d >= 0; --d) {
        c[d] = flat % shape[d];
        flat /= shape[d];
      }
    }
    std::array<std::int64_t, 3> start_xyz{0, 0, 0};
    std::vector<std::int64_t> start(nsp);
    for (std::int64_t d = 0; d < nsp; ++d) {
      const std::int64_t centre = c[d] + before[d];
      start[d] = std::clamp<std::int64_t>(centre - crop[d] / 2, 0, padded[d] - crop[d]);
      start_xyz[nsp - 1 - d] = start[d] - before[d];
    }
    Sample o_s;
    o_s.id = s.id + "#" + std::to_string(k);
    o_s.geometry = detail::crop_geometry(s.geometry, start_xyz);
    static const std::string fg_marker = std::string(kCompactMarkerPrefix) + "fg_indices",
                             bg_marker = std::string(kCompactMarkerPrefix) + "bg_indices";
    for (const auto& [name, t] : s.tensors)
      if (name != "fg_indices" && name != "bg_indices" && name != fg_marker && name != bg_marker)
        o_s.tensors[name] = t;
    for (const auto& key : keys) {
      at::Tensor t = src.at(key);
      for (std::int64_t d = 0; d < nsp; ++d) t = t.narrow(d + 1, start[d], crop[d]);
      o_s.tensors[key] = t.contiguous();
    }
    if (compact) {
      SEGFLOW_ASSIGN_OR_RETURN(o_s, expand_sample(std::move(o_s)));
    }
    out.push_back(std::move(o_s));
  }
  return out;
}

namespace {

class RandCropPosNegStage final : public Stage {
 public:
  using Options = RandCropPosNegOptions;
  static constexpr const char* kName = "rand_crop_pos_neg";
  static constexpr const char* kDoc =
      "num_samples crops centred on foreground (pos) or background (neg) voxels";
  static constexpr bool kDeterministic = false;

  RandCropPosNegStage(Options o, nlohmann::json resolved)
      : Stage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  Status apply(std::vector<Sample>& samples, Rng& rng) const override {
    std::vector<Sample> out;
    out.reserve(samples.size() * static_cast<std::size_t>(o_.num_samples));
    for (const Sample& s : samples) {
      SEGFLOW_ASSIGN_OR_RETURN(std::vector<Sample> crops, rand_crop_pos_neg(s, o_, rng));
      for (auto& c : crops) out.push_back(std::move(c));
    }
    samples = std::move(out);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_rand_crop_pos_neg_stage(StageRegistry& r) { return add_stage<RandCropPosNegStage>(r); }

}  // namespace segflow::pipeline
