#include "models/interop/nnunet_export.hpp"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "messages/file_util.hpp"
#include "models/interop/export.hpp"
#include "models/interop/torch_load.hpp"
#include "models/nets/plain_unet.hpp"
#include "models/nets/res_enc_unet.hpp"
#include "models/nets/unet.hpp"
#include "models/nets/weights.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::models {

namespace {

using nlohmann::json;

/// The inference preprocessing of a job in nnU-Net's terms.
struct NnunetPreprocessing {
  std::optional<std::array<double, 3>> spacing_xyz;
  std::string scheme = "NoNormalization";
  bool use_mask_for_norm = false;
  json intensity = json::object();     ///< one channel's foreground_intensity_properties
  std::vector<std::int64_t> flip_xyz;  ///< rand_flip's axes (0 = x)
  std::vector<std::int64_t> crop_xyz;  ///< rand_crop_pos_neg's spatial_size
  std::vector<std::string> notes;
};

std::string stage_at(const pipeline::PipelineSpec& spec, std::size_t i) {
  return (spec.file.empty() ? std::string() : spec.file + ": ") + spec.path + "[" + std::to_string(i) +
         "] (" + spec.stages[i].name + ")";
}

/// scale_intensity_range {a_min, a_max, b_min, b_max, clip} as nnU-Net's CTNormalization.
Result<json> ct_from_scale_range(const json& o, const std::string& where) {
  if (!o.value("clip", false))
    return invalid_argument(where +
                            ": clip false has no nnU-Net equivalent (CTNormalization always clips); "
                            "expected clip: true");
  const double a_min = o.value("a_min", 0.0), a_max = o.value("a_max", 1.0);
  const double b_min = o.value("b_min", 0.0), b_max = o.value("b_max", 1.0);
  if (!(b_max > b_min) || !(a_max > a_min))
    return invalid_argument(where +
                            ": expected a_max > a_min and b_max > b_min for nnU-Net's CTNormalization");
  const double s = (a_max - a_min) / (b_max - b_min);
  return json{
      {"percentile_00_5", a_min}, {"percentile_99_5", a_max}, {"mean", a_min - b_min * s}, {"std", s}};
}

/// normalize_ct's per-channel lists (one value = every channel) for channel 0.
json ct_from_normalize_ct(const json& o) {
  auto first = [&](const char* k) {
    const json& v = o.at(k);
    return v.is_array() ? v.at(0).get<double>() : v.get<double>();
  };
  return json{{"percentile_00_5", first("lower")},
              {"percentile_99_5", first("upper")},
              {"mean", first("mean")},
              {"std", first("std")}};
}

Status set_normalization(NnunetPreprocessing& p, bool& seen, const std::string& where, std::string scheme) {
  if (seen)
    return invalid_argument(where + ": a second normalisation stage; nnU-Net applies one per channel");
  seen = true;
  p.scheme = std::move(scheme);
  return Status::ok();
}

Result<NnunetPreprocessing> translate_stages(const pipeline::PipelineSpec& spec, std::int64_t channels) {
  NnunetPreprocessing p;
  bool normalised = false;
  for (std::size_t i = 0; i < spec.stages.size(); ++i) {
    const auto& [name, o] = spec.stages[i];
    const std::string where = stage_at(spec, i);
    if (name == "load" || name == "fg_bg_indices") continue;
    if (name == "rand_flip") {
      p.flip_xyz = o.value("spatial_axis", std::vector<std::int64_t>{0, 1, 2});
    } else if (name == "rand_crop_pos_neg") {
      p.crop_xyz = o.value("spatial_size", std::vector<std::int64_t>{});
    } else if (name.rfind("rand_", 0) == 0) {
      continue;  // augmentation: training only
    } else if (name == "resample") {
      if (o.value("grid", std::string("keep_extent")) != "keep_extent")
        return invalid_argument(
            where +
            ": grid exact_spacing has no nnU-Net equivalent (nnU-Net keeps the "
            "field of view, round(n * spacing / target) voxels); expected grid keep_extent");
      const auto s = o.at("spacing").get<std::vector<double>>();
      if (s.size() != 3) return invalid_argument(where + ": expected spacing [x, y, z]");
      p.spacing_xyz = std::array<double, 3>{s[0], s[1], s[2]};
      if (normalised)
        p.notes.push_back(
            "nnU-Net normalises before resampling, the job after: values differ where it resamples");
    } else if (name == "zscore") {
      SEGFLOW_RETURN_IF_ERROR(set_normalization(p, normalised, where, "ZScoreNormalization"));
      p.use_mask_for_norm = o.value("nonzero", false);
    } else if (name == "normalize_intensity") {
      if (o.value("nonzero", false) || !o.value("mask_key", std::string()).empty())
        return invalid_argument(where +
                                ": nonzero / mask_key differ from nnU-Net's masked z-score (use the zscore "
                                "stage); expected nonzero false");
      if (channels > 1 && !o.value("channel_wise", false))
        return invalid_argument(where +
                                ": statistics over all channels; nnU-Net's are per channel (expected "
                                "channel_wise: true)");
      SEGFLOW_RETURN_IF_ERROR(set_normalization(p, normalised, where, "ZScoreNormalization"));
    } else if (name == "normalize_ct" || name == "scale_intensity_range") {
      SEGFLOW_RETURN_IF_ERROR(set_normalization(p, normalised, where, "CTNormalization"));
      if (name == "normalize_ct") {
        p.intensity = ct_from_normalize_ct(o);
      } else {
        SEGFLOW_ASSIGN_OR_RETURN(p.intensity, ct_from_scale_range(o, where));
      }
    } else {
      return invalid_argument(where +
                              ": nnU-Net's preprocessing has no equivalent of this stage (it reads, crops "
                              "to the non-zero box, normalises and resamples only)");
    }
  }
  return p;
}

json resampling_kwargs(bool is_seg) {
  return {{"is_seg", is_seg}, {"order", 1}, {"order_z", 0}, {"force_separate_z", false}};
}

/// The network's arguments as plans.json's architecture (export_model's spec: its target,
/// PlainConvUNet or ResidualEncoderUNet, and arguments, with nnU-Net's import paths; input
/// channels, classes and deep supervision come from elsewhere).
json plans_architecture(const json& spec) {
  json a = spec["args"];
  const std::string d = a["conv_op"].get<std::string>().substr(4);  // "2d" | "3d"
  a["conv_op"] = "torch.nn.modules.conv.Conv" + d;
  a["norm_op"] = a["norm_op"].get<std::string>().rfind("Instance", 0) == 0
                     ? "torch.nn.modules.instancenorm.InstanceNorm" + d
                     : "torch.nn.modules.batchnorm.BatchNorm" + d;
  a["nonlin"] = "torch.nn.LeakyReLU";
  a["dropout_op"] = nullptr;
  a["dropout_op_kwargs"] = nullptr;
  for (const char* k : {"input_channels", "num_classes", "deep_supervision"}) a.erase(k);
  return {{"network_class_name", spec["target"]},
          {"arch_kwargs", a},
          {"_kw_requires_import", {"conv_op", "norm_op", "dropout_op", "nonlin"}}};
}

json dataset_json(const ConvUNetTopology& o, const std::vector<std::string>& class_names, bool ct) {
  json channels = json::object();
  for (std::int64_t c = 0; c < o.in_channels; ++c) channels[std::to_string(c)] = ct ? "CT" : "image";
  json labels = json::object();
  for (std::int64_t k = 0; k < o.num_classes; ++k) {
    std::string n = k == 0 ? "background" : "class_" + std::to_string(k);
    const auto ku = static_cast<std::size_t>(k);
    if (k > 0 && ku < class_names.size() && !class_names[ku].empty() && !labels.contains(class_names[ku]))
      n = class_names[ku];
    labels[n] = k;
  }
  return {{"channel_names", channels},
          {"labels", labels},
          {"numTraining", 0},
          {"file_ending", ".nii.gz"},
          {"description", "exported by segflow export --to nnunet"}};
}

c10::IValue checkpoint_dict(const ExportedModel& m, const std::string& configuration, std::int64_t fold,
                            const std::vector<std::int64_t>& mirror_axes) {
  c10::impl::GenericDict init(c10::StringType::get(), c10::AnyType::get());
  init.insert("configuration", configuration);
  init.insert("fold", fold);
  c10::impl::GenericDict ck(c10::StringType::get(), c10::AnyType::get());
  ck.insert("network_weights", c10::IValue(cpu_tensor_dict(m.state_dict)));
  ck.insert("init_args", c10::IValue(init));
  ck.insert("trainer_name", std::string("nnUNetTrainer"));
  if (mirror_axes.empty()) {
    ck.insert("inference_allowed_mirroring_axes", c10::IValue());
  } else {
    std::vector<c10::IValue> axes(mirror_axes.begin(), mirror_axes.end());
    ck.insert("inference_allowed_mirroring_axes", c10::ivalue::Tuple::create(std::move(axes)));
  }
  ck.insert("current_epoch", std::int64_t{0});
  return c10::IValue(ck);
}

/// What the configuration's name, sizes and mirroring axes are, in nnU-Net's array order.
struct NnunetGeometry {
  std::string configuration;         ///< "3d_fullres" | "2d"
  std::vector<std::int64_t> patch;   ///< (z,) y, x
  std::vector<double> spacing;       ///< (z,) y, x; the job's whole spacing is spacing_zyx
  std::vector<double> spacing_zyx;   ///< the job's resample target, z, y, x
  std::vector<std::int64_t> mirror;  ///< inference_allowed_mirroring_axes
};

/// The geometry of a `dims`-D plain_unet: a 3D one's patch and spacing are (z, y, x); a 2D
/// one (segflow runs it slice by slice along array axis 0, z, like nnU-Net's 2d
/// configuration) gets the (y, x) of the job's window and spacing.
Result<NnunetGeometry> nnunet_geometry(const JobConfig& cfg, const NnunetPreprocessing& pre, int dims) {
  const std::vector<std::int64_t>& roi =
      cfg.validation.roi_size.empty() ? pre.crop_xyz : cfg.validation.roi_size;
  // A 2D window may be written [x, y] or [x, y, z] (segflow's inference takes x, y).
  if (roi.size() != 3 && !(dims == 2 && roi.size() == 2))
    return invalid_argument(cfg.file + ": validation.roi_size: expected [x, y, z]" +
                            (dims == 2 ? std::string(" or [x, y]") : std::string()) +
                            " (nnU-Net's patch_size; no rand_crop_pos_neg size to fall back on)");
  NnunetGeometry g;
  g.configuration = dims == 2 ? "2d" : "3d_fullres";
  const std::vector<std::int64_t> patch_xyz(roi.begin(), roi.begin() + dims);
  const std::vector<double> spacing_xyz(pre.spacing_xyz->begin(), pre.spacing_xyz->end());
  g.patch.assign(patch_xyz.rbegin(), patch_xyz.rend());
  g.spacing_zyx.assign(spacing_xyz.rbegin(), spacing_xyz.rend());
  g.spacing.assign(g.spacing_zyx.end() - dims, g.spacing_zyx.end());
  // rand_flip's axis a (0 = x) is array axis dims - 1 - a; a 2D network has no z to mirror.
  for (std::int64_t a : pre.flip_xyz)
    if (a >= 0 && a < dims) g.mirror.push_back(dims - 1 - a);
  std::sort(g.mirror.begin(), g.mirror.end());
  g.mirror.erase(std::unique(g.mirror.begin(), g.mirror.end()), g.mirror.end());
  return g;
}

/// Where nnU-Net's inference differs from the job's, beyond what translate_stages found.
void add_notes(std::vector<std::string>& notes, const JobConfig& cfg, const NnunetGeometry& g) {
  if (g.configuration == "2d")
    notes.push_back(
        "2d: nnU-Net keeps each case's own z spacing and resamples y and x only; the job "
        "resamples z to " +
        json(g.spacing_zyx[0]).dump() + " mm too, so slices differ unless a case's z spacing is that");
  notes.push_back(
      "nnU-Net crops each case to the bounding box of its non-zero voxels before normalising "
      "and labels the outside 0; segflow does not crop");
  notes.push_back("tile_step_size " + std::to_string(1.0 - cfg.validation.overlap) +
                  " reproduces validation.overlap; nnU-Net's Gaussian (sigma 1/8 of the patch) and window "
                  "placement may differ from segflow's where windows overlap");
}

json configuration_json(const JobConfig& cfg, const ConvUNetTopology& o, const NnunetPreprocessing& pre,
                        const NnunetGeometry& g, const json& spec) {
  return {{"data_identifier", "segflow_" + g.configuration},
          {"preprocessor_name", "DefaultPreprocessor"},
          {"batch_size", cfg.train.batch_size},
          {"patch_size", g.patch},
          {"median_image_size_in_voxels", g.patch},
          {"spacing", g.spacing},
          {"normalization_schemes", std::vector<std::string>(o.in_channels, pre.scheme)},
          {"use_mask_for_norm", std::vector<bool>(o.in_channels, pre.use_mask_for_norm)},
          {"resampling_fn_data", "resample_data_or_seg_to_shape"},
          {"resampling_fn_data_kwargs", resampling_kwargs(false)},
          {"resampling_fn_seg", "resample_data_or_seg_to_shape"},
          {"resampling_fn_seg_kwargs", resampling_kwargs(true)},
          {"resampling_fn_probabilities", "resample_data_or_seg_to_shape"},
          {"resampling_fn_probabilities_kwargs", resampling_kwargs(false)},
          {"architecture", plans_architecture(spec)},
          {"batch_dice", true}};
}

}  // namespace

