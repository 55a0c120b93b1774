// segflow ctl: the daemon client. One ZeroMQ REQ round trip per command (the protocol:
// docs/reference/control-protocol.md; the server's command table in daemon/control.cpp),
// readable output or the raw reply with --json. The commands are one table below
// ({name, request, print}); the usage text is made from it.
#include <zmq.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "apps/infer_args.hpp"
#include "daemon/curve.hpp"
#include "daemon/job_state.hpp"

namespace segflow::apps {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Client {
  std::string endpoint;
  int timeout_ms = 5000;
  std::string server_key, public_key, secret_key;  // CURVE when server_key is set
};

Result<json> call(const Client& c, const json& request) {
  try {
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::req);
    s.set(zmq::sockopt::linger, 0);
    if (!c.server_key.empty()) {
      s.set(zmq::sockopt::curve_serverkey, c.server_key);
      s.set(zmq::sockopt::curve_publickey, c.public_key);
      s.set(zmq::sockopt::curve_secretkey, c.secret_key);
    }
    try {
      s.connect(c.endpoint);
    } catch (const zmq::error_t& e) {
      return invalid_argument("--endpoint " + c.endpoint + ": " + e.what());
    }
    const std::string text = request.dump(-1, ' ', false, json::error_handler_t::replace);
    s.send(zmq::buffer(text), zmq::send_flags::none);
    zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, std::chrono::milliseconds(c.timeout_ms));
    if (!(items[0].revents & ZMQ_POLLIN)) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", c.timeout_ms / 1000.0);
      return io_error("no answer from " + c.endpoint + " within " + secs + " s (is segflowd running there" +
                      (c.server_key.empty() ? "" : ", and is this client's key authorized") + "?)");
    }
    zmq::message_t reply;
    if (!s.recv(reply, zmq::recv_flags::dontwait)) return io_error("no reply from " + c.endpoint);
    try {
      return json::parse(reply.to_string());
    } catch (const std::exception& e) {
      return corrupt_data("the daemon's reply is not JSON: " + std::string(e.what()));
    }
  } catch (const zmq::error_t& e) {
    return io_error(std::string("ZeroMQ: ") + e.what());
  }
}

/// j[k], or null when j is not an object or has no k (never UB on a const json).
json field(const json& j, const char* k) {
  if (!j.is_object()) return json();
  auto it = j.find(k);
  return it == j.end() ? json() : *it;
}

std::string num(const json& v, const char* fmt = "%.4g") {
  if (!v.is_number()) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v.get<double>());
  return buf;
}

std::string str(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  return v.dump();
}

std::string devices_text(const json& j) {
  std::string d;
  const json devs = field(j, "devices");
  if (devs.is_array())
    for (const auto& x : devs) d += (d.empty() ? "" : ",") + str(x);
  return d.empty() ? "-" : d;
}

void print_jobs(const json& jobs) {
  if (jobs.empty()) {
    std::printf("no jobs\n");
    return;
  }
  std::printf("%-4s %-22s %-10s %-9s %-7s %-8s %-7s %-10s %-7s %s\n", "ID", "NAME", "STATE", "EPOCH", "STEP",
              "LOSS", "DICE", "SAMPLES/S", "DEVICE", "REASON");
  for (const auto& j : jobs) {
    if (!j.is_object()) continue;
    const std::string epoch = str(j.value("epoch", json())) + "/" + str(j.value("epochs", json()));
    std::string state = str(j.value("state", json()));
    if (field(j, "pending").is_string()) state += "*";
    std::printf("%-4s %-22s %-10s %-9s %-7s %-8s %-7s %-10s %-7s %s\n", str(j.value("id", json())).c_str(),
                str(j.value("name", json())).c_str(), state.c_str(), epoch.c_str(),
                str(field(j, "step")).c_str(), num(j.value("loss", json())).c_str(),
                num(j.value("best_dice", json()), "%.3f").c_str(),
                num(j.value("samples_per_s", json()), "%.1f").c_str(), devices_text(j).c_str(),
                str(field(j, "reason")).c_str());
  }
}

