#include "models/interop/monai_import.hpp"

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "messages/file_util.hpp"
#include "models/interop/torch_load.hpp"
#include "models/nets/layers.hpp"
#include "models/nets/monai_names.hpp"
#include "models/nets/weights.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::models {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string monai_lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

/// MONAI's layer spelling: "batch", "BATCH" or ["batch", {kwargs}].
Result<std::pair<std::string, json>> monai_layer(const json& v, const std::string& field) {
  if (v.is_string()) return std::make_pair(monai_lower(v.get<std::string>()), json::object());
  if (v.is_array() && !v.empty() && v[0].is_string() &&
      (v.size() == 1 || (v.size() == 2 && v[1].is_object())))
    return std::make_pair(monai_lower(v[0].get<std::string>()), v.size() == 2 ? v[1] : json::object());
  if (v.is_null()) return std::make_pair(std::string("none"), json::object());
  return invalid_argument(field + ": expected a name or [name, {arguments}], got " + v.dump());
}

Result<std::string> monai_norm_name(const json& v, const std::string& field, bool& nonaffine_instance) {
  SEGFLOW_ASSIGN_OR_RETURN(auto layer, monai_layer(v, field));
  const auto& [name, kw] = layer;
  for (const auto& [k, x] : kw.items())
    if (!(name == "instance" && k == "affine"))
      return invalid_argument(field + ": argument '" + k + "' of " + name +
                              " norm has no segflow equivalent");
  if (name == "instance") nonaffine_instance = !kw.value("affine", false);
  if (name == "batch" || name == "instance" || name == "none") return name;
  return invalid_argument(field + ": expected batch, instance or none, got " + name);
}

Result<std::string> monai_act_name(const json& v, const std::string& field) {
  SEGFLOW_ASSIGN_OR_RETURN(auto layer, monai_layer(v, field));
  const auto& [name, kw] = layer;
  for (const auto& [k, x] : kw.items()) {
    const bool ok = k == "inplace" || (name == "prelu" && k == "init") ||
                    (name == "prelu" && k == "num_parameters" && x == 1) ||
                    (name == "leakyrelu" && k == "negative_slope" && x.is_number() &&
                     x.get<double>() == ActOptions{}.negative_slope);
    if (!ok)
      return invalid_argument(field + ": " + name + " argument " + k + "=" + x.dump() + " is not segflow's");
  }
  if (name == "relu" || name == "prelu" || name == "leakyrelu" || name == "gelu") return name;
  return invalid_argument(field + ": expected relu, prelu, leakyrelu or gelu, got " + name);
}

/// An integer or a per-axis list; a list is reversed when `reverse` (MONAI's (z, y, x)).
Result<json> monai_axis_sizes(const json& v, bool reverse, const std::string& field) {
  if (v.is_number_integer()) return v;
  if (v.is_array() && !v.empty() &&
      std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number_integer(); })) {
    json out = v;
    if (reverse) std::reverse(out.begin(), out.end());
    return out;
  }
  return invalid_argument(field + ": expected an integer or a list of integers, got " + v.dump());
}

