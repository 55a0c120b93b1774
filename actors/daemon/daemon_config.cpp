#include "actors/daemon/daemon_config.hpp"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "pipeline/pipeline_spec.hpp"

namespace segflow::actors::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Status expect(bool ok, const std::string& where, const std::string& what, const json& got) {
  if (ok) return Status::ok();
  return invalid_config(where + ": expected " + what + ", got " + got.dump());
}

}  // namespace

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
    return invalid_config(file + ": expected a mapping of daemon settings, got " + j.dump());
  const std::string p = file + ": ";
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    const std::string where = file + ": " + k;
    if (k == "data_root" || k == "state_dir" || k == "plugin_dir") {
      SEGFLOW_RETURN_IF_ERROR(
          expect(v.is_string() && !v.get<std::string>().empty(), where, "a folder path", v));
      (k == "data_root" ? c.data_root : k == "state_dir" ? c.state_dir : c.plugin_dir) = v.get<std::string>();
    } else if (k == "devices") {
      bool ok = v.is_array() && !v.empty();
      if (ok)
        for (const auto& d : v) ok = ok && d.is_string() && !d.get<std::string>().empty();
      SEGFLOW_RETURN_IF_ERROR(expect(ok, where, "a non-empty list of device names (auto, cpu, cuda:N)", v));
      c.devices.clear();
      for (const auto& d : v) c.devices.push_back(d.get<std::string>());
    } else if (k == "control" || k == "events") {
      SEGFLOW_RETURN_IF_ERROR(expect(v.is_string(), where, "an endpoint (ipc://PATH or tcp://HOST:PORT)", v));
      (k == "control" ? c.control : c.events) = v.get<std::string>();
    } else if (k == "max_request_bytes") {
      SEGFLOW_RETURN_IF_ERROR(expect(v.is_number_integer() && v.get<std::int64_t>() >= 256 &&
                                         v.get<std::int64_t>() <= (std::int64_t{1} << 30),
                                     where, "an integer in [256, 2^30]", v));
      c.max_request_bytes = v.get<std::int64_t>();
    } else if (k == "rescan_interval_s" || k == "settle_s") {
      SEGFLOW_RETURN_IF_ERROR(
          expect(v.is_number() && v.get<double>() > 0, where, "a number of seconds > 0", v));
      (k == "rescan_interval_s" ? c.rescan_interval_s : c.settle_s) = v.get<double>();
    } else if (k == "log_level") {
      static const char* levels[] = {"trace", "debug", "info", "warn", "error", "off"};
      bool ok = false;
      if (v.is_string())
        for (const char* l : levels) ok = ok || v.get<std::string>() == l;
      SEGFLOW_RETURN_IF_ERROR(expect(ok, where, "one of trace, debug, info, warn, error, off", v));
      c.log_level = v.get<std::string>();
    } else if (k == "curve") {
      if (v.is_null()) continue;
      SEGFLOW_RETURN_IF_ERROR(expect(v.is_object(), where, "a mapping", v));
      for (auto ct = v.begin(); ct != v.end(); ++ct) {
        const std::string cw = where + "." + ct.key();
        SEGFLOW_RETURN_IF_ERROR(
            expect(ct->is_string() && !ct->get<std::string>().empty(), cw, "a path", *ct));
        if (ct.key() == "server_secret_key_file")
          c.curve.server_secret_key_file = ct->get<std::string>();
        else if (ct.key() == "server_public_key_file")
          c.curve.server_public_key_file = ct->get<std::string>();
        else if (ct.key() == "authorized_clients_dir")
          c.curve.authorized_clients_dir = ct->get<std::string>();
        else
          return invalid_config(cw +
                                ": unknown key; expected server_secret_key_file, server_public_key_file, "
                                "authorized_clients_dir");
      }
      if (!c.curve.server_secret_key_file.empty() && c.curve.authorized_clients_dir.empty())
        return invalid_config(where + ".authorized_clients_dir: required with server_secret_key_file");
      if (c.curve.server_secret_key_file.empty() &&
          (!c.curve.authorized_clients_dir.empty() || !c.curve.server_public_key_file.empty()))
        return invalid_config(where + ".server_secret_key_file: required when curve is configured");
    } else {
      return invalid_config(
          p + k +
          ": unknown key; expected data_root, state_dir, plugin_dir, devices, control, events, "
          "max_request_bytes, rescan_interval_s, settle_s, log_level, curve");
    }
  }
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

}  // namespace segflow::actors::daemon
