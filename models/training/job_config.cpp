#include "models/training/job_config.hpp"

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "messages/hashing.hpp"
#include "pipeline/options.hpp"
#include "pipeline/split.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/map_labels.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using nlohmann::json;
using pipeline::format_value;
using pipeline::OptionParser;
using pipeline::Range;

void DataSettings::bind(OptionParser& p) {
  p.string("root", root, "dataset folder (MSD, DICOM cases or MedSAM npy)");
  if (p.given("synth")) {
    pipeline::SynthOptions o = synth.value_or(pipeline::SynthOptions{});
    p.section("synth", o, "when root is missing: make it with these `segflow synth` options");
    synth = o;
  } else {
    p.mapping("synth", "when root is missing: make it with these `segflow synth` options");
    p.set_resolved("synth", synth ? pipeline::resolved_options(*synth) : json(nullptr));
  }
  p.number("val_fraction", val_fraction, Range{0.0, 1.0, false, true}, "",
           "fraction of cases held out for validation");
  p.integer("val_cases", val_cases, Range::at_least(-1), "cases",
            "cases held out for validation; -1 = use val_fraction");
  p.integer("num_classes", num_classes, Range::non_negative(), "",
            "label values 0..n-1 incl. background; 0 = the model's out_channels");
  p.integer("folds", folds, Range::at_least(2), "folds",
            "cross-validation folds (at most the number of cases)");
  p.integer("fold", fold, Range::at_least(-1), "",
            "the cross-validation fold to train, 0..folds-1; -1 = the val_fraction/val_cases split");
  if (p.ok() && fold >= folds)
    p.fail("fold", "expected -1 (no cross-validation) or a fold in [0, " + std::to_string(folds - 1) +
                       "] (data.folds " + std::to_string(folds) + "), got " + std::to_string(fold));
}

