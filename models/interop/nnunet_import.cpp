// nnU-Net in: an nnU-Net v2 results folder's plans, dataset and fold checkpoint read back as
// a segflow job config, checkpoint and tensor archive (the inverse of nnunet_export.cpp).
#include "models/interop/nnunet_import.hpp"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "messages/file_util.hpp"
#include "models/interop/torch_load.hpp"
#include "models/nets/nnunet_names.hpp"
#include "models/nets/weights.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::models {

namespace {

using nlohmann::json;

Result<json> read_json_file(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec))
    return not_found(p.string() + ": missing; expected an nnU-Net v2 results folder's " +
                     p.filename().string());
  std::ifstream in(p);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt_data(p.string() + ": not JSON");
  return j;
}

/// A [z, y, x] list as segflow's YAML [x, y, z].
std::string yaml_xyz(const json& zyx_list) {
  json v = zyx_list;
  std::reverse(v.begin(), v.end());
  return v.dump();
}

/// The one value of an nnU-Net per-stage list (or integer), or invalid_argument.
Result<std::int64_t> uniform(const json& v, const std::string& field, const std::string& net) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (!v.is_array() || v.empty()) return invalid_argument(field + ": expected an integer or a list");
  for (const auto& x : v)
    if (x != v.front())
      return invalid_argument(field + ": " + v.dump() + " differs per stage; segflow's " + net +
                              " has one count");
  return v.front().get<std::int64_t>();
}

Result<std::string> model_yaml(const json& conf, std::int64_t in_channels, std::int64_t classes,
                               const std::string& where) {
  const json& arch = conf.at("architecture");
  const std::string cls = arch.value("network_class_name", std::string("none"));
  // dynamic_network_architectures' PlainConvUNet, or its ResidualEncoderUNet of BasicBlockD
  // blocks and the default stem (what nnU-Net's ResEnc presets build).
  const bool res_enc = cls.ends_with(".ResidualEncoderUNet") || cls == "ResidualEncoderUNet";
  if (!res_enc && cls.find("PlainConvUNet") == std::string::npos)
    return invalid_argument(where +
                            ": architecture.network_class_name: expected PlainConvUNet or "
                            "ResidualEncoderUNet, got " +
                            cls);
  const std::string net = res_enc ? "res_enc_unet" : "plain_unet";
  const json& a = arch.at("arch_kwargs");
  if (res_enc)
    for (const char* k : {"block", "bottleneck_channels", "stem_channels"})
      if (a.contains(k) && !a[k].is_null() &&
          !(std::string(k) == "block" && a[k].is_string() &&
            a[k].get<std::string>().ends_with("BasicBlockD")))
        return invalid_argument(
            where + ": architecture.arch_kwargs." + k + ": " + a[k].dump() +
            "; segflow's res_enc_unet builds BasicBlockD blocks with the default stem only");
  const auto f = a.at("features_per_stage").get<std::vector<std::int64_t>>();
  const std::int64_t cap = *std::max_element(f.begin(), f.end());
  for (std::size_t s = 0; s < f.size(); ++s)
    if (f[s] != std::min<std::int64_t>(f[0] << s, cap))
      return invalid_argument(where + ": architecture.arch_kwargs.features_per_stage: " + json(f).dump() +
                              " is not base x 2^s capped; segflow's " + net + " cannot build it");
  // The encoder: convs per stage (plain) or residual blocks per stage (ResEnc, any per stage).
  std::string encoder;
  if (res_enc) {
    const json& b = a.at("n_blocks_per_stage");
    encoder =
        "n_blocks_per_stage: " +
        (b.is_array() ? b.dump() : json(std::vector<std::int64_t>(f.size(), b.get<std::int64_t>())).dump());
  } else {
    SEGFLOW_ASSIGN_OR_RETURN(std::int64_t enc,
                             uniform(a.at("n_conv_per_stage"), where + ": n_conv_per_stage", net));
    encoder = "n_conv_per_stage: " + std::to_string(enc);
  }
  SEGFLOW_ASSIGN_OR_RETURN(
      std::int64_t dec, uniform(a.at("n_conv_per_stage_decoder"), where + ": n_conv_per_stage_decoder", net));
  const std::string norm = a.value("norm_op", std::string());
  const bool instance = norm.find("InstanceNorm") != std::string::npos;
  if (!instance && norm.find("BatchNorm") == std::string::npos)
    return invalid_argument(
        where + ": architecture.arch_kwargs.norm_op: expected InstanceNorm or BatchNorm, got " + norm);
  json ks = json::array(), st = json::array();
  for (const auto& k : a.at("kernel_sizes")) ks.push_back(json::parse(yaml_xyz(k)));
  for (const auto& k : a.at("strides")) st.push_back(json::parse(yaml_xyz(k)));
  const json nl = a.value("nonlin_kwargs", json::object());
  const double slope = nl.is_object() ? nl.value("negative_slope", 0.01) : 0.01;
  std::ostringstream y;
  y << "{name: " << net << ", spatial_dims: " << conf.at("patch_size").size()
    << ", in_channels: " << in_channels << ", out_channels: " << classes << ", n_stages: " << f.size()
    << ", base_features: " << f[0] << ", max_features: " << cap << ", " << encoder
    << ", n_conv_per_stage_decoder: " << dec << ", kernel_sizes: " << ks.dump() << ", strides: " << st.dump()
    << ", conv_bias: " << (a.value("conv_bias", true) ? "true" : "false") << ", negative_slope: " << slope
    << ", norm: " << (instance ? "instance" : "batch") << ", deep_supervision: true}";
  return y.str();
}

