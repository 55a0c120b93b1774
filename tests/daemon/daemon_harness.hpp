#pragma once
// Test harness for the daemon suite: the real segflowd as a child process (tests/child_process.hpp:
// killed when the guard dies, whatever happened), ZeroMQ request and subscription helpers, polling with
// generous timeouts (the test machine is slow under load), and a tiny training job.

#include <doctest/doctest.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "job_yaml.hpp"
#include "test_util.hpp"

namespace segflow::testing::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

/// The built segflowd: $SEGFLOWD_BIN, else next to segflow ($SEGFLOW_BIN/segflowd).
inline std::string segflowd_bin() {
  if (const char* d = std::getenv("SEGFLOWD_BIN")) return d;
  const char* b = std::getenv("SEGFLOW_BIN");
  return b ? std::string(b) + "/segflowd" : std::string("segflowd");
}

inline zmq::context_t& zmq_context() {
  static zmq::context_t ctx(1);
  return ctx;
}

/// segflowd started with `args`, its output appended to `log`.
inline ChildProcess start_segflowd(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> all = {segflowd_bin()};
  all.insert(all.end(), args.begin(), args.end());
  return ChildProcess(all, {}, log);
}

/// A key file's text without surrounding whitespace.
inline std::string trim_key(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

/// CURVE credentials of a client.
struct CurveClient {
  std::string server_public, client_public, client_secret;
};

/// Sends raw frames on a fresh REQ socket; the reply, or nothing within the timeout.
inline std::optional<std::string> request_frames(const std::string& endpoint,
                                                 const std::vector<std::string>& frames,
                                                 int timeout_ms = 20000, const CurveClient* curve = nullptr) {
  zmq::socket_t s(zmq_context(), zmq::socket_type::req);
  s.set(zmq::sockopt::linger, 0);
  if (curve) {
    s.set(zmq::sockopt::curve_serverkey, curve->server_public);
    s.set(zmq::sockopt::curve_publickey, curve->client_public);
    s.set(zmq::sockopt::curve_secretkey, curve->client_secret);
  }
  s.connect(endpoint);
  for (std::size_t i = 0; i < frames.size(); ++i)
    s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
  if (!(items[0].revents & ZMQ_POLLIN)) return std::nullopt;
  zmq::message_t m;
  if (!s.recv(m)) return std::nullopt;
  return m.to_string();
}

/// One JSON request; the parsed reply, or nothing within the timeout.
inline std::optional<json> request(const std::string& endpoint, const json& req, int timeout_ms = 20000,
                                   const CurveClient* curve = nullptr) {
  auto r = request_frames(endpoint, {req.dump()}, timeout_ms, curve);
  if (!r) return std::nullopt;
  return json::parse(*r);
}

/// A request that must be answered; returns the reply (ok or not).
inline json call(const std::string& endpoint, const json& req) {
  auto r = request(endpoint, req);
  REQUIRE_MESSAGE(r.has_value(), ("no reply to " + req.dump() + " from " + endpoint));
  return *r;
}

/// A request that must succeed; returns the reply.
inline json ok(const std::string& endpoint, const json& req) {
  json r = call(endpoint, req);
  REQUIRE_MESSAGE(r.value("ok", false), (req.dump() + " -> " + r.dump()));
  return r;
}

/// Polls `pred` every 250 ms for up to `timeout_s`; true when it held.
inline bool eventually(const std::function<bool()>& pred, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

/// A job's status object.
inline json job_status(const std::string& endpoint, std::int64_t id) {
  return ok(endpoint, {{"cmd", "status"}, {"job", id}})["job"];
}

/// Waits for a job to reach `state` (and `extra` to hold); fails with the daemon's log.
inline json wait_job(ChildProcess& d, const std::string& endpoint, std::int64_t id, const std::string& state,
                     double timeout_s, const std::function<bool(const json&)>& extra = {}) {
  json last;
  const bool reached = eventually(
      [&] {
        REQUIRE_MESSAGE(d.alive(), ("segflowd died:\n" + d.log_tail()));
        last = job_status(endpoint, id);
        return last["state"] == state && (!extra || extra(last));
      },
      timeout_s);
  REQUIRE_MESSAGE(reached, ("job " + std::to_string(id) + " did not reach " + state + "; last status " +
                            last.dump() + "\n--- segflowd log ---\n" + d.log_tail()));
  return last;
}

/// A SUB socket on the events endpoint collecting (topic, body) pairs.
class Events {
 public:
  Events(const std::string& endpoint, const std::string& prefix = "")
      : s_(zmq_context(), zmq::socket_type::sub) {
    s_.set(zmq::sockopt::linger, 0);
    s_.set(zmq::sockopt::rcvhwm, 0);
    s_.set(zmq::sockopt::subscribe, prefix);
    s_.connect(endpoint);
  }
  /// Receives what is there (waiting up to `wait_ms` for the first message).
  void drain(int wait_ms = 0) {
    for (;;) {
      zmq::pollitem_t items[] = {{s_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(wait_ms));
      if (!(items[0].revents & ZMQ_POLLIN)) return;
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(s_, std::back_inserter(parts))) return;
      if (parts.size() == 2) got.emplace_back(parts[0].to_string(), json::parse(parts[1].to_string()));
      wait_ms = 0;
    }
  }
  /// Waits until an event matches; returns it.
  std::optional<json> wait_for(const std::function<bool(const std::string&, const json&)>& pred,
                               double timeout_s) {
    std::size_t seen = 0;
    std::optional<json> hit;
    eventually(
        [&] {
          drain(100);
          for (; seen < got.size(); ++seen)
            if (pred(got[seen].first, got[seen].second)) {
              hit = got[seen].second;
              return true;
            }
          return false;
        },
        timeout_s);
    return hit;
  }
  std::vector<std::pair<std::string, json>> got;

 private:
  zmq::socket_t s_;
};

/// A daemon setup in a temporary folder: config file, data root, state folder.
struct Setup {
  TempDir dir{"segflowd"};
  fs::path data = dir / "data";
  fs::path state = dir / "state";
  fs::path config = dir / "daemon.yaml";
  std::string control = "ipc://" + (dir / "state" / "control.sock").string();
  std::string events = "ipc://" + (dir / "state" / "events.sock").string();

  /// Writes daemon.yaml with these extra lines.
  void write_config(const std::string& extra = "") const {
    write_file(config, "data_root: " + data.string() + "\nstate_dir: " + state.string() +
                           "\nplugin_dir: " + (dir / "plugins").string() +
                           "\nrescan_interval_s: 2\nsettle_s: 0.5\nlog_level: info\n" + extra);
  }
  /// Starts segflowd on this config and waits for it to answer ping.
  std::unique_ptr<ChildProcess> start(const std::string& log_name = "segflowd.log") const {
    auto d = std::make_unique<ChildProcess>(start_segflowd({"--config", config.string()}, dir / log_name));
    const bool up = eventually(
        [&] {
          REQUIRE_MESSAGE(d->alive(), ("segflowd exited at start:\n" + d->log_tail()));
          auto r = request(control, {{"cmd", "ping"}}, 1000);
          return r && r->value("ok", false);
        },
        120);
    REQUIRE_MESSAGE(up, ("segflowd did not answer ping:\n" + d->log_tail()));
    return d;
  }
};

/// The suites' tiny job (tests/test_util.hpp) for `epochs` epochs, logging every step.
inline std::string tiny_job(const fs::path& data_root, int epochs, const std::string& extra = "") {
  JobYaml job;
  job.root = data_root;
  job.epochs = epochs;
  job.train += ", log_every: 1";
  job.extra = extra;
  return job.yaml();
}

/// A synthetic NIfTI dataset `name` of `cases` 24^3 cases under `root`, made atomically
/// (written as NAME.partial, then renamed): the watcher sees it appear whole.
inline void make_dataset(const fs::path& root, const std::string& name, int cases, int seed = 9) {
  fs::create_directories(root);
  const fs::path partial = root / (name + ".partial");
  auto r = run_segflow("synth --cases " + std::to_string(cases) + " --size 24 --format nifti --seed " +
                       std::to_string(seed) + " --out " + shell_quote(partial.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  fs::rename(partial, root / name);
}

/// The `datasets` entry of `name` (null when the daemon lists no such dataset).
inline json dataset_entry(const std::string& control, const std::string& name) {
  json r = ok(control, {{"cmd", "datasets"}});
  for (const auto& d : r["datasets"])
    if (d["name"] == name) return d;
  return json();
}

/// Trains the tiny job for `epochs` epochs (or `job`, a job config on s.data / "tiny") in a
/// daemon on `s` and shuts it down; returns last.pt.
inline fs::path train_checkpoint(Setup& s, int epochs = 1, const std::string& job = "") {
  s.write_config();
  make_dataset(s.data, "tiny", 5, 9);
  auto d = s.start("train.log");
  const auto train = ok(s.control, {{"cmd", "start"},
                                    {"config", job.empty() ? tiny_job(s.data / "tiny", epochs) : job},
                                    {"file", "tiny.yaml"}})["job"]
                         .get<std::int64_t>();
  const json trained = wait_job(*d, s.control, train, "completed", 120);
  const fs::path checkpoint = fs::path(trained["run_dir"].get<std::string>()) / "last.pt";
  REQUIRE(fs::exists(checkpoint));
  ok(s.control, {{"cmd", "shutdown"}});
  REQUIRE_MESSAGE(d->wait_exit(60) == 0, d->log_tail());
  return checkpoint;
}

/// The epoch numbers of a run folder's metrics.jsonl epoch records, in file order.
inline std::vector<std::int64_t> epoch_records(const fs::path& run_dir) {
  std::vector<std::int64_t> out;
  std::ifstream f(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    json j = json::parse(line);
    if (j.value("type", "") == "epoch") out.push_back(j["epoch"].get<std::int64_t>());
  }
  return out;
}

/// Size, spacing, origin and direction of two images agree (SimpleITK reads both): what the
/// daemon's inference tests check of an output against its scan.
inline void check_same_grid(const std::filesystem::path& a, const std::filesystem::path& b) {
  const nlohmann::json ra = reference_read("sitk", a);
  const nlohmann::json rb = reference_read("sitk", b);
  CHECK(ra["size"] == rb["size"]);
  for (const char* k : {"spacing", "origin", "direction"}) {
    REQUIRE(ra[k].size() == rb[k].size());
    for (std::size_t i = 0; i < ra[k].size(); ++i)
      CHECK_MESSAGE(std::abs(ra[k][i].get<double>() - rb[k][i].get<double>()) < 1e-4,
                    (std::string(k) + " differs: " + ra[k].dump() + " vs " + rb[k].dump()));
  }
}

}  // namespace segflow::testing::daemon
