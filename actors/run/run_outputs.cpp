#include "actors/run/run_outputs.hpp"

#include "messages/log.hpp"
#include "models/training/run_layout.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;

Result<std::int64_t> trim_run_outputs(const fs::path& run_dir, const models::TrainState& at) {
  const models::RunLayout run(run_dir);
  SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t from_metrics, trim_metrics_jsonl(run.metrics(), at));
  SEGFLOW_ASSIGN_OR_RETURN(const std::int64_t from_tensorboard, trim_tensorboard(run.tensorboard(), at));
  return from_metrics + from_tensorboard;
}

void trim_for_resume(const fs::path& run_dir, const models::TrainState& at) {
  auto dropped = trim_run_outputs(run_dir, at);
  if (!dropped.is_ok())
    log::warn("resume: cannot drop the interrupted run's records past the checkpoint: " +
              dropped.status().message());
  else if (*dropped > 0)
    log::info("resume: dropped " + std::to_string(*dropped) +
              " metric records written after the checkpoint (epoch " + std::to_string(at.epoch) + ", step " +
              std::to_string(at.step) + ")");
}

}  // namespace segflow::actors