Result<NnunetResults> nnunet_results(const JobConfig& cfg, const std::vector<std::string>& class_names,
                                     const torch::nn::Module& module, const NnunetExportOptions& options) {
  // The networks nnU-Net builds: dynamic_network_architectures' PlainConvUNet and
  // ResidualEncoderUNet.
  const ConvUNetTopology* o = cfg.model.get_if<PlainConvUNetOptions>();
  if (o == nullptr) o = cfg.model.get_if<ResEncUNetOptions>();
  if (o == nullptr)
    return invalid_argument(
        cfg.file +
        ": model.name: expected plain_unet or res_enc_unet (nnU-Net builds dynamic_network_"
        "architectures' PlainConvUNet or ResidualEncoderUNet), got " +
        cfg.model.name() + "; export --to pytorch writes a unet as MONAI's UNet");
  SEGFLOW_ASSIGN_OR_RETURN(NnunetPreprocessing pre, translate_stages(cfg.stages, o->in_channels));
  if (!pre.spacing_xyz) pre.spacing_xyz = options.spacing;
  if (!pre.spacing_xyz)
    return invalid_argument(cfg.file +
                            ": stages: no resample stage, and nnU-Net resamples every case to its "
                            "configuration's spacing; expected a resample stage or --spacing X,Y,Z");
  SEGFLOW_ASSIGN_OR_RETURN(NnunetGeometry g, nnunet_geometry(cfg, pre, o->spatial_dims));
  SEGFLOW_ASSIGN_OR_RETURN(ExportedModel m, export_model(cfg.model, module));

  NnunetResults r;
  r.configuration = g.configuration;
  r.fold = options.fold;
  json intensity = json::object();
  for (std::int64_t c = 0; c < o->in_channels; ++c) intensity[std::to_string(c)] = pre.intensity;
  add_notes(pre.notes, cfg, g);
  // A 2d configuration's case "shape" has one slice; the median spacing keeps the job's z
  // (segflow import --from nnunet resamples z to it).
  json median_shape = g.patch;
  if (g.patch.size() == 2) median_shape.insert(median_shape.begin(), 1);
  r.plans = {{"dataset_name", "Dataset999_" + cfg.name},
             {"plans_name", "nnUNetPlans"},
             {"original_median_spacing_after_transp", g.spacing_zyx},
             {"original_median_shape_after_transp", median_shape},
             {"image_reader_writer", "SimpleITKIO"},
             {"transpose_forward", {0, 1, 2}},
             {"transpose_backward", {0, 1, 2}},
             {"configurations", {{r.configuration, configuration_json(cfg, *o, pre, g, m.spec)}}},
             {"experiment_planner_used", "segflow export --to nnunet"},
             {"label_manager", "LabelManager"},
             {"foreground_intensity_properties_per_channel", intensity},
             {"segflow",
              {{"job", cfg.name},
               {"checkpoint", options.checkpoint},
               {"tile_step_size", 1.0 - cfg.validation.overlap},
               {"blending", cfg.validation.mode},
               {"notes", pre.notes}}}};
  r.dataset = dataset_json(*o, class_names, pre.scheme == "CTNormalization");
  r.checkpoint = checkpoint_dict(m, r.configuration, r.fold, g.mirror);
  r.notes = pre.notes;
  return r;
}

Status write_nnunet_results(const NnunetResults& results, const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out, ec))
    return invalid_argument(out.string() + ": exists; expected a new results folder (nothing was written)");
  return write_folder_atomically(out, [&](const fs::path& tmp) -> Status {
    const fs::path fold = tmp / ("fold_" + std::to_string(results.fold));
    if (!fs::create_directories(fold, ec))
      return io_error(fold.string() + ": cannot create: " + ec.message());
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(tmp / "dataset.json", results.dataset.dump(2) + '\n'));
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(tmp / "plans.json", results.plans.dump(2) + '\n'));
    const std::vector<char> bytes = torch_save_bytes(results.checkpoint);
    return write_file_atomically(fold / "checkpoint_final.pth", std::string_view(bytes.data(), bytes.size()));
  });
}

}  // namespace segflow::models