void print_job(const json& j) {
  std::printf("job %s (%s): %s\n", str(field(j, "id")).c_str(), str(field(j, "name")).c_str(),
              str(field(j, "state")).c_str());
  auto line = [](const char* k, const std::string& v) {
    if (!v.empty() && v != "-") std::printf("  %-12s %s\n", k, v.c_str());
  };
  const std::string infer = daemon::to_string(daemon::JobKind::infer);
  if (field(j, "kind") == infer) {
    line("kind", infer);
    line("cases", str(field(j, "epoch")) + "/" + str(field(j, "epochs")));
    line("checkpoint", str(field(j, "checkpoint")));
    line("model", str(field(j, "model")));
    line("input", str(field(j, "input")));
    line("output", str(field(j, "output")));
    line("tta", str(field(j, "tta")));
    line("devices", devices_text(j));
    for (const auto& o : field(j, "outputs")) line("wrote", str(field(o, "output")));
    line("reason", str(field(j, "reason")));
    return;
  }
  if (field(j, "kind") == daemon::to_string(daemon::JobKind::plan)) {
    line("kind", "plan");
    line("dataset", str(field(j, "dataset_path")));
    line("plan folder", str(field(j, "plan_dir")));
    std::string configs;
    for (const auto& c : field(j, "configurations")) configs += (configs.empty() ? "" : ", ") + str(c);
    line("planned", configs);
    for (const auto& e : field(j, "excluded")) line("left out", str(field(e, "message")));
    std::string ids;
    for (const auto& id : field(j, "train_jobs")) ids += (ids.empty() ? "" : ", ") + str(id);
    line("train jobs", ids);
    line("devices", devices_text(j));
    line("reason", str(field(j, "reason")));
    return;
  }
  line("epoch", str(field(j, "epoch")) + "/" + str(field(j, "epochs")));
  line("step", str(field(j, "step")));
  line("loss", num(field(j, "loss")));
  line("best dice", num(field(j, "best_dice"), "%.4f"));
  line("samples/s", num(field(j, "samples_per_s"), "%.2f"));
  line("devices", devices_text(j));
  line("run folder", str(field(j, "run_dir")));
  line("dataset", str(field(j, "dataset")));
  line("config", str(field(j, "file")));
  line("pending", str(field(j, "pending")));
  line("reason", str(field(j, "reason")));
}

void print_datasets(const json& r) {
  const json& ds = field(r, "datasets");
  if (r.value("ready", true) == false) std::printf("(the first index of the data folder is still running)\n");
  if (ds.empty()) {
    std::printf("no datasets under %s\n", str(r.value("data_root", json())).c_str());
    return;
  }
  std::printf("%-20s %-11s %-6s %-9s %-11s %-4s %-8s %s\n", "DATASET", "LAYOUT", "CASES", "LABELLED",
              "UNLABELLED", "BAD", "PENDING", "PATH");
  for (const auto& d : ds) {
    std::printf("%-20s %-11s %-6s %-9s %-11s %-4s %-8s %s\n", str(field(d, "name")).c_str(),
                str(field(d, "layout")).c_str(), str(field(d, "cases")).c_str(),
                str(field(d, "labelled")).c_str(), str(field(d, "unlabelled")).c_str(),
                str(field(d, "bad")).c_str(), str(field(d, "pending")).c_str(),
                str(field(d, "path")).c_str());
    if (d.value("error", std::string()) != "")
      std::printf("  not a dataset: %s\n", str(field(d, "error")).c_str());
    for (const auto& b : field(d, "bad_files"))
      std::printf("  bad %s: %s\n", str(field(b, "case")).c_str(), str(field(b, "reason")).c_str());
    for (const auto& b : field(d, "pending_files"))
      std::printf("  pending %s: %s\n", str(field(b, "case")).c_str(), str(field(b, "reason")).c_str());
  }
}

void print_stages(const json& stages) {
  for (const auto& s : stages) {
    std::printf("%-24s %-13s %s\n", str(field(s, "name")).c_str(),
                s.value("deterministic", true) ? "deterministic" : "random",
                str(s.value("doc", json())).c_str());
  }
}

bool has_text(const json& v) { return v.is_string() && !v.get<std::string>().empty(); }

