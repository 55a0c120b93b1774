#include "actors/jobs/job_runner.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>
#include <sstream>

#include "actors/jobs/batch_sources.hpp"
#include "actors/jobs/validation_predictions.hpp"
#include "actors/run/run_folder.hpp"
#include "actors/run/run_outputs.hpp"
#include "messages/log.hpp"
#include "models/training/class_names.hpp"
#include "models/training/device_memory.hpp"
#include "pipeline/options.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/plugin.hpp"
#include "pipeline/stage.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/synth.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Status ensure_dataset_locked(const models::JobConfig& cfg);

}  // namespace

Status ensure_dataset(const models::JobConfig& cfg) {
  // Several ranks (torchrun) or jobs may ask for the same dataset at once: the first to take
  // the lock makes it, the others wait and then find it there.
  const fs::path root = cfg.data.root;
  const fs::path lock_file = (root.has_parent_path() ? root.parent_path() : fs::path(".")) /
                             std::string(".").append(root.filename().string()).append(".lock");
  SEGFLOW_ASSIGN_OR_RETURN(auto lock, FileLock::acquire(lock_file));
  return ensure_dataset_locked(cfg);
}

namespace {

Status ensure_dataset_locked(const models::JobConfig& cfg) {
  std::error_code ec;
  // A dataset that segflow synthesised records its recipe; when the config now asks for
  // another one, that folder (and only such a folder) is made again.
  const fs::path marker = fs::path(cfg.data.root) / ".segflow-synth.json";
  if (fs::exists(cfg.data.root, ec)) {
    if (!cfg.data.synth || !fs::exists(marker, ec)) return Status::ok();
    std::ifstream f(marker);
    std::stringstream ss;
    ss << f.rdbuf();
    // The marker holds the options as written then (older segflow: only the keys given).
    const json made = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    auto was = pipeline::parse_options<pipeline::SynthOptions>(made, marker.string());
    if (was.is_ok() && *was == *cfg.data.synth) return Status::ok();
    log::info(cfg.data.root + ": synthesised with other settings than data.synth asks for; making it again");
    fs::remove_all(cfg.data.root, ec);
    if (ec) return io_error(cfg.data.root + ": cannot remove the old synthetic dataset: " + ec.message());
  }
  if (!cfg.data.synth)
    return not_found(cfg.file + ": data.root: " + cfg.data.root +
                     " does not exist (and no data.synth to make it)");
  pipeline::SynthOptions o = *cfg.data.synth;  // checked when the config was read
  log::info("making dataset " + cfg.data.root + " (" + std::to_string(o.cases) + " " + o.format +
            " cases of size " + std::to_string(o.size) + ")");
  // Write next to the target and rename, so a half-written dataset never looks complete.
  const fs::path final_root = cfg.data.root;
  o.out = final_root.string() + ".partial";
  fs::remove_all(o.out, ec);
  SEGFLOW_RETURN_IF_ERROR(pipeline::synthesize_dataset(o).with_context(cfg.file + ": data.synth"));
  fs::create_directories(final_root.parent_path().empty() ? "." : final_root.parent_path(), ec);
  {
    std::ofstream f(fs::path(o.out) / ".segflow-synth.json");
    f << pipeline::resolved_options(*cfg.data.synth).dump();
  }
  fs::rename(o.out, final_root, ec);
  if (ec)
    return io_error(final_root.string() + ": rename of the synthesised dataset failed: " + ec.message());
  return Status::ok();
}

}  // namespace

