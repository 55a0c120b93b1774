#pragma once
// segflowd: the long-running service. One process holds
//   - the state database (state_dir/state.db) and a lock file (one daemon per state_dir),
//   - the dataset watcher thread (data_root),
//   - the job manager (one thread per running job),
//   - the control REP socket, answered on the calling thread (run_daemon's), and the
//     events PUB socket, shared by every thread behind a mutex,
//   - with CURVE configured, the ZAP handler thread admitting authorized client keys.
//
// Stopping: the shutdown command, SIGTERM or SIGINT stop the control loop; running jobs
// write a checkpoint at the end of their epoch (a second signal, or shutdown {"now": true},
// makes it the next step) and are resumed at the next start. After kill -9 the next start
// resumes them from their last checkpoint.

#include "daemon/config.hpp"

namespace segflow::daemon {

/// Runs the daemon until it is told to stop. Returns the process exit code: 0 after a clean
/// shutdown, 1 when it cannot start (the error is logged, one line).
int run_daemon(DaemonConfig cfg);

/// Asks a running run_daemon to stop (async-signal-safe; a second call hurries the jobs).
void request_daemon_stop() noexcept;

}  // namespace segflow::daemon