/// The segflow `unet` model section for MONAI UNet arguments `a` (`where` names them).
Result<json> unet_model(const json& a, bool reverse, const std::string& where, bool& nonaffine_instance) {
  static const std::vector<std::string> kKnown{
      "spatial_dims",  "in_channels", "out_channels", "channels", "strides", "kernel_size", "up_kernel_size",
      "num_res_units", "act",         "norm",         "dropout",  "bias",    "adn_ordering"};
  for (const auto& [k, v] : a.items()) {
    if (!k.empty() && k[0] == '_') continue;
    if (std::find(kKnown.begin(), kKnown.end(), k) == kKnown.end())
      return invalid_argument(
          where + "." + k +
          ": not an argument segflow's unet has (MONAI UNet arguments: " + json(kKnown).dump() + ")");
    if (v.is_string() && !v.get<std::string>().empty() &&
        (v.get<std::string>()[0] == '@' || v.get<std::string>()[0] == '$'))
      return invalid_argument(
          where + "." + k + ": '" + v.get<std::string>() +
          "' is a bundle reference/expression segflow does not evaluate; expected a value");
  }
  for (const char* k : {"spatial_dims", "in_channels", "out_channels", "channels", "strides"})
    if (!a.contains(k)) return invalid_argument(where + "." + k + ": missing (MONAI's UNet requires it)");
  if (a.value("adn_ordering", std::string("NDA")) != "NDA")
    return invalid_argument(where + ".adn_ordering: expected NDA (segflow's order), got " +
                            a["adn_ordering"].dump());
  json m = {{"name", "unet"}};
  for (const char* k : {"spatial_dims", "in_channels", "out_channels", "num_res_units"}) {
    if (!a.contains(k)) continue;
    if (!a[k].is_number_integer())
      return invalid_argument(where + "." + k + ": expected an integer, got " + a[k].dump());
    m[k] = a[k];
  }
  m["channels"] = a["channels"];
  m["strides"] = json::array();
  if (!a["strides"].is_array())
    return invalid_argument(where + ".strides: expected a list, got " + a["strides"].dump());
  for (const auto& s : a["strides"]) {
    SEGFLOW_ASSIGN_OR_RETURN(json st, monai_axis_sizes(s, reverse, where + ".strides"));
    m["strides"].push_back(st);
  }
  for (const char* k : {"kernel_size", "up_kernel_size"}) {
    SEGFLOW_ASSIGN_OR_RETURN(m[k], monai_axis_sizes(a.value(k, json(3)), reverse, where + "." + k));
  }
  m["num_res_units"] = a.value("num_res_units", json(0));
  SEGFLOW_ASSIGN_OR_RETURN(
      m["norm"], monai_norm_name(a.value("norm", json("instance")), where + ".norm", nonaffine_instance));
  SEGFLOW_ASSIGN_OR_RETURN(m["act"], monai_act_name(a.value("act", json("prelu")), where + ".act"));
  const json dropout = a.value("dropout", json(0.0));
  if (!dropout.is_number() && !dropout.is_null())
    return invalid_argument(where + ".dropout: expected a probability, got " + dropout.dump());
  m["dropout"] = dropout.is_null() ? 0.0 : dropout.get<double>();
  if (a.contains("bias") && !a["bias"].is_boolean())
    return invalid_argument(where + ".bias: expected true or false, got " + a["bias"].dump());
  m["bias"] = a.value("bias", true);
  return m;
}

Result<json> read_bundle_config(const fs::path& bundle, fs::path& file) {
  std::error_code ec;
  for (const char* name : {"inference.json", "inference.yaml", "inference.yml"}) {
    file = bundle / "configs" / name;
    if (!fs::is_regular_file(file, ec)) continue;
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    if (file.extension() == ".json") {
      json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) return corrupt_data(file.string() + ": not a JSON object");
      return j;
    }
    try {
      return pipeline::yaml_to_json(YAML::Load(text.str()));
    } catch (const std::exception& e) {
      return corrupt_data(file.string() + ": not YAML: " + std::string(e.what()).substr(0, 200));
    }
  }
  return not_found((bundle / "configs" / "inference.json").string() +
                   ": missing (also .yaml/.yml); expected a MONAI bundle folder");
}

bool is_reference(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    return !s.empty() && (s[0] == '@' || s[0] == '$');
  }
  if (v.is_array() || v.is_object())
    for (const auto& x : v)
      if (is_reference(x)) return true;
  return false;
}

std::string monai_target(const json& t) {
  std::string target = t.is_object() ? t.value("_target_", std::string()) : std::string();
  const auto dot = target.rfind('.');
  return dot == std::string::npos ? target : target.substr(dot + 1);
}

