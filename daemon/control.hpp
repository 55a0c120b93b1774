#pragma once
// The control protocol (DESIGN.md): ZeroMQ REQ/REP, one JSON object per message,
// {"cmd": ..., fields} -> {"ok": true, ...} | {"ok": false, "error": "...", "code": "..."}.
// The commands, their fields and replies: docs/reference/control-protocol.md. The server's
// one list of them is the command table in control.cpp ({name, fields, handle}); the
// client's is the table in apps/cmd_ctl.cpp.
//
// Validation comes first and names the field: malformed JSON, a non-object, a missing or
// unknown cmd, unknown fields, missing fields and wrong types are errors and change nothing.
// Requests over max_request_bytes are answered with an error without being parsed.

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>

#include "daemon/config.hpp"

namespace segflow::pipeline {
class StageRegistry;
}

namespace segflow::daemon {

class JobManager;
class DatasetWatcher;
class StateDb;
namespace dicom {
class DicomService;
}

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
  void set_dicom(dicom::DicomService* dicom) { dicom_ = dicom; }

  /// True once a shutdown request was answered; `shutdown_now()` when it asked for "now".
  bool shutdown_requested() const { return shutdown_; }
  bool shutdown_now() const { return shutdown_now_; }

 private:
  struct Request;  // the validated fields of one request (control.cpp)
  struct Command;  // one entry of the command table: {name, fields, handle} (control.cpp)
  static const Command kCommands[];

  /// Finds the command, validates the fields against its entry and runs its handler.
  nlohmann::json dispatch(const nlohmann::json& req);
  const DaemonConfig& cfg_;
  JobManager& jobs_;
  StateDb& db_;
  const DatasetWatcher& watcher_;
  const pipeline::StageRegistry& registry_;
  dicom::DicomService* dicom_ = nullptr;
  bool shutdown_ = false;
  bool shutdown_now_ = false;
};

/// {"ok": false, "error": message, "code": code name}.
nlohmann::json error_reply(const Status& st);

}  // namespace segflow::daemon
