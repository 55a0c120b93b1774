#include "models/job_config.hpp"

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "pipeline/options.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using nlohmann::json;
using pipeline::format_value;

namespace {

/// Reads the keys of one section, remembering which were used, so leftovers are errors.
class Section {
 public:
  Section(const json& j, std::string file, std::string path)
      : j_(j), file_(std::move(file)), path_(std::move(path)) {}

  Status status() const { return st_; }
  bool ok() const { return st_.is_ok(); }
  std::string where(const std::string& key) const {
    return (file_.empty() ? std::string("config") : file_) + ": " + (path_.empty() ? key : path_ + "." + key);
  }
  void fail(const std::string& key, const std::string& msg) {
    if (st_.is_ok()) st_ = invalid_config(where(key) + ": " + msg);
  }
  const json* get(const std::string& key) {
    used_.push_back(key);
    if (!j_.is_object() || !j_.contains(key) || j_.at(key).is_null()) return nullptr;
    return &j_.at(key);
  }
  void integer(const std::string& key, std::int64_t& v, std::int64_t lo, std::int64_t hi = INT64_MAX) {
    if (auto* x = get(key)) {
      if (!x->is_number_integer() || x->get<std::int64_t>() < lo || x->get<std::int64_t>() > hi)
        fail(key, "expected an integer " + range_text(lo, hi) + ", got " + format_value(*x));
      else
        v = x->get<std::int64_t>();
    }
  }
  void number(const std::string& key, double& v, double lo, double hi, bool hi_open = false) {
    if (auto* x = get(key)) {
      if (!x->is_number() || x->get<double>() < lo ||
          (hi_open ? x->get<double>() >= hi : x->get<double>() > hi))
        fail(key, "expected a number in [" + fmt(lo) + ", " + fmt(hi) + (hi_open ? ")" : "]") + ", got " +
                      format_value(*x));
      else
        v = x->get<double>();
    }
  }
  void boolean(const std::string& key, bool& v) {
    if (auto* x = get(key)) {
      if (!x->is_boolean())
        fail(key, "expected true or false, got " + format_value(*x));
      else
        v = x->get<bool>();
    }
  }
  void string(const std::string& key, std::string& v) {
    if (auto* x = get(key)) {
      if (!x->is_string())
        fail(key, "expected a string, got " + format_value(*x));
      else
        v = x->get<std::string>();
    }
  }
  void choice(const std::string& key, std::string& v, const std::vector<std::string>& allowed) {
    std::string s = v;
    string(key, s);
    if (std::find(allowed.begin(), allowed.end(), s) == allowed.end())
      fail(key, "expected one of " + pipeline::join(allowed) + ", got \"" + s + "\"");
    else
      v = s;
  }
  void int_list(const std::string& key, std::vector<std::int64_t>& v, std::int64_t lo) {
    if (auto* x = get(key)) {
      bool good = x->is_array();
      if (good)
        for (auto& e : *x) good &= e.is_number_integer() && e.get<std::int64_t>() >= lo;
      if (!good)
        fail(key, "expected a list of integers >= " + std::to_string(lo) + ", got " + format_value(*x));
      else
        v = x->get<std::vector<std::int64_t>>();
    }
  }
  /// Errors for keys nobody asked for.
  void finish() {
    if (!st_.is_ok() || !j_.is_object()) return;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(used_.begin(), used_.end(), it.key()) == used_.end()) {
        fail(it.key(), "unknown key; expected one of " + pipeline::join(used_));
        return;
      }
  }

