#include "daemon/control.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "daemon/dataset_watcher.hpp"
#include "daemon/dicom/service.hpp"
#include "daemon/job_manager.hpp"
#include "daemon/state_db.hpp"
#include "messages/log.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::daemon {

using nlohmann::json;

json error_reply(const Status& st) {
  return {{"ok", false}, {"error", st.message()}, {"code", to_string(st.code())}};
}

namespace detail {

/// How a field is read (by pipeline::OptionParser, whose errors name the field: "job:
/// expected an integer >= 1, got -1").
enum class FieldType {
  job_id,   ///< an integer >= 1
  string,   ///< any string
  boolean,  ///< true or false
  strings,  ///< a list of strings
  number,   ///< a number > 0
  request,  ///< any JSON value, checked by the command's own binding (infer: models::InferRequest)
};

/// One field of a command. Null counts as absent.
struct Field {
  const char* name;
  FieldType type;
  bool required;    ///< absent: "<name>: missing (<cmd> needs <doc>)"
  const char* doc;  ///< what it is, a noun phrase
};

}  // namespace detail

using detail::Field;
using detail::FieldType;

namespace {

const Field kJobField = {"job", FieldType::job_id, true, "a job id"};

json ok_reply(const json& body) {
  json r = {{"ok", true}};
  for (auto it = body.begin(); it != body.end(); ++it) r[it.key()] = it.value();
  return r;
}

Status as_argument(const Status& st) { return st.is_ok() ? st : invalid_argument(st.message()); }

/// The deepest nesting of arrays and objects in `bytes`, read as JSON text (strings skipped).
int max_nesting(const std::string& bytes) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : bytes) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return max_depth;
}

/// The request as JSON, or the error reply for bytes that are not one JSON object.
Result<json> parse_request(const std::string& bytes) {
  // Deeply nested input would cost deep recursion when the value is destroyed: refuse it.
  if (max_nesting(bytes) > 32)
    return invalid_argument("malformed request: JSON nested deeper than 32 levels");
  json req;
  try {
    req = json::parse(bytes);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    return invalid_argument("malformed JSON: " + what);
  }
  if (!req.is_object())
    return invalid_argument(std::string("expected a JSON object {\"cmd\": ...}, got ") + req.type_name());
  return req;
}

/// Reads one field into `values` (only when given); errors stay in the parser.
void read_field(pipeline::OptionParser& p, const Field& f, json& values) {
  const bool given = p.given(f.name) != nullptr;
  switch (f.type) {
    case FieldType::job_id: {
      std::int64_t id = 0;
      p.integer(f.name, id, pipeline::Range::at_least(1), "", f.doc);
      if (given) values[f.name] = id;
      break;
    }
    case FieldType::string: {
      std::string v;
      p.string(f.name, v, f.doc);
      if (given) values[f.name] = v;
      break;
    }
    case FieldType::boolean: {
      bool v = false;
      p.boolean(f.name, v, f.doc);
      if (given) values[f.name] = v;
      break;
    }
    case FieldType::strings: {
      std::vector<std::string> v;
      p.string_list(f.name, v, false, f.doc);
      if (given) values[f.name] = v;
      break;
    }
    case FieldType::request: {
      json v;
      p.json_value(f.name, v, "any", f.doc);
      if (given) values[f.name] = v;
      break;
    }
    case FieldType::number: {
      double v = 0;
      p.number(f.name, v, pipeline::Range::positive(), "", f.doc);
      if (given) values[f.name] = v;
      break;
    }
  }
}

/// The job config of a `start`: its text and the name messages give it.
struct JobConfigText {
  std::string text, name;
};

}  // namespace

/// The fields of one request, read in the order of its command's entry and checked: each
/// present one has its type (absent ones read as "", false, [] and has() false).
struct ControlHandler::Request {
  json values = json::object();  ///< the fields given, by name

  bool has(const char* k) const { return values.contains(k); }
  std::string text(const char* k) const { return has(k) ? values.at(k).get<std::string>() : std::string(); }
  bool flag(const char* k) const { return has(k) && values.at(k).get<bool>(); }
  std::vector<std::string> list(const char* k) const {
    return has(k) ? values.at(k).get<std::vector<std::string>>() : std::vector<std::string>();
  }
  /// The job id (commands whose job field is required, or after has("job")).
  std::int64_t job() const { return values.at("job").get<std::int64_t>(); }
};

