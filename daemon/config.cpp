#include "daemon/config.hpp"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "models/planning/plan.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/options.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using pipeline::OptionParser;
using pipeline::Range;

/// A folder path: a non-empty string.
void folder(OptionParser& p, const char* key, std::filesystem::path& field, const char* doc) {
  std::string s = field.string();
  p.string(key, s, doc);
  if (p.ok() && s.empty()) p.fail(key, "expected a folder path, got \"\"");
  field = s;
}

/// A key file of `curve`: a non-empty string.
void key_file(OptionParser& p, const char* key, std::filesystem::path& field, const char* doc) {
  std::string s = field.string();
  p.string(key, s, doc);
  if (p.ok() && p.given(key) && s.empty()) p.fail(key, "expected a path, got \"\"");
  field = s;
}

}  // namespace

void CurveSettings::bind(OptionParser& p) {
  key_file(p, "server_secret_key_file", server_secret_key_file, "the server's secret key (mode 0600)");
  key_file(p, "server_public_key_file", server_public_key_file, "optional: checked against the secret key");
  key_file(p, "authorized_clients_dir", authorized_clients_dir, "one client public key per file");
  if (!p.ok()) return;
  if (!server_secret_key_file.empty() && authorized_clients_dir.empty())
    p.fail("authorized_clients_dir", "required with server_secret_key_file");
  else if (server_secret_key_file.empty() &&
           (!authorized_clients_dir.empty() || !server_public_key_file.empty()))
    p.fail("server_secret_key_file", "required when curve is configured");
}

void AutoInferRule::bind(OptionParser& p) {
  if (!p.given("dataset"))
    return p.fail("dataset", "missing (auto_infer entries need dataset and checkpoint or model)");
  if (!p.given("checkpoint") && !p.given("model"))
    return p.fail("checkpoint", "missing (auto_infer entries need dataset and checkpoint or model)");
  if (p.given("checkpoint") && p.given("model"))
    return p.fail("model", "a model package names its checkpoints: give checkpoint or model, not both");
  p.string("dataset", dataset, "dataset folder under data_root whose new cases are inferred");
  if (p.ok() && (dataset.empty() || dataset[0] == '.' || dataset.find('/') != std::string::npos))
    return p.fail(
        "dataset",
        "expected a folder name under data_root (no '/', not starting with '.'), got \"" + dataset + "\"");
  std::string s = checkpoint.string();
  p.string("checkpoint", s, "best.pt / last.pt of a run; must exist when the daemon starts");
  if (p.ok() && p.given("checkpoint") && s.empty())
    return p.fail("checkpoint", "expected a checkpoint path, got \"\"");
  checkpoint = s;
  s = model.string();
  p.string("model", s, "model package folder (segflow package); must exist when the daemon starts");
  if (p.ok() && p.given("model") && s.empty()) return p.fail("model", "expected a package folder, got \"\"");
  model = s;
  s = output.string();
  p.string("output", s, "folder of the label maps <case>.nii.gz; \"\" = <state_dir>/inferred/<dataset>");
  output = s;
  p.choice("tta", tta, {"none", "mirror", "mirror-all"}, "test-time augmentation");
  if (p.ok() && !model.empty() && tta != "none")
    return p.fail("tta", "a model package sets its TTA; leave tta out");
  p.string("device", device, "device of the jobs: auto, cpu, cuda:N");
  if (p.ok() && device.empty()) return p.fail("device", "expected auto, cpu or cuda:N, got \"\"");
  p.choice("output_format", output_format, {"", "seg", "nifti", "both"},
           "seg (DICOM SEG), nifti or both; \"\" = seg for a DICOM series, nifti otherwise");
  p.string("send_to", send_to,
           "the DICOM destination the SEGs are queued for: a name of dicom.destinations or the AE title of "
           "dicom.send_to");
  p.number("quiet_seconds", quiet_seconds, pipeline::Range::non_negative(), "s",
           "a DICOM series is complete after this long without a new instance");
  if (p.ok() && !send_to.empty() && output_format == "nifti")
    return p.fail("send_to", "output_format nifti writes no DICOM SEG to send (use seg or both)");
  bind_prompts(p);
  options.bind(p, true);
  if (!p.ok()) return;
  // The request's own rules between fields, on the request each case's job will make (a
  // package, or box prompts): a sliding-window option with prompts, a postprocess with a package.
  models::InferRequest as_run = options;
  as_run.options.model = model;
  if (!prompts.empty()) as_run.boxes = prompts;  // any prompt source makes it box-prompted
  p.check(as_run.check(), "");
}

