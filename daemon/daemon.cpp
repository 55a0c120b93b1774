#include "daemon/daemon.hpp"

#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/auto_infer.hpp"
#include "daemon/auto_train.hpp"
#include "daemon/control.hpp"
#include "daemon/curve.hpp"
#include "daemon/dataset_watcher.hpp"
#include "daemon/dicom/service.hpp"
#include "daemon/job_manager.hpp"
#include "daemon/state_db.hpp"
#include "messages/log.hpp"
#include "pipeline/plugin.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::atomic<int> g_stop_requests{0};

void on_stop_signal(int) { request_daemon_stop(); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// Caps glibc's malloc arenas before the daemon's threads start. With glibc's default (8 per
/// core) the control threads and a training job's threads each kept memory in arenas of their
/// own, and RSS climbed for as long as both ran (bench/daemon_soak.py, bench/RESULTS.md).
/// MALLOC_ARENA_MAX in the environment wins (glibc has read it already); the value in effect
/// is written back to cfg so that `ping` reports it.
void apply_malloc_arena_max(DaemonConfig& cfg) {
  if (const char* env = std::getenv("MALLOC_ARENA_MAX"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long n = std::strtoll(env, &end, 10);
    cfg.malloc_arena_max = (end != env && n > 0) ? n : 0;
    return;
  }
#if defined(__GLIBC__)
  if (cfg.malloc_arena_max > 0 && ::mallopt(M_ARENA_MAX, static_cast<int>(cfg.malloc_arena_max)) != 1) {
    log::warn("malloc_arena_max: glibc refused " + std::to_string(cfg.malloc_arena_max) +
              "; its default stays");
    cfg.malloc_arena_max = 0;
  }
#else
  cfg.malloc_arena_max = 0;
#endif
}

/// The PUB socket, shared by the job threads.
class Publisher {
 public:
  explicit Publisher(zmq::socket_t& s) : s_(s) {}
  void publish(const std::string& topic, const json& body) {
    const std::string text = dump(body);
    std::lock_guard<std::mutex> lock(mu_);
    try {
      if (s_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        (void)s_.send(zmq::buffer(text), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      log::debug(std::string("events: ") + e.what());
    }
  }

 private:
  zmq::socket_t& s_;
  std::mutex mu_;
};

int start_failure(const std::string& message) {
  log::error("segflowd: " + message);
  return 1;
}

/// Holds state_dir/segflowd.lock (flock) for the life of the process.
class StateLock {
 public:
  Status acquire(const fs::path& state_dir) {
    const fs::path p = state_dir / "segflowd.lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return io_error(p.string() + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {0};
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      return invalid_argument("another segflowd (pid " + std::string(n > 0 ? buf : "?") +
                              ") is running with state_dir " + state_dir.string());
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
    return Status::ok();
  }
  ~StateLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

/// Binds with a umask that keeps an ipc socket owner-only from the start, then chmods it.
Status bind_socket(zmq::socket_t& s, const std::string& endpoint, const std::string& what) {
  const mode_t old = ::umask(0077);
  try {
    s.bind(endpoint);
  } catch (const zmq::error_t& e) {
    ::umask(old);
    return io_error(what + ": cannot bind " + endpoint + ": " + e.what());
  }
  ::umask(old);
  if (endpoint.rfind("ipc://", 0) == 0) ::chmod(endpoint.substr(6).c_str(), 0600);
  return Status::ok();
}

void set_curve_server(zmq::socket_t& s, const std::string& secret) {
  s.set(zmq::sockopt::zap_domain, "segflow");
  s.set(zmq::sockopt::curve_server, true);
  s.set(zmq::sockopt::curve_secretkey, secret);
}

/// The config made final and applied to the process: malloc arenas and the log level.
Status prepare_config(DaemonConfig& cfg) {
  SEGFLOW_RETURN_IF_ERROR(finalize_daemon_config(cfg));
  apply_malloc_arena_max(cfg);
  log::Level level = log::Level::info;
  if (log::parse_level(cfg.log_level, level)) log::set_level(level);
  return Status::ok();
}

/// state_dir (and its runs/) made, owner-only when new, and locked for this process.
Status prepare_state_dir(const DaemonConfig& cfg, StateLock& lock) {
  std::error_code ec;
  const bool fresh = !fs::exists(cfg.state_dir, ec);
  fs::create_directories(cfg.state_dir / "runs", ec);
  if (!fs::is_directory(cfg.state_dir, ec))
    return io_error(cfg.state_dir.string() + ": cannot create state_dir");
  if (fresh) ::chmod(cfg.state_dir.c_str(), 0700);
  return lock.acquire(cfg.state_dir);
}

/// The built-in stages and the plugins of plugin_dir (a bad plugin is logged, not fatal).
pipeline::StageRegistry load_registry(const DaemonConfig& cfg) {
  pipeline::StageRegistry registry = pipeline::builtin_registry();
  std::error_code ec;
  if (fs::is_directory(cfg.plugin_dir, ec)) {
    auto plugins = pipeline::load_plugins(cfg.plugin_dir, registry);
    if (!plugins.is_ok())
      log::error("plugins: " + plugins.status().message() + " (going on without the rest)");
    else if (!plugins->empty())
      log::info("plugins: " + std::to_string(plugins->size()) + " loaded from " + cfg.plugin_dir.string());
  }
  return registry;
}

/// The CURVE server secret key ("" without CURVE), checked against its public key file.
Result<std::string> curve_secret(const DaemonConfig& cfg) {
  if (!cfg.curve.enabled()) return std::string();
  const CurveSettings& c = cfg.curve;
  auto s = read_key_file(c.server_secret_key_file);
  if (!s.is_ok()) return io_error("curve.server_secret_key_file: " + s.status().message());
  auto derived = public_key_of(*s);
  if (!derived.is_ok())
    return io_error(c.server_secret_key_file.string() + ": " + derived.status().message());
  if (!c.server_public_key_file.empty()) {
    auto p = read_key_file(c.server_public_key_file);
    if (!p.is_ok()) return io_error("curve.server_public_key_file: " + p.status().message());
    if (*p != *derived)
      return invalid_config("curve: " + c.server_public_key_file.string() + " is not the public key of " +
                            c.server_secret_key_file.string());
  }
  struct stat st {};
  if (::stat(c.server_secret_key_file.c_str(), &st) == 0 && (st.st_mode & 0077))
    log::warn("curve: " + c.server_secret_key_file.string() + " is readable by others (chmod 600 it)");
  return *s;
}

/// The control (REP) and events (PUB) sockets set up (CURVE with a secret) and bound.
Status open_sockets(const DaemonConfig& cfg, const std::string& secret, zmq::socket_t& rep,
                    zmq::socket_t& pub) {
  // Larger than max_request_bytes still gets an error reply; far larger (8x) is dropped by
  // libzmq before it is buffered whole.
  const std::int64_t hard_cap =
      std::min<std::int64_t>(cfg.max_request_bytes * 8 + 4096, std::int64_t{1} << 31);
  try {
    rep.set(zmq::sockopt::linger, 1000);
    rep.set(zmq::sockopt::maxmsgsize, hard_cap);
    pub.set(zmq::sockopt::linger, 0);
    pub.set(zmq::sockopt::sndhwm, 10000);
    if (cfg.curve.enabled()) {
      set_curve_server(rep, secret);
      set_curve_server(pub, secret);
    }
  } catch (const zmq::error_t& e) {
    return io_error(std::string("cannot set up the sockets: ") + e.what());
  }
  SEGFLOW_RETURN_IF_ERROR(bind_socket(rep, cfg.control, "control"));
  return bind_socket(pub, cfg.events, "events");
}

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

void log_ready(const DaemonConfig& cfg, const std::vector<std::string>& pool) {
  std::string devices;
  for (const auto& d : pool) devices += (devices.empty() ? "" : ", ") + d;
  log::info("segflowd ready (pid " + std::to_string(::getpid()) + "): control " + cfg.control + ", events " +
            cfg.events + (cfg.curve.enabled() ? " (CURVE)" : "") + ", data_root " + cfg.data_root.string() +
            ", state_dir " + cfg.state_dir.string() + ", devices " + devices);
}

/// Answers control requests (and polls auto_infer and auto_train each second) until a stop
/// signal or the shutdown command.
void control_loop(const DaemonConfig& cfg, ControlHandler& handler, AutoInfer& auto_infer,
                  AutoTrain& auto_train, zmq::socket_t& rep) {
  auto next_auto = std::chrono::steady_clock::now();
  while (g_stop_requests.load() == 0 && !handler.shutdown_requested()) {
    try {
      if (std::chrono::steady_clock::now() >= next_auto) {
        if (!cfg.auto_infer.empty()) auto_infer.poll();  // lists a dataset only when its records changed
        auto_train.poll();                               // nothing without auto_train entries
        next_auto = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      }
      zmq::pollitem_t items[] = {{rep.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(200));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(rep, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
      json reply = handler.handle(frames.size() == 1 ? frames[0].to_string() : std::string(), frames.size());
      (void)rep.send(zmq::buffer(dump(reply)), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      log::error(std::string("control: ") + e.what());
    } catch (const std::exception& e) {
      log::error(std::string("control: ") + e.what());
    }
  }
}

/// The services (watcher, DICOM, jobs, auto_infer, control) started, the control loop run
/// and the services stopped again. Returns run_daemon's exit code.
int serve(const DaemonConfig& cfg, StateDb& db, const pipeline::StageRegistry& registry, zmq::socket_t& rep,
          Publisher& publisher) {
  const PublishFn publish = [&publisher](const std::string& t, const json& b) { publisher.publish(t, b); };
  // The watcher's change callback asks auto_infer and auto_train (made below, once jobs exist)
  // to look again.
  std::atomic<AutoInfer*> auto_infer_ptr{nullptr};
  std::atomic<AutoTrain*> auto_train_ptr{nullptr};
  DatasetWatcher watcher({cfg.data_root, cfg.rescan_interval_s, cfg.settle_s}, db,
                         [&auto_infer_ptr, &auto_train_ptr](const std::string& dataset) {
                           if (AutoInfer* a = auto_infer_ptr.load()) a->mark_dirty(dataset);
                           if (AutoTrain* a = auto_train_ptr.load()) a->mark_dirty(dataset);
                         });
  if (Status st = watcher.start(); !st.is_ok()) return start_failure(st.message());
  ::signal(SIGPIPE, SIG_IGN);  // before the DICOM threads write to peers that may be gone
  dicom::DicomService dicom(cfg.dicom, cfg.data_root, cfg.state_dir, db);
  dicom.set_on_send_done([&auto_infer_ptr](const DicomSendRecord& r) {
    if (AutoInfer* a = auto_infer_ptr.load()) a->on_send_done(r);
  });
  if (Status st = dicom.start(); !st.is_ok()) return start_failure(st.message());
  JobManager jobs({cfg.state_dir, cfg.data_root, cfg.plugin_dir, cfg.devices}, db, registry, publish,
                  [&watcher](const std::string& d) { return watcher.version(d); });
  if (Status st = jobs.recover(); !st.is_ok()) return start_failure(st.message());
  AutoInfer auto_infer(cfg.auto_infer, cfg.data_root, db, jobs, publish, &dicom);
  if (Status st = auto_infer.prepare(); !st.is_ok()) return start_failure(st.message());
  auto_infer_ptr.store(&auto_infer);
  AutoTrain auto_train(cfg.auto_train, db, jobs, publish);
  auto_train_ptr.store(&auto_train);
  ControlHandler handler(cfg, jobs, db, watcher, registry);
  handler.set_dicom(&dicom);

  install_stop_signals();
  log_ready(cfg, jobs.devices());
  publisher.publish("daemon", {{"state", "ready"}, {"pid", static_cast<std::int64_t>(::getpid())}});
  control_loop(cfg, handler, auto_infer, auto_train, rep);

  log::info(std::string("segflowd shutting down (") +
            (handler.shutdown_requested() ? "shutdown command" : "signal") + ")");
  publisher.publish("daemon", {{"state", "stopping"}});
  auto_infer_ptr.store(nullptr);
  auto_train_ptr.store(nullptr);
  jobs.shutdown(handler.shutdown_now() || g_stop_requests.load() >= 2,
                [] { return g_stop_requests.load() >= 2; });
  dicom.stop();
  watcher.stop();
  publisher.publish("daemon", {{"state", "stopped"}});
  return 0;
}

}  // namespace

void request_daemon_stop() noexcept { g_stop_requests.fetch_add(1); }

int run_daemon(DaemonConfig cfg) {
  g_stop_requests.store(0);
  if (Status st = prepare_config(cfg); !st.is_ok()) return start_failure(st.message());
  StateLock lock;
  if (Status st = prepare_state_dir(cfg, lock); !st.is_ok()) return start_failure(st.message());
  auto db = StateDb::open(cfg.state_dir / "state.db");
  if (!db.is_ok()) return start_failure(db.status().message());
  const pipeline::StageRegistry registry = load_registry(cfg);
  auto secret = curve_secret(cfg);
  if (!secret.is_ok()) return start_failure(secret.status().message());

  zmq::context_t ctx(1);
  std::unique_ptr<ZapHandler> zap;
  if (cfg.curve.enabled()) {
    zap = std::make_unique<ZapHandler>(ctx, cfg.curve.authorized_clients_dir);
    if (Status st = zap->start(); !st.is_ok()) return start_failure(st.message());
  }
  zmq::socket_t rep(ctx, zmq::socket_type::rep);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  if (Status st = open_sockets(cfg, *secret, rep, pub); !st.is_ok()) return start_failure(st.message());
  Publisher publisher(pub);
  if (const int rc = serve(cfg, **db, registry, rep, publisher); rc != 0) return rc;
  rep.close();
  pub.close();
  if (zap) zap->stop();
  log::info("segflowd stopped");
  return 0;
}

}  // namespace segflow::daemon