/// One MONAI transform as segflow stage YAML ("" for a no-op); the reason as an error when
/// there is no exact segflow stage.
Result<std::string> monai_transform_stage(const json& t, bool reverse) {
  const std::string name = monai_target(t);
  json o = t;
  o.erase("keys");
  if (is_reference(o)) return invalid_argument(name + " has a bundle reference/expression: " + o.dump());
  if (name == "LoadImaged" || name == "LoadImage") return std::string("  - {name: load}\n");
  if (name == "EnsureChannelFirstd" || name == "EnsureTyped" || name == "ToTensord" || name == "AddChanneld")
    return std::string();
  if (name == "Orientationd" && o.contains("axcodes") && o["axcodes"].is_string())
    return "  - {name: reorient, options: {axcodes: " + o["axcodes"].get<std::string>() + "}}\n";
  if (name == "Spacingd" && o.contains("pixdim") && o["pixdim"].is_array() && o["pixdim"].size() == 3) {
    json mode = o.value("mode", json("bilinear"));
    if (mode.is_array() && !mode.empty()) mode = mode[0];  // the image's
    if (mode != "bilinear" && mode != "nearest") return invalid_argument("Spacingd mode " + mode.dump());
    json spacing = o["pixdim"];
    if (reverse) std::reverse(spacing.begin(), spacing.end());
    return "  - {name: resample, options: {spacing: " + spacing.dump() +
           ", grid: exact_spacing, mode: " + (mode == "bilinear" ? "trilinear" : "nearest") + "}}\n";
  }
  if (name == "ScaleIntensityRanged" && o.contains("a_min") && o.contains("a_max")) {
    return "  - {name: scale_intensity_range, options: {a_min: " + o["a_min"].dump() +
           ", a_max: " + o["a_max"].dump() + ", b_min: " + o.value("b_min", json(0.0)).dump() +
           ", b_max: " + o.value("b_max", json(1.0)).dump() +
           ", clip: " + (o.value("clip", false) ? "true" : "false") + "}}\n";
  }
  return invalid_argument(name.empty() ? "a transform without _target_"
                                       : name + " has no exact segflow stage");
}

/// stages: (and validation:) YAML from a bundle's preprocessing and inferer; the default
/// (load only) with a note when a transform has no exact equivalent.
std::string monai_preprocessing(const json& config, bool reverse, MonaiImport& r) {
  const std::string kDefault = "stages:\n  - {name: load}\n";
  r.preprocessing = "default";
  const json pre = config.value("preprocessing", json());
  if (!pre.is_object() || !pre.contains("transforms") || !pre["transforms"].is_array()) {
    r.notes.push_back(
        "preprocessing: default (load only): the bundle config has no preprocessing.transforms");
    return kDefault;
  }
  std::string stages = "stages:\n";
  for (const auto& t : pre["transforms"]) {
    auto st = monai_transform_stage(t, reverse);
    if (!st.is_ok()) {
      r.notes.push_back("preprocessing: default (load only): " + st.status().message() +
                        "; set the stages by hand");
      return kDefault;
    }
    stages += *st;
  }
  if (stages.find("{name: load}") == std::string::npos) stages.insert(8, "  - {name: load}\n");
  r.preprocessing = "bundle";
  const json inf = config.value("inferer", json());
  if (monai_target(inf) == "SlidingWindowInferer" && inf.contains("roi_size") && !is_reference(inf)) {
    json roi = inf["roi_size"];
    if (reverse) std::reverse(roi.begin(), roi.end());
    stages += "validation: {roi_size: " + roi.dump() +
              ", overlap: " + inf.value("overlap", json(0.25)).dump() +
              ", sw_batch_size: " + inf.value("sw_batch_size", json(1)).dump() +
              ", mode: " + inf.value("mode", json("constant")).get<std::string>() + "}\n";
  } else {
    r.notes.push_back("validation: no SlidingWindowInferer in the bundle; segflow's defaults (whole volume)");
  }
  return stages;
}

std::string monai_shape(at::IntArrayRef s) { return c10::str(s); }