void AutoInferRule::bind_prompts(OptionParser& p) {
  p.choice("prompts", prompts, {"", "boxes", "label_map"},
           "box-prompted (sam) checkpoints: boxes (a box file per case in boxes_dir) or label_map (the "
           "case's label file)");
  std::string dir = boxes_dir.string();
  p.string("boxes_dir", dir, "prompts: boxes: folder of <case id>.json / .csv; \"\" = <dataset>/boxes");
  boxes_dir = dir;
  p.boolean("propagate", propagate, "one seed box per label, propagated slice by slice");
  p.integer("box_margin", box_margin, Range::at_least(0), "voxels",
            "propagate: voxels added per side to the previous slice's mask box (default 3)");
  if (!p.ok()) return;
  if (!model.empty() && !prompts.empty())
    return p.fail("prompts",
                  "a model package holds no box-prompted model (segflow package refuses them); "
                  "leave prompts out or give the sam checkpoint");
  if (prompts.empty())
    for (const char* k : {"boxes_dir", "propagate", "box_margin"})
      if (p.given(k)) return p.fail(k, "used only with prompts: boxes or label_map");
  if (p.given("boxes_dir") && prompts != "boxes")
    return p.fail("boxes_dir", "used only with prompts: boxes, got prompts: " + prompts);
  if (p.given("box_margin") && !propagate) return p.fail("box_margin", "used only with propagate: true");
  if (!prompts.empty() && tta != "none")
    return p.fail("tta", "box-prompted inference has no TTA; got " + tta);
}

