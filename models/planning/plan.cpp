#include "models/planning/plan.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "models/nets/res_enc_unet.hpp"
#include "models/planning/detail/axes.hpp"
#include "models/planning/trial.hpp"

namespace segflow::models::planning {

namespace fs = std::filesystem;

const char* to_string(ConfigurationKind k) {
  switch (k) {
    case ConfigurationKind::two_d:
      return "2d";
    case ConfigurationKind::fullres_3d:
      return "3d_fullres";
    case ConfigurationKind::lowres_3d:
      return "3d_lowres";
  }
  return "3d_fullres";
}

Result<ConfigurationKind> parse_configuration(const std::string& name) {
  for (auto k : {ConfigurationKind::two_d, ConfigurationKind::fullres_3d, ConfigurationKind::lowres_3d})
    if (name == to_string(k)) return k;
  return invalid_argument("configuration: expected 2d, 3d_fullres or 3d_lowres, got '" + name + "'");
}

const char* to_string(MemoryModel m) { return m == MemoryModel::nnunet ? "nnunet" : "measured"; }

Result<MemoryModel> parse_memory_model(const std::string& name) {
  if (name == "nnunet") return MemoryModel::nnunet;
  if (name == "measured") return MemoryModel::measured;
  return invalid_argument("--memory-model: expected nnunet or measured, got '" + name + "'");
}

const ConfigurationPlan* PlanResult::find(ConfigurationKind k) const {
  for (const auto& c : configurations)
    if (c.kind == k) return &c;
  return nullptr;
}

std::string yaml_file_name(ConfigurationKind k) { return std::string(to_string(k)) + ".yaml"; }

namespace {

std::string join_ints(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// What planning one configuration needs to know.
struct ConfigInput {
  ConfigurationKind kind = ConfigurationKind::fullres_3d;
  std::vector<double> spacing, median_shape;  ///< nnU-Net axis order
  double approx_voxels = 0;                   ///< voxels of the whole dataset at this spacing
  std::int64_t in_channels = 1, num_classes = 2;
  std::vector<int> transpose;  ///< transpose_forward (array axes of nnU-Net axes 0..2)
};

std::int64_t max_features(const ConfigInput& in, const NnunetConstants& k) {
  return in.spacing.size() == 2 ? k.max_features_2d : k.max_features_3d;
}

/// How a memory model chooses: which candidate of the shrinking sequence, and the batch.
class Judge {
 public:
  virtual ~Judge() = default;
  virtual Result<std::size_t> choose(const std::vector<Topology>& seq, const ConfigInput& in,
                                     ConfigurationPlan& plan) = 0;
  /// The batch size before nnU-Net's caps (a share of the dataset, the minimum).
  virtual Result<std::int64_t> batch(const Topology& t, const ConfigInput& in, std::int64_t cap,
                                     ConfigurationPlan& plan) = 0;
};

/// nnU-Net's estimate against its reference constants.
class NnunetJudge : public Judge {
 public:
  explicit NnunetJudge(const PlanOptions& o) : o_(o) {}

  double estimate(const Topology& t, const ConfigInput& in) const {
    const auto& k = o_.constants;
    const auto f = features_per_stage(t.n_stages(), k.base_num_features, max_features(in, k));
    // nnU-Net builds the network without deep supervision to estimate it.
    if (k.residual_encoder)
      return res_enc_feature_map_size(t.patch_size, t, f, in.num_classes, nnunet_resenc_blocks(t.n_stages()),
                                      1, false);
    return conv_feature_map_size(t.patch_size, t, f, in.num_classes, k.blocks_per_stage, false);
  }
  double reference(const ConfigInput& in) const {
    const auto& k = o_.constants;
    return (in.spacing.size() == 2 ? k.reference_val_2d : k.reference_val_3d) *
           (o_.memory_gb / k.reference_val_corresp_gb);
  }
  double ref_bs(const ConfigInput& in) const {
    return static_cast<double>(in.spacing.size() == 2 ? o_.constants.reference_bs_2d
                                                      : o_.constants.reference_bs_3d);
  }
  Result<std::size_t> choose(const std::vector<Topology>& seq, const ConfigInput& in,
                             ConfigurationPlan& plan) override {
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const double e = estimate(seq[i], in);
      if ((o_.constants.estimate_per_batch_of_2 ? e / ref_bs(in) * 2 : e) <= reference(in)) return i;
    }
    plan.notes.push_back("no candidate patch fits nnU-Net's estimate for " + std::to_string(o_.memory_gb) +
                         " GB; the smallest tried is used");
    return seq.size() - 1;
  }
  Result<std::int64_t> batch(const Topology& t, const ConfigInput& in, std::int64_t,
                             ConfigurationPlan& plan) override {
    plan.vram_estimate = estimate(t, in);
    plan.vram_reference = reference(in);
    return static_cast<std::int64_t>(py_round(plan.vram_reference / plan.vram_estimate * ref_bs(in)));
  }

 private:
  const PlanOptions& o_;
};

/// Trial steps on the device.
class MeasuredJudge : public Judge {
 public:
  MeasuredJudge(const PlanOptions& o, std::string amp, double budget_s)
      : o_(o), amp_(std::move(amp)), budget_s_(budget_s) {}