void print_dicom(const json& r) {
  const json node = field(r, "node");
  if (node.value("listening", false)) {
    std::string where = has_text(field(node, "address")) ? str(field(node, "address")) : "";
    if (has_text(field(node, "tls_address")))
      where += (where.empty() ? "" : " and ") + str(field(node, "tls_address")) + " (TLS)";
    std::printf("DICOM node %s at %s, dataset %s: %s active\n", str(field(node, "ae_title")).c_str(),
                where.c_str(), str(field(node, "dataset")).c_str(), str(field(node, "active")).c_str());
    if (has_text(field(node, "tls_address")))
      std::printf("  TLS handshakes refused: %s\n", str(field(node, "tls_handshakes_refused")).c_str());
    std::printf(
        "  associations: %s received, %s completed, %s refused, %s aborted, %s failed; %s bad connections\n",
        str(field(node, "associations_received")).c_str(), str(field(node, "associations_completed")).c_str(),
        str(field(node, "associations_refused")).c_str(), str(field(node, "associations_aborted")).c_str(),
        str(field(node, "associations_failed")).c_str(), str(field(node, "bad_connections")).c_str());
    std::printf("  instances: %s stored (%s bytes, %s cases written), %s refused; %s echoes\n",
                str(field(node, "instances_stored")).c_str(), str(field(node, "bytes_stored")).c_str(),
                str(field(node, "cases_written")).c_str(), str(field(node, "instances_refused")).c_str(),
                str(field(node, "echoes")).c_str());
    if (has_text(field(node, "last_error")))
      std::printf("  last error: %s\n", str(field(node, "last_error")).c_str());
    for (const auto& a : field(node, "recent"))
      std::printf("  #%s %s -> %s (%s): %s%s, %s instances\n", str(field(a, "id")).c_str(),
                  str(field(a, "calling_ae")).c_str(), str(field(a, "called_ae")).c_str(),
                  str(field(a, "peer")).c_str(), str(field(a, "outcome")).c_str(),
                  !has_text(field(a, "reason")) ? "" : (" (" + str(field(a, "reason")) + ")").c_str(),
                  str(field(a, "instances")).c_str());
  } else {
    std::printf("DICOM node: off (dicom.port and dicom.tls.port are 0)\n");
  }
  const json sender = field(r, "sender");
  std::printf("send queue to %s: %s queued, %s sent, %s failed\n",
              field(sender, "destination").is_null() ? "(dicom.send_to not set)"
                                                     : str(field(sender, "destination")).c_str(),
              str(field(sender, "queued")).c_str(), str(field(sender, "sent")).c_str(),
              str(field(sender, "failed")).c_str());
  const json destinations = field(sender, "destinations");  // kept alive: items() refers to it
  for (const auto& [name, where] : destinations.items())
    std::printf("  destination %s: %s\n", name.c_str(), str(where).c_str());
  for (const auto& q : field(sender, "sends")) {
    // "-> PACS_B (RECEIVER@host:port)": the named destination and where its last attempt went.
    std::string to = has_text(field(q, "target")) ? str(field(q, "target")) : "send_to";
    if (has_text(field(q, "destination"))) to += " (" + str(field(q, "destination")) + ")";
    std::printf(
        "  send %s %s -> %s: %s, %s attempts%s\n", str(field(q, "id")).c_str(),
        str(field(q, "source")).c_str(), to.c_str(), str(field(q, "state")).c_str(),
        str(field(q, "attempts")).c_str(),
        !has_text(field(q, "last_error")) ? "" : ("; last error: " + str(field(q, "last_error"))).c_str());
  }
  const json fetcher = field(r, "fetcher");
  if (fetcher.is_object()) {
    std::printf("fetches: %s queued, %s running, %s done, %s failed\n", str(field(fetcher, "queued")).c_str(),
                str(field(fetcher, "running")).c_str(), str(field(fetcher, "done")).c_str(),
                str(field(fetcher, "failed")).c_str());
    for (const auto& f : field(fetcher, "fetches")) {
      const std::string what = "study " + str(field(f, "study")) +
                               (has_text(field(f, "series")) ? " series " + str(field(f, "series")) : "");
      std::printf(
          "  fetch %s %s from %s: %s, %s/%s series, %s instances%s\n", str(field(f, "id")).c_str(),
          what.c_str(), str(field(f, "source")).c_str(), str(field(f, "state")).c_str(),
          str(field(f, "series_done")).c_str(), str(field(f, "series_total")).c_str(),
          str(field(f, "instances")).c_str(),
          !has_text(field(f, "last_error")) ? "" : ("; last error: " + str(field(f, "last_error"))).c_str());
    }
  }
  for (const auto& id : field(r, "queued")) std::printf("queued as send %s\n", str(id).c_str());
  if (!field(r, "fetch").is_null()) std::printf("queued as fetch %s\n", str(field(r, "fetch")).c_str());
}

