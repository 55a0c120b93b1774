// Fuzz harness: one daemon control request, bytes -> reply, through the daemon's own
// ControlHandler with a real state database (SQLite), job manager and dataset watcher in a
// fresh state folder per input. The job manager is shut down before the request, so a
// valid `start` or `infer` is validated and stored but never runs. Every reply must be a JSON
// object with a boolean "ok", and an error must say what was wrong.
#include <system_error>

#include "daemon/control.hpp"
#include "daemon/dataset_watcher.hpp"
#include "daemon/job_manager.hpp"
#include "daemon/state_db.hpp"
#include "fuzz_target.hpp"
#include "pipeline/stage_registry.hpp"

namespace sd = segflow::daemon;

SEGFLOW_FUZZ_TARGET(control) {
  static const pipeline::StageRegistry registry = pipeline::builtin_registry();
  const auto root = scratch_dir() / "daemon";
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  std::filesystem::create_directories(root / "state");
  std::filesystem::create_directories(root / "data");

  sd::DaemonConfig cfg;
  cfg.data_root = root / "data";
  cfg.state_dir = root / "state";
  cfg.plugin_dir = root / "plugins";
  cfg.devices = {"cpu"};
  Status fin = sd::finalize_daemon_config(cfg);
  invariant(fin.is_ok(), "the harness's daemon config: " + fin.message());
  auto db = sd::StateDb::open(cfg.state_dir / "state.db");
  invariant(db.is_ok(), "state.db: " + db.status().message());
  sd::DatasetWatcher watcher({cfg.data_root, cfg.rescan_interval_s, cfg.settle_s}, **db,
                             [](const std::string&) {});
  sd::JobManager jobs({cfg.state_dir, cfg.data_root, cfg.plugin_dir, cfg.devices}, **db, registry, {},
                      [](const std::string&) { return std::uint64_t{0}; });
  jobs.shutdown(true);  // nothing submitted runs
  sd::ControlHandler handler(cfg, jobs, **db, watcher, registry);

  const std::string request(reinterpret_cast<const char*>(data), size);
  const nlohmann::json reply = handler.handle(request);
  invariant(reply.is_object(), "a reply that is not a JSON object");
  invariant(reply.contains("ok") && reply["ok"].is_boolean(), "a reply without a boolean ok");
  if (!reply["ok"].get<bool>())
    invariant(
        reply.contains("error") && reply["error"].is_string() && !reply["error"].get<std::string>().empty(),
        "an error reply without a message");
  (void)reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