/// One command: its name, its fields (in reading order: the order the "expected ..." of an
/// unknown-field error lists them) and its handler, which returns the reply's fields.
struct ControlHandler::Command {
  const char* name;
  std::vector<Field> fields;
  Result<json> (*handle)(ControlHandler& h, const Request& r);

  /// The request's fields (all but "cmd"), checked against this entry.
  Result<Request> read(const json& req) const {
    json given = req;
    given.erase("cmd");
    pipeline::OptionParser p(given, "");
    p.name_keys("field", name);
    Request r;
    for (const Field& f : fields) {
      if (f.required && !p.given(f.name))
        return invalid_argument(std::string(f.name) + ": missing (" + name + " needs " + f.doc + ")");
      read_field(p, f, r.values);
      SEGFLOW_RETURN_IF_ERROR(as_argument(p.status()));
    }
    SEGFLOW_RETURN_IF_ERROR(as_argument(p.finish()));
    return r;
  }
};

namespace {

/// `start`'s config from its checked fields: inline text (config, named by file) or a file
/// the daemon reads (path).
Result<JobConfigText> start_config(const json& fields) {
  const bool has_config = fields.contains("config"), has_path = fields.contains("path");
  if (has_config && has_path) return invalid_argument("config, path: give one of them, not both");
  if (!has_config && !has_path)
    return invalid_argument("config: missing (the job config as YAML text in config, or a file in path)");
  if (has_path && fields.contains("file"))
    return invalid_argument("file: only with config (path names the file itself)");
  if (!has_path) {
    const std::string file = fields.value("file", std::string());
    return JobConfigText{fields.at("config").get<std::string>(), !file.empty() ? file : "<inline config>"};
  }
  const std::string path = fields.at("path").get<std::string>();
  std::ifstream in(path);
  if (!in) return not_found("path: " + path + ": cannot read the job config");
  std::stringstream ss;
  ss << in.rdbuf();
  return JobConfigText{ss.str(), path};
}

/// The fields `plan` and `train` share, in reading order: the planner's options.
std::vector<Field> plan_fields(bool train) {
  std::vector<Field> f = {
      {"dataset", FieldType::string, true, "a dataset folder, or a dataset of data_root"},
      {"out", FieldType::string, false, "the plan folder (default DATASET/.segflow-plans)"}};
  if (train) {
    f.push_back(
        {"configuration", FieldType::string, false, "the configuration to train (default 3d_fullres)"});
    f.push_back(
        {"folds", FieldType::strings, false, "the folds to train: numbers, or [\"all\"] (default [\"0\"])"});
    f.push_back({"set", FieldType::strings, false, "--set overrides of the training jobs: key=value"});
  } else {
    f.push_back(
        {"configurations", FieldType::strings, false, "configurations to plan: 2d, 3d_fullres, 3d_lowres"});
  }
  f.push_back({"memory_gb", FieldType::number, false, "the plan's memory target in GB (default 8)"});
  f.push_back({"memory_model", FieldType::string, false, "nnunet or measured (default measured)"});
  f.push_back({"preset", FieldType::string, false,
               "which of nnU-Net's planners: default, resenc-m, resenc-l or resenc-xl (default default)"});
  f.push_back(
      {"device", FieldType::string, false, "where the plan's trials run: a device (cpu, cuda:0) or auto"});
  return f;
}

/// The fields of `infer`: every field of an inference request (models/inference/infer_request.hpp).
std::vector<Field> infer_fields() {
  std::vector<Field> f;
  for (const models::InferField& x : models::infer_fields())
    f.push_back({x.key.data(), FieldType::request, false, x.help.data()});
  return f;
}

/// A plan request from the checked fields of `plan`, or of `train` (then it trains too).
Result<PlanJobSpec> plan_spec(const json& v, bool train) {
  PlanJobSpec s;
  s.dataset = v.at("dataset").get<std::string>();
  s.out = v.value("out", std::string());
  s.configurations = v.value("configurations", std::vector<std::string>());
  s.memory_gb = v.value("memory_gb", 0.0);
  s.memory_model = v.value("memory_model", std::string());
  s.preset = v.value("preset", std::string());
  s.device = v.value("device", std::string("auto"));
  if (!train) return s;
  s.train = v.value("configuration", std::string("3d_fullres"));
  s.overrides = v.value("set", std::vector<std::string>());
  for (const auto& f : v.value("folds", std::vector<std::string>{"0"})) {
    if (f == "all") {
      s.all_folds = true;
      continue;
    }
    char* end = nullptr;
    const long long k = std::strtoll(f.c_str(), &end, 10);
    if (f.empty() || *end != '\0' || k < 0)
      return invalid_argument("folds: expected fold numbers >= 0 or \"all\", got \"" + f + "\"");
    s.folds.push_back(k);
  }
  return s;
}

/// A `list` entry: the short form of a job's status.
json list_entry(const json& j) {
  return {{"id", j["id"]},       {"name", j["name"]},     {"kind", j["kind"]},       {"state", j["state"]},
          {"epoch", j["epoch"]}, {"epochs", j["epochs"]}, {"devices", j["devices"]}, {"reason", j["reason"]}};
}

json ping_reply(const DaemonConfig& cfg, const std::vector<std::string>& devices) {
  return {{"pid", static_cast<std::int64_t>(::getpid())},
          {"version", "0.1.0"},
          {"control", cfg.control},
          {"events", cfg.events},
          {"state_dir", cfg.state_dir.string()},
          {"data_root", cfg.data_root.string()},
          {"malloc_arena_max", cfg.malloc_arena_max},
          {"devices", devices}};
}

}  // namespace

