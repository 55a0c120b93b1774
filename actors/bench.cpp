#include "actors/bench.hpp"

#include <torch/torch.h>

#include <chrono>
#include <functional>

#include "actors/job_runner.hpp"
#include "messages/log.hpp"
#include "models/device_memory.hpp"
#include "pipeline/staged_source.hpp"

namespace segflow::actors {

using nlohmann::json;

namespace {

struct Totals {
  std::int64_t epochs = 0, steps = 0;
  double seconds = 0, samples = 0, wait = 0;
  json to_json() const {
    return {{"epochs", epochs},
            {"steps", steps},
            {"seconds", seconds},
            {"samples_per_s", seconds > 0 ? samples / seconds : 0.0},
            {"step_ms", steps ? seconds / static_cast<double>(steps) * 1e3 : 0.0},
            {"data_wait_ms", steps ? wait / static_cast<double>(steps) * 1e3 : 0.0}};
  }
};

/// Runs epochs until `seconds` have passed (or max_epochs), at least one.
Result<Totals> timed_epochs(models::Trainer& t, pipeline::BatchSource& src, std::int64_t steps,
                            double seconds, std::int64_t max_epochs) {
  models::TrainObserver none;
  Totals tot;
  while (true) {
    SEGFLOW_ASSIGN_OR_RETURN(models::EpochInfo e, t.train_epoch(src, steps, none));
    ++tot.epochs;
    tot.steps += e.steps;
    tot.seconds += e.seconds;
    tot.samples += e.samples_per_s * e.seconds;
    tot.wait += e.data_wait_s;
    if (max_epochs > 0 ? tot.epochs >= max_epochs : tot.seconds >= seconds) break;
  }
  return tot;
}

}  // namespace

Result<std::vector<json>> bench_training(const models::JobConfig& base, const BenchOptions& o,
                                         const std::function<void(const json&)>& emit) {
  std::vector<json> out;
  auto put = [&](json j) {
    if (emit) emit(j);
    out.push_back(std::move(j));
  };
  std::vector<std::string> loaders =
      o.loaders.empty() ? std::vector<std::string>{base.train.loader} : o.loaders;
  json eff = json::object(), sps = json::object();
  std::string device;
  double peak_gpu = 0;
  for (const auto& loader : loaders) {
    models::JobConfig cfg = base;
    cfg.train.loader = loader;
    models::TrainObserver none;
    SEGFLOW_ASSIGN_OR_RETURN(PreparedJob job, prepare_job(cfg, RunOptions{}, none));
    device = job.trainer->device().str();
    const std::int64_t steps = job.steps_per_epoch;
    // Warm-up epoch: fills the caches, and records the batches the compute run replays.
    pipeline::RecordingBatchSource rec(*job.source, static_cast<std::size_t>(steps * cfg.train.accumulate));
    SEGFLOW_ASSIGN_OR_RETURN(Totals first, timed_epochs(*job.trainer, rec, steps, 0.0, 1));
    SEGFLOW_ASSIGN_OR_RETURN(Totals e2e,
                             timed_epochs(*job.trainer, *job.source, steps, o.seconds, o.max_epochs));
    json j = {{"bench", "e2e"},
              {"config", cfg.name},
              {"loader", loader},
              {"device", device},
              {"batch_size", cfg.train.batch_size},
              {"first_epoch_s", first.seconds}};
    j.update(e2e.to_json());
    put(j);
    // The same steps on staged batches: no data path at all.
    std::vector<Batch> staged = rec.take_recorded();
    if (staged.empty()) return internal_error("bench: the warm-up epoch produced no batches");
    for (auto& b : staged)
      for (auto& [k, t] : b.tensors) t = t.to(job.trainer->device());
    pipeline::StagedBatchSource replay(std::move(staged), steps * cfg.train.accumulate);
    SEGFLOW_ASSIGN_OR_RETURN(Totals comp, timed_epochs(*job.trainer, replay, steps, o.seconds,
                                                       std::max<std::int64_t>(e2e.epochs, 1)));
    json c = {{"bench", "compute"},
              {"config", cfg.name},
              {"loader", loader},
              {"device", device},
              {"batch_size", cfg.train.batch_size}};
    c.update(comp.to_json());
    put(c);
    const double e = e2e.to_json()["samples_per_s"].get<double>(),
                 cs = comp.to_json()["samples_per_s"].get<double>();
    eff[loader] = cs > 0 ? e / cs : 0.0;
    sps[loader] = e;
    peak_gpu = std::max(peak_gpu, models::peak_device_memory_mb(job.trainer->device()));
  }
  json s = {{"bench", "summary"},     {"config", base.name},
            {"device", device},       {"pipeline_efficiency", eff},
            {"samples_per_s", sps},   {"peak_host_mb", models::peak_host_memory_mb()},
            {"peak_gpu_mb", peak_gpu}};
  if (sps.contains("actors") && sps.contains("simple") && sps["simple"].get<double>() > 0)
    s["actors_over_simple"] = sps["actors"].get<double>() / sps["simple"].get<double>();
  put(s);
  return out;
}

}  // namespace segflow::actors