 private:
  static std::string fmt(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  }
  static std::string range_text(std::int64_t lo, std::int64_t hi) {
    return hi == INT64_MAX ? ">= " + std::to_string(lo)
                           : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  const json& j_;
  std::string file_, path_;
  std::vector<std::string> used_;
  Status st_;
};

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
  // yaml-cpp nodes are handles: walk with copies that alias the same tree.
  std::vector<YAML::Node> chain{root};
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node cur = chain.back();
    const std::string& p = parts[i];
    if (cur.IsSequence()) {
      std::size_t idx = 0;
      try {
        idx = std::stoul(p);
      } catch (...) {
        return invalid_argument("--set " + key + ": '" + p + "' is not an index of the sequence at " +
                                parts[i - 1]);
      }
      if (idx >= cur.size())
        return invalid_argument("--set " + key + ": index " + p + " out of range (size " +
                                std::to_string(cur.size()) + ")");
      chain.push_back(cur[idx]);
    } else {
      chain.push_back(cur[p]);
    }
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

Status parse_into(const json& j, const std::string& file, JobConfig& c) {
  if (!j.is_object())
    return invalid_config((file.empty() ? "config" : file) + ": expected a mapping at the top level");
  Section top(j, file, "");
  top.string("name", c.name);
  if (!std::regex_match(c.name, std::regex("[A-Za-z0-9._-]+")))
    top.fail("name", "expected letters, digits, '.', '_' or '-', got \"" + c.name + "\"");
  std::int64_t seed = static_cast<std::int64_t>(c.seed);
  top.integer("seed", seed, 0);
  c.seed = static_cast<std::uint64_t>(seed);
  SEGFLOW_RETURN_IF_ERROR(top.status());

  if (auto* d = top.get("data")) {
    Section s(*d, file, "data");
    s.string("root", c.data.root);
    if (auto* syn = s.get("synth")) {
      if (!syn->is_object())
        s.fail("synth", "expected a mapping of synth options, got " + format_value(*syn));
      else
        c.data.synth = *syn;
    }
    s.number("val_fraction", c.data.val_fraction, 0.0, 1.0, true);
    s.integer("val_cases", c.data.val_cases, 0);
    s.integer("num_classes", c.data.num_classes, 0);
    s.finish();
    SEGFLOW_RETURN_IF_ERROR(s.status());
  }
  const json* stages = top.get("stages");
  if (!stages)
    return invalid_config((file.empty() ? "config" : file) +
                          ": stages: expected a list of stages, got nothing");
  SEGFLOW_ASSIGN_OR_RETURN(c.stages, pipeline::parse_pipeline_spec(*stages, file, "stages"));

  const json* model = top.get("model");
  if (!model || !model->is_object() || !model->contains("name") || !(*model)["name"].is_string())
    return invalid_config((file.empty() ? "config" : file) +
                          ": model.name: expected a model name (unet, plain_unet, sam)");
  c.model_name = (*model)["name"].get<std::string>();
  c.model_options = *model;
  c.model_options.erase("name");
  for (const char* key : {"loss", "optimizer", "schedule"}) {
    if (auto* x = top.get(key)) {
      if (!x->is_object())
        return invalid_config(top.where(key) + ": expected a mapping, got " + format_value(*x));
      json& dst =
          std::string(key) == "loss" ? c.loss : (std::string(key) == "optimizer" ? c.optimizer : c.schedule);
      dst = *x;
    }
  }
  if (auto* t = top.get("train")) {
    Section s(*t, file, "train");
    auto& tr = c.train;
    s.integer("epochs", tr.epochs, 1);
    s.integer("batch_size", tr.batch_size, 1);
    s.integer("accumulate", tr.accumulate, 1);
    s.number("grad_clip", tr.grad_clip, 0.0, 1e12);
    s.choice("amp", tr.amp, {"none", "bf16", "fp16"});
    s.string("device", tr.device);
    if (!std::regex_match(tr.device, std::regex("auto|cpu|cuda(:[0-9]+)?")))
      s.fail("device", "expected auto, cpu, cuda or cuda:N, got \"" + tr.device + "\"");
    if (auto* x = s.get("devices")) {
      bool good = x->is_array();  // [] (the resolved default) = one trainer on train.device
      if (good)
        for (auto& e : *x)
          good &= e.is_string() && std::regex_match(e.get<std::string>(), std::regex("cpu|cuda(:[0-9]+)?"));
      if (!good)
        s.fail("devices", "expected a list of cpu, cuda or cuda:N (one data-parallel rank each), got " +
                              format_value(*x));
      else
        tr.devices = x->get<std::vector<std::string>>();
    }
    s.integer("val_interval", tr.val_interval, 0);
    s.integer("checkpoint_interval", tr.checkpoint_interval, 1);
    s.integer("steps_per_epoch", tr.steps_per_epoch, 0);
    s.choice("loader", tr.loader, {"actors", "simple"});
    s.integer("decode_workers", tr.decode_workers, 1, 256);
    s.integer("prefetch", tr.prefetch, 1, 1024);
    s.number("cache_rate", tr.cache_rate, 0.0, 1.0);
    s.integer("cache_bytes", tr.cache_bytes, 0);
    s.string("disk_cache", tr.disk_cache);
    s.integer("threads", tr.threads, 0, 1024);
    s.boolean("cudnn_benchmark", tr.cudnn_benchmark);
    s.boolean("channels_last", tr.channels_last);
    s.integer("log_every", tr.log_every, 1);
    s.finish();
    SEGFLOW_RETURN_IF_ERROR(s.status());
  }
  if (auto* v = top.get("validation")) {
    Section s(*v, file, "validation");
    s.int_list("roi_size", c.validation.roi_size, 1);
    s.number("overlap", c.validation.overlap, 0.0, 1.0, true);
    s.choice("mode", c.validation.mode, {"gaussian", "constant"});
    s.integer("sw_batch_size", c.validation.sw_batch_size, 1);
    s.finish();
    SEGFLOW_RETURN_IF_ERROR(s.status());
  }
  if (auto* o = top.get("output")) {
    Section s(*o, file, "output");
    s.string("runs_dir", c.runs_dir);
    s.finish();
    SEGFLOW_RETURN_IF_ERROR(s.status());
  }
  top.finish();
  SEGFLOW_RETURN_IF_ERROR(top.status());

  c.resolved = {
      {"name", c.name},
      {"seed", c.seed},
      {"data",
       {{"root", c.data.root},
        {"synth", c.data.synth},
        {"val_fraction", c.data.val_fraction},
        {"val_cases", c.data.val_cases},
        {"num_classes", c.data.num_classes}}},
      {"stages", pipeline::to_json(c.stages)},
      {"model",
       [&] {
         json m = c.model_options;
         m["name"] = c.model_name;
         return m;
       }()},
      {"loss", c.loss},
      {"optimizer", c.optimizer},
      {"schedule", c.schedule},
      {"train",
       {{"epochs", c.train.epochs},
        {"batch_size", c.train.batch_size},
        {"accumulate", c.train.accumulate},
        {"grad_clip", c.train.grad_clip},
        {"amp", c.train.amp},
        {"device", c.train.device},
        {"devices", c.train.devices},
        {"val_interval", c.train.val_interval},
        {"checkpoint_interval", c.train.checkpoint_interval},
        {"steps_per_epoch", c.train.steps_per_epoch},
        {"loader", c.train.loader},
        {"decode_workers", c.train.decode_workers},
        {"prefetch", c.train.prefetch},
        {"cache_rate", c.train.cache_rate},
        {"cache_bytes", c.train.cache_bytes},
        {"disk_cache", c.train.disk_cache},
        {"threads", c.train.threads},
        {"cudnn_benchmark", c.train.cudnn_benchmark},
        {"channels_last", c.train.channels_last},
        {"log_every", c.train.log_every}}},
      {"validation",
       {{"roi_size", c.validation.roi_size},
        {"overlap", c.validation.overlap},
        {"mode", c.validation.mode},
        {"sw_batch_size", c.validation.sw_batch_size}}},
      {"output", {{"runs_dir", c.runs_dir}}},
  };
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

std::string run_name(const JobConfig& cfg) {
  json key = cfg.resolved;
  // Settings that do not change the result do not change the folder.
  for (const char* k : {"loader", "decode_workers", "prefetch", "cache_bytes", "disk_cache", "log_every"})
    key["train"].erase(k);
  const std::string text = key.dump();
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ULL;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08llx", static_cast<unsigned long long>(h & 0xffffffffULL));
  return cfg.name + "-s" + std::to_string(cfg.seed) + "-" + buf;
}

}  // namespace segflow::models