// The commands: adding one is one entry here (and one in the client's table, apps/cmd_ctl.cpp).
// The order is the order error messages list them in.
const ControlHandler::Command ControlHandler::kCommands[] = {
    {"start",
     {{"config", FieldType::string, false, "the job config as YAML text"},
      {"path", FieldType::string, false, "a job config file the daemon reads"},
      {"file", FieldType::string, false, "the name of the config text in messages"},
      {"set", FieldType::strings, false, "--set overrides: key=value"}},
     [](ControlHandler& h, const Request& r) -> Result<json> {
       SEGFLOW_ASSIGN_OR_RETURN(JobConfigText cfg, start_config(r.values));
       return h.jobs_.submit(cfg.text, cfg.name, r.list("set"));
     }},
    {"infer", infer_fields(),
     [](ControlHandler& h, const Request& r) -> Result<json> {
       // Every option of `segflow infer`, checked by the request's binding; checkpoint, input
       // and output: submit_infer says which is missing.
       auto request = models::read_infer_request(r.values, "");
       if (!request.is_ok()) return as_argument(request.status());
       InferJobSpec spec;
       spec.request = std::move(*request);
       return h.jobs_.submit_infer(std::move(spec));
     }},
    {"plan", plan_fields(false),
     [](ControlHandler& h, const Request& r) -> Result<json> {
       SEGFLOW_ASSIGN_OR_RETURN(PlanJobSpec spec, plan_spec(r.values, false));
       return h.jobs_.submit_plan(std::move(spec));
     }},
    {"train", plan_fields(true),
     [](ControlHandler& h, const Request& r) -> Result<json> {
       SEGFLOW_ASSIGN_OR_RETURN(PlanJobSpec spec, plan_spec(r.values, true));
       return h.jobs_.submit_plan(std::move(spec));
     }},
    {"stop", {kJobField}, [](ControlHandler& h, const Request& r) { return h.jobs_.stop(r.job()); }},
    {"pause",
     {kJobField, {"now", FieldType::boolean, false, "stop at once instead of after the current epoch"}},
     [](ControlHandler& h, const Request& r) { return h.jobs_.pause(r.job(), r.flag("now")); }},
    {"resume", {kJobField}, [](ControlHandler& h, const Request& r) { return h.jobs_.resume(r.job()); }},
    {"status",
     {{"job", FieldType::job_id, false, "a job id; every job when absent"}},
     [](ControlHandler& h, const Request& r) -> Result<json> {
       if (!r.has("job")) return json{{"jobs", h.jobs_.status_all()}};
       SEGFLOW_ASSIGN_OR_RETURN(json job, h.jobs_.status(r.job()));
       return json{{"job", job}};
     }},
    {"list",
     {},
     [](ControlHandler& h, const Request&) -> Result<json> {
       json out = json::array();
       for (const auto& j : h.jobs_.status_all()) out.push_back(list_entry(j));
       return json{{"jobs", out}};
     }},
    {"datasets",
     {{"dataset", FieldType::string, false, "one dataset's name; all when absent"}},
     [](ControlHandler& h, const Request& r) -> Result<json> {
       SEGFLOW_ASSIGN_OR_RETURN(json d, DatasetWatcher::describe(h.db_, r.text("dataset")));
       return json{{"datasets", d}, {"data_root", h.cfg_.data_root.string()}, {"ready", h.watcher_.ready()}};
     }},
    {"stages",
     {},
     [](ControlHandler& h, const Request&) -> Result<json> {
       return json{{"stages", pipeline::describe_stages(h.registry_)}};
     }},
    {"ping",
     {},
     [](ControlHandler& h, const Request&) -> Result<json> { return ping_reply(h.cfg_, h.jobs_.devices()); }},
    {"shutdown",
     {{"now", FieldType::boolean, false, "stop running jobs at once instead of after their epoch"}},
     [](ControlHandler& h, const Request& r) -> Result<json> {
       h.shutdown_ = true;
       h.shutdown_now_ = r.flag("now");
       return json{{"shutting_down", true}};
     }},
    {"dicom",
     {{"send", FieldType::strings, false, "DICOM files (SEG results) to queue for dicom.send_to"},
      {"to", FieldType::string, false, "with send: a name of dicom.destinations instead of dicom.send_to"},
      {"fetch", FieldType::string, false, "a DICOMweb destination to fetch a study from"},
      {"study", FieldType::string, false, "with fetch: the StudyInstanceUID"},
      {"series", FieldType::string, false, "with fetch: one SeriesInstanceUID of the study"}},
     [](ControlHandler& h, const Request& r) -> Result<json> {
       if (!h.dicom_) return internal_error("the DICOM service is not running");
       return h.dicom_->command(
           {r.list("send"), r.text("to"), r.text("fetch"), r.text("study"), r.text("series")});
     }},
};