namespace {

/// auto_train folds: "all" or a list of distinct fold numbers >= 0.
void bind_folds(OptionParser& p, AutoTrainRule& r) {
  const nlohmann::json* v = p.given("folds");
  if (v && v->is_string() && v->get<std::string>() == "all") {
    json ignored;
    p.json_value("folds", ignored, "list of integers or all", "folds to train");
    r.all_folds = true;
    r.folds.clear();
    return;
  }
  p.integer_list("folds", r.folds, Range::at_least(0), true, "folds to train, or all");
  if (p.ok() && v && r.folds.empty()) p.fail("folds", "expected a list of fold numbers or all, got []");
}

/// auto_train set: a mapping of job config keys to values, as "key=value" overrides that a job
/// config must accept.
void bind_set(OptionParser& p, AutoTrainRule& r) {
  json set = json::object();
  p.json_value("set", set, "mapping", "overrides of the training jobs: {train.epochs: 2, ...}");
  if (!p.ok()) return;
  if (!set.is_object())
    return p.fail("set", "expected a mapping {key: value}, got " + pipeline::format_value(set));
  r.set.clear();
  for (auto it = set.begin(); it != set.end(); ++it)
    r.set.push_back(it.key() + "=" +
                    (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
  // The keys and values are checked against a job config as the plans write them.
  auto cfg = models::parse_job_config(
      "name: auto_train\ndata: {root: .}\nstages: []\nmodel: {name: plain_unet}\n", p.path_of("set"), r.set);
  if (!cfg.is_ok()) p.add_error(invalid_config(cfg.status().message()));
}

}  // namespace

void AutoTrainRule::bind(OptionParser& p) {
  if (!p.given("dataset")) return p.fail("dataset", "missing (auto_train entries need a dataset)");
  p.string("dataset", dataset, "dataset folder under data_root (a name or a path), or \"*\" for any");
  if (p.ok() && (dataset.empty() || dataset[0] == '.'))
    return p.fail("dataset", "expected a folder of data_root or \"*\", got \"" + dataset + "\"");
  p.string("configuration", configuration, "configuration to train: 2d, 3d_fullres or 3d_lowres");
  if (p.ok())
    if (auto k = models::planning::parse_configuration(configuration); !k.is_ok())
      return p.fail("configuration", k.status().message());
  bind_folds(p, *this);
  bind_set(p, *this);
  p.number("memory_gb", memory_gb, Range::non_negative(), "GB", "the plan's memory target; 0 = 8");
  p.choice("memory_model", memory_model, {"", "nnunet", "measured"}, "the plan's memory model");
  std::vector<std::string> presets = models::planning::preset_names();
  presets.insert(presets.begin(), "");
  p.choice("preset", preset, presets, "which of nnU-Net's planners (segflow plan --preset); \"\" = default");
  p.string("device", device, "device of the plan and training jobs: auto, cpu, cuda:N");
  if (p.ok() && device.empty()) p.fail("device", "expected auto, cpu or cuda:N, got \"\"");
}

void DaemonConfig::bind(OptionParser& p) {
  folder(p, "data_root", data_root, "watched folder; each top-level folder is a dataset");
  folder(p, "state_dir", state_dir, "state.db, runs/, control.sock, events.sock");
  folder(p, "plugin_dir", plugin_dir, "stage plugins (*.so); a missing folder means none");
  p.string_list("devices", devices, true, "one running job per device: auto, cpu, cuda:N");
  if (p.ok())
    for (const auto& d : devices)
      if (d.empty()) {
        p.fail("devices", "expected a non-empty list of device names (auto, cpu, cuda:N), got an empty name");
        break;
      }
  p.string("control", control,
           "REP endpoint: ipc://PATH or tcp://HOST:PORT; \"\" = ipc://<state_dir>/control.sock");
  p.string("events", events,
           "PUB endpoint: ipc://PATH or tcp://HOST:PORT; \"\" = ipc://<state_dir>/events.sock");
  p.integer("max_request_bytes", max_request_bytes, Range::closed(256, double(std::int64_t{1} << 30)),
            "bytes", "larger requests get an error reply");
  p.number("rescan_interval_s", rescan_interval_s, Range::positive(), "s", "period of the full rescan");
  p.number("settle_s", settle_s, Range::positive(), "s", "a file whose size stays put this long is complete");
  p.choice("log_level", log_level, {"trace", "debug", "info", "warn", "error", "off"}, "log verbosity");
  p.integer("malloc_arena_max", malloc_arena_max, Range::closed(0, 1024), "arenas",
            "glibc malloc arenas; 0 = glibc's default; MALLOC_ARENA_MAX in the environment wins");
  p.section("curve", curve, "ZeroMQ CURVE keys of the server", "key");
  p.section("dicom", dicom, "DICOM storage node and result sender (daemon/dicom/config.hpp)", "key");
  json rules = json::array();
  p.json_value("auto_infer", rules, "list of mappings",
               "models run on each new case of a dataset: [{dataset, checkpoint, output, tta, device}]");
  if (!p.ok()) return;
  if (!rules.is_array())
    return p.fail("auto_infer", "expected a list of mappings, got " + pipeline::format_value(rules));
  auto_infer.clear();
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const std::string key = "auto_infer[" + std::to_string(i) + "]";
    if (!rules[i].is_object())
      return p.fail(key, "expected a mapping {dataset, checkpoint, output, tta, device}, got " +
                             pipeline::format_value(rules[i]));
    OptionParser nested(rules[i], p.path_of(key));
    nested.name_keys("key");
    AutoInferRule rule;
    rule.bind(nested);
    p.add_error(nested.finish());
    if (!p.ok()) return;
    for (const auto& other : auto_infer)
      if (other.dataset == rule.dataset)
        return p.fail(key + ".dataset", "dataset \"" + rule.dataset + "\" already has an auto_infer entry");
    auto_infer.push_back(std::move(rule));
  }
  bind_auto_train(p);
}

void DaemonConfig::bind_auto_train(OptionParser& p) {
  json rules = json::array();
  p.json_value("auto_train", rules, "list of mappings",
               "datasets planned and trained when they appear: [{dataset, configuration, folds, set, ...}]");
  if (!p.ok()) return;
  if (!rules.is_array())
    return p.fail("auto_train", "expected a list of mappings, got " + pipeline::format_value(rules));
  auto_train.clear();
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const std::string key = "auto_train[" + std::to_string(i) + "]";
    if (!rules[i].is_object())
      return p.fail(key, "expected a mapping {dataset, configuration, folds, set}, got " +
                             pipeline::format_value(rules[i]));
    OptionParser nested(rules[i], p.path_of(key));
    nested.name_keys("key");
    AutoTrainRule rule;
    rule.bind(nested);
    p.add_error(nested.finish());
    if (!p.ok()) return;
    for (const auto& other : auto_train)
      if (other.dataset == rule.dataset)
        return p.fail(key + ".dataset", "dataset \"" + rule.dataset + "\" already has an auto_train entry");
    auto_train.push_back(std::move(rule));
  }
}