/// Copies `src` (MONAI names) into `module` (built from `model`): all checked first, nothing
/// copied on error. Kernels' spatial axes reversed when `flip`.
Status copy_monai_weights(torch::nn::Module& module, const json& model,
                          const std::vector<std::pair<std::string, at::Tensor>>& src, bool flip,
                          bool nonaffine_instance, const std::string& where, MonaiImport& r) {
  std::map<std::string, at::Tensor> by_name(src.begin(), src.end());
  const std::size_t levels = model["channels"].size() - 1;
  const std::int64_t nru = model["num_res_units"].get<std::int64_t>();
  std::vector<std::pair<at::Tensor, at::Tensor>> plan;  // (target, source)
  std::vector<std::string> bad, missing;
  std::size_t filled = 0;
  auto visit = [&](const std::string& name, at::Tensor t) -> Status {
    SEGFLOW_ASSIGN_OR_RETURN(std::string m, monai_unet_name(name, levels, nru));
    const std::string monai = "model." + m;
    auto it = by_name.find(monai);
    if (it == by_name.end()) {
      const bool norm = monai.find(".adn.N.") != std::string::npos;
      if (nonaffine_instance && norm && (name.ends_with("norm.weight") || name.ends_with("norm.bias"))) {
        plan.emplace_back(t, name.ends_with("weight") ? at::ones_like(t) : at::zeros_like(t));
        ++filled;
        return Status::ok();
      }
      missing.push_back(monai);
      return Status::ok();
    }
    const at::Tensor file = it->second;
    by_name.erase(it);
    // Both shapes in the file's axis order: segflow's kernels are (z, y, x), MONAI's (x, y, z).
    std::vector<std::int64_t> perm{0, 1};
    for (std::int64_t d = t.dim() - 1; d >= 2; --d) perm.push_back(d);
    const bool permute = flip && t.dim() >= 3 && file.dim() == t.dim();
    const at::Tensor expected = permute ? t.permute(perm) : t;
    if (file.sizes() != expected.sizes())
      bad.push_back(monai + " has shape " + monai_shape(file.sizes()) + ", the network expects " +
                    monai_shape(expected.sizes()));
    else
      plan.emplace_back(t, permute ? file.permute(perm) : file);
    return Status::ok();
  };
  for (auto& p : module.named_parameters()) SEGFLOW_RETURN_IF_ERROR(visit(p.key(), p.value()));
  for (auto& b : module.named_buffers()) SEGFLOW_RETURN_IF_ERROR(visit(b.key(), b.value()));
  std::vector<std::string> left;
  for (const auto& [n, t] : by_name) left.push_back(n);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size() && i < 12; ++i) s += (i ? "; " : "") + v[i];
    return v.size() > 12 ? s + "; and " + std::to_string(v.size() - 12) + " more" : s;
  };
  if (!bad.empty()) return invalid_argument(where + ": shapes do not fit: " + list(bad));
  if (!missing.empty())
    return invalid_argument(where + ": tensors the network needs are missing: " + list(missing));
  if (!left.empty()) return invalid_argument(where + ": tensors the network does not have: " + list(left));
  torch::NoGradGuard no_grad;
  for (auto& [t, s] : plan) t.copy_(s);
  r.tensors = plan.size() - filled;
  if (filled > 0)
    r.notes.push_back(
        "norm: MONAI's instance norm is not affine; segflow's affine one gets weight 1, bias 0 (" +
        std::to_string(filled) + " tensors)");
  return Status::ok();
}

Status write_monai_import(const fs::path& out, const std::string& yaml, Trainer& trainer,
                          const MonaiImport& r) {
  return write_folder_atomically(out, [&](const fs::path& tmp) -> Status {
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(tmp / "job.yaml", yaml));
    SEGFLOW_RETURN_IF_ERROR(trainer.save_checkpoint(tmp / "model.pt"));
    SEGFLOW_RETURN_IF_ERROR(
        write_tensor_archive(tmp / "weights.sfta", named_tensors(trainer.model().module())));
    return write_file_atomically(tmp / "import.json", r.to_json().dump(2) + "\n");
  });
}

}  // namespace

