#include "actors/daemon/control.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "actors/daemon/dataset_watcher.hpp"
#include "actors/daemon/dicom_service.hpp"
#include "actors/daemon/job_manager.hpp"
#include "actors/daemon/state_db.hpp"
#include "messages/log.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::actors::daemon {

using nlohmann::json;

json error_reply(const Status& st) {
  return {{"ok", false}, {"error", st.message()}, {"code", to_string(st.code())}};
}

namespace {

constexpr const char* kCommands =
    "start, infer, stop, pause, resume, status, list, datasets, stages, ping, shutdown, dicom";

/// The fields of one request (all but "cmd"), read by the option reader: errors name the
/// field ("job: expected an integer >= 1, got -1", "bogus: unknown field for status; expected
/// job").
class Fields {
 public:
  Fields(const json& req, const std::string& cmd) : p_(without_cmd(req), "") { p_.name_keys("field", cmd); }

  /// The job id: required, an integer >= 1.
  Result<std::int64_t> job(const std::string& cmd) {
    std::int64_t id = 0;
    if (!p_.given("job")) return invalid_argument("job: missing (" + cmd + " needs a job id)");
    p_.integer("job", id, pipeline::Range::at_least(1), "", "the job id");
    SEGFLOW_RETURN_IF_ERROR(status());
    return id;
  }
  /// An optional string ("" when absent).
  Result<std::string> string(const char* key, const char* doc) {
    std::string v;
    p_.string(key, v, doc);
    SEGFLOW_RETURN_IF_ERROR(status());
    return v;
  }
  Result<bool> boolean(const char* key, const char* doc) {
    bool v = false;
    p_.boolean(key, v, doc);
    SEGFLOW_RETURN_IF_ERROR(status());
    return v;
  }
  Result<std::vector<std::string>> strings(const char* key, const char* doc) {
    std::vector<std::string> v;
    p_.string_list(key, v, false, doc);
    SEGFLOW_RETURN_IF_ERROR(status());
    return v;
  }
  bool has(const char* key) const { return p_.given(key) != nullptr; }
  /// Unknown fields, once every field of the command has been read.
  Status finish() { return as_argument(p_.finish()); }

 private:
  static json without_cmd(json req) {
    req.erase("cmd");
    return req;
  }
  static Status as_argument(const Status& st) { return st.is_ok() ? st : invalid_argument(st.message()); }
  Status status() const { return as_argument(p_.status()); }

  pipeline::OptionParser p_;
};

json ok_reply(json body = json::object()) {
  json r = {{"ok", true}};
  for (auto it = body.begin(); it != body.end(); ++it) r[it.key()] = it.value();
  return r;
}

}  // namespace

json ControlHandler::handle(const std::string& bytes, std::size_t frames) {
  try {
    if (frames != 1)
      return error_reply(invalid_argument("expected a request of one frame (one JSON object), got " +
                                          std::to_string(frames) + " frames"));
    if (static_cast<std::int64_t>(bytes.size()) > cfg_.max_request_bytes)
      return error_reply(invalid_argument("request of " + std::to_string(bytes.size()) +
                                          " bytes exceeds max_request_bytes (" +
                                          std::to_string(cfg_.max_request_bytes) + ")"));
    // Deeply nested input would cost deep recursion when the value is destroyed: refuse it.
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
    if (max_depth > 32)
      return error_reply(invalid_argument("malformed request: JSON nested deeper than 32 levels"));
    json req;
    try {
      req = json::parse(bytes);
    } catch (const json::parse_error& e) {
      std::string what = e.what();
      if (what.size() > 200) what = what.substr(0, 200) + "...";
      return error_reply(invalid_argument("malformed JSON: " + what));
    }
    if (!req.is_object())
      return error_reply(
          invalid_argument(std::string("expected a JSON object {\"cmd\": ...}, got ") + req.type_name()));
    return dispatch(req);
  } catch (const std::exception& e) {
    log::error(std::string("control: ") + e.what());
    return error_reply(internal_error(std::string("internal error: ") + e.what()));
  }
}