  Result<std::size_t> choose(const std::vector<Topology>& seq, const ConfigInput& in,
                             ConfigurationPlan& plan) override {
    const std::int64_t b = o_.constants.min_batch_size;
    SEGFLOW_ASSIGN_OR_RETURN(const Trial first, measure(seq.front(), b, in, plan));
    if (first.fits) return std::size_t{0};
    std::size_t lo = 0, hi = seq.size() - 1;
    SEGFLOW_ASSIGN_OR_RETURN(const Trial last, measure(seq[hi], b, in, plan));
    if (!last.fits)
      return invalid_argument(std::string(to_string(in.kind)) + ": even the smallest candidate patch " +
                              join_ints(last.patch_size) + " with batch " + std::to_string(b) +
                              " does not fit: " + last.why + " (raise --memory-gb or --max-step-s)");
    while (hi - lo > 1) {  // the sequence shrinks: find the first (largest) candidate that fits
      const std::size_t mid = (lo + hi) / 2;
      SEGFLOW_ASSIGN_OR_RETURN(const Trial t, measure(seq[mid], b, in, plan));
      (t.fits ? hi : lo) = mid;
    }
    return hi;
  }

  Result<std::int64_t> batch(const Topology& t, const ConfigInput& in, std::int64_t cap,
                             ConfigurationPlan& plan) override {
    const std::int64_t b0 = o_.constants.min_batch_size;
    const Trial* base = nullptr;
    for (const auto& tr : plan.trials)
      if (tr.patch_size == t.patch_size && tr.batch_size == b0 && tr.fits) base = &tr;
    if (!base || cap <= b0) return b0;
    const Trial t0 = *base;
    const std::int64_t b1 = std::min(2 * b0, cap);
    SEGFLOW_ASSIGN_OR_RETURN(const Trial t1, measure(t, b1, in, plan));
    if (!t1.fits) return b0;
    // Linear in the batch: the largest batch both figures allow (5% headroom), checked.
    const double dt = (t1.step_s - t0.step_s) / static_cast<double>(b1 - b0);
    const double dm = (t1.peak_mb - t0.peak_mb) / static_cast<double>(b1 - b0);
    std::int64_t b = cap;
    if (dm > 0)
      b = std::min<std::int64_t>(b, b1 + static_cast<std::int64_t>((0.95 * memory_mb() - t1.peak_mb) / dm));
    if (budget_s_ > 0 && dt > 0)
      b = std::min<std::int64_t>(b, b1 + static_cast<std::int64_t>((0.95 * budget_s_ - t1.step_s) / dt));
    while (b > b1) {
      SEGFLOW_ASSIGN_OR_RETURN(const Trial tb, measure(t, b, in, plan));
      if (tb.fits) return b;
      b = std::max(b1, static_cast<std::int64_t>(static_cast<double>(b) * 0.8));
    }
    return b1;
  }

 private:
  double memory_mb() const { return o_.memory_gb * 1024.0; }

  Result<Trial> measure(const Topology& t, std::int64_t batch, const ConfigInput& in,
                        ConfigurationPlan& plan) {
    for (const auto& tr : plan.trials)
      if (tr.patch_size == t.patch_size && tr.batch_size == batch) return tr;
    TrialSpec spec;
    spec.model = detail::unet_json(t, o_.constants.base_num_features, max_features(in, o_.constants),
                                   in.in_channels, in.num_classes, in.transpose, o_.constants);
    spec.spatial = detail::tensor_order(t.patch_size, in.transpose);
    spec.batch = batch;
    spec.in_channels = in.in_channels;
    spec.num_classes = in.num_classes;
    spec.device = o_.device;
    spec.amp = amp_;
    spec.steps = o_.trial_steps;
    SEGFLOW_ASSIGN_OR_RETURN(const TrialMeasurement m, run_trial(spec));
    Trial tr{t.patch_size, batch, m.peak_mb, m.step_s, false, ""};
    char buf[160];
    if (m.out_of_memory)
      tr.why = "out of memory";
    else if (m.peak_mb > memory_mb())
      std::snprintf(buf, sizeof buf, "peak %.0f MiB > --memory-gb %.3g", m.peak_mb, o_.memory_gb),
          tr.why = buf;
    else if (budget_s_ > 0 && m.step_s > budget_s_)
      std::snprintf(buf, sizeof buf, "step %.3g s > --max-step-s %.3g", m.step_s, budget_s_), tr.why = buf;
    else
      tr.fits = true;
    plan.trials.push_back(tr);
    return tr;
  }

