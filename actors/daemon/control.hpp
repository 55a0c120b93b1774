#pragma once
// The control protocol (DESIGN.md): one JSON object per request, {"cmd": ...} ->
// {"ok": true, ...} | {"ok": false, "error": "...", "code": "..."}. Commands and fields:
//
//   start     config (YAML text) | path (a file the daemon reads); file (name for messages,
//             with config); set ([key=value, ...])                 -> job, state, run_dir, dataset
//   infer     checkpoint, input, output (paths); tta (none | mirror | mirror-all), device
//             (optional)                                            -> job, state, kind, output
//   stop      job                                                   -> job, state, pending
//   pause     job; now (bool: at the next step, not the epoch end)  -> job, state, pending
//   resume    job                                                   -> job, state
//   status    job (optional)                                        -> job: {...} | jobs: [...]
//   list                                                            -> jobs: [{id, name, state, epoch,
//   epochs}] datasets  dataset (optional)                                    -> datasets: [...], ready stages
//   -> stages: describe_stages ping                                                            -> pid,
//   version, endpoints shutdown  now (bool)                                            -> shutting_down
//   dicom     send ([FILE, ...], optional)   -> node, sender, queued (actors/daemon/dicom_service.hpp)
//
// Validation comes first and names the field: malformed JSON, a non-object, a missing or
// unknown cmd, unknown fields, missing fields and wrong types are errors and change nothing.
// Requests over max_request_bytes are answered with an error without being parsed.

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>

#include "actors/daemon/daemon_config.hpp"

namespace segflow::pipeline {
class StageRegistry;
}

namespace segflow::actors::daemon {

class JobManager;
class DatasetWatcher;
class StateDb;
class DicomService;

/// Turns request bytes into reply JSON. Never throws. Called from the control thread only.
class ControlHandler {
 public:
  ControlHandler(const DaemonConfig& cfg, JobManager& jobs, StateDb& db, const DatasetWatcher& watcher,
                 const pipeline::StageRegistry& registry)
      : cfg_(cfg), jobs_(jobs), db_(db), watcher_(watcher), registry_(registry) {}

  /// The reply to one request (a single frame of `bytes`, or `frames` > 1: refused).
  nlohmann::json handle(const std::string& bytes, std::size_t frames = 1);

  /// The DICOM node and sender the `dicom` command reports on (dicom_service.hpp); set once
  /// before the first request.
  void set_dicom(DicomService* dicom) { dicom_ = dicom; }

  /// True once a shutdown request was answered; `shutdown_now()` when it asked for "now".
  bool shutdown_requested() const { return shutdown_; }
  bool shutdown_now() const { return shutdown_now_; }

 private:
  nlohmann::json dispatch(const nlohmann::json& req);
  const DaemonConfig& cfg_;
  JobManager& jobs_;
  StateDb& db_;
  const DatasetWatcher& watcher_;
  const pipeline::StageRegistry& registry_;
  DicomService* dicom_ = nullptr;
  bool shutdown_ = false;
  bool shutdown_now_ = false;
};

/// {"ok": false, "error": message, "code": code name}.
nlohmann::json error_reply(const Status& st);

}  // namespace segflow::actors::daemon
