#include "actors/parallel/data_parallel.hpp"

#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "actors/jobs/validation_predictions.hpp"
#include "actors/run/run_folder.hpp"
#include "actors/run/run_outputs.hpp"
#include "messages/log.hpp"
#include "models/parallel/collective.hpp"
#include "models/training/device_memory.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;
using models::parallel::Collective;
using models::parallel::CollectiveOptions;
using models::parallel::DdpGradientSync;

namespace {

/// Forwards every event to `inner` (rank 0's observers, or nothing) and makes should_stop()
/// a decision of all ranks: the trainer polls it at the same points on every rank (once per
/// step, once per epoch), so a MAX all-reduce there keeps the ranks in step.
class AgreedStopObserver : public models::TrainObserver {
 public:
  AgreedStopObserver(models::TrainObserver* inner, Collective& collective)
      : inner_(inner), coll_(collective) {}
  void on_epoch_start(std::int64_t e, std::int64_t n) override {
    if (inner_) inner_->on_epoch_start(e, n);
  }
  void on_step(const models::StepInfo& i) override {
    if (inner_) inner_->on_step(i);
  }
  void on_epoch_end(const models::EpochInfo& i) override {
    if (inner_) inner_->on_epoch_end(i);
  }
  void on_validation(const models::ValidationInfo& i) override {
    if (inner_) inner_->on_validation(i);
  }
  void on_checkpoint(const fs::path& p, const std::string& k) override {
    if (inner_) inner_->on_checkpoint(p, k);
  }
  void on_case_failure(const pipeline::CaseFailure& f) override {
    if (inner_) inner_->on_case_failure(f);
  }
  void on_early_stop(const models::EarlyStopInfo& i) override {
    if (inner_) inner_->on_early_stop(i);
  }
  bool should_stop() override {
    const bool local = inner_ && inner_->should_stop();
    auto r = coll_.any(local);
    if (!r.is_ok()) throw std::runtime_error(r.status().message());
    return *r;
  }

 private:
  models::TrainObserver* inner_;
  Collective& coll_;
};

/// A fresh private folder for a rank > 0's throwaway checkpoints, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(std::int64_t rank) {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("segflow-rank" + std::to_string(rank) + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::error_code ec;
    fs::create_directories(path_, ec);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// One rank's training once its job is prepared and its collective joined: agree on the
/// resume checkpoint, load it, attach DDP (which broadcasts rank 0's weights), fit.
/// `events` is rank 0's observer list, null elsewhere.
Status train_rank(PreparedJob& job, const std::shared_ptr<Collective>& coll,
                  const DataParallelOptions& options, const std::optional<fs::path>& resume,
                  models::TrainObserver* events, const fs::path& run_dir) {
  auto& trainer = *job.trainer;
  const std::string who =
      "rank " + std::to_string(coll->rank()) + " of " + std::to_string(coll->world_size());
  // A checkpoint some ranks cannot read would leave them at other epochs and steps.
  const bool have = resume.has_value() && fs::exists(*resume);
  SEGFLOW_ASSIGN_OR_RETURN(bool all_have, coll->all(have));
  SEGFLOW_ASSIGN_OR_RETURN(bool any_have, coll->any(have));
  if (any_have && !all_have)
    return not_found(who + ": resume checkpoint " + (resume ? resume->string() : std::string("(none)")) +
                     " is not readable on every rank (the run folder must be on a shared filesystem)");
  if (have) SEGFLOW_RETURN_IF_ERROR(trainer.load_checkpoint(*resume));

  SEGFLOW_ASSIGN_OR_RETURN(auto sync, DdpGradientSync::create(trainer, coll, options.ddp));
  trainer.set_gradient_sync(sync);
  AgreedStopObserver agreed(events, *coll);
  static const std::vector<Sample> no_validation;
  Status st;
  try {
    st = trainer.fit(*job.source, job.steps_per_epoch, events ? job.validation : no_validation, run_dir,
                     agreed);
  } catch (const std::exception& e) {  // should_stop's collective, polled outside train_epoch
    st = internal_error(e.what());
  }
  trainer.set_gradient_sync(nullptr);
  return st.is_ok() ? st : st.with_context(who);
}

Result<std::vector<std::string>> rank_devices(const models::JobConfig& cfg, const DataParallelOptions& o) {
  const auto w = o.world_size;
  if (w < 1) return invalid_argument("data parallel: world_size must be >= 1, got " + std::to_string(w));
  if (!o.devices.empty()) {
    if (static_cast<std::int64_t>(o.devices.size()) != w)
      return invalid_argument("data parallel: " + std::to_string(o.devices.size()) +
                              " devices for world size " + std::to_string(w));
    std::vector<c10::Device> seen;  // one rank per GPU (NCCL refuses two on one device)
    for (const auto& d : o.devices) {
      SEGFLOW_ASSIGN_OR_RETURN(c10::Device dev, models::resolve_device(d));
      if (dev.is_cuda() && std::find(seen.begin(), seen.end(), dev) != seen.end())
        return invalid_argument("data parallel: devices: " + dev.str() +
                                " is given twice; expected each CUDA device at most once");
      seen.push_back(dev);
    }
    return o.devices;
  }
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device base, models::resolve_device(cfg.train.device));
  std::vector<std::string> out;
  for (std::int64_t r = 0; r < w; ++r)
    out.push_back(base.is_cuda() ? "cuda:" + std::to_string(r) : std::string("cpu"));
  if (base.is_cuda() && static_cast<std::int64_t>(torch::cuda::device_count()) < w)
    return invalid_argument("data parallel: world size " + std::to_string(w) + " needs " + std::to_string(w) +
                            " CUDA devices, found " + std::to_string(torch::cuda::device_count()));
  return out;
}

