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
  p.boolean("class_balanced", class_balanced,
            "a positive crop picks a class present in the case uniformly, then a voxel of it (nnU-Net); "
            "uses fg_bg_indices per_class lists");
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
    std::vector<std::int64_t> v;
    v.reserve(picks.size());
    if (list.is_cpu()) {  // the usual case (index lists are host-resident): read in place
      const at::Tensor l =
          list.scalar_type() == torch::kInt ? list.contiguous() : list.to(torch::kLong).contiguous();
      if (l.scalar_type() == torch::kInt)
        for (std::int64_t k : picks) v.push_back(l.data_ptr<std::int32_t>()[k]);
      else
        for (std::int64_t k : picks) v.push_back(l.data_ptr<std::int64_t>()[k]);
      return v;
    }
    // A device list: one gather there and one copy back, as the crop boxes are cut on the host.
    auto sel = torch::tensor(picks, torch::kLong).to(list.device(), /*non_blocking=*/true);
    at::Tensor h = list.index_select(0, sel).to(torch::kLong).cpu();
    v.assign(h.data_ptr<std::int64_t>(), h.data_ptr<std::int64_t>() + h.numel());
    return v;
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

/// The crop in tensor order (d = 0 is the first spatial dim: z for 3-D): the volume's shape,
/// the crop size, the padded shape and the padding before the volume (centred, when the
/// volume is smaller than the crop).
struct CropGrid {
  std::int64_t nsp = 0;
  std::vector<std::int64_t> shape, crop, padded, before;
  std::int64_t numel = 1;  ///< voxels of the unpadded volume
  bool pad = false;
};

CropGrid crop_grid(at::IntArrayRef label_sizes, const std::array<std::int64_t, 3>& spatial_size,
                   std::int64_t nsp) {
  CropGrid g;
  g.nsp = nsp;
  g.shape.assign(label_sizes.begin() + 1, label_sizes.end());
  g.crop.resize(nsp), g.padded.resize(nsp), g.before.resize(nsp);
  for (std::int64_t d = 0; d < nsp; ++d) {
    const std::int64_t want = spatial_size[nsp - 1 - d];
    g.crop[d] = want <= 0 ? g.shape[d] : want;
    g.padded[d] = std::max(g.shape[d], g.crop[d]);
    g.before[d] = (g.padded[d] - g.shape[d]) / 2;
    g.numel *= g.shape[d];
  }
  for (std::int64_t d = 0; d < nsp; ++d) g.pad = g.pad || g.padded[d] != g.shape[d];
  return g;
}

/// The foreground of a case class by class (class_balanced): label values and their voxels.
struct ClassCandidates {
  std::vector<std::int64_t> values;
  std::vector<Candidates> sets;
};

/// The per-class lists fg_bg_indices stored (per_class), in label order.
Result<ClassCandidates> stored_classes(const Sample& s) {
  ClassCandidates cc;
  for (const auto& [key, t] : s.tensors) {
    const auto value = class_of_indices_key(key);
    if (!value) continue;
    SEGFLOW_ASSIGN_OR_RETURN(Candidates c, candidates_of(s, key));
    if (c.size() == 0) continue;
    cc.values.push_back(*value);
    cc.sets.push_back(std::move(c));
  }
  // std::map orders "fg_indices_10" before "fg_indices_2": sort by value.
  std::vector<std::size_t> order(cc.values.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return cc.values[a] < cc.values[b]; });
  ClassCandidates sorted;
  for (auto i : order) sorted.values.push_back(cc.values[i]), sorted.sets.push_back(std::move(cc.sets[i]));
  return sorted;
}

bool has_class_lists(const Sample& s) {
  for (const auto& [key, t] : s.tensors)
    if (class_of_indices_key(key)) return true;
  return false;
}