nlohmann::json MonaiImport::to_json() const {
  return {{"checkpoint", checkpoint.string()},
          {"config", config.string()},
          {"network", network},
          {"preprocessing", preprocessing},
          {"notes", notes},
          {"tensors", tensors}};
}

const std::vector<std::string>& monai_layouts() {
  static const std::vector<std::string> k{"monai", "segflow"};
  return k;
}

Result<MonaiImport> import_monai(const fs::path& source, const json& args, const std::string& layout,
                                 const fs::path& out) {
  std::error_code ec;
  if (layout != "monai" && layout != "segflow")
    return invalid_argument("layout: expected monai or segflow, got '" + layout + "'");
  if (fs::exists(out, ec)) return invalid_argument(out.string() + ": exists; expected a new folder");
  if (!fs::exists(source, ec))
    return not_found(source.string() + ": missing; expected a MODEL.pt or a bundle folder");
  const bool reverse = layout == "segflow", flip = layout == "monai";
  MonaiImport r;
  json network = args, config;
  std::string where = "arguments";
  fs::path weights = source;
  if (fs::is_directory(source, ec)) {
    if (!args.empty())
      return invalid_argument(
          "--spatial-dims, --channels, ...: for a bare MODEL.pt only; a bundle's network "
          "comes from its network_def");
    fs::path file;
    SEGFLOW_ASSIGN_OR_RETURN(config, read_bundle_config(source, file));
    where = file.string() + ": network_def";
    if (!config.contains("network_def") || !config["network_def"].is_object())
      return invalid_argument(where + ": missing; expected {_target_: monai.networks.nets.UNet, ...}");
    network = config["network_def"];
    const std::string target = network.value("_target_", std::string());
    static const std::vector<std::string> kUnet{"UNet",
                                                "Unet",
                                                "unet",
                                                "monai.networks.nets.UNet",
                                                "monai.networks.nets.unet.UNet",
                                                "monai.networks.nets.Unet"};
    if (std::find(kUnet.begin(), kUnet.end(), target) == kUnet.end())
      return invalid_argument(where + "._target_: expected monai.networks.nets.UNet (segflow's unet), got '" +
                              target + "'");
    weights = source / "models" / "model.pt";
  }
  bool nonaffine = false;
  SEGFLOW_ASSIGN_OR_RETURN(json model, unet_model(network, reverse, where, nonaffine));
  for (auto it = network.begin(); it != network.end();)
    it = (!it.key().empty() && it.key()[0] == '_') ? network.erase(it) : std::next(it);
  r.network = network;
  const std::string stages =
      config.is_null() ? std::string("stages:\n  - {name: load}\n") : monai_preprocessing(config, reverse, r);
  if (config.is_null()) r.preprocessing = "default";
  if (config.is_null())
    r.notes.push_back("preprocessing: default (load only): a bare MODEL.pt has none; set the stages by hand");
  const std::string yaml = "# imported from " + source.string() + " (MONAI UNet, layout " + layout +
                           ")\nname: monai-import\ndata: {root: data}\n" + stages + "model: " + model.dump() +
                           "\n";
  SEGFLOW_ASSIGN_OR_RETURN(JobConfig cfg, parse_job_config(yaml, (out / "job.yaml").string()));
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, Trainer::create(cfg, c10::Device(c10::kCPU)));
  SEGFLOW_ASSIGN_OR_RETURN(c10::IValue saved, read_torch_save(weights));
  SEGFLOW_ASSIGN_OR_RETURN(auto tensors, state_dict_tensors(saved, weights.string()));
  SEGFLOW_RETURN_IF_ERROR(copy_monai_weights(trainer->model().module(), model, tensors, flip, nonaffine,
                                             weights.string() + " against " + where, r));
  r.checkpoint = out / "model.pt";
  r.config = out / "job.yaml";
  SEGFLOW_RETURN_IF_ERROR(write_monai_import(out, yaml, *trainer, r));
  return r;
}

}  // namespace segflow::models
