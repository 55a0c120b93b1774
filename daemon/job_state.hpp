#pragma once
// A daemon job's state and kind. The names are what the state database stores and the
// control protocol and events carry ("queued", "infer"); to_string and parse are the only
// places that spell them.

#include <string>
#include <string_view>

#include "messages/status.hpp"

namespace segflow::daemon {

/// Where a job is in its life (job_manager.hpp draws the state machine).
enum class JobState {
  queued,     ///< waiting for a device (also after a restart or a shutdown)
  running,    ///< a worker thread runs it on its device
  paused,     ///< stopped with a checkpoint; resume queues it again
  stopped,    ///< stopped for good (stop)
  completed,  ///< ran to its end
  failed,     ///< ended with an error (the reason says which)
};

/// What a job does.
enum class JobKind {
  train,  ///< actors::run_training on a job config
  infer,  ///< models::run_inference(_batch) on a checkpoint (the record's config_yaml holds the request)
  plan,   ///< models::planning on a dataset folder, then (ctl train, auto_train) training jobs queued
};

/// "queued", "running", ... as stored and sent.
const char* to_string(JobState state) noexcept;
/// "train", "infer" or "plan".
const char* to_string(JobKind kind) noexcept;

/// The state named `text`; an error that lists the names otherwise.
Result<JobState> parse_job_state(std::string_view text);
/// The kind named `text`; an error that lists the names otherwise.
Result<JobKind> parse_job_kind(std::string_view text);

/// True for the states a job never leaves by itself (stopped, completed, failed).
bool is_final(JobState state) noexcept;

}  // namespace segflow::daemon