void TrainSettings::bind(OptionParser& p) {
  p.integer("epochs", epochs, Range::at_least(1), "epochs", "passes over the training cases");
  p.integer("batch_size", batch_size, Range::at_least(1), "samples", "samples per micro-batch (after crops)");
  p.integer("accumulate", accumulate, Range::at_least(1), "micro-batches",
            "micro-batches per optimizer step");
  p.number("grad_clip", grad_clip, Range::non_negative(), "", "max global gradient norm; 0 = off");
  p.choice("amp", amp, {"none", "bf16", "fp16", "auto"},
           "mixed precision (fp16: CUDA only, dynamic loss scaling; auto: bf16 where the device has it "
           "natively, fp16 on an older GPU, none on a CPU without native bf16: models/training/amp.hpp)");
  p.string("device", device, "auto, cpu, cuda or cuda:N");
  if (p.ok() && !std::regex_match(device, std::regex("auto|cpu|cuda(:[0-9]+)?")))
    p.fail("device", "expected auto, cpu, cuda or cuda:N, got \"" + device + "\"");
  p.string_list("devices", devices, false,
                "data-parallel ranks, one device each; [] = one trainer on device");
  if (const json* x = p.given("devices"); p.ok() && x) {
    for (const auto& d : devices)
      if (!std::regex_match(d, std::regex("cpu|cuda(:[0-9]+)?")))
        return p.fail(
            "devices",
            "expected a list of cpu, cuda or cuda:N (one data-parallel rank each), got " + format_value(*x));
    // Two ranks on one GPU would share its memory and NCCL refuses such a communicator
    // ("cuda" is cuda:0). CPU ranks may repeat: Gloo runs any number on one host.
    auto norm = [](const std::string& d) { return d == "cuda" ? std::string("cuda:0") : d; };
    for (std::size_t i = 0; i < devices.size(); ++i)
      for (std::size_t k = 0; k < i; ++k)
        if (norm(devices[i]) != "cpu" && norm(devices[i]) == norm(devices[k]))
          return p.fail("devices", "expected each CUDA device at most once, got " + format_value(*x) + " (" +
                                       devices[k] + " and " + devices[i] + " are the same device)");
  }
  p.integer("val_interval", val_interval, Range::non_negative(), "epochs",
            "validate every N epochs (and at the end); 0 = never");
  p.integer("checkpoint_interval", checkpoint_interval, Range::at_least(1), "epochs",
            "write last.pt every N epochs (and at the end)");
  p.integer("steps_per_epoch", steps_per_epoch, Range::non_negative(), "steps",
            "cap on the optimizer steps per epoch; 0 = all batches");
  p.choice("loader", loader, {"actors", "simple"},
           "actors (the CAF pipeline) or simple (synchronous baseline)");
  p.integer("decode_workers", decode_workers, Range::closed(1, 256), "workers", "decode pool size");
  p.integer("prefetch", prefetch, Range::closed(1, 1024), "batches", "batches prepared ahead per trainer");
  p.number("cache_rate", cache_rate, Range::closed(0, 1), "", "fraction of cases cached in memory");
  p.integer("cache_bytes", cache_bytes, Range::non_negative(), "bytes", "memory cache budget");
  p.string("disk_cache", disk_cache, "persistent cache folder; \"\" = none");
  p.choice("cache_dtype", cache_dtype, {"exact", "float16", "bfloat16", "none"},
           "form of cached samples: exact (lossless), float16/bfloat16 (non-integer images rounded), none");
  p.choice("cache_device", cache_device, {"cpu", "cuda"},
           "where the memory cache lives (cuda: the training GPU)");
  if (p.ok() && cache_device == "cuda" &&
      (device == "cpu" || std::find(devices.begin(), devices.end(), "cpu") != devices.end()))
    p.fail("cache_device", "expected cpu when training on the CPU (train.device/devices), got cuda");
  p.integer_or_auto("threads", threads, std::int64_t{0}, Range::closed(0, 1024), "threads",
                    "intra-op threads of the trainer; auto (or 0) = the cores other processes leave free, "
                    "re-decided while training (docs/explanation/threads.md)");
  p.boolean("cudnn_benchmark", cudnn_benchmark, "cuDNN autotuner on CUDA");
  p.boolean("channels_last", channels_last, "channels-last memory format on CUDA");
  p.boolean("activation_checkpointing", activation_checkpointing,
            "keep only each network stage's input for backward and recompute the stage there: less memory, "
            "one more forward");
  p.integer("log_every", log_every, Range::at_least(1), "steps", "metrics.jsonl step records every N steps");
  bind_early_stopping(p);
  p.strings("freeze", freeze, false, "regexes over parameter names that get no gradient (fine-tuning)");
  p.integer("unfreeze_epoch", unfreeze_epoch, Range::non_negative(), "epochs",
            "the epoch from which frozen parameters train too; 0 = frozen for the whole run");
  if (p.ok() && unfreeze_epoch > 0 && freeze.empty())
    p.fail("unfreeze_epoch", "expected train.freeze rules to go with it, got none");
  // DDP's reducer expects a gradient for every parameter it was built over, and its
  // fallback would hand frozen ones zero gradients (weight decay would still move them).
  if (p.ok() && !freeze.empty() && devices.size() > 1)
    p.fail("freeze", "expected one device (freezing is not supported with data-parallel ranks yet), got " +
                         std::to_string(devices.size()) + " train.devices");
}

const std::vector<std::string>& early_stopping_metrics() {
  static const std::vector<std::string> names = {"val/dice_mean"};
  return names;
}

void EarlyStoppingSettings::bind(OptionParser& p) {
  p.choice("metric", metric, early_stopping_metrics(), "the validation figure watched");
  p.integer("patience", patience, Range::at_least(1), "validations",
            "validations in a row without an improvement before training stops");
  if (p.ok() && !p.given("patience"))
    p.fail("patience", "expected an integer >= 1 (validations without an improvement), got nothing");
  p.number("min_delta", min_delta, Range::non_negative(), "",
           "an improvement must exceed the best so far by more than this");
  p.choice("mode", mode, {"max", "min"}, "max: higher is better; min: lower is better");
}