  const PlanOptions& o_;
  std::string amp_;
  double budget_s_;
};

/// nnU-Net's normalization scheme of a channel name (map_channel_name_to_normalization).
std::string normalization_scheme(const std::string& channel) {
  std::string c = channel;
  std::transform(c.begin(), c.end(), c.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (c == "ct") return "CTNormalization";
  if (c == "nonorm") return "NoNormalization";
  if (c == "rescale_to_0_1") return "RescaleTo01Normalization";
  if (c == "rgb_to_0_1") return "RGBTo01Normalization";
  return "ZScoreNormalization";
}

void set_normalization(ConfigurationPlan& plan, const pipeline::DatasetFingerprint& fp) {
  const bool crop_matters = fp.median_relative_size_after_cropping < 0.75;
  for (const auto& ch : fp.channel_names) {
    plan.normalization_schemes.push_back(normalization_scheme(ch));
    plan.use_mask_for_norm.push_back(crop_matters &&
                                     plan.normalization_schemes.back() == "ZScoreNormalization");
  }
}

/// get_plans_for_configuration: the candidate chosen by `judge`, its batch size with nnU-Net's caps.
Result<ConfigurationPlan> plan_configuration(const ConfigInput& in, Judge& judge, const PlanOptions& o) {
  ConfigurationPlan plan;
  plan.kind = in.kind;
  plan.spacing = in.spacing;
  plan.median_shape = in.median_shape;
  const auto seq = shrink_sequence(in.spacing, in.median_shape, o.constants.featuremap_min_edge);
  SEGFLOW_ASSIGN_OR_RETURN(const std::size_t pick, judge.choose(seq, in, plan));
  plan.topology = seq[pick];
  plan.features_per_stage = features_per_stage(plan.topology.n_stages(), o.constants.base_num_features,
                                               max_features(in, o.constants));
  double patch_voxels = 1;
  for (auto v : plan.topology.patch_size) patch_voxels *= static_cast<double>(v);
  const auto cap =
      static_cast<std::int64_t>(py_round(in.approx_voxels * o.constants.max_dataset_covered / patch_voxels));
  SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t b, judge.batch(plan.topology, in, cap, plan));
  plan.batch_size = std::max(std::min(b, cap), o.constants.min_batch_size);
  if (pick > 0)
    plan.notes.push_back("patch " + join_ints(plan.topology.patch_size) + ": candidate " +
                         std::to_string(pick + 1) + " of nnU-Net's shrinking sequence from " +
                         join_ints(seq.front().patch_size) + " (the largest that fits)");
  if (plan.batch_size == cap && b > cap)
    plan.notes.push_back("batch " + std::to_string(plan.batch_size) +
                         ": capped so one batch covers at most " +
                         fmt_percent(o.constants.max_dataset_covered) + " of the dataset's voxels");
  return plan;
}

template <class T>
std::vector<T> permuted(const std::vector<T>& v, const std::vector<int>& order) {
  std::vector<T> out;
  for (int i : order) out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

double product(const std::vector<double>& v) {
  double p = 1;
  for (double x : v) p *= x;
  return p;
}

/// The dataset's figures every configuration starts from (nnU-Net's plan_experiment).
struct DatasetFigures {
  std::vector<double> fullres_spacing;      ///< array order
  std::vector<int> tf, tb;                  ///< transpose_forward / backward
  std::vector<double> median_shape;         ///< after resampling to fullres_spacing, array order
  std::vector<double> spacing_t, median_t;  ///< the two above transposed
  double approx_voxels = 0;
};

DatasetFigures dataset_figures(const pipeline::DatasetFingerprint& fp, const NnunetConstants& k) {
  std::vector<std::vector<double>> spacings, shapes;
  for (const auto& c : fp.cases) {
    spacings.push_back({c.spacing[2], c.spacing[1], c.spacing[0]});
    shapes.push_back({static_cast<double>(c.shape_after_crop[2]), static_cast<double>(c.shape_after_crop[1]),
                      static_cast<double>(c.shape_after_crop[0])});
  }
  DatasetFigures d;
  d.fullres_spacing = fullres_target_spacing(spacings, shapes, k.anisotropy_threshold);
  d.tf = transpose_forward(d.fullres_spacing);
  d.tb = transpose_backward(d.tf);
  std::vector<std::vector<double>> new_shapes;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    new_shapes.push_back(compute_new_shape(shapes[i], spacings[i], d.fullres_spacing));
  for (std::size_t a = 0; a < 3; ++a) {
    std::vector<double> col;
    for (const auto& s : new_shapes) col.push_back(s[a]);
    d.median_shape.push_back(np_percentile(col, 50));
  }
  d.spacing_t = permuted(d.fullres_spacing, d.tf);
  d.median_t = permuted(d.median_shape, d.tf);
  d.approx_voxels = product(d.median_t) * static_cast<double>(fp.cases.size());
  return d;
}

/// nnU-Net's 3d_lowres search: the spacing grows by 3% (the coarse axes first while any is
/// more than twice as fine as the coarsest) until the patch covers a quarter of the median
/// image; dropped when the image shrinks less than twofold. Judged by nnU-Net's estimate.
std::optional<ConfigInput> lowres_input(const ConfigInput& full_in, const ConfigurationPlan& full,
                                        Judge& nnunet, const PlanOptions& o, std::size_t cases,
                                        std::vector<std::string>& notes) {
  std::vector<double> low = full.spacing;
  double median_vox = product(full_in.median_shape);
  std::vector<double> patch(full.topology.patch_size.begin(), full.topology.patch_size.end());
  double patch_vox = product(patch);
  std::optional<ConfigInput> in;
  while (patch_vox / median_vox < o.constants.lowres_creation_threshold) {
    const double mx = *std::max_element(low.begin(), low.end());
    const bool coarse_first = std::any_of(low.begin(), low.end(), [&](double s) { return mx / s > 2; });
    for (double& s : low)
      if (!coarse_first || mx / s > 2) s *= o.constants.lowres_spacing_increase;
    ConfigInput next = full_in;
    next.kind = ConfigurationKind::lowres_3d;
    next.spacing = low;
    next.median_shape.clear();
    median_vox = 1;
    for (std::size_t a = 0; a < low.size(); ++a) {
      const double m = full.spacing[a] / low[a] * full_in.median_shape[a];
      median_vox *= m;
      next.median_shape.push_back(py_round(m));
    }
    next.approx_voxels = median_vox * static_cast<double>(cases);
    auto plan = plan_configuration(next, nnunet, o);
    if (!plan.is_ok()) return std::nullopt;
    patch_vox = 1;
    for (auto v : plan->topology.patch_size) patch_vox *= static_cast<double>(v);
    in = next;
  }
  if (!in) {
    notes.push_back("no 3d_lowres: the 3d_fullres patch covers at least 25% of the median image");
  } else if (product(full_in.median_shape) / median_vox < 2) {
    notes.push_back("no 3d_lowres: its images would be less than half the size of 3d_fullres's");
    in.reset();
  }
  return in;
}

/// Plans `in` with `judge`; with the measured model also with nnU-Net's estimate, recording
/// where the two differ.
Result<ConfigurationPlan> plan_with(const ConfigInput& in, Judge& judge, NnunetJudge& nnunet,
                                    const PlanOptions& o) {
  SEGFLOW_ASSIGN_OR_RETURN(ConfigurationPlan plan, plan_configuration(in, judge, o));
  plan.memory_model = o.memory_model;
  if (o.memory_model != MemoryModel::measured) return plan;
  SEGFLOW_ASSIGN_OR_RETURN(ConfigurationPlan ref, plan_configuration(in, nnunet, o));
  plan.nnunet_patch_size = ref.topology.patch_size;
  plan.nnunet_batch_size = ref.batch_size;
  plan.vram_estimate = ref.vram_estimate;
  plan.vram_reference = ref.vram_reference;
  if (ref.topology.patch_size != plan.topology.patch_size || ref.batch_size != plan.batch_size) {
    std::string why = "measured trials chose patch " + join_ints(plan.topology.patch_size) + " batch " +
                      std::to_string(plan.batch_size) + " where nnU-Net's estimate gives patch " +
                      join_ints(ref.topology.patch_size) + " batch " + std::to_string(ref.batch_size);
    for (const auto& t : plan.trials)
      if (!t.fits && t.patch_size == ref.topology.patch_size) why += " (its trial: " + t.why + ")";
    plan.notes.push_back(why);
  }
  return plan;
}

}  // namespace

Status set_preset(PlanOptions& o, const std::string& preset, bool keep_memory_gb) {
  const NnunetConstants* k = preset_constants(preset);
  if (!k) return invalid_argument("--preset: " + preset_error(preset));
  o.preset = preset;
  o.constants = *k;
  if (!keep_memory_gb) o.memory_gb = preset_memory_gb(preset);
  return Status::ok();
}

Result<PlanResult> plan_from_fingerprint(pipeline::DatasetFingerprint fp, const PlanOptions& o) {
  if (!(o.memory_gb > 0))
    return invalid_argument("--memory-gb: expected a number > 0, got " + std::to_string(o.memory_gb));
  if (o.trial_steps < 1)
    return invalid_argument("trial_steps: expected >= 1, got " + std::to_string(o.trial_steps));
  if (o.configurations.empty())
    return invalid_argument("--configurations: expected at least one configuration");
  if (fp.cases.empty()) return invalid_argument(fp.root.string() + ": no case to plan from");
  PlanResult r;
  r.device = o.device;
  r.preset = o.preset;
  r.constants = o.constants;
  SEGFLOW_ASSIGN_OR_RETURN(r.amp, resolve_trial_amp(o.amp, o.device));
  const fs::path root = fp.root.lexically_normal();
  r.dataset_name = !o.name.empty()
                       ? o.name
                       : (root.has_filename() ? root.filename() : root.parent_path().filename()).string();
  const DatasetFigures d = dataset_figures(fp, o.constants);
  r.fullres_spacing = d.fullres_spacing;
  r.transpose_forward = d.tf;
  r.transpose_backward = d.tb;
  const bool cpu = o.device.rfind("cuda", 0) != 0;
  NnunetJudge nnunet(o);
  MeasuredJudge measured(o, r.amp, o.max_step_s > 0 ? o.max_step_s : (cpu ? 2.0 : 0.0));
  Judge& judge = o.memory_model == MemoryModel::nnunet ? static_cast<Judge&>(nnunet) : measured;
  auto wanted = [&](ConfigurationKind k) {
    return std::find(o.configurations.begin(), o.configurations.end(), k) != o.configurations.end();
  };
  ConfigInput base;
  base.in_channels = static_cast<std::int64_t>(fp.channel_names.size());
  base.num_classes = fp.num_classes;
  base.transpose = d.tf;
  base.approx_voxels = d.approx_voxels;
  std::vector<ConfigurationPlan> planned;
  if ((wanted(ConfigurationKind::fullres_3d) || wanted(ConfigurationKind::lowres_3d)) && d.median_t[0] != 1) {
    ConfigInput in = base;
    in.spacing = d.spacing_t;
    in.median_shape = d.median_t;
    SEGFLOW_ASSIGN_OR_RETURN(ConfigurationPlan full, plan_with(in, judge, nnunet, o));
    std::optional<ConfigurationPlan> low;
    if (wanted(ConfigurationKind::lowres_3d)) {
      if (auto low_in = lowres_input(in, full, nnunet, o, fp.cases.size(), r.notes)) {
        SEGFLOW_ASSIGN_OR_RETURN(low, plan_with(*low_in, judge, nnunet, o));
        if (o.memory_model == MemoryModel::measured)
          low->notes.push_back(
              "spacing: nnU-Net's 3d_lowres search, judged by its estimate (trials only at the end)");
      }
    }
    full.batch_dice = low.has_value();
    if (wanted(ConfigurationKind::fullres_3d)) planned.push_back(std::move(full));
    if (low) planned.push_back(std::move(*low));
  } else if (d.median_t[0] == 1) {
    r.notes.push_back("no 3D configuration: the median image has one slice");
  }
  if (wanted(ConfigurationKind::two_d)) {
    ConfigInput in = base;
    in.kind = ConfigurationKind::two_d;
    in.spacing = {d.spacing_t[1], d.spacing_t[2]};
    in.median_shape = {d.median_t[1], d.median_t[2]};
    SEGFLOW_ASSIGN_OR_RETURN(ConfigurationPlan two, plan_with(in, judge, nnunet, o));
    two.batch_dice = true;
    planned.push_back(std::move(two));
  }
  for (auto k : o.configurations)
    for (auto& c : planned)
      if (c.kind == k) {
        set_normalization(c, fp);
        r.configurations.push_back(c);
      }
  r.fingerprint = std::move(fp);
  return r;
}

Result<PlanResult> plan_dataset(const fs::path& dataset, const PlanOptions& options) {
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::DatasetFingerprint fp,
                           pipeline::compute_fingerprint(dataset, options.fingerprint));
  return plan_from_fingerprint(std::move(fp), options);
}

}  // namespace segflow::models::planning