Result<std::string> normalization_yaml(const json& conf, const json& plans, const std::string& where) {
  const auto schemes = conf.at("normalization_schemes").get<std::vector<std::string>>();
  for (const auto& s : schemes)
    if (s != schemes.front())
      return invalid_argument(where + ": normalization_schemes: " + json(schemes).dump() +
                              " differ per channel; segflow's import takes one scheme");
  const std::string& s = schemes.front();
  if (s == "NoNormalization") return std::string();
  if (s == "ZScoreNormalization")
    return std::string("  - {name: zscore, options: {nonzero: ") +
           (conf.value("use_mask_for_norm", json::array({false})).at(0).get<bool>() ? "true" : "false") +
           "}}\n";
  if (s == "CTNormalization") {
    json lower = json::array(), upper = json::array(), mean = json::array(), stdv = json::array();
    const json& props = plans.at("foreground_intensity_properties_per_channel");
    for (std::size_t c = 0; c < schemes.size(); ++c) {
      const json& p = props.at(std::to_string(c));
      lower.push_back(p.at("percentile_00_5"));
      upper.push_back(p.at("percentile_99_5"));
      mean.push_back(p.at("mean"));
      stdv.push_back(p.at("std"));
    }
    return "  - {name: normalize_ct, options: {lower: " + lower.dump() + ", upper: " + upper.dump() +
           ", mean: " + mean.dump() + ", std: " + stdv.dump() + "}}\n";
  }
  return invalid_argument(
      where + ": normalization_schemes: " + s +
      " has no segflow stage; expected CTNormalization, ZScoreNormalization or NoNormalization");
}

/// The configuration's spacing as the resample stage's [x, y, z]. A 2d configuration has
/// (y, x) only: nnU-Net keeps each case's z spacing, segflow's resample has no "keep" axis,
/// so z is the plans' original_median_spacing_after_transp[0] (what export wrote: the job's z).
Result<std::string> import_spacing(const json& conf, const json& plans, const std::string& plans_file,
                                   const std::string& where) {
  const json& s = conf.at("spacing");
  const std::size_t dims = conf.at("patch_size").size();
  if (!s.is_array() || s.size() != dims || (dims != 2 && dims != 3))
    return invalid_argument(where + ": spacing: expected 2 (2d) or 3 numbers matching patch_size " +
                            conf.at("patch_size").dump() + ", got " + s.dump());
  if (dims == 3) return yaml_xyz(s);
  const json median = plans.value("original_median_spacing_after_transp", json());
  if (!median.is_array() || median.size() != 3 || !median[0].is_number() || !(median[0].get<double>() > 0))
    return invalid_argument(plans_file +
                            ": original_median_spacing_after_transp: expected [z, y, x] (the z spacing a "
                            "2d configuration's import resamples to), got " +
                            median.dump());
  return json::array({s[1], s[0], median[0]}).dump();
}

/// The job (YAML) that `conf` (plans.json's configuration) translates to.
Result<std::string> import_job_yaml(const json& plans, const json& dataset, const std::string& configuration,
                                    const std::filesystem::path& fold_dir, const std::string& plans_file) {
  const std::string where = plans_file + ": configurations." + configuration;
  if (!plans["configurations"].contains(configuration)) return invalid_argument(where + ": missing");
  const json& conf = plans["configurations"][configuration];
  // segflow's axes are the file's (z, y, x); a 2d configuration slices along array axis 0.
  const json transpose = plans.value("transpose_forward", json::array({0, 1, 2}));
  if (transpose != json::array({0, 1, 2}))
    return invalid_argument(plans_file +
                            ": transpose_forward: expected [0, 1, 2] (segflow keeps the file's " +
                            "axis order), got " + transpose.dump());
  std::int64_t classes = 0;
  for (const auto& [name, v] : dataset.at("labels").items())
    if (v.is_number_integer()) classes = std::max<std::int64_t>(classes, v.get<std::int64_t>() + 1);
  const auto in_channels = static_cast<std::int64_t>(dataset.at("channel_names").size());
  SEGFLOW_ASSIGN_OR_RETURN(std::string model, model_yaml(conf, in_channels, classes, where));
  SEGFLOW_ASSIGN_OR_RETURN(std::string norm, normalization_yaml(conf, plans, where));
  SEGFLOW_ASSIGN_OR_RETURN(std::string spacing, import_spacing(conf, plans, plans_file, where));
  const bool slices = conf.at("patch_size").size() == 2;
  // nnU-Net's predictor (tile_step_size 0.5, its layout and Gaussian), or what segflow export
  // recorded.
  const json sf = plans.value("segflow", json::object());
  const double overlap = 1.0 - sf.value("tile_step_size", 0.5);
  const std::string mode = sf.value("blending", std::string("nnunet"));
  return "# imported from " + fold_dir.string() + " (nnU-Net v2 " + configuration + ")\n" +
         (slices ? "# 2d: run slice by slice along z like nnU-Net; nnU-Net keeps each case's z spacing, "
                   "this job resamples z to the plans' median\n"
                 : "") +
         "name: nnunet-import\ndata: {root: data}\nstages:\n  - {name: load}\n"
         "  - {name: resample, options: {spacing: " +
         spacing + "}}\n" + norm + "model: " + model +
         "\nvalidation: {roi_size: " + yaml_xyz(conf.at("patch_size")) +
         ", overlap: " + std::to_string(overlap) + ", mode: " + mode + "}\n";
}