/// class_balanced: the classes present, from fg_bg_indices' per-class lists, else computed
/// from the label (when the case has foreground, `n_fg`). Empty without class_balanced.
Result<ClassCandidates> class_candidates(const Sample& s, const RandCropPosNegOptions& o, std::int64_t n_fg,
                                         const CropGrid& g) {
  static constexpr const char* kStage = "rand_crop_pos_neg";
  if (!o.class_balanced || n_fg == 0) return ClassCandidates{};
  if (has_class_lists(s)) {
    SEGFLOW_ASSIGN_OR_RETURN(ClassCandidates cc, stored_classes(s));
    for (std::size_t i = 0; i < cc.sets.size(); ++i)
      if (cc.sets[i].extent() > g.numel)
        return invalid_argument(std::string(kStage) + ": sample '" + s.id +
                                "': " + class_indices_key(cc.values[i]) + " does not fit the label grid " +
                                detail::shape_string(s.at(o.label_key)) +
                                " (a spatial stage ran after fg_bg_indices?)");
    return cc;
  }
  auto computed = class_indices(s.at(o.label_key), 0);
  if (!computed.is_ok())
    return invalid_argument(std::string(kStage) + ": sample '" + s.id + "': '" + o.label_key +
                            "': " + computed.status().message() + " (option class_balanced)");
  ClassCandidates cc;
  for (auto& [value, list] : computed.value()) {
    cc.values.push_back(value);
    cc.sets.push_back(Candidates{list, std::nullopt});
  }
  return cc;
}

/// The crop centres drawn: per crop, one uniform (pos or neg) and one integer (which voxel),
/// in crop order (class_balanced: for a positive crop, first an integer for the class); a
/// crop with neither class anywhere draws a centre anywhere.
struct Draws {
  std::vector<int> kind;  ///< per crop: 1 fg, 0 bg, -1 anywhere
  std::vector<std::int64_t> fg_pick, bg_pick;
  std::vector<std::int64_t> fg_class;  ///< class_balanced: per fg pick, the index of its class
  std::vector<std::array<std::int64_t, 3>> any_centre;
};

/// `class_sizes`: with class_balanced, the voxels of each class present (else empty).
Draws draw_centres(const RandCropPosNegOptions& o, const CropGrid& g, std::int64_t n_fg, std::int64_t n_bg,
                   const std::vector<std::int64_t>& class_sizes, Rng& rng) {
  const double ratio = o.pos / (o.pos + o.neg);
  Draws dr;
  dr.kind.resize(o.num_samples);
  for (std::int64_t k = 0; k < o.num_samples; ++k) {
    bool want_pos = rng.uniform() < ratio;
    if (n_fg == 0) want_pos = false;
    if (n_bg == 0) want_pos = true;
    if (n_fg == 0 && n_bg == 0) {
      dr.kind[k] = -1;
      std::array<std::int64_t, 3> c{0, 0, 0};
      for (std::int64_t d = 0; d < g.nsp; ++d) c[d] = rng.integer(0, g.shape[d] - 1);
      dr.any_centre.push_back(c);
    } else if (want_pos && !class_sizes.empty()) {
      dr.kind[k] = 1;
      const std::int64_t c = rng.integer(0, static_cast<std::int64_t>(class_sizes.size()) - 1);
      dr.fg_class.push_back(c);
      dr.fg_pick.push_back(rng.integer(0, class_sizes[c] - 1));
    } else if (want_pos) {
      dr.kind[k] = 1;
      dr.fg_pick.push_back(rng.integer(0, n_fg - 1));
    } else {
      dr.kind[k] = 0;
      dr.bg_pick.push_back(rng.integer(0, n_bg - 1));
    }
  }
  return dr;
}

/// The flat indices of the positive crops' centres, read class by class when balanced.
std::vector<std::int64_t> gather_fg(const Draws& dr, const Candidates& fg, const ClassCandidates& classes) {
  if (dr.fg_class.empty()) return fg.gather(dr.fg_pick);
  std::vector<std::int64_t> out(dr.fg_pick.size());
  for (std::size_t c = 0; c < classes.sets.size(); ++c) {
    std::vector<std::int64_t> picks;
    std::vector<std::size_t> where;
    for (std::size_t j = 0; j < dr.fg_pick.size(); ++j)
      if (dr.fg_class[j] == static_cast<std::int64_t>(c)) picks.push_back(dr.fg_pick[j]), where.push_back(j);
    const auto flat = classes.sets[c].gather(picks);
    for (std::size_t i = 0; i < where.size(); ++i) out[where[i]] = flat[i];
  }
  return out;
}