/// `early_stopping`: absent or null leaves it off and out of the resolved config (so configs
/// without it keep their run folder names).
void TrainSettings::bind_early_stopping(OptionParser& p) {
  if (!p.given("early_stopping")) {
    p.mapping("early_stopping", "stop when validation stops improving; absent = off");
    return;
  }
  EarlyStoppingSettings o = early_stopping.value_or(EarlyStoppingSettings{});
  p.section("early_stopping", o, "stop when validation stops improving; absent = off");
  early_stopping = o;
  if (p.ok() && val_interval == 0)
    p.fail("early_stopping",
           "expected train.val_interval > 0 (early stopping counts validations), got val_interval 0");
}

void ValidationSettings::bind(OptionParser& p) {
  p.integer_list("roi_size", roi_size, Range::at_least(1), false,
                 "sliding window (x, y, z) or (x, y) in voxels; [] = whole volume");
  p.number("overlap", overlap, Range{0.0, 1.0, false, true}, "",
           "fraction of the window shared by neighbours");
  p.choice("mode", mode, {"gaussian", "constant", "nnunet"},
           "blending of overlapping windows (nnunet: nnU-Net's predictor's layout and Gaussian)");
  p.integer("sw_batch_size", sw_batch_size, Range::at_least(1), "windows", "windows per forward pass");
  p.boolean("save_predictions", save_predictions,
            "at the end of training, predict and score the validation cases into the run's validation/");
  p.boolean("save_probabilities", save_probabilities,
            "with save_predictions, also write each validation case's class probabilities "
            "(<case>_probabilities.nii.gz; segflow select's ensembles)");
}

namespace {

/// Applies "a.b.2.c=value" to a YAML tree (value parsed as YAML).
Status apply_override(YAML::Node root, const std::string& ov, const std::string& file) {
  const auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    return invalid_argument("--set " + ov + ": expected key=value (e.g. train.epochs=4)");
  const std::string key = ov.substr(0, eq), text = ov.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const std::exception& e) {
    return invalid_argument("--set " + key + ": value '" + text + "' is not valid YAML: " + e.what());
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  // A scalar on the path cannot hold a key (yaml-cpp throws on operator[]; found by fuzzing:
  // tests/fuzz/regressions/job_config/).
  auto not_a_section = [&](std::size_t upto) {
    std::string path = "--set ";
    path += key;
    path += ": '";
    for (std::size_t j = 0; j < upto; ++j) path += (j ? "." : "") + parts[j];
    path += upto == 0 ? "(the document)" : "";
    path += "' is a value, not a section or a sequence";
    return invalid_argument(path);
  };
  // yaml-cpp nodes are handles: walk with copies that alias the same tree.
  std::vector<YAML::Node> chain{root};
  try {
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node cur = chain.back();
      const std::string& p = parts[i];
      if (cur.IsScalar()) return not_a_section(i);
      if (cur.IsSequence()) {
        std::size_t idx = 0;
        try {
          idx = std::stoul(p);
        } catch (...) {
          std::string msg = "--set ";
          msg += key;
          msg += ": '";
          msg += p;
          msg += "' is not an index of a sequence";
          return invalid_argument(msg);
        }
        if (idx >= cur.size()) {
          std::string msg = "--set ";
          msg += key;
          msg += ": index ";
          msg += p;
          msg += " out of range (size ";
          msg += std::to_string(cur.size());
          msg += ")";
          return invalid_argument(msg);
        }
        chain.push_back(cur[idx]);
      } else {
        chain.push_back(cur[p]);
      }
    }
    if (chain.back().IsScalar()) return not_a_section(parts.size() - 1);
  } catch (const YAML::Exception& e) {
    return invalid_argument("--set " + key + ": " + e.what());
  }
  YAML::Node parent = chain.back();
  const std::string& last = parts.back();
  if (parent.IsSequence()) {
    std::size_t idx = 0;
    try {
      idx = std::stoul(last);
    } catch (...) {
      return invalid_argument("--set " + key + ": '" + last + "' is not a sequence index");
    }
    if (idx >= parent.size()) return invalid_argument("--set " + key + ": index out of range");
    parent[idx] = value;
  } else {
    parent[last] = value;
  }
  (void)file;
  return Status::ok();
}