Result<DaemonConfig> parse_daemon_config(const std::string& text, const std::string& file) {
  json j;
  try {
    YAML::Node root = YAML::Load(text);
    j = pipeline::yaml_to_json(root);
  } catch (const YAML::Exception& e) {
    return invalid_config(file + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  DaemonConfig c;
  c.file = file;
  if (j.is_null()) return c;  // an empty file: all defaults
  if (!j.is_object())
    return invalid_config(file + ": expected a mapping of daemon settings, got " + pipeline::format_value(j));
  OptionParser p(j, file + ": ");
  p.name_keys("key");
  c.bind(p);
  SEGFLOW_RETURN_IF_ERROR(p.finish());
  return c;
}

Result<DaemonConfig> load_daemon_config(const fs::path& file) {
  std::ifstream f(file);
  if (!f) return not_found(file.string() + ": cannot open the daemon config");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_daemon_config(ss.str(), file.string());
}

std::string default_control_endpoint(const fs::path& state_dir) {
  return "ipc://" + (state_dir / "control.sock").string();
}
std::string default_events_endpoint(const fs::path& state_dir) {
  return "ipc://" + (state_dir / "events.sock").string();
}

namespace {

/// Host part of "tcp://HOST:PORT" ("" when not tcp).
std::string tcp_host(const std::string& ep) {
  if (ep.rfind("tcp://", 0) != 0) return "";
  std::string rest = ep.substr(6);
  if (!rest.empty() && rest[0] == '[') {
    auto close = rest.find(']');
    return close == std::string::npos ? rest : rest.substr(1, close - 1);
  }
  auto colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

/// A box-prompted (sam) checkpoint needs prompts and any other takes none: the model's name
/// from the checkpoint's meta record (its tensors are not loaded). A checkpoint that cannot be
/// read is an error only with prompts; without, its jobs report it as for any checkpoint.
Status check_auto_infer_prompts(const AutoInferRule& r, const std::string& key) {
  if (!r.model.empty()) return Status::ok();  // packages: prompts refused by bind
  auto meta = models::read_checkpoint_meta(r.checkpoint);
  if (!meta.is_ok()) {
    if (r.prompts.empty()) return Status::ok();
    return invalid_config(key + ".checkpoint: " + r.checkpoint.string() +
                          ": cannot be read to check it takes box prompts: " + meta.status().message());
  }
  const json* name = nullptr;
  if (auto cfg = meta->find("config"); cfg != meta->end() && cfg->is_object())
    if (auto m = cfg->find("model"); m != cfg->end() && m->is_object())
      if (auto n = m->find("name"); n != m->end() && n->is_string()) name = &*n;
  const std::string model = name ? name->get<std::string>() : std::string("unknown");
  if (model == "sam" && r.prompts.empty())
    return invalid_config(key + ".prompts: missing: " + r.checkpoint.string() +
                          " is a box-prompted (sam) checkpoint; expected prompts: boxes (a box file per "
                          "case) or label_map (the case's label file)");
  if (model != "sam" && !r.prompts.empty())
    return invalid_config(key + ".prompts: " + r.checkpoint.string() +
                          " is not a box-prompted (sam) checkpoint (model '" + model +
                          "'); leave prompts, boxes_dir, propagate and box_margin out");
  return Status::ok();
}

}  // namespace

Status check_endpoint(const std::string& ep, const std::string& what) {
  if (ep.rfind("ipc://", 0) == 0) {
    const std::string path = ep.substr(6);
    if (path.empty() || path == "*")
      return invalid_config(what + ": ipc endpoint needs a path, got '" + ep + "'");
    if (path.size() > 100)  // sockaddr_un.sun_path holds 108 bytes
      return invalid_config(what + ": ipc socket path is too long (" + std::to_string(path.size()) +
                            " bytes, at most 100): " + path);
    return Status::ok();
  }
  if (ep.rfind("tcp://", 0) == 0) {
    const std::string rest = ep.substr(6);
    auto colon = rest.rfind(':');
    if (colon == std::string::npos || colon + 1 >= rest.size())
      return invalid_config(what + ": expected tcp://HOST:PORT, got '" + ep + "'");
    const std::string port = rest.substr(colon + 1);
    for (char ch : port)
      if (ch < '0' || ch > '9') return invalid_config(what + ": port must be a number, got '" + ep + "'");
    if (tcp_host(ep).empty()) return invalid_config(what + ": expected tcp://HOST:PORT, got '" + ep + "'");
    return Status::ok();
  }
  return invalid_config(what + ": expected ipc://PATH or tcp://HOST:PORT, got '" + ep + "'");
}

bool is_local_endpoint(const std::string& ep) {
  if (ep.rfind("ipc://", 0) == 0) return true;
  const std::string h = tcp_host(ep);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

Status finalize_daemon_config(DaemonConfig& c) {
  std::error_code ec;
  auto abs = [&](fs::path& p) {
    if (!p.empty()) p = fs::absolute(p, ec).lexically_normal();
  };
  abs(c.data_root);
  abs(c.state_dir);
  abs(c.plugin_dir);
  abs(c.curve.server_secret_key_file);
  abs(c.curve.server_public_key_file);
  abs(c.curve.authorized_clients_dir);
  if (c.control.empty()) c.control = default_control_endpoint(c.state_dir);
  if (c.events.empty()) c.events = default_events_endpoint(c.state_dir);
  const std::string where = c.file.empty() ? std::string("segflowd") : c.file.string();
  SEGFLOW_RETURN_IF_ERROR(dicom::check_dicom_files(c.dicom, where + ": "));
  for (std::size_t i = 0; i < c.auto_infer.size(); ++i) {
    AutoInferRule& r = c.auto_infer[i];
    const std::string key = where + ": auto_infer[" + std::to_string(i) + "]";
    abs(r.checkpoint);
    abs(r.model);
    if (r.output.empty()) r.output = c.state_dir / "inferred" / r.dataset;
    abs(r.output);
    if (!r.model.empty() && !fs::is_directory(r.model, ec))
      return invalid_config(key + ".model: " + r.model.string() +
                            ": no such folder (expected a model package)");
    if (r.model.empty() && !fs::is_regular_file(r.checkpoint, ec))
      return invalid_config(key + ".checkpoint: " + r.checkpoint.string() + ": no such file");
    if (fs::exists(r.output, ec) && !fs::is_directory(r.output, ec))
      return invalid_config(key + ".output: " + r.output.string() + ": expected a folder, got a file");
    if (!r.send_to.empty()) {
      auto target = c.dicom.resolve(r.send_to);
      if (!target.is_ok()) return invalid_config(key + ".send_to: " + target.status().message());
      r.send_target = *target;
    }
    if (r.prompts == "boxes" && r.boxes_dir.empty()) r.boxes_dir = c.data_root / r.dataset / "boxes";
    abs(r.boxes_dir);
    SEGFLOW_RETURN_IF_ERROR(check_auto_infer_prompts(r, key));
  }
  for (std::size_t i = 0; i < c.auto_train.size(); ++i) {
    AutoTrainRule& r = c.auto_train[i];
    if (r.dataset == "*" || r.dataset.find('/') == std::string::npos) continue;
    const fs::path p = fs::absolute(r.dataset, ec).lexically_normal();
    if (p.parent_path() != c.data_root)
      return invalid_config(where + ": auto_train[" + std::to_string(i) +
                            "].dataset: expected a folder of data_root " + c.data_root.string() + ", got " +
                            p.string());
    r.dataset = p.filename().string();
  }
  SEGFLOW_RETURN_IF_ERROR(check_endpoint(c.control, where + ": control"));
  SEGFLOW_RETURN_IF_ERROR(check_endpoint(c.events, where + ": events"));
  if (c.control == c.events)
    return invalid_config(where + ": control and events must be different endpoints");
  for (const auto* ep : {&c.control, &c.events}) {
    if (!is_local_endpoint(*ep) && !c.curve.enabled())
      return invalid_config(
          where + ": " + (ep == &c.control ? "control" : "events") + " endpoint " + *ep +
          " is not loopback or ipc: binding it needs CURVE keys (curve.server_secret_key_file, "
          "curve.authorized_clients_dir; make them with `segflow ctl keygen --out DIR`)");
  }
  return Status::ok();
}

}  // namespace segflow::daemon
