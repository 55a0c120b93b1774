#pragma once
// The one way a test runs another process. ChildProcess starts a command with extra
// environment variables, its output appended to a log file or captured on a pipe; it waits
// with a timeout, signals, kills, and reads the output back. Whatever still runs when the
// object dies (a failed REQUIRE, say) is SIGKILLed and reaped, so no test leaves a process
// behind. Built on it: run_command (a shell line run to completion) and start_child_entry
// (this test executable again, running one of its ChildEntry functions).
//
// posix_spawnp, not fork + exec: the suites are multi-threaded (LibTorch, CAF, ZeroMQ), and
// no code of ours runs in the child between the two.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace segflow::testing {

/// Where a child's stdout and stderr go.
enum class ChildOutput {
  inherit,  ///< the test's own stdout and stderr
  log,      ///< both appended to a log file (log_tail() reads it)
  pipe,     ///< stdout captured (read_stdout() reads it to the end); stderr inherited
};

/// A started process, SIGKILLed and reaped on destruction unless it already exited.
/// Movable, not copyable. Not thread-safe: one thread waits on it.
class ChildProcess {
 public:
  /// Starts `args` (args[0] looked up on PATH unless it holds a '/') with this process's
  /// environment plus `env` ("NAME=value", replacing a variable of that name). With a `log`
  /// path, stdout and stderr are appended to it. Throws when the process cannot start.
  ChildProcess(std::vector<std::string> args, const std::vector<std::string>& env = {},
               std::filesystem::path log = {})
      : ChildProcess(std::move(args), env, log.empty() ? ChildOutput::inherit : ChildOutput::log, log) {}

  ChildProcess(std::vector<std::string> args, const std::vector<std::string>& env, ChildOutput output,
               std::filesystem::path log = {})
      : log_(std::move(log)) {
    if (args.empty()) throw std::invalid_argument("ChildProcess: no command");
    std::vector<std::string> environment = merged_environment(env);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : environment) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    int pipe_fds[2] = {-1, -1};
    if (output == ChildOutput::log) {
      posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    } else if (output == ChildOutput::pipe) {
      if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
        posix_spawn_file_actions_destroy(&actions);
        throw std::runtime_error("ChildProcess: pipe failed: " + std::string(std::strerror(errno)));
      }
      posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);  // dup2 clears O_CLOEXEC
    }
    const int err = ::posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
    if (err != 0) {
      if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
      pid_ = -1;
      throw std::runtime_error("cannot start " + args[0] + ": " + std::strerror(err));
    }
    out_fd_ = pipe_fds[0];
  }

  ~ChildProcess() {
    kill();
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  ChildProcess(ChildProcess&& o) noexcept
      : log_(std::move(o.log_)),
        pid_(std::exchange(o.pid_, -1)),
        out_fd_(std::exchange(o.out_fd_, -1)),
        exited_(o.exited_),
        status_(o.status_) {}
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  /// True while it runs (reaps it when it has exited).
  bool alive() {
    if (exited_ || pid_ <= 0) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) set_exited(st);
    return r == 0;
  }

  /// Waits up to `timeout_s` for the exit; the exit code (128 + signal number when a signal
  /// ended it), or -1 when it still runs.
  int wait_exit(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (alive()) {
      if (std::chrono::steady_clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return exit_code();
  }

  /// Waits for the exit, however long it takes; the exit code (128 + signal number).
  int wait_exit() {
    if (!exited_ && pid_ > 0) {
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      set_exited(st);
    }
    return exit_code();
  }

  /// Sends `sig` if it still runs.
  void signal(int sig) {
    if (alive()) ::kill(pid_, sig);
  }

  /// SIGKILL and reap (nothing when it already exited).
  void kill() {
    if (!alive()) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    set_exited(st);
  }

  /// ChildOutput::pipe: everything it writes to stdout, read until it closes stdout.
  std::string read_stdout() {
    std::string out;
    if (out_fd_ < 0) return out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(out_fd_, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    ::close(out_fd_);
    out_fd_ = -1;
    return out;
  }

  /// ChildOutput::log: the last `n` bytes of its log.
  std::string log_tail(std::size_t n = 6000) const {
    std::ifstream f(log_, std::ios::binary);
    std::string s{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    return s.size() > n ? s.substr(s.size() - n) : s;
  }

 private:
  /// This process's environment with `extra` ("NAME=value") replacing or adding variables.
  static std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
    std::vector<std::string> out;
    auto name_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
    std::map<std::string, std::size_t> at;
    for (char** p = environ; *p; ++p) {
      out.emplace_back(*p);
      at.emplace(name_of(out.back()), out.size() - 1);
    }
    for (const auto& kv : extra) {
      auto it = at.find(name_of(kv));
      if (it != at.end()) {
        out[it->second] = kv;
      } else {
        out.push_back(kv);
        at.emplace(name_of(kv), out.size() - 1);
      }
    }
    return out;
  }
  void set_exited(int st) {
    exited_ = true;
    status_ = st;
  }
  int exit_code() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_); }

  std::filesystem::path log_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
};

/// Result of a command: exit status and what it printed (stdout; stderr when merged).
struct CommandResult {
  int exit_code = -1;
  std::string out;
};

/// Runs a shell command to completion, capturing stdout (append " 2>&1" to capture stderr
/// as well).
inline CommandResult run_command(const std::string& cmd) {
  ChildProcess c({"/bin/sh", "-c", cmd}, {}, ChildOutput::pipe);
  CommandResult r;
  r.out = c.read_stdout();
  r.exit_code = c.wait_exit();
  return r;
}

/// Entry points a test can start as a child process (see tests/doctest_main.cpp): the
/// suite's own executable run with SEGFLOW_TEST_CHILD=<name> calls the entry and exits.
inline std::map<std::string, std::function<int()>>& child_entries() {
  static std::map<std::string, std::function<int()>> entries;
  return entries;
}

/// Registers a child entry at static-initialisation time (one per name and suite).
struct ChildEntry {
  ChildEntry(const std::string& name, std::function<int()> fn) { child_entries()[name] = std::move(fn); }
};

/// This test executable again, running the ChildEntry `name` instead of the tests, with
/// `env` added to its environment and its output going to `log` (or captured with
/// ChildOutput::pipe).
inline ChildProcess start_child_entry(const std::string& name, std::vector<std::string> env,
                                      ChildOutput output, const std::filesystem::path& log = {}) {
  env.push_back("SEGFLOW_TEST_CHILD=" + name);
  return ChildProcess({std::filesystem::read_symlink("/proc/self/exe").string()}, env, output, log);
}

}  // namespace segflow::testing