Result<c10::impl::GenericDict> read_nnunet_checkpoint(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec))
    return not_found(p.string() + ": missing (the fold's checkpoint)");
  // read_torch_save, not pickle_load: nnU-Net's own trainer saves OrderedDicts.
  SEGFLOW_ASSIGN_OR_RETURN(c10::IValue v, read_torch_save(p));
  if (!v.isGenericDict()) return corrupt_data(p.string() + ": expected a dict");
  return v.toGenericDict();
}

}  // namespace

Result<std::filesystem::path> import_nnunet(const std::filesystem::path& fold_dir,
                                            const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  const fs::path results = fold_dir.lexically_normal().parent_path();
  std::error_code ec;
  if (fs::exists(out, ec)) return invalid_argument(out.string() + ": exists; expected a new folder");
  SEGFLOW_ASSIGN_OR_RETURN(json plans, read_json_file(results / "plans.json"));
  SEGFLOW_ASSIGN_OR_RETURN(json dataset, read_json_file(results / "dataset.json"));
  SEGFLOW_ASSIGN_OR_RETURN(auto ck, read_nnunet_checkpoint(fold_dir / "checkpoint_final.pth"));
  if (!ck.contains("network_weights") || !ck.contains("init_args"))
    return corrupt_data((fold_dir / "checkpoint_final.pth").string() +
                        ": expected network_weights and init_args");
  const std::string configuration = ck.at("init_args").toGenericDict().at("configuration").toStringRef();
  SEGFLOW_ASSIGN_OR_RETURN(std::string yaml, import_job_yaml(plans, dataset, configuration, fold_dir,
                                                             (results / "plans.json").string()));
  SEGFLOW_ASSIGN_OR_RETURN(JobConfig cfg, parse_job_config(yaml, (out / "job.yaml").string()));
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, Trainer::create(cfg, c10::Device(c10::kCPU)));
  // The classes as the results folder's dataset.json names them, carried by model.pt.
  trainer->set_class_names(pipeline::dataset_label_names(results));
  const auto weights = ck.at("network_weights").toGenericDict();
  torch::NoGradGuard no_grad;
  const bool res_enc = cfg.model.name() == "res_enc_unet";
  auto copy = [&](const std::string& name, at::Tensor& t) -> Status {
    // A res_enc_unet's tensors carry nnU-Net's names (models/nets/res_enc_unet.hpp).
    std::vector<std::string> names{name};
    if (!res_enc) {
      SEGFLOW_ASSIGN_OR_RETURN(names, nnunet_plain_names(name));
    }
    if (!weights.contains(names[0]))
      return invalid_argument((fold_dir / "checkpoint_final.pth").string() + ": network_weights lacks " +
                              names[0]);
    const at::Tensor src = weights.at(names[0]).toTensor();
    if (src.sizes() != t.sizes())
      return invalid_argument((fold_dir / "checkpoint_final.pth").string() + ": " + names[0] + " has shape " +
                              c10::str(src.sizes()) + ", plans.json's network expects " +
                              c10::str(t.sizes()));
    t.copy_(src);
    return Status::ok();
  };
  auto& module = trainer->model().module();
  for (auto& p : module.named_parameters()) SEGFLOW_RETURN_IF_ERROR(copy(p.key(), p.value()));
  for (auto& b : module.named_buffers()) SEGFLOW_RETURN_IF_ERROR(copy(b.key(), b.value()));
  SEGFLOW_RETURN_IF_ERROR(write_folder_atomically(out, [&](const fs::path& tmp) -> Status {
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(tmp / "job.yaml", yaml));
    SEGFLOW_RETURN_IF_ERROR(trainer->save_checkpoint(tmp / "model.pt"));
    TensorMap tensors;  // segflow names, for model.weights (fine-tuning)
    for (const auto& p : module.named_parameters()) tensors[p.key()] = p.value().detach();
    for (const auto& b : module.named_buffers()) tensors[b.key()] = b.value().detach();
    return write_tensor_archive(tmp / "weights.sfta", tensors);
  }));
  return out / "model.pt";
}

}  // namespace segflow::models
