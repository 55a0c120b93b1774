// segflowd: the daemon. Parses arguments and the daemon config, then runs the service
// (daemon/daemon.hpp) until the shutdown command, SIGTERM or SIGINT.
#include <cstdio>
#include <exception>
#include <string>

#include "apps/cli_args.hpp"
#include "daemon/config.hpp"
#include "daemon/daemon.hpp"

namespace {

constexpr const char* kUsage = R"(segflowd — the segflow training daemon

usage: segflowd [--config FILE] [--data-root DIR] [--state-dir DIR] [--control ENDPOINT]
                [--events ENDPOINT] [--log-level trace|debug|info|warn|error|off]

  --config FILE      daemon config (configs/daemon.yaml documents every key); without it
                     the defaults: data_root data/, state_dir state/, devices [auto],
                     control ipc://state/control.sock, events ipc://state/events.sock
  the other options override the config's keys of the same name.

The config's sections (configs/daemon.yaml, docs/reference/daemon-config.md): the watched
data_root and its datasets, devices and the job queue, control/events endpoints and CURVE,
auto_infer (run a model on each new case, NIfTI or SEG out), auto_train (plan and train a
dataset that appears, with no config written), and dicom (a DICOM node: C-ECHO and C-STORE
into a dataset folder, results sent on to a PACS with retries).

Talk to it with `segflow ctl COMMAND` (`segflow ctl --help` lists the commands). SIGTERM
or SIGINT stop it gracefully (jobs checkpoint at the end of their epoch; a second signal
makes them stop at the next step).
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace segflow;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  auto args = apps::parse_args(argc, argv, 1,
                               {"config", "data-root", "state-dir", "control", "events", "log-level"}, {});
  if (!args.is_ok()) {
    std::fprintf(stderr, "segflowd: %s\n", args.status().message().c_str());
    return 2;
  }
  if (!args->positional.empty()) {
    std::fprintf(stderr, "segflowd: unexpected argument '%s' (see segflowd --help)\n",
                 args->positional[0].c_str());
    return 2;
  }
  try {
    daemon::DaemonConfig cfg;
    if (args->has("config")) {
      auto c = daemon::load_daemon_config(args->get("config"));
      if (!c.is_ok()) {
        std::fprintf(stderr, "segflowd: %s\n", c.status().message().c_str());
        return 2;
      }
      cfg = std::move(*c);
    }
    if (args->has("data-root")) cfg.data_root = args->get("data-root");
    if (args->has("state-dir")) cfg.state_dir = args->get("state-dir");
    if (args->has("control")) cfg.control = args->get("control");
    if (args->has("events")) cfg.events = args->get("events");
    if (args->has("log-level")) cfg.log_level = args->get("log-level");
    if (Status st = daemon::finalize_daemon_config(cfg); !st.is_ok()) {
      std::fprintf(stderr, "segflowd: %s\n", st.message().c_str());
      return 2;
    }
    return daemon::run_daemon(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "segflowd: internal error: %s\n", e.what());
    return 1;
  }
}