CollectiveOptions collective_options(const DataParallelOptions& o) {
  CollectiveOptions co;
  co.timeout = o.timeout;
  co.bucket_bytes = static_cast<std::int64_t>(o.ddp.bucket_cap_mb * 1024.0 * 1024.0);
  return co;
}

}  // namespace

Result<fs::path> run_data_parallel(const models::JobConfig& cfg, const RunOptions& run,
                                   models::TrainObserver& observer, std::int64_t world_size) {
  DataParallelOptions o;
  o.world_size = world_size;
  return run_data_parallel(cfg, run, observer, o);
}

Result<fs::path> run_data_parallel(const models::JobConfig& cfg, const RunOptions& run,
                                   models::TrainObserver& observer, const DataParallelOptions& options) {
  SEGFLOW_ASSIGN_OR_RETURN(auto devices, rank_devices(cfg, options));
  const std::int64_t world = options.world_size;

  // Jobs one after the other: the first may synthesise the dataset, and Trainer::create
  // seeds the process-wide RNG (rank 0's weights win anyway, by broadcast).
  // The run folder before the jobs: every rank's data path publishes on its event bus, and it
  // outlives the batch sources, whose last events it delivers.
  RunFolder rf(cfg, run);
  models::TrainObserver quiet;
  std::vector<PreparedJob> jobs;
  for (std::int64_t r = 0; r < world; ++r) {
    models::JobConfig c = cfg;
    c.train.device = devices[static_cast<std::size_t>(r)];
    RunOptions o = run;
    o.rank = r;
    o.world_size = world;
    o.data_events = rf.data_events();
    auto job = prepare_job(c, o, r == 0 ? observer : quiet);
    if (!job.is_ok())
      return job.status().with_context("rank " + std::to_string(r) + " of " + std::to_string(world));
    jobs.push_back(std::move(job).value());
  }

  SEGFLOW_RETURN_IF_ERROR(rf.open(cfg, *jobs[0].trainer, jobs[0].split, observer));
  log::info("data-parallel run " + rf.dir().string() + ": " + std::to_string(world) + " ranks on " +
            devices[0] + (world > 1 ? " .. " + devices.back() : std::string()) + ", " +
            std::to_string(jobs[0].steps_per_epoch) + " steps per epoch, global batch " +
            std::to_string(cfg.train.batch_size * world) + " x " + std::to_string(cfg.train.accumulate));

  models::parallel::LocalRendezvous rendezvous(static_cast<int>(world), collective_options(options));
  std::vector<Status> results(static_cast<std::size_t>(world));
  std::vector<std::int64_t> order(static_cast<std::size_t>(world), -1);
  std::atomic<std::int64_t> failures{0};
  std::vector<std::thread> threads;
  for (std::int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      // This thread's CUDA work (NCCL set-up, streams, allocations) on its rank's device.
      c10::OptionalDeviceGuard device_guard;
      if (jobs[i].trainer->device().is_cuda()) device_guard.reset_device(jobs[i].trainer->device());
      Status st;
      try {
        auto coll = rendezvous.join(static_cast<int>(r), jobs[i].trainer->device());
        if (!coll.is_ok()) {
          st = coll.status();
        } else {
          std::shared_ptr<Collective> c = std::move(coll).value();
          if (r == 0) {
            st = train_rank(jobs[i], c, options, rf.resume(), &rf.events(), rf.dir());
          } else {
            ScratchDir scratch(r);
            st = train_rank(jobs[i], c, options, rf.resume(), nullptr, scratch.path());
          }
          // `c` goes here: a failed rank's sockets close, so the others fail now rather
          // than at the timeout.
        }
      } catch (const std::exception& e) {
        st = internal_error("rank " + std::to_string(r) + ": " + e.what());
      }
      if (!st.is_ok()) order[i] = failures++;
      results[i] = st;
    });
  }
  for (auto& t : threads) t.join();
  // The rank that failed first is the cause; the others mostly report its absence.
  std::optional<std::size_t> first;
  for (std::size_t i = 0; i < results.size(); ++i)
    if (order[i] >= 0 && (!first || order[i] < order[*first])) first = i;
  if (first) return results[*first];
  if (!observer.should_stop())
    SEGFLOW_RETURN_IF_ERROR(write_validation_predictions(cfg, jobs[0].split, rf.dir(), *jobs[0].trainer));
  return rf.dir();
}