Result<std::int64_t> job_arg(const Args& a, const std::string& cmd) {
  if (a.positional.size() != 2) return invalid_argument(cmd + ": expected one JOB id");
  auto v = parse_int("JOB", a.positional[1]);
  if (!v.is_ok()) return v.status();
  if (*v < 1) return invalid_argument("JOB: expected a job id >= 1, got " + a.positional[1]);
  return static_cast<std::int64_t>(*v);
}

int keygen(const Args& a) {
  if (!a.has("out")) return fail("ctl keygen", invalid_argument("--out DIR: required"));
  auto kp = daemon::write_keypair(a.get("out"));
  if (!kp.is_ok()) return fail("ctl keygen", kp.status());
  const fs::path dir = a.get("out");
  if (a.flag("json")) {
    std::cout << json{{"public_key", kp->public_key},
                      {"public_key_file", (dir / "public.key").string()},
                      {"secret_key_file", (dir / "secret.key").string()}}
                     .dump()
              << '\n';
  } else {
    std::printf("wrote %s and %s (mode 0600)\npublic key: %s\n", (dir / "public.key").c_str(),
                (dir / "secret.key").c_str(), kp->public_key.c_str());
  }
  return 0;
}

// ---- Requests: the JSON request of each command from its arguments ----

/// An error naming the first argument after the command when there are more than `allowed`
/// positional arguments (the command included).
Status no_more_arguments(const Args& a, std::size_t allowed) {
  if (a.positional.size() > allowed) return invalid_argument("unexpected argument '" + a.positional[1] + "'");
  return Status::ok();
}