/// A typed section read by its parse function; its resolved value (defaults filled in)
/// becomes the top parser's. Absent keeps `field` (the job's default).
template <class T, class Parse>
void typed_section(OptionParser& top, const char* key, const char* doc, T& field, Parse parse) {
  const bool given = top.given(key) != nullptr;
  const json v = top.mapping(key, doc);
  if (!top.ok()) return;
  if (given) {
    auto r = parse(v, top.path_of(key));
    if (!r.is_ok()) return top.add_error(r.status());
    field = std::move(*r);
  }
  json resolved;
  to_json(resolved, field);
  top.set_resolved(key, std::move(resolved));
}

/// The runs_dir of `output`.
struct OutputSettings {
  std::string& runs_dir;
  void bind(OptionParser& p) { p.string("runs_dir", runs_dir, "parent of the run folders"); }
};

Status parse_into(const json& j, const std::string& file, JobConfig& c) {
  const std::string label = file.empty() ? std::string("config") : file;
  if (!j.is_object()) return invalid_config(label + ": expected a mapping at the top level");
  OptionParser p(j, label + ": ");
  p.name_keys("key");
  p.string("name", c.name, "run folder prefix");
  if (p.ok() && !std::regex_match(c.name, std::regex("[A-Za-z0-9._-]+")))
    p.fail("name", "expected letters, digits, '.', '_' or '-', got \"" + c.name + "\"");
  p.integer("seed", c.seed, Range::non_negative(), "", "seed of model init, data order and augmentation");
  p.section("data", c.data, "where the data comes from", "key");
  SEGFLOW_RETURN_IF_ERROR(p.status());

  json stages;
  p.json_value("stages", stages, "list of stages", "the pipeline: stage names with options");
  if (stages.is_null()) return invalid_config(label + ": stages: expected a list of stages, got nothing");
  SEGFLOW_ASSIGN_OR_RETURN(c.stages, pipeline::parse_pipeline_spec(stages, file, "stages"));
  p.set_resolved("stages", pipeline::to_json(c.stages));

  if (!p.given("model")) {
    std::string known;
    for (const auto& n : known_models()) known += (known.empty() ? "" : ", ") + n;
    return invalid_config(label + ": model.name: expected a model name (" + known + "), got nothing");
  }
  typed_section(p, "model", "the network (models/nets/registry.hpp)", c.model,
                [](const json& v, const std::string& w) { return parse_model_options(v, w); });
  typed_section(p, "loss", "the loss (models/training/losses.hpp)", c.loss,
                [](const json& v, const std::string& w) { return parse_loss_options(v, w); });
  typed_section(p, "optimizer", "the optimizer (models/training/optim.hpp)", c.optimizer,
                [](const json& v, const std::string& w) { return parse_optimizer_options(v, w); });
  typed_section(p, "schedule", "the learning-rate schedule (models/training/optim.hpp)", c.schedule,
                [](const json& v, const std::string& w) { return parse_schedule_options(v, w); });
  SEGFLOW_RETURN_IF_ERROR(p.status());
  p.section("train", c.train, "how to train", "key");
  p.section("validation", c.validation, "sliding-window validation", "key");
  OutputSettings output{c.runs_dir};
  p.section("output", output, "where run folders go", "key");
  SEGFLOW_RETURN_IF_ERROR(p.finish());
  c.resolved = p.resolved();
  return Status::ok();
}

}  // namespace