namespace {

/// Validation samples: the deterministic part on whole volumes; for box-prompted models
/// (fixed-size 2D inputs) also the random part with a fixed per-case seed, so every
/// validation sees the same slices and boxes.
Result<std::vector<Sample>> make_validation_samples(const std::vector<pipeline::CaseEntry>& val,
                                                    const pipeline::Pipeline& pipe,
                                                    const models::ModelInfo& info, std::uint64_t seed,
                                                    models::TrainObserver& observer) {
  std::vector<Sample> out;
  const bool patches = info.needs_box || info.fixed_size > 0;
  for (std::size_t i = 0; i < val.size(); ++i) {
    auto s = pipe.run_deterministic(val[i]);
    if (!s.is_ok()) {
      observer.on_case_failure({val[i].id, s.status().message()});
      continue;
    }
    if (!patches) {
      out.push_back(std::move(*s));
      continue;
    }
    std::vector<Sample> v{std::move(*s)};
    pipeline::Rng rng = pipeline::Rng::for_sample(seed, 0, 0xFFFFFFFFull, i);
    Status st = pipe.run_random(v, rng);
    if (!st.is_ok()) {
      observer.on_case_failure({val[i].id, st.message()});
      continue;
    }
    for (auto& x : v) out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

PreparedJob::~PreparedJob() {
  source.reset();  // stop the data path before the pipeline it runs goes away
  trainer.reset();
}

Result<PreparedJob> prepare_job(const models::JobConfig& cfg, const RunOptions& opts,
                                models::TrainObserver& observer) {
  PreparedJob job;
  // The whole config (stages, model, loss, optimizer) before any data is read or made.
  pipeline::StageRegistry registry = pipeline::builtin_registry();
  if (!opts.plugin_dir.empty())
    SEGFLOW_RETURN_IF_ERROR(pipeline::load_plugins(opts.plugin_dir, registry).status());
  SEGFLOW_RETURN_IF_ERROR(models::validate_job_config(cfg, registry));
  SEGFLOW_RETURN_IF_ERROR(ensure_dataset(cfg));
  SEGFLOW_ASSIGN_OR_RETURN(auto index,
                           pipeline::scan_dataset(cfg.data.root, pipeline::ScanOptions{.validate = false}));
  for (auto& s : index.skipped) observer.on_case_failure({s.path.string(), s.reason});
  if (index.cases.empty()) return invalid_argument(cfg.data.root + ": no usable cases");
  SEGFLOW_ASSIGN_OR_RETURN(job.split, pipeline::make_split(index.cases, models::split_options(cfg)));
  if (job.split.train.empty()) return invalid_argument(cfg.data.root + ": no training cases after the split");

  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Pipeline pipe, pipeline::build_pipeline(cfg.stages, registry, cfg.file));
  job.pipeline = std::make_unique<pipeline::Pipeline>(std::move(pipe));

  SEGFLOW_ASSIGN_OR_RETURN(c10::Device device, models::resolve_device(cfg.train.device));
  SEGFLOW_ASSIGN_OR_RETURN(job.trainer, models::Trainer::create(cfg, device));
  job.trainer->set_class_names(models::job_class_names(cfg, index.label_names));

  pipeline::LoaderOptions lo;
  lo.cases = job.split.train;
  lo.pipeline = job.pipeline.get();
  lo.batch_size = cfg.train.batch_size;
  lo.seed = cfg.seed;
  lo.rank = opts.rank;
  lo.world_size = opts.world_size;
  lo.device = device.str();
  lo.decode_workers = static_cast<int>(cfg.train.decode_workers);
  lo.max_inflight_batches = static_cast<int>(cfg.train.prefetch);
  lo.cache_rate = cfg.train.cache_rate;
  lo.cache_bytes = cfg.train.cache_bytes;
  lo.cache_dtype = cfg.train.cache_dtype;
  lo.cache_device = cfg.train.cache_device;
  lo.disk_cache_dir = cfg.train.disk_cache;
  SEGFLOW_ASSIGN_OR_RETURN(job.source, make_batch_source(cfg.train.loader, lo, opts.data_events));

  // Steps per epoch for the schedule: this rank's cases x samples per case / (batch x accumulate).
  std::int64_t per_case = 1;
  {
    auto probe = job.pipeline->run_deterministic(job.split.train.front());
    if (probe.is_ok()) {
      std::vector<Sample> v{std::move(*probe)};
      pipeline::Rng rng(0);
      if (job.pipeline->run_random(v, rng).is_ok())
        per_case = std::max<std::int64_t>(1, static_cast<std::int64_t>(v.size()));
    }
  }
  const auto world = std::max<std::int64_t>(1, opts.world_size);
  const auto ncases = (static_cast<std::int64_t>(job.split.train.size()) + world - 1) / world;
  const std::int64_t batches = (ncases * per_case + cfg.train.batch_size - 1) / cfg.train.batch_size;
  job.steps_per_epoch = (batches + cfg.train.accumulate - 1) / cfg.train.accumulate;
  if (cfg.train.steps_per_epoch > 0)
    job.steps_per_epoch = std::min(job.steps_per_epoch, cfg.train.steps_per_epoch);

  SEGFLOW_ASSIGN_OR_RETURN(
      job.validation,
      make_validation_samples(job.split.val, *job.pipeline, job.trainer->model().info(), cfg.seed, observer));
  return job;
}

Result<fs::path> run_training(const models::JobConfig& cfg, const RunOptions& opts,
                              models::TrainObserver& observer) {
  // The run folder first (it touches nothing on disk before open()): its event bus is where
  // the data path publishes, and it outlives the batch source, whose last events it delivers.
  RunFolder run(cfg, opts);
  RunOptions with_bus = opts;
  with_bus.data_events = run.data_events();
  SEGFLOW_ASSIGN_OR_RETURN(PreparedJob job, prepare_job(cfg, with_bus, observer));
  auto& trainer = job.trainer;
  const c10::Device device = trainer->device();

  SEGFLOW_RETURN_IF_ERROR(run.open(cfg, *trainer, job.split, observer));
  log::info("run " + run.dir().string() + ": " + std::to_string(job.split.train.size()) +
            " training cases, " + std::to_string(job.validation.size()) + " validation samples, " +
            std::to_string(job.steps_per_epoch) + " steps per epoch on " + device.str() + " (" +
            cfg.train.loader + " loader)");
  log::info("intra-op threads " + trainer->intra_op_team().reason());
  SEGFLOW_RETURN_IF_ERROR(
      trainer->fit(*job.source, job.steps_per_epoch, job.validation, run.dir(), run.events()));
  // Out-of-fold predictions, unless the run was stopped from outside (a paused or stopped
  // daemon job resumes later and predicts then).
  if (!observer.should_stop())
    SEGFLOW_RETURN_IF_ERROR(write_validation_predictions(cfg, job.split, run.dir(), *trainer));
  return run.dir();
}

}  // namespace segflow::actors