/// Paths are sent absolute: the daemon's working folder is not the client's.
std::string absolute(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

Result<json> start_request(const Args& a) {
  if (a.positional.size() != 2) return invalid_argument("expected one CONFIG file");
  std::ifstream f(a.positional[1]);
  if (!f) return not_found(a.positional[1] + ": cannot open job config");
  std::stringstream ss;
  ss << f.rdbuf();
  return json{{"cmd", "start"}, {"config", ss.str()}, {"file", a.positional[1]}, {"set", a.all("set")}};
}

/// `ctl infer`: the flags of `segflow infer` as the request's fields (paths absolute), which
/// the daemon reads with the same binding (models/inference/infer_request.hpp).
Result<json> infer_request(const Args& a) {
  SEGFLOW_RETURN_IF_ERROR(no_more_arguments(a, 1));
  for (const char* k : {"input", "output"})
    if (!a.has(k)) return invalid_argument(std::string("--") + k + ": required");
  if (a.has("checkpoint") == a.has("model"))
    return invalid_argument(
        "--checkpoint or --model: expected one (a checkpoint, or a segflow package folder)");
  SEGFLOW_ASSIGN_OR_RETURN(json req, infer_fields_from_args(a, true));
  req["cmd"] = "infer";
  return req;
}

/// The planner's flags of `ctl plan` and `ctl train` into a request for DATASET (sent
/// absolute when it is a folder here, else as a name of the daemon's data_root).
Result<json> dataset_request(const Args& a, const char* cmd) {
  if (a.positional.size() != 2)
    return invalid_argument(std::string(cmd) + ": expected one DATASET folder or name");
  const std::string d = a.positional[1];
  json req = {{"cmd", cmd}, {"dataset", fs::is_directory(d) ? absolute(d) : d}};
  if (a.has("out")) req["out"] = absolute(a.get("out"));
  if (a.has("memory-gb")) {
    char* end = nullptr;
    const double g = std::strtod(a.get("memory-gb").c_str(), &end);
    if (*end != '\0' || !(g > 0))
      return invalid_argument("--memory-gb: expected a number > 0, got '" + a.get("memory-gb") + "'");
    req["memory_gb"] = g;
  }
  if (a.has("memory-model")) req["memory_model"] = a.get("memory-model");
  if (a.has("preset")) req["preset"] = a.get("preset");
  if (a.has("device")) req["device"] = a.get("device");
  return req;
}

Result<json> plan_request(const Args& a) {
  SEGFLOW_ASSIGN_OR_RETURN(json req, dataset_request(a, "plan"));
  if (a.has("configurations")) {
    json list = json::array();
    std::stringstream ss(a.get("configurations"));
    for (std::string c; std::getline(ss, c, ',');)
      if (!c.empty()) list.push_back(c);
    req["configurations"] = list;
  }
  return req;
}

Result<json> train_request(const Args& a) {
  SEGFLOW_ASSIGN_OR_RETURN(json req, dataset_request(a, "train"));
  if (a.has("configuration")) req["configuration"] = a.get("configuration");
  if (a.has("fold")) req["folds"] = a.all("fold");
  req["set"] = a.all("set");
  return req;
}

/// {"cmd": cmd, "job": JOB} from `ctl CMD JOB`.
Result<json> job_request(const Args& a, const std::string& cmd) {
  SEGFLOW_ASSIGN_OR_RETURN(std::int64_t id, job_arg(a, cmd));
  return json{{"cmd", cmd}, {"job", id}};
}

Result<json> pause_request(const Args& a) {
  SEGFLOW_ASSIGN_OR_RETURN(json req, job_request(a, "pause"));
  if (a.flag("now")) req["now"] = true;
  return req;
}

Result<json> status_request(const Args& a) {
  if (a.positional.size() <= 1) return json{{"cmd", "status"}};
  return job_request(a, "status");
}

/// A request of the command alone (no arguments).
Result<json> plain_request(const Args& a, const char* cmd) {
  SEGFLOW_RETURN_IF_ERROR(no_more_arguments(a, 1));
  return json{{"cmd", cmd}};
}

Result<json> datasets_request(const Args& a) {
  SEGFLOW_RETURN_IF_ERROR(no_more_arguments(a, 2));
  json req = {{"cmd", "datasets"}};
  if (a.positional.size() == 2) req["dataset"] = a.positional[1];
  return req;
}

Result<json> shutdown_request(const Args& a) {
  SEGFLOW_RETURN_IF_ERROR(no_more_arguments(a, 1));
  json req = {{"cmd", "shutdown"}};
  if (a.flag("now")) req["now"] = true;
  return req;
}

Result<json> dicom_request(const Args& a) {
  json req = {{"cmd", "dicom"}};
  const std::string sub = a.positional.size() > 1 ? a.positional[1] : "";
  const bool send = sub == "send" && a.positional.size() >= 3;
  const bool fetch = sub == "fetch" && a.positional.size() == 2;
  if (a.positional.size() > 1 && !send && !fetch)
    return invalid_argument(
        "expected `dicom`, `dicom send FILE ... [--to NAME]` or `dicom fetch --from NAME --study UID "
        "[--series UID]`");
  if (!send && a.has("to")) return invalid_argument("--to: only with `dicom send FILE ...`");
  for (const char* k : {"from", "study", "series"})
    if (!fetch && a.has(k)) return invalid_argument(std::string("--") + k + ": only with `dicom fetch`");
  if (send) {
    json files = json::array();
    for (std::size_t i = 2; i < a.positional.size(); ++i) files.push_back(absolute(a.positional[i]));
    req["send"] = files;
    if (a.has("to")) req["to"] = a.get("to");
  }
  if (fetch) {
    if (!a.has("from")) return invalid_argument("--from: missing (the DICOMweb destination to fetch from)");
    if (!a.has("study")) return invalid_argument("--study: missing (the StudyInstanceUID to fetch)");
    req["fetch"] = a.get("from");
    req["study"] = a.get("study");
    if (a.has("series")) req["series"] = a.get("series");
  }
  return req;
}

// ---- Replies: each command's reply, readable ----

void print_submitted(const json& r) {
  std::printf("job %s %s (run folder %s)\n", str(field(r, "job")).c_str(), str(field(r, "state")).c_str(),
              str(field(r, "run_dir")).c_str());
}

void print_infer_submitted(const json& r) {
  std::printf("job %s %s (inference into %s)\n", str(field(r, "job")).c_str(), str(field(r, "state")).c_str(),
              str(field(r, "output")).c_str());
}

void print_plan_submitted(const json& r) {
  std::printf("job %s %s (plan of %s into %s)\n", str(field(r, "job")).c_str(),
              str(field(r, "state")).c_str(), str(field(r, "dataset")).c_str(),
              str(field(r, "plan_dir")).c_str());
}

/// stop, pause, resume: the state, and the request still pending.
void print_job_state(const json& r) {
  const json pending = field(r, "pending");
  const std::string note =
      pending.is_string() ? " (" + pending.get<std::string>() + " pending: a checkpoint is written first)"
                          : "";
  std::printf("job %s: %s%s\n", str(field(r, "job")).c_str(), str(field(r, "state")).c_str(), note.c_str());
}

void print_status(const json& r) {
  if (r.contains("job"))
    print_job(field(r, "job"));
  else
    print_jobs(field(r, "jobs"));
}

void print_list(const json& r) { print_jobs(field(r, "jobs")); }
void print_stage_list(const json& r) { print_stages(field(r, "stages")); }

void print_ping(const json& r) {
  std::printf("segflowd pid %s: control %s, events %s, devices %s\n", str(field(r, "pid")).c_str(),
              str(field(r, "control")).c_str(), str(field(r, "events")).c_str(), devices_text(r).c_str());
}

void print_shutdown(const json&) {
  std::printf("segflowd is shutting down (running jobs write a checkpoint first)\n");
}

// ---- The commands ----

/// One `segflow ctl` command. Adding one is one entry here (and one in the server's table,
/// daemon/control.cpp).
struct CtlCommand {
  const char* name;
  const char* synopsis;  ///< its usage line after the two-space indent
  const char* help;      ///< what it does ('\n' continues it); "": shares a line with its neighbours
  Result<json> (*request)(const Args& a);  ///< the request from the arguments
  void (*print)(const json& reply);        ///< the reply, readable (--json prints it as it is)
  int (*local)(const Args& a);             ///< instead of a request: a command that needs no daemon
};

// clang-format off
const CtlCommand kCtlCommands[] = {
    {"start", "start CONFIG [--set key=value ...]", "submit a job (the config is sent inline); prints its id",
     start_request, print_submitted, nullptr},
    {"infer", "infer (--checkpoint PT ... | --model MODEL_DIR) --input PATH --output PATH\n"
              "       [every option of segflow infer: --device D, --tta, --overlap, --amp, --boxes ...]",
     "queue an inference job (a scan, a folder or a dataset; --model: a segflow package)", infer_request,
     print_infer_submitted, nullptr},
    {"plan", "plan DATASET [--configurations 2d,3d_fullres,3d_lowres] [--preset P] [--memory-gb G]\n"
             "       [--memory-model M] [--device D] [--out DIR]",
     "queue a plan job: fingerprint and plan a dataset (default into DATASET/.segflow-plans)",
     plan_request, print_plan_submitted, nullptr},
    {"train", "train DATASET [--configuration C] [--fold K|all ...] [--set key=value ...] [plan flags]",
     "plan (or reuse a current plan), then queue one training job per fold (default 0)",
     train_request, print_plan_submitted, nullptr},
    {"stop", "stop JOB", "", [](const Args& a) { return job_request(a, "stop"); }, print_job_state, nullptr},
    {"pause", "pause JOB [--now]", "", pause_request, print_job_state, nullptr},
    {"resume", "resume JOB", "", [](const Args& a) { return job_request(a, "resume"); },
     print_job_state, nullptr},
    {"status", "status [JOB]", "state, epoch, step, loss, best Dice, samples/s, devices",
     status_request, print_status, nullptr},
    {"list", "list", "", [](const Args& a) { return plain_request(a, "list"); }, print_list, nullptr},
    {"datasets", "datasets", "", datasets_request, print_datasets, nullptr},
    {"stages", "stages", "", [](const Args& a) { return plain_request(a, "stages"); },
     print_stage_list, nullptr},
    {"ping", "ping", "", [](const Args& a) { return plain_request(a, "ping"); }, print_ping, nullptr},
    {"shutdown", "shutdown [--now]", "stop the daemon (running jobs checkpoint first)",
     shutdown_request, print_shutdown, nullptr},
    {"dicom", "dicom [send FILE ... [--to NAME] | fetch --from NAME --study UID [--series UID]]",
     "the DICOM node (associations, instances, failures),\n"
     "the send queue and the fetches; `send` queues result files\n"
     "for dicom.send_to (--to: a destination by name); `fetch`\n"
     "pulls a study from a DICOMweb destination (QIDO-RS,\n"
     "WADO-RS) into the node's dataset",
     dicom_request, print_dicom, nullptr},
    {"keygen", "keygen --out DIR", "write a CURVE key pair: DIR/public.key, DIR/secret.key",
     nullptr, nullptr, keygen},
};
// clang-format on

const CtlCommand* find_command(const std::string& name) {
  auto it = std::find_if(std::begin(kCtlCommands), std::end(kCtlCommands),
                         [&](const CtlCommand& c) { return name == c.name; });
  return it == std::end(kCtlCommands) ? nullptr : it;
}

/// The daemon's commands, each with a help on its own line (the help at column 40), the ones
/// without on a shared line ("stop JOB | pause JOB [--now] | resume JOB").
std::string ctl_commands_text() {
  constexpr std::size_t kHelpColumn = 40;
  std::string u = "commands:\n";
  std::string shared;
  for (const CtlCommand& c : kCtlCommands) {
    if (*c.help == '\0') {
      shared += (shared.empty() ? "  " : " | ") + std::string(c.synopsis);
      continue;
    }
    if (!shared.empty()) u += shared + "\n";
    shared.clear();
    std::string line = "  " + std::string(c.synopsis);
    line = line.size() + 3 <= kHelpColumn ? line + std::string(kHelpColumn - line.size(), ' ')
                                          : line + "\n" + std::string(kHelpColumn, ' ');
    u += line + wrap_text(c.help, kHelpColumn, kHelpColumn) + "\n";
  }
  if (!shared.empty()) u += shared + "\n";
  return u;
}

constexpr Option kCtlConnectionOptions[] = {
    {"endpoint", "E",
     "the daemon's control endpoint; default $SEGFLOW_CTL_ENDPOINT, else ipc://state/control.sock "
     "(segflowd's default with state_dir \"state\")"},
    {"timeout", "S", "seconds to wait for the reply, (0, 3600]; default 5"},
    {"json", "", "print the daemon's JSON reply instead of readable lines"},
    {"curve-server-key", "FILE", "the server's public key (CURVE); goes with --curve-client-keys"},
    {"curve-client-keys", "DIR", "a folder with this client's public.key and secret.key"},
};
constexpr Option kCtlCommandOptions[] = {
    {"set", "key=value", "start, train: override a config key (repeatable)"},
    {"device", "D", "infer, plan, train: the device (cpu, cuda, cuda:N)"},
    {"configurations", "2d,3d_fullres,3d_lowres", "plan: which configurations to plan"},
    {"configuration", "C", "train: the configuration to train; default 3d_fullres"},
    {"fold", "K|all", "train: the folds to queue (repeatable); default 0"},
    {"memory-gb", "G", "plan, train: the planner's memory target, > 0"},
    {"memory-model", "measured|nnunet", "plan, train: the planner's memory model"},
    {"preset", "default|resenc-m|resenc-l|resenc-xl",
     "plan, train: which of nnU-Net's planners (segflow plan --preset)"},
    {"out", "DIR",
     "plan, train: the plan folder (default DATASET/.segflow-plans); keygen: where the keys go"},
    {"now", "", "pause: at the next step instead of the end of the epoch; shutdown: without waiting"},
    {"to", "NAME", "dicom send: the destination (dicom.send_to) to send to by name"},
    {"from", "NAME", "dicom fetch: the DICOMweb destination to pull from"},
    {"study", "UID", "dicom fetch: the StudyInstanceUID to pull"},
    {"series", "UID", "dicom fetch: only this SeriesInstanceUID of the study"},
};

/// `ctl infer`'s options: every option of `segflow infer` (its request's fields) but --device,
/// which plan and train share.
std::span<const Option> ctl_infer_options() {
  static const std::vector<Option> options = [] {
    std::vector<Option> o;
    for (const char* group :
         {"", "sliding window (not with box prompts)", "model package", "box prompts (a sam checkpoint)"})
      for (const Option& x : infer_flags(group, {"device"})) o.push_back(x);
    return o;
  }();
  return options;
}

/// "start, infer, ..., keygen": the names of the table.
std::string command_names() {
  std::string names;
  for (const CtlCommand& c : kCtlCommands) names += (names.empty() ? "" : ", ") + std::string(c.name);
  return names;
}

/// The connection from --endpoint, --timeout and the CURVE key options.
Result<Client> make_client(const Args& a) {
  Client c;
  const char* env = std::getenv("SEGFLOW_CTL_ENDPOINT");
  c.endpoint = a.get("endpoint", env && *env ? env : "ipc://state/control.sock");
  if (a.has("timeout")) {
    char* end = nullptr;
    const std::string t = a.get("timeout");
    const double s = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || !(s > 0) || s > 3600)
      return invalid_argument("--timeout: expected seconds in (0, 3600], got '" + t + "'");
    c.timeout_ms = static_cast<int>(std::lround(s * 1000));
  }
  if (a.has("curve-server-key") != a.has("curve-client-keys"))
    return invalid_argument("--curve-server-key and --curve-client-keys go together");
  if (!a.has("curve-server-key")) return c;
  auto sk = daemon::read_key_file(a.get("curve-server-key"));
  if (!sk.is_ok()) return sk.status().with_context("--curve-server-key");
  const fs::path dir = a.get("curve-client-keys");
  auto pk = daemon::read_key_file(dir / "public.key");
  if (!pk.is_ok()) return pk.status().with_context("--curve-client-keys");
  auto sec = daemon::read_key_file(dir / "secret.key");
  if (!sec.is_ok()) return sec.status().with_context("--curve-client-keys");
  c.server_key = *sk;
  c.public_key = *pk;
  c.secret_key = *sec;
  return c;
}