Result<JobConfig> parse_job_config(const std::string& text, const std::string& file,
                                   const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return invalid_config((file.empty() ? "config" : file) + ": line " + std::to_string(e.mark.line + 1) +
                          ": invalid YAML: " + e.msg);
  }
  if (!root.IsMap())
    return invalid_config((file.empty() ? "config" : file) + ": expected a mapping at the top level");
  for (const auto& ov : overrides) SEGFLOW_RETURN_IF_ERROR(apply_override(root, ov, file));
  if (const auto dup = pipeline::duplicate_yaml_key(root); !dup.empty())  // e.g. a map_labels source
    return invalid_config((file.empty() ? "config" : file) + ": " + dup +
                          ": duplicate key; expected each key once");
  JobConfig c;
  c.file = file;
  SEGFLOW_RETURN_IF_ERROR(parse_into(pipeline::yaml_to_json(root), file, c));
  return c;
}

Result<JobConfig> load_job_config(const fs::path& file, const std::vector<std::string>& overrides) {
  std::ifstream f(file);
  if (!f) return not_found(file.string() + ": cannot open job config");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_job_config(ss.str(), file.string(), overrides);
}

Result<JobConfig> job_config_from_json(const json& j, const std::string& file) {
  JobConfig c;
  c.file = file;
  SEGFLOW_RETURN_IF_ERROR(parse_into(j, file, c));
  return c;
}

Status validate_job_config(const JobConfig& cfg, const pipeline::StageRegistry& registry) {
  const std::string label = cfg.file.empty() ? std::string("config") : cfg.file;
  SEGFLOW_RETURN_IF_ERROR(pipeline::build_pipeline(cfg.stages, registry, cfg.file).status());
  SEGFLOW_RETURN_IF_ERROR(check_label_mapping(cfg));  // map_labels targets < the number of classes
  if (cfg.train.amp == "fp16" && cfg.train.device == "cpu")
    return invalid_config(
        label + ": train.amp: fp16 needs a CUDA device (use bf16 or auto on the CPU), got device cpu");
  if (!cfg.model.weights.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(cfg.model.weights, ec))
      return invalid_config(label + ": model.weights: expected a tensor archive, got \"" + cfg.model.weights +
                            "\" (no such file)");
  }
  try {
    torch::NoGradGuard no_grad;
    ModelOptions m = cfg.model;
    m.weights.clear();  // exists (checked above); read when the job builds its trainer
    auto model = create_model(m);
    if (!model.is_ok()) return model.status().with_context(label + ": model");
    if (auto frozen = frozen_parameters(model->module(), cfg.train.freeze, "train.freeze"); !frozen.is_ok())
      return invalid_config(label + ": " + frozen.status().message());
    SEGFLOW_RETURN_IF_ERROR(check_input_sizes(model->info(), cfg.stages, cfg.validation.roi_size, label));
    auto loss = make_loss(cfg.loss);
    if (!loss.is_ok()) return loss.status().with_context(label + ": loss");
    auto opt = make_optimizer(cfg.optimizer, model->trainable_parameters());
    if (!opt.is_ok()) return opt.status().with_context(label + ": optimizer");
  } catch (const std::exception& e) {
    return invalid_config(label + ": model: cannot be built: " + first_line(e));
  }
  return Status::ok();
}

