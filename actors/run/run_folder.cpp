#include "actors/run/run_folder.hpp"

#include <torch/torch.h>

#include <functional>

#include "messages/file_util.hpp"
#include "messages/log.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/device_memory.hpp"
#include "models/training/run_layout.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;

RunFolder::RunFolder(const models::JobConfig& cfg, const RunOptions& opts) {
  dir_ = opts.run_dir ? *opts.run_dir : fs::path(cfg.runs_dir) / models::run_name(cfg);
  resume_ = opts.resume;
  if (resume_) dir_ = opts.run_dir ? *opts.run_dir : resume_->parent_path();
  const models::RunLayout layout(dir_);
  if (!resume_ && opts.resume_last && fs::exists(layout.last_checkpoint()))
    resume_ = layout.last_checkpoint();
  start_over_ = !resume_ && opts.resume_last;
}

RunFolder::~RunFolder() {
  // The data path's last events (its collector is flushed by then when the batch source went
  // first, as in run_training); a failing sink must not throw out of a destructor.
  try {
    bus_.deliver();
  } catch (const std::exception& e) {
    log::warn(std::string("run folder: delivering the last data-path events failed: ") + e.what());
  }
}

Status RunFolder::open(const models::JobConfig& cfg, models::Trainer& trainer, const pipeline::Split& split,
                       models::TrainObserver& user) {
  const models::RunLayout layout(dir_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return io_error(dir_.string() + ": cannot create the run folder: " + ec.message());
  SEGFLOW_RETURN_IF_ERROR(write_file_atomically(layout.config(), cfg.resolved.dump(2) + '\n'));
  SEGFLOW_RETURN_IF_ERROR(pipeline::write_split(dir_, split));
  if (resume_) {
    SEGFLOW_RETURN_IF_ERROR(trainer.load_checkpoint(*resume_));
    log::info("resumed from " + resume_->string() + " at epoch " + std::to_string(trainer.state().epoch));
    trim_for_resume(dir_, trainer.state());
  } else if (start_over_) {
    trim_for_resume(dir_, models::TrainState{});
  }
  const c10::Device device = trainer.device();
  std::function<double()> gpu_mb;
  if (device.is_cuda()) gpu_mb = [device] { return models::peak_device_memory_mb(device); };
  metrics_ = std::make_unique<JsonlMetricsObserver>(layout.metrics(), cfg.train.log_every);
  tensorboard_ = std::make_unique<TensorBoardObserver>(layout.tensorboard(), cfg.train.log_every, gpu_mb);
  plot_ = std::make_unique<ProgressPlotObserver>(layout.progress_plot());
  if (resume_) plot_->replay(layout.metrics());
  metrics_->on_run_start(trainer, resume_ ? resume_->string() : std::string());
  bus_.add(metrics_.get());
  bus_.add(tensorboard_.get());
  bus_.add(plot_.get());
  bus_.add(&user);
  return Status::ok();
}

}  // namespace segflow::actors