/// The reply printed (readable, or raw with --json); an error reply goes to stderr.
int show_reply(const CtlCommand& c, const json& r, bool raw, const std::string& where) {
  const bool ok = r.is_object() && r.value("ok", false);
  if (raw) {
    std::cout << r.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    if (!ok)
      std::fprintf(stderr, "segflow %s: %s\n", where.c_str(),
                   r.value("error", std::string("failed")).c_str());
    return ok ? 0 : 1;
  }
  if (!ok) {
    std::fprintf(stderr, "segflow %s: %s\n", where.c_str(),
                 r.is_object() ? r.value("error", std::string("failed")).c_str() : "unexpected reply");
    return 1;
  }
  c.print(r);
  return 0;
}

}  // namespace

const Command& ctl_command() {
  static const Command c{
      "ctl",
      cmd_ctl,
      {{"",
        "ctl [--endpoint E] [--json] [--timeout S] [--curve-server-key FILE --curve-client-keys DIR] "
        "COMMAND ...",
        "talk to segflowd: one request per call, readable output or its JSON reply",
        "docs/how-to/daemon.md, docs/reference/control-protocol.md",
        {{"COMMAND ...", "one of the commands below, with its arguments"}},
        {{"connection (every command)", kCtlConnectionOptions},
         {"command options", kCtlCommandOptions},
         {"infer (as segflow infer)", ctl_infer_options()}}}},
      ctl_commands_text};
  return c;
}

int cmd_ctl(int argc, char** argv) {
  auto parsed = parse_args(argc, argv, 2, ctl_command().forms.front());
  if (!parsed.is_ok()) return fail("ctl", parsed.status());
  const Args& a = *parsed;
  if (a.positional.empty()) {
    std::fputs(help_text(ctl_command()).c_str(), stderr);
    return 2;
  }
  const std::string cmd = a.positional[0];
  const CtlCommand* c = find_command(cmd);
  if (c && c->local) return c->local(a);
  const std::string where = "ctl " + cmd;
  auto client = make_client(a);  // before the command is known, as the options apply to all
  if (!client.is_ok()) return fail(where, client.status());
  if (!c) return fail("ctl", invalid_argument("unknown command '" + cmd + "' (" + command_names() + ")"));
  auto request = c->request(a);
  if (!request.is_ok()) return fail(where, request.status());
  auto reply = call(*client, *request);
  if (!reply.is_ok()) return fail(where, reply.status());
  return show_reply(*c, *reply, a.flag("json"), where);
}

}  // namespace segflow::apps