json ControlHandler::dispatch(const json& req) {
  if (!req.contains("cmd"))
    return error_reply(invalid_argument(std::string("cmd: missing (one of ") + kCommands + ")"));
  if (!req["cmd"].is_string())
    return error_reply(invalid_argument("cmd: expected a string (one of " + std::string(kCommands) +
                                        "), got " + pipeline::format_value(req["cmd"])));
  const std::string cmd = req["cmd"].get<std::string>();
  Fields f(req, cmd);
#define SEGFLOW_TRY(var, expr)                                \
  auto var##_r = (expr);                                      \
  if (!var##_r.is_ok()) return error_reply(var##_r.status()); \
  auto var = std::move(var##_r).value()
#define SEGFLOW_CHECK(expr)                    \
  do {                                         \
    Status _st = (expr);                       \
    if (!_st.is_ok()) return error_reply(_st); \
  } while (0)

  if (cmd == "start") {
    SEGFLOW_TRY(config, f.string("config", "the job config as YAML text"));
    SEGFLOW_TRY(path, f.string("path", "a job config file the daemon reads"));
    SEGFLOW_TRY(file, f.string("file", "the name of the config text in messages"));
    SEGFLOW_TRY(set, f.strings("set", "--set overrides: key=value"));
    SEGFLOW_CHECK(f.finish());
    if (f.has("config") && f.has("path"))
      return error_reply(invalid_argument("config, path: give one of them, not both"));
    if (!f.has("config") && !f.has("path"))
      return error_reply(
          invalid_argument("config: missing (the job config as YAML text in config, or a file in path)"));
    if (f.has("path") && f.has("file"))
      return error_reply(invalid_argument("file: only with config (path names the file itself)"));
    std::string text, name;
    if (f.has("path")) {
      std::ifstream in(path);
      if (!in) return error_reply(not_found("path: " + path + ": cannot read the job config"));
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
      name = path;
    } else {
      text = config;
      name = !file.empty() ? file : "<inline config>";
    }
    SEGFLOW_TRY(r, jobs_.submit(text, name, set));
    return ok_reply(r);
  }
  if (cmd == "infer") {
    InferJobSpec spec;
    SEGFLOW_TRY(checkpoint, f.string("checkpoint", "a checkpoint (best.pt, last.pt) of a run"));
    SEGFLOW_TRY(input, f.string("input", "a scan, a folder of scans or a dataset"));
    SEGFLOW_TRY(output, f.string("output", "a label map file (one scan) or a folder"));
    SEGFLOW_TRY(tta, f.string("tta", "test-time augmentation: none, mirror or mirror-all"));
    SEGFLOW_TRY(device, f.string("device", "a device (cpu, cuda:0) or auto"));
    SEGFLOW_CHECK(f.finish());
    spec.checkpoint = checkpoint;
    spec.input = input;
    spec.output = output;
    if (f.has("tta")) spec.tta = tta;
    if (f.has("device")) spec.device = device;
    SEGFLOW_TRY(r, jobs_.submit_infer(std::move(spec)));
    return ok_reply(r);
  }
  if (cmd == "stop" || cmd == "resume") {
    SEGFLOW_TRY(id, f.job(cmd));
    SEGFLOW_CHECK(f.finish());
    SEGFLOW_TRY(r, cmd == "stop" ? jobs_.stop(id) : jobs_.resume(id));
    return ok_reply(r);
  }
  if (cmd == "pause") {
    SEGFLOW_TRY(id, f.job(cmd));
    SEGFLOW_TRY(now, f.boolean("now", "stop at once instead of after the current epoch"));
    SEGFLOW_CHECK(f.finish());
    SEGFLOW_TRY(r, jobs_.pause(id, now));
    return ok_reply(r);
  }
  if (cmd == "status") {
    if (f.has("job")) {
      SEGFLOW_TRY(id, f.job(cmd));
      SEGFLOW_CHECK(f.finish());
      SEGFLOW_TRY(r, jobs_.status(id));
      return ok_reply({{"job", r}});
    }
    SEGFLOW_CHECK(f.finish());
    return ok_reply({{"jobs", jobs_.status_all()}});
  }
  if (cmd == "list") {
    SEGFLOW_CHECK(f.finish());
    json out = json::array();
    for (const auto& j : jobs_.status_all())
      out.push_back({{"id", j["id"]},
                     {"name", j["name"]},
                     {"kind", j["kind"]},
                     {"state", j["state"]},
                     {"epoch", j["epoch"]},
                     {"epochs", j["epochs"]},
                     {"devices", j["devices"]},
                     {"reason", j["reason"]}});
    return ok_reply({{"jobs", out}});
  }
  if (cmd == "datasets") {
    SEGFLOW_TRY(only, f.string("dataset", "one dataset's name; all when absent"));
    SEGFLOW_CHECK(f.finish());
    SEGFLOW_TRY(d, DatasetWatcher::describe(db_, only));
    return ok_reply({{"datasets", d}, {"data_root", cfg_.data_root.string()}, {"ready", watcher_.ready()}});
  }
  if (cmd == "stages") {
    SEGFLOW_CHECK(f.finish());
    return ok_reply({{"stages", pipeline::describe_stages(registry_)}});
  }
  if (cmd == "ping") {
    SEGFLOW_CHECK(f.finish());
    return ok_reply({{"pid", static_cast<std::int64_t>(::getpid())},
                     {"version", "0.1.0"},
                     {"control", cfg_.control},
                     {"events", cfg_.events},
                     {"state_dir", cfg_.state_dir.string()},
                     {"data_root", cfg_.data_root.string()},
                     {"malloc_arena_max", cfg_.malloc_arena_max},
                     {"devices", jobs_.devices()}});
  }
  if (cmd == "dicom") {
    SEGFLOW_TRY(send, f.strings("send", "DICOM files (SEG results) to queue for dicom.send_to"));
    SEGFLOW_CHECK(f.finish());
    if (!dicom_) return error_reply(internal_error("the DICOM service is not running"));
    SEGFLOW_TRY(r, dicom_->command(send));
    return ok_reply(r);
  }
  if (cmd == "shutdown") {
    SEGFLOW_TRY(now, f.boolean("now", "stop running jobs at once instead of after their epoch"));
    SEGFLOW_CHECK(f.finish());
    shutdown_ = true;
    shutdown_now_ = now;
    return ok_reply({{"shutting_down", true}});
  }
#undef SEGFLOW_TRY
#undef SEGFLOW_CHECK
  return error_reply(invalid_argument("cmd: unknown command '" + cmd + "' (one of " + kCommands + ")"));
}

}  // namespace segflow::actors::daemon
