// A plan as files: plans.json in nnU-Net v2's field names and axis order, and one runnable
// segflow job YAML per configuration, each choice commented with the figure behind it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "models/nets/res_enc_unet.hpp"
#include "models/planning/detail/axes.hpp"
#include "models/planning/plan.hpp"

namespace segflow::models::planning {

namespace {

constexpr double kPi = 3.14159265358979323846;

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

template <class T>
std::string fmt_list(const std::vector<T>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    if constexpr (std::is_floating_point_v<T>)
      s += fmt_num(v[i]);
    else
      s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string fmt_nested(const std::vector<std::vector<std::int64_t>>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt_list(v[i]);
  return s + "]";
}

/// A job name from a dataset name: [A-Za-z0-9._-] kept, the rest '-'.
std::string job_name(const std::string& dataset, ConfigurationKind k) {
  std::string s = dataset.empty() ? std::string("dataset") : dataset;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '-';
  return s + "-" + to_string(k);
}

/// Spacing of configuration `c` in segflow's (x, y, z) order; 2D configurations keep the
/// 3D target's z (segflow resamples volumes, then crops one-slice patches).
std::vector<double> xyz_spacing(const PlanResult& p, const ConfigurationPlan& c) {
  if (c.spacing.size() == 3) return detail::to_xyz(c.spacing, p.transpose_forward);
  const auto& f = p.fullres_spacing;  // array order
  return {f[2], f[1], f[0]};
}

/// Patch in (x, y, z); a 2D patch gets z = 1.
std::vector<std::int64_t> xyz_patch(const PlanResult& p, const ConfigurationPlan& c) {
  auto v = detail::to_xyz(c.topology.patch_size, p.transpose_forward);
  if (v.size() == 2) v.push_back(1);
  return v;
}

std::string median_spacing_text(const PlanResult& p) {
  std::vector<std::vector<double>> cols(3);
  for (const auto& c : p.fingerprint.cases)
    for (int a = 0; a < 3; ++a) cols[a].push_back(c.spacing[a]);
  std::vector<double> m;
  for (auto& col : cols) m.push_back(np_percentile(col, 50));
  return fmt_list(m);
}

// ---- YAML ----

/// nnU-Net's 5-fold cross-validation, fold 0 (fewer folds with fewer than 5 cases; none
/// with one).
std::string data_split_yaml(std::size_t cases) {
  if (cases < 2) return "  val_cases: 0       # one case: nothing to validate on\n";
  const std::size_t folds = std::min<std::size_t>(5, cases);
  return "  folds: " + std::to_string(folds) + "           # nnU-Net's " + std::to_string(folds) +
         "-fold cross-validation\n  fold: 0            # segflow train --fold K (or all)\n";
}

/// Training cases of fold 0 (cross_validation_folds: part 0 is the largest).
std::size_t train_cases(std::size_t cases) {
  if (cases < 2) return cases;
  const std::size_t folds = std::min<std::size_t>(5, cases);
  return cases - (cases + folds - 1) / folds;
}

void yaml_header(std::ostream& y, const PlanResult& p, const ConfigurationPlan& c) {
  const auto& fp = p.fingerprint;
  y << "# segflow plan: configuration " << to_string(c.kind) << " of " << p.dataset_name
    << ", by nnU-Net v2's\n"
    << "# ExperimentPlanner rules (docs/how-to/plan.md); memory model " << to_string(c.memory_model) << " on "
    << p.device << ".\n"
    << "# Fingerprint (fingerprint.json): " << fp.cases.size() << " cases planned, " << fp.excluded.size()
    << " excluded; median spacing (x, y, z) " << median_spacing_text(p) << " mm; median size after\n"
    << "# cropping to the non-zero region " << fmt_num(fp.median_relative_size_after_cropping * 100)
    << "% of the image.\n"
    << "# Override any key with --set (segflow train " << yaml_file_name(c.kind)
    << " --set train.epochs=50).\n";
  for (const auto& n : c.notes) y << "# note: " << n << "\n";
  y << "name: " << job_name(p.dataset_name, c.kind) << "\nseed: 0\n";
  std::string labels;
  for (std::size_t i = 0; i < fp.label_names.size() && i < 6; ++i)
    labels += (i ? ", " : "") + fp.label_names[i];
  if (fp.label_names.size() > 6) labels += ", ...";
  y << "data:\n  root: \"" << fp.root.string() << "\"\n"
    << "  num_classes: " << fp.num_classes << "      # label values 0.." << fp.num_classes - 1
    << (labels.empty() ? std::string() : " (" + labels + ")") << "\n"
    << data_split_yaml(fp.cases.size());
}

/// The normalisation stage(s) of the channels (nnU-Net's schemes by channel name).
void yaml_normalization(std::ostream& y, const PlanResult& p, const ConfigurationPlan& c) {
  const auto& fp = p.fingerprint;
  const auto& s = c.normalization_schemes;
  const bool same = std::all_of(s.begin(), s.end(), [&](const std::string& x) { return x == s.front(); });
  const std::string scheme = same ? s.front() : "ZScoreNormalization";
  if (!same)
    y << "  # channels with different nnU-Net schemes; segflow's stages apply to every channel: z-score for "
         "all\n";
  if (scheme == "CTNormalization") {
    std::vector<double> lo, hi, mean, sd;
    for (const auto& st : fp.foreground_intensity) {
      lo.push_back(st.percentile_00_5);
      hi.push_back(st.percentile_99_5);
      mean.push_back(st.mean);
      sd.push_back(st.std);
    }
    y << "  # channel \"" << fp.channel_names.front()
      << "\": nnU-Net's CTNormalization with the pooled foreground "
      << "(label > 0) intensities\n  # of " << fp.cases.size() << " cases ("
      << fp.foreground_intensity.front().voxels
      << " voxels): clip to percentiles 0.5 / 99.5, z-score with their mean and std\n"
      << "  - name: normalize_ct\n    options: {lower: " << fmt_list(lo) << ", upper: " << fmt_list(hi)
      << ", mean: " << fmt_list(mean) << ", std: " << fmt_list(sd) << "}\n";
  } else if (scheme == "ZScoreNormalization") {
    const bool mask =
        std::any_of(c.use_mask_for_norm.begin(), c.use_mask_for_norm.end(), [](bool b) { return b; });
    y << "  # nnU-Net's ZScoreNormalization per image and channel; "
      << (mask ? "over the non-zero region: the median case keeps "
               : "over every voxel: the median case keeps ")
      << fmt_num(fp.median_relative_size_after_cropping * 100) << "% after cropping (threshold 75%)\n"
      << "  - name: zscore\n    options: {nonzero: " << (mask ? "true" : "false") << "}\n";
  } else if (scheme == "RescaleTo01Normalization") {
    y << "  # nnU-Net's RescaleTo01Normalization: each image's min..max to 0..1\n"
      << "  - name: clip_percentiles\n    options: {lower: 0, upper: 100, rescale: true, b_min: 0, b_max: "
         "1}\n";
  } else if (scheme == "RGBTo01Normalization") {
    y << "  # nnU-Net's RGBTo01Normalization: 0..255 to 0..1\n"
      << "  - name: scale_intensity_range\n    options: {a_min: 0, a_max: 255, b_min: 0, b_max: 1, clip: "
         "false}\n";
  } else {
    y << "  # nnU-Net's NoNormalization: intensities as read\n";
  }
}

void yaml_preprocessing(std::ostream& y, const PlanResult& p, const ConfigurationPlan& c) {
  const auto& fp = p.fingerprint;
  y << "stages:\n  - name: load\n";
  const bool nonneg = std::all_of(fp.foreground_intensity.begin(), fp.foreground_intensity.end(),
                                  [](const pipeline::IntensityStats& s) { return !(s.min < 0); });
  if (fp.median_relative_size_after_cropping < 1.0 && nonneg)
    y << "  # crop to the non-zero region (nnU-Net's crop_to_nonzero): the median case keeps "
      << fmt_num(fp.median_relative_size_after_cropping * 100) << "%\n"
      << "  - name: crop_foreground\n    options: {source_key: image, threshold: 0}\n";
  const auto sp = xyz_spacing(p, c);
  y << "  # target spacing (x, y, z): nnU-Net's fullres rule on the " << fp.cases.size()
    << " cases' spacings (median " << median_spacing_text(p)
    << ";\n  # an axis over 3x coarser with few voxels "
    << "takes its 10th percentile)"
    << (c.kind == ConfigurationKind::lowres_3d ? ", then coarsened for 3d_lowres" : "")
    << (c.kind == ConfigurationKind::two_d ? "; 2D crops in-plane" : "") << "\n"
    << "  - name: resample\n    options: {spacing: " << fmt_list(sp) << "}\n";
  yaml_normalization(y, p, c);
}

/// Whether nnU-Net's dummy-2D augmentation applies (3D patch more than 3x longer in-plane
/// than along its coarse axis); then rotations are in-plane only and low-resolution
/// simulation leaves the coarse axis alone.
bool dummy_2d(const ConfigurationPlan& c) {
  if (c.topology.patch_size.size() != 3) return false;
  const auto& ps = c.topology.patch_size;
  return static_cast<double>(*std::max_element(ps.begin(), ps.end())) / static_cast<double>(ps[0]) > 3.0;
}

void yaml_augmentation(std::ostream& y, const PlanResult& p, const ConfigurationPlan& c) {
  const auto patch = xyz_patch(p, c);
  y << "  - name: fg_bg_indices\n    options: {per_class: true}\n"
    << "  # patch (x, y, z) " << fmt_list(patch) << ": nnU-Net's patch for a median image of "
    << fmt_list(detail::to_xyz(c.median_shape, p.transpose_forward))
    << " voxels; a third of the crops\n  # centred on a class present in the case (nnU-Net's "
       "oversample_foreground_percent 0.33)\n"
    << "  - name: rand_crop_pos_neg\n    options: {spatial_size: " << fmt_list(patch)
    << ", pos: 1, neg: 2, num_samples: 1, class_balanced: true}\n";
  const bool two_d = c.kind == ConfigurationKind::two_d, flat = dummy_2d(c);
  const int coarse = 2 - detail::array_axes(3, p.transpose_forward)[0];  // segflow axis of nnU-Net's axis 0
  std::vector<double> rot(3, 0.0);
  double angle = 30.0;
  if (two_d || flat) {
    const auto& ps = c.topology.patch_size;
    angle = two_d && static_cast<double>(*std::max_element(ps.begin(), ps.end())) /
                             static_cast<double>(*std::min_element(ps.begin(), ps.end())) >
                         1.5
                ? 15.0
                : 180.0;
    rot[two_d ? 2 : static_cast<std::size_t>(coarse)] = angle / 180.0 * kPi;
  } else {
    rot.assign(3, angle / 180.0 * kPi);
  }
  y << "  # nnU-Net's SpatialTransform: rotation +-" << fmt_num(angle) << " deg"
    << (two_d || flat ? " in-plane (" + std::string(flat ? "anisotropic patch: dummy 2D" : "2D") + ")" : "")
    << ", scaling 0.7..1.4 (here 0.7..1.3), p 0.2\n"
    << "  - name: rand_affine\n    options: {prob: 0.2, rotate_range: " << fmt_list(rot)
    << ", scale_range: [0.3, 0.3, 0.3]}\n"
    << "  # nnU-Net's intensity augmentations (nnUNetTrainer.get_training_transforms)\n"
    << "  - name: rand_gaussian_noise\n    options: {prob: 0.1, std: 0.1}\n"
    << "  - name: rand_gaussian_blur\n    options: {prob: 0.2, sigma: [0.5, 1.0], prob_per_channel: 0.5}\n"
    << "  - name: rand_brightness\n    options: {prob: 0.15, multiplier: [0.75, 1.25]}\n"
    << "  - name: rand_contrast\n    options: {prob: 0.15, factor: [0.75, 1.25]}\n"
    << "  - name: rand_simulate_low_resolution\n    options: {prob: 0.25, zoom: [0.5, 1.0], "
       "prob_per_channel: 0.5"
    << (flat ? ", ignore_axes: [" + std::to_string(coarse) + "]" : "") << "}\n"
    << "  - name: rand_gamma\n    options: {prob: 0.1, gamma: [0.7, 1.5], sampling: halves, invert_prob: "
       "1.0, "
       "retain_stats: true, channel_wise: true}\n"
    << "  - name: rand_gamma\n    options: {prob: 0.3, gamma: [0.7, 1.5], sampling: halves, invert_prob: "
       "0.0, "
       "retain_stats: true, channel_wise: true}\n"
    << "  - name: rand_flip\n    options: {prob: 0.5, spatial_axis: " << (two_d ? "[0, 1]" : "[0, 1, 2]")
    << "}\n";
}

void yaml_model(std::ostream& y, const PlanResult& p, const ConfigurationPlan& c) {
  const auto& fp = p.fingerprint;
  const auto m = detail::unet_json(
      c.topology, c.features_per_stage.front(), c.topology.patch_size.size() == 2 ? 512 : 320,
      static_cast<std::int64_t>(fp.channel_names.size()), fp.num_classes, p.transpose_forward, p.constants);
  std::vector<std::vector<std::int64_t>> strides = m["strides"], kernels = m["kernel_sizes"];
  const bool res_enc = p.constants.residual_encoder;
  y << (res_enc
            ? "# nnU-Net's ResidualEncoderUNet (the " + p.preset + " preset, nnU-Net's " +
                  preset_nnunet_names(p.preset).first +
                  "): residual blocks per\n# encoder stage 1, 3, 4, 6, 6, ..., one conv per decoder stage; "
            : std::string("# nnU-Net's PlainConvUNet; "))
    << "topology from get_pool_and_conv_props on the target spacing and the patch:\n"
    << "# an axis pools while its spacing is within 2x of the finest and its feature map stays >= 8; "
       "kernels\n"
    << "# are 1 along an axis until its spacing comes within 2x of the finest.\n"
    << "model:\n  name: " << m["name"].get<std::string>() << "\n  spatial_dims: " << m["spatial_dims"]
    << "\n  in_channels: " << m["in_channels"] << "\n  out_channels: " << m["out_channels"]
    << "\n  n_stages: " << m["n_stages"] << "\n  base_features: " << m["base_features"]
    << "\n  max_features: " << m["max_features"] << "\n"
    << (res_enc
            ? "  n_blocks_per_stage: " + m["n_blocks_per_stage"].dump() + "\n  n_conv_per_stage_decoder: 1\n"
            : std::string("  n_conv_per_stage: 2\n  n_conv_per_stage_decoder: 2\n"))
    << "  strides: " << fmt_nested(strides) << "      # per stage, (x, y"
    << (strides.front().size() == 3 ? ", z" : "") << ")\n"
    << "  kernel_sizes: " << fmt_nested(kernels) << "\n  deep_supervision: true\n";
}

void yaml_training(std::ostream& y, const PlanResult& p, const ConfigurationPlan& c) {
  const auto patch = xyz_patch(p, c);
  std::vector<std::int64_t> roi(patch.begin(),
                                patch.begin() + static_cast<std::ptrdiff_t>(c.topology.patch_size.size()));
  std::string batch_why;
  if (c.memory_model == MemoryModel::nnunet) {
    batch_why = "nnU-Net's estimate: " + fmt_num(c.vram_estimate) + " feature-map voxels vs " +
                fmt_num(c.vram_reference) + " for the memory target";
  } else {
    batch_why = "measured trial steps (plans.json segflow.trials)";
  }
  const auto n_train = static_cast<std::int64_t>(train_cases(p.fingerprint.cases.size()));
  const std::int64_t steps = std::max<std::int64_t>(1, (n_train + c.batch_size - 1) / c.batch_size);
  const std::int64_t epochs = (250000 + steps - 1) / steps;
  y << "loss: {name: dice_ce, to_onehot_y: true, softmax: true, include_background: false, batch: "
    << (c.batch_dice ? "true" : "false") << "}   # nnU-Net's DC_and_CE_loss"
    << (c.batch_dice ? " with batch Dice" : "") << "\n"
    << "optimizer: {name: sgd, lr: 0.01, momentum: 0.99, nesterov: true, weight_decay: 0.00003}\n"
    << "schedule: {name: poly, poly_exponent: 0.9}\n"
    << "train:\n  epochs: " << epochs
    << "            # nnU-Net's 1000 x 250 = 250000 steps; an epoch here is one pass over\n"
    << "                          # the " << n_train << " training cases of fold 0: " << steps
    << " step(s) of the batch\n"
    << "  batch_size: " << c.batch_size << "           # " << batch_why << "; at most "
    << fmt_percent(p.constants.max_dataset_covered) << " of the dataset per batch\n"
    << "  amp: " << p.amp << "\n  device: " << p.device
    << "\n  val_interval: " << std::max<std::int64_t>(1, epochs / 20)
    << "        # 20 sliding-window validations over the run\n  checkpoint_interval: "
    << std::max<std::int64_t>(1, epochs / 100) << "\n"
    << "validation:\n  roi_size: " << fmt_list(roi) << "\n  overlap: 0.5\n  mode: gaussian\n";
}

// ---- plans.json ----

nlohmann::json configuration_json(const PlanResult& p, const ConfigurationPlan& c) {
  const std::size_t dims = c.topology.patch_size.size();
  const std::string d = dims == 2 ? "2d" : "3d";
  nlohmann::json arch = {
      {"n_stages", c.topology.n_stages()},
      {"features_per_stage", c.features_per_stage},
      {"conv_op", "torch.nn.modules.conv.Conv" + d},
      {"kernel_sizes", c.topology.conv_kernel_sizes},
      {"strides", c.topology.pool_op_kernel_sizes},
      {"n_conv_per_stage", std::vector<int>(static_cast<std::size_t>(c.topology.n_stages()), 2)},
      {"n_conv_per_stage_decoder", std::vector<int>(static_cast<std::size_t>(c.topology.n_stages() - 1), 2)},
      {"conv_bias", true},
      {"norm_op", "torch.nn.modules.instancenorm.InstanceNorm" + d},
      {"norm_op_kwargs", {{"eps", 1e-5}, {"affine", true}}},
      {"dropout_op", nullptr},
      {"dropout_op_kwargs", nullptr},
      {"nonlin", "torch.nn.LeakyReLU"},
      {"nonlin_kwargs", {{"inplace", true}}}};
  std::string network = "dynamic_network_architectures.architectures.unet.PlainConvUNet";
  if (p.constants.residual_encoder) {  // ResEncUNetPlanner's arguments
    network = "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet";
    arch.erase("n_conv_per_stage");
    arch["n_blocks_per_stage"] = nnunet_resenc_blocks(c.topology.n_stages());
    arch["n_conv_per_stage_decoder"] =
        std::vector<int>(static_cast<std::size_t>(c.topology.n_stages() - 1), 1);
  }
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : c.trials)
    trials.push_back({{"patch_size", t.patch_size},
                      {"batch_size", t.batch_size},
                      {"peak_mb", t.peak_mb},
                      {"step_s", t.step_s},
                      {"fits", t.fits},
                      {"why", t.why}});
  nlohmann::json j = {{"data_identifier", std::string("nnUNetPlans_") + to_string(c.kind)},
                      {"preprocessor_name", "DefaultPreprocessor"},
                      {"batch_size", c.batch_size},
                      {"patch_size", c.topology.patch_size},
                      {"median_image_size_in_voxels", c.median_shape},
                      {"spacing", c.spacing},
                      {"normalization_schemes", c.normalization_schemes},
                      {"use_mask_for_norm", c.use_mask_for_norm},
                      {"pool_op_kernel_sizes", c.topology.pool_op_kernel_sizes},
                      {"conv_kernel_sizes", c.topology.conv_kernel_sizes},
                      {"architecture",
                       {{"network_class_name", network},
                        {"arch_kwargs", arch},
                        {"_kw_requires_import", {"conv_op", "norm_op", "dropout_op", "nonlin"}}}},
                      {"batch_dice", c.batch_dice}};
  j["segflow"] = {{"memory_model", to_string(c.memory_model)},
                  {"vram_estimate", c.vram_estimate},
                  {"vram_reference", c.vram_reference},
                  {"trials", trials},
                  {"notes", c.notes},
                  {"yaml", yaml_file_name(c.kind)},
                  {"patch_size_xyz", xyz_patch(p, c)},
                  {"spacing_xyz", xyz_spacing(p, c)}};
  if (c.memory_model == MemoryModel::measured) {
    j["segflow"]["nnunet_patch_size"] = c.nnunet_patch_size;
    j["segflow"]["nnunet_batch_size"] = c.nnunet_batch_size;
  }
  return j;
}

}  // namespace

std::string PlanResult::job_yaml(const ConfigurationPlan& c) const {
  std::ostringstream y;
  yaml_header(y, *this, c);
  yaml_preprocessing(y, *this, c);
  yaml_augmentation(y, *this, c);
  yaml_model(y, *this, c);
  yaml_training(y, *this, c);
  return y.str();
}

nlohmann::json PlanResult::plans_json() const {
  const auto& fp = fingerprint;
  std::vector<std::vector<double>> sp(3), sh(3);
  for (const auto& c : fp.cases)
    for (int a = 0; a < 3; ++a) {
      sp[a].push_back(c.spacing[2 - a]);
      sh[a].push_back(static_cast<double>(c.shape_after_crop[2 - a]));
    }
  nlohmann::json med_sp = nlohmann::json::array(), med_sh = nlohmann::json::array();
  for (int a : transpose_forward) {
    med_sp.push_back(np_percentile(sp[a], 50));
    med_sh.push_back(static_cast<std::int64_t>(py_round(np_percentile(sh[a], 50))));
  }
  nlohmann::json configs = nlohmann::json::object();
  for (const auto& c : configurations) configs[to_string(c.kind)] = configuration_json(*this, c);
  if (find(ConfigurationKind::lowres_3d) && find(ConfigurationKind::fullres_3d)) {
    configs["3d_lowres"]["next_stage"] = "3d_cascade_fullres";
    configs["3d_cascade_fullres"] = {{"inherits_from", "3d_fullres"}, {"previous_stage", "3d_lowres"}};
  }
  const nlohmann::json fpj = fp.to_json();
  return {{"dataset_name", dataset_name},
          {"plans_name", preset_nnunet_names(preset).second},
          {"original_median_spacing_after_transp", med_sp},
          {"original_median_shape_after_transp", med_sh},
          {"image_reader_writer", "segflow"},
          {"transpose_forward", transpose_forward},
          {"transpose_backward", transpose_backward},
          {"configurations", configs},
          {"experiment_planner_used", "segflow plan --preset " + preset + " (nnU-Net v2 " +
                                          preset_nnunet_names(preset).first + " rules)"},
          {"label_manager", "LabelManager"},
          {"foreground_intensity_properties_per_channel", fpj["foreground_intensity_properties_per_channel"]},
          {"segflow",
           {{"device", device},
            {"amp", amp},
            {"preset", preset},
            {"fullres_spacing_xyz", {fullres_spacing[2], fullres_spacing[1], fullres_spacing[0]}},
            {"notes", notes},
            {"data_signature", fp.data_signature},
            {"cases", fp.cases.size()},
            {"excluded", fp.excluded.size()}}}};
}

}  // namespace segflow::models::planning