Result<fs::path> run_distributed_from_env(const models::JobConfig& cfg, const RunOptions& run,
                                          models::TrainObserver& observer,
                                          const DataParallelOptions& options) {
  SEGFLOW_ASSIGN_OR_RETURN(auto env, models::parallel::launch_env());
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device base, models::resolve_device(cfg.train.device));
  models::JobConfig c = cfg;
  // One process per GPU: LOCAL_RANK picks it (torchrun's convention).
  if (base.is_cuda()) c.train.device = "cuda:" + std::to_string(env.local_rank);
  RunFolder rf(cfg, run);  // before the job: see run_data_parallel
  RunOptions o = run;
  o.rank = env.rank;
  o.world_size = env.world_size;
  if (env.rank == 0) o.data_events = rf.data_events();  // only rank 0 writes the run's outputs
  const std::string who = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
  models::TrainObserver quiet;
  auto prepared = prepare_job(c, o, env.rank == 0 ? observer : quiet);
  if (!prepared.is_ok()) return prepared.status().with_context(who);
  PreparedJob job = std::move(prepared).value();
  c10::OptionalDeviceGuard device_guard;
  if (job.trainer->device().is_cuda()) device_guard.reset_device(job.trainer->device());
  SEGFLOW_ASSIGN_OR_RETURN(
      std::shared_ptr<Collective> coll,
      models::parallel::connect(env, job.trainer->device(), collective_options(options)));
  if (env.rank == 0) {
    SEGFLOW_RETURN_IF_ERROR(rf.open(cfg, *job.trainer, job.split, observer));
    log::info("distributed run " + rf.dir().string() + ": " + std::to_string(env.world_size) + " ranks (" +
              env.launcher + "), store " + env.master_addr + ":" + std::to_string(env.master_port) +
              ", global batch " + std::to_string(cfg.train.batch_size * env.world_size) + " x " +
              std::to_string(cfg.train.accumulate));
    SEGFLOW_RETURN_IF_ERROR(train_rank(job, coll, options, rf.resume(), &rf.events(), rf.dir()));
    if (!observer.should_stop())
      SEGFLOW_RETURN_IF_ERROR(write_validation_predictions(cfg, job.split, rf.dir(), *job.trainer));
    return rf.dir();
  }
  ScratchDir scratch(env.rank);
  SEGFLOW_RETURN_IF_ERROR(train_rank(job, coll, options, rf.resume(), nullptr, scratch.path()));
  return fs::path();
}

}  // namespace segflow::actors