/// Crop k of `s` around centre `c` (tensor order) from the (padded) tensors `src`; the
/// sample's other tensors are kept, its candidate indices dropped.
Sample crop_at(const Sample& s, const std::map<std::string, at::Tensor>& src,
               const std::vector<std::string>& keys, const CropGrid& g, const std::array<std::int64_t, 3>& c,
               std::int64_t k) {
  const std::int64_t nsp = g.nsp;
  std::array<std::int64_t, 3> start_xyz{0, 0, 0};
  std::vector<std::int64_t> start(nsp);
  for (std::int64_t d = 0; d < nsp; ++d) {
    const std::int64_t centre = c[d] + g.before[d];
    start[d] = std::clamp<std::int64_t>(centre - g.crop[d] / 2, 0, g.padded[d] - g.crop[d]);
    start_xyz[nsp - 1 - d] = start[d] - g.before[d];
  }
  Sample o_s;
  o_s.id = s.id + "#" + std::to_string(k);
  o_s.geometry = detail::crop_geometry(s.geometry, start_xyz);
  o_s.tensors = s.tensors;
  detail::drop_indices(o_s);  // the candidate centre sets and their markers
  for (const auto& key : keys) {
    at::Tensor t = src.at(key);
    for (std::int64_t d = 0; d < nsp; ++d) t = t.narrow(d + 1, start[d], g.crop[d]);
    o_s.tensors[key] = t.contiguous();
  }
  return o_s;
}

}  // namespace

Result<std::vector<Sample>> rand_crop_pos_neg(const Sample& input, const RandCropPosNegOptions& o, Rng& rng) {
  static constexpr const char* kStage = "rand_crop_pos_neg";
  const auto keys = detail::present_keys(input, o.keys, o.allow_missing_keys);
  std::vector<std::string> all = keys;
  all.push_back(o.label_key);
  if (!o.image_key.empty()) all.push_back(o.image_key);
  SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t nsp, detail::check_keys(input, all, kStage));
  // The label's sizes are the same in the compact form.
  const CropGrid g = crop_grid(input.at(o.label_key).sizes(), o.spatial_size, nsp);

  // A compact sample (pipeline/cache/compact.hpp) is cropped as it is and the crops are
  // expanded; when the volume needs padding or the indices must be computed from the
  // values, it is expanded first.
  const bool precomputed = input.has("fg_indices") && input.has("bg_indices");
  bool compact = is_compact(input);
  std::optional<Sample> expanded;
  if (compact && (g.pad || !precomputed || (o.class_balanced && !has_class_lists(input)))) {
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
    if (std::max(fg.extent(), bg.extent()) > g.numel)
      return invalid_argument(std::string(kStage) + ": sample '" + s.id +
                              "': fg_indices/bg_indices do not fit the label grid " +
                              detail::shape_string(label) + " (a spatial stage ran after fg_bg_indices?)");
  } else {
    std::tie(fg.list, bg.list) =
        fg_bg_indices(label, o.image_key.empty() ? at::Tensor() : s.at(o.image_key), o.image_threshold, 0);
  }
  SEGFLOW_ASSIGN_OR_RETURN(const ClassCandidates classes, class_candidates(s, o, fg.size(), g));
  std::vector<std::int64_t> class_sizes;
  for (const auto& c : classes.sets) class_sizes.push_back(c.size());
  const Draws dr = draw_centres(o, g, fg.size(), bg.size(), class_sizes, rng);
  const std::vector<std::int64_t> fg_flat = gather_fg(dr, fg, classes), bg_flat = bg.gather(dr.bg_pick);

  // Pad (centred, zeros) when the volume is smaller than the crop.
  std::map<std::string, at::Tensor> src;
  for (const auto& key : keys) {
    at::Tensor t = s.at(key);
    if (g.pad) {
      std::vector<std::int64_t> p;  // last dim first, (before, after) pairs
      for (std::int64_t d = nsp - 1; d >= 0; --d) {
        p.push_back(g.before[d]);
        p.push_back(g.padded[d] - g.shape[d] - g.before[d]);
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
    if (dr.kind[k] == -1) {
      c = dr.any_centre[ai++];
    } else {
      std::int64_t flat = dr.kind[k] == 1 ? fg_flat[fi++] : bg_flat[bi++];
      for (std::int64_t d = nsp - 1; d >= 0; --d) {
        c[d] = flat % g.shape[d];
        flat /= g.shape[d];
      }
    }
    Sample o_s = crop_at(s, src, keys, g, c, k);
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