json ControlHandler::handle(const std::string& bytes, std::size_t frames) {
  try {
    if (frames != 1)
      return error_reply(invalid_argument("expected a request of one frame (one JSON object), got " +
                                          std::to_string(frames) + " frames"));
    if (static_cast<std::int64_t>(bytes.size()) > cfg_.max_request_bytes)
      return error_reply(invalid_argument("request of " + std::to_string(bytes.size()) +
                                          " bytes exceeds max_request_bytes (" +
                                          std::to_string(cfg_.max_request_bytes) + ")"));
    auto req = parse_request(bytes);
    if (!req.is_ok()) return error_reply(req.status());
    return dispatch(*req);
  } catch (const std::exception& e) {
    log::error(std::string("control: ") + e.what());
    return error_reply(internal_error(std::string("internal error: ") + e.what()));
  }
}

json ControlHandler::dispatch(const json& req) {
  std::string names;  // "start, infer, ...": from the table
  for (const Command& c : kCommands) names += (names.empty() ? "" : ", ") + std::string(c.name);
  if (!req.contains("cmd")) return error_reply(invalid_argument("cmd: missing (one of " + names + ")"));
  if (!req["cmd"].is_string())
    return error_reply(invalid_argument("cmd: expected a string (one of " + names + "), got " +
                                        pipeline::format_value(req["cmd"])));
  const std::string cmd = req["cmd"].get<std::string>();
  const auto* c = std::find_if(std::begin(kCommands), std::end(kCommands),
                               [&](const Command& e) { return cmd == e.name; });
  if (c == std::end(kCommands))
    return error_reply(invalid_argument("cmd: unknown command '" + cmd + "' (one of " + names + ")"));
  auto request = c->read(req);
  if (!request.is_ok()) return error_reply(request.status());
  auto body = c->handle(*this, *request);
  return body.is_ok() ? ok_reply(*body) : error_reply(body.status());
}

}  // namespace segflow::daemon
