#include "actors/daemon/control.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "actors/daemon/dataset_watcher.hpp"
#include "actors/daemon/job_manager.hpp"
#include "actors/daemon/state_db.hpp"
#include "messages/log.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::actors::daemon {

using nlohmann::json;

json error_reply(const Status& st) {
  return {{"ok", false}, {"error", st.message()}, {"code", to_string(st.code())}};
}

namespace {

constexpr const char* kCommands =
    "start, stop, pause, resume, status, list, datasets, stages, ping, shutdown";

/// A value as it appears in an error message (shortened).
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s + " (" + v.type_name() + ")";
}

/// Typed access to a request's fields; every error names the field.
class Fields {
 public:
  Fields(const json& req, std::string cmd) : req_(req), cmd_(std::move(cmd)) {}

  Status only(std::initializer_list<const char*> allowed) const {
    for (auto it = req_.begin(); it != req_.end(); ++it) {
      if (it.key() == "cmd") continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || it.key() == a;
      if (ok) continue;
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      return invalid_argument(it.key() + ": unknown field for " + cmd_ +
                              (list.empty() ? " (it takes no fields)" : " (fields: " + list + ")"));
    }
    return Status::ok();
  }

  bool has(const char* k) const { return req_.contains(k); }

  Result<std::int64_t> job() const {
    if (!has("job")) return invalid_argument("job: missing (" + cmd_ + " needs a job id)");
    const json& v = req_["job"];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1)
      return invalid_argument("job: expected a job id (an integer >= 1), got " + shown(v));
    return v.get<std::int64_t>();
  }

  Result<std::optional<std::string>> string(const char* k) const {
    if (!has(k)) return std::optional<std::string>{};
    const json& v = req_[k];
    if (!v.is_string()) return invalid_argument(std::string(k) + ": expected a string, got " + shown(v));
    return std::optional<std::string>(v.get<std::string>());
  }

  Result<bool> boolean(const char* k) const {
    if (!has(k)) return false;
    const json& v = req_[k];
    if (!v.is_boolean())
      return invalid_argument(std::string(k) + ": expected true or false, got " + shown(v));
    return v.get<bool>();
  }

  Result<std::vector<std::string>> strings(const char* k) const {
    std::vector<std::string> out;
    if (!has(k)) return out;
    const json& v = req_[k];
    if (!v.is_array())
      return invalid_argument(std::string(k) + ": expected a list of strings, got " + shown(v));
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string())
        return invalid_argument(std::string(k) + "[" + std::to_string(i) + "]: expected a string, got " +
                                shown(v[i]));
      out.push_back(v[i].get<std::string>());
    }
    return out;
  }

 private:
  const json& req_;
  std::string cmd_;
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
                                        "), got " + shown(req["cmd"])));
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
    SEGFLOW_CHECK(f.only({"config", "path", "file", "set"}));
    SEGFLOW_TRY(config, f.string("config"));
    SEGFLOW_TRY(path, f.string("path"));
    SEGFLOW_TRY(file, f.string("file"));
    SEGFLOW_TRY(set, f.strings("set"));
    if (config && path) return error_reply(invalid_argument("config, path: give one of them, not both"));
    if (!config && !path)
      return error_reply(
          invalid_argument("config: missing (the job config as YAML text in config, or a file in path)"));
    if (path && file)
      return error_reply(invalid_argument("file: only with config (path names the file itself)"));
    std::string text, name;
    if (path) {
      std::ifstream in(*path);
      if (!in) return error_reply(not_found("path: " + *path + ": cannot read the job config"));
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
      name = *path;
    } else {
      text = *config;
      name = file && !file->empty() ? *file : "<inline config>";
    }
    SEGFLOW_TRY(r, jobs_.submit(text, name, set));
    return ok_reply(r);
  }
  if (cmd == "stop" || cmd == "resume") {
    SEGFLOW_CHECK(f.only({"job"}));
    SEGFLOW_TRY(id, f.job());
    SEGFLOW_TRY(r, cmd == "stop" ? jobs_.stop(id) : jobs_.resume(id));
    return ok_reply(r);
  }
  if (cmd == "pause") {
    SEGFLOW_CHECK(f.only({"job", "now"}));
    SEGFLOW_TRY(id, f.job());
    SEGFLOW_TRY(now, f.boolean("now"));
    SEGFLOW_TRY(r, jobs_.pause(id, now));
    return ok_reply(r);
  }
  if (cmd == "status") {
    SEGFLOW_CHECK(f.only({"job"}));
    if (f.has("job")) {
      SEGFLOW_TRY(id, f.job());
      SEGFLOW_TRY(r, jobs_.status(id));
      return ok_reply({{"job", r}});
    }
    return ok_reply({{"jobs", jobs_.status_all()}});
  }
  if (cmd == "list") {
    SEGFLOW_CHECK(f.only({}));
    json out = json::array();
    for (const auto& j : jobs_.status_all())
      out.push_back({{"id", j["id"]},
                     {"name", j["name"]},
                     {"state", j["state"]},
                     {"epoch", j["epoch"]},
                     {"epochs", j["epochs"]},
                     {"devices", j["devices"]},
                     {"reason", j["reason"]}});
    return ok_reply({{"jobs", out}});
  }
  if (cmd == "datasets") {
    SEGFLOW_CHECK(f.only({"dataset"}));
    SEGFLOW_TRY(only, f.string("dataset"));
    SEGFLOW_TRY(d, DatasetWatcher::describe(db_, only ? *only : ""));
    return ok_reply({{"datasets", d}, {"data_root", cfg_.data_root.string()}, {"ready", watcher_.ready()}});
  }
  if (cmd == "stages") {
    SEGFLOW_CHECK(f.only({}));
    return ok_reply({{"stages", pipeline::describe_stages(registry_)}});
  }
  if (cmd == "ping") {
    SEGFLOW_CHECK(f.only({}));
    return ok_reply({{"pid", static_cast<std::int64_t>(::getpid())},
                     {"version", "0.1.0"},
                     {"control", cfg_.control},
                     {"events", cfg_.events},
                     {"state_dir", cfg_.state_dir.string()},
                     {"data_root", cfg_.data_root.string()},
                     {"devices", jobs_.devices()}});
  }
  if (cmd == "shutdown") {
    SEGFLOW_CHECK(f.only({"now"}));
    SEGFLOW_TRY(now, f.boolean("now"));
    shutdown_ = true;
    shutdown_now_ = now;
    return ok_reply({{"shutting_down", true}});
  }
#undef SEGFLOW_TRY
#undef SEGFLOW_CHECK
  return error_reply(invalid_argument("cmd: unknown command '" + cmd + "' (one of " + kCommands + ")"));
}

}  // namespace segflow::actors::daemon