std::string run_name(const JobConfig& cfg) {
  json key = cfg.resolved;
  // Settings that do not change the result do not change the folder.
  for (const char* k :
       {"loader", "decode_workers", "prefetch", "cache_bytes", "disk_cache", "cache_device", "log_every"})
    key["train"].erase(k);
  // No freezing is what runs without these keys did (their folders keep their names).
  if (cfg.train.freeze.empty()) {
    key["train"].erase("freeze");
    key["train"].erase("unfreeze_epoch");
  }
  // Lossless cache forms give the same batches; float16/bfloat16 do not.
  if (const std::string d = key["train"].value("cache_dtype", ""); d == "exact" || d == "none")
    key["train"].erase("cache_dtype");
  // Saving the validation probabilities changes no weights (and keeps older runs' names).
  if (key["validation"].is_object()) key["validation"].erase("save_probabilities");
  // The folds of one config share a hash (the fold is spelled out after it); without
  // cross-validation neither key is hashed, so such runs keep the names they had before.
  if (json& d = key["data"]; d.is_object()) {
    d.erase("fold");
    if (cfg.data.fold < 0) d.erase("folds");
  }
  const std::string text = key.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string name = cfg.name + "-s" + std::to_string(cfg.seed) + "-" + Fnv1a64().add(text).hex(8);
  if (cfg.data.fold >= 0) name += "-fold" + std::to_string(cfg.data.fold);
  return name;
}

pipeline::SplitOptions split_options(const JobConfig& cfg) {
  pipeline::SplitOptions o;
  o.seed = cfg.seed;
  o.val_fraction = cfg.data.val_fraction;
  o.val_cases = cfg.data.val_cases;
  o.folds = cfg.data.folds;
  o.fold = cfg.data.fold;
  o.source = cfg.file;
  o.root = cfg.data.root;
  return o;
}

std::string stage_options_where(const JobConfig& cfg, std::size_t i) {
  const std::string at = cfg.stages.path + "[" + std::to_string(i) + "].options";
  return cfg.file.empty() ? at : cfg.file + ": " + at;
}

namespace {

/// Where configured_num_classes came from, for messages.
std::string num_classes_source(const JobConfig& cfg) {
  return cfg.data.num_classes > 0 ? "data.num_classes" : "model.out_channels";
}

}  // namespace

std::int64_t configured_num_classes(const JobConfig& cfg) {
  if (cfg.data.num_classes > 0) return cfg.data.num_classes;
  const json& model = cfg.resolved.is_object() ? cfg.resolved.value("model", json::object()) : json::object();
  const auto it = model.find("out_channels");
  if (it == model.end() || !it->is_number_integer()) return 0;
  const auto out = it->get<std::int64_t>();
  return out == 1 ? 2 : out;
}

namespace {

/// The error of one map_labels stage whose targets do not fit `k` classes; ok when they fit.
Status check_one(const pipeline::MapLabelsOptions& o, std::int64_t k, const std::string& where,
                 const std::string& source) {
  std::string of = "num_classes " + std::to_string(k);
  of += ", from " + source;
  if (!o.keep.empty()) {
    if (static_cast<std::int64_t>(o.keep.size()) <= k - 1) return Status::ok();
    std::string m = where + ".keep: expected at most " + std::to_string(k - 1);
    m += " labels (targets 1.." + std::to_string(k - 1) + " of " + of + "), got ";
    m += std::to_string(o.keep.size()) + " " + pipeline::format_value(json(o.keep));
    return invalid_config(m);
  }
  for (const auto& [s, t] : o.pairs) {
    if (t < k) continue;
    std::string m = where + ".mapping: expected targets in 0.." + std::to_string(k - 1);
    m += " (" + of + "), got " + std::to_string(t);
    m += " (for source " + std::to_string(s) + ")";
    return invalid_config(m);
  }
  return Status::ok();
}

}  // namespace

Status check_label_mapping(const JobConfig& cfg) {
  const std::int64_t k = configured_num_classes(cfg);
  for (std::size_t i = 0; i < cfg.stages.stages.size(); ++i) {
    const auto& s = cfg.stages.stages[i];
    if (s.name != "map_labels") continue;
    const std::string where = stage_options_where(cfg, i);
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::MapLabelsOptions o,
                             pipeline::parse_map_labels_options(s.options, where));
    if (k <= 0 || o.pairs.empty()) continue;
    SEGFLOW_RETURN_IF_ERROR(check_one(o, k, where, num_classes_source(cfg)));
  }
  return Status::ok();
}

}  // namespace segflow::models
