#include "actors/jobs/bench.hpp"

#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "actors/actor_batch_source.hpp"
#include "actors/jobs/job_runner.hpp"
#include "messages/log.hpp"
#include "models/training/cpu_threads.hpp"
#include "models/training/device_memory.hpp"
#include "pipeline/simple_loader.hpp"
#include "pipeline/staged_source.hpp"

namespace segflow::actors {

using nlohmann::json;

namespace {

struct Totals {
  std::int64_t epochs = 0, steps = 0;
  double seconds = 0, samples = 0, wait = 0;
  double wall_start = 0, wall_end = 0;  ///< unix seconds: the measured window (for GPU samplers)
  json to_json() const {
    return {{"epochs", epochs},
            {"window_start_unix", wall_start},
            {"window_end_unix", wall_end},
            {"steps", steps},
            {"seconds", seconds},
            {"samples_per_s", seconds > 0 ? samples / seconds : 0.0},
            {"step_ms", steps ? seconds / static_cast<double>(steps) * 1e3 : 0.0},
            {"data_wait_ms", steps ? wait / static_cast<double>(steps) * 1e3 : 0.0}};
  }
};

/// The memory cache of a data path: bytes, voxels, entries, decode time (what the source
/// reports; zeros for a source that has no cache).
struct CacheFigures {
  std::int64_t bytes = 0, voxels = 0, entries = 0, not_admitted = 0, disk_hits = 0;
  double decode_s = 0;
  json to_json() const {
    return {{"cache_bytes", bytes},
            {"cached_voxels", voxels},
            {"cache_entries", entries},
            {"cache_not_admitted", not_admitted},
            {"cache_disk_hits", disk_hits},
            {"bytes_per_cached_voxel",
             voxels > 0 ? static_cast<double>(bytes) / static_cast<double>(voxels) : 0.0}};
  }
};

CacheFigures cache_figures(pipeline::BatchSource& src) {
  CacheFigures f;
  if (auto* s = dynamic_cast<pipeline::SimpleLoader*>(&src)) {
    const auto st = s->stats();
    f = {st.cache_bytes, st.cache_voxels, st.cache_entries, st.not_admitted, st.disk_hits, st.decode_seconds};
  } else if (auto* a = dynamic_cast<ActorBatchSource*>(&src)) {
    if (auto st = a->stats(); st.is_ok())
      f = {st->cache.bytes,        st->cache.voxels,    st->cache.entries,
           st->cache.not_admitted, st->cache.disk_hits, st->cache.decode_seconds};
  }
  return f;
}

/// Starts a new peak for VmHWM (Linux: "5" to /proc/self/clear_refs) and for the CUDA
/// caching allocator, so that each loader's run reports its own peaks.
void reset_peaks(const c10::Device& device) {
  std::ofstream("/proc/self/clear_refs") << "5";
  if (device.is_cuda() && torch::cuda::is_available())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
}

/// LibTorch's per-op profiler (Kineto) on this thread while it lives; finish() writes the
/// trace in Chrome trace format. Ops on CPU, and CUDA kernels when the device is a GPU.
class OpTrace {
 public:
  OpTrace(std::string path, const c10::Device& device) : path_(std::move(path)) {
    if (path_.empty()) return;
    namespace pi = torch::profiler::impl;
    std::set<pi::ActivityType> acts{pi::ActivityType::CPU};
    if (device.is_cuda()) acts.insert(pi::ActivityType::CUDA);
    const pi::ProfilerConfig cfg(pi::ProfilerState::KINETO, /*report_input_shapes=*/true);
    torch::autograd::profiler::prepareProfiler(cfg, acts);
    torch::autograd::profiler::enableProfiler(cfg, acts);
    on_ = true;
  }
  ~OpTrace() {
    if (on_) (void)torch::autograd::profiler::disableProfiler();
  }
  Status finish() {
    if (!on_) return Status::ok();
    on_ = false;
    try {
      auto result = torch::autograd::profiler::disableProfiler();
      if (!result) return internal_error("bench --profile: the profiler returned no result");
      result->save(path_);
    } catch (const std::exception& e) {
      return io_error("bench --profile: " + path_ + ": " + first_line(e));
    }
    if (!std::filesystem::exists(path_))
      return io_error("bench --profile: " + path_ + ": no trace was written");
    return Status::ok();
  }

 private:
  std::string path_;
  bool on_ = false;
};

/// Runs epochs until `seconds` have passed (or max_epochs), at least one.
Result<Totals> timed_epochs(models::Trainer& t, pipeline::BatchSource& src, std::int64_t steps,
                            double seconds, std::int64_t max_epochs) {
  models::TrainObserver none;
  Totals tot;
  auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  tot.wall_start = unix_now();
  while (true) {
    SEGFLOW_ASSIGN_OR_RETURN(models::EpochInfo e, t.train_epoch(src, steps, none));
    ++tot.epochs;
    tot.steps += e.steps;
    tot.seconds += e.seconds;
    tot.samples += e.samples_per_s * e.seconds;
    tot.wait += e.data_wait_s;
    if (max_epochs > 0 ? tot.epochs >= max_epochs : tot.seconds >= seconds) break;
  }
  tot.wall_end = unix_now();
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
  json eff = json::object(), sps = json::object(), bpv = json::object(), host_mb = json::object(),
       gpu_mb = json::object();
  std::string device;
  double peak_gpu = 0, peak_host = 0;
  for (const auto& loader : loaders) {
    models::JobConfig cfg = base;
    cfg.train.loader = loader;
    models::TrainObserver none;
    SEGFLOW_ASSIGN_OR_RETURN(PreparedJob job, prepare_job(cfg, RunOptions{}, none));
    device = job.trainer->device().str();
    reset_peaks(job.trainer->device());  // after set-up: the model, validation samples, dataset
    const std::int64_t steps = job.steps_per_epoch;
    // Warm-up epoch: fills the caches, and records the batches the compute run replays.
    pipeline::RecordingBatchSource rec(*job.source, static_cast<std::size_t>(steps * cfg.train.accumulate));
    SEGFLOW_ASSIGN_OR_RETURN(Totals first, timed_epochs(*job.trainer, rec, steps, 0.0, 1));
    const CacheFigures after_first = cache_figures(*job.source);
    OpTrace trace(out.empty() ? o.profile_path : std::string(), job.trainer->device());
    SEGFLOW_ASSIGN_OR_RETURN(Totals e2e,
                             timed_epochs(*job.trainer, *job.source, steps, o.seconds, o.max_epochs));
    SEGFLOW_RETURN_IF_ERROR(trace.finish());
    const CacheFigures cache = cache_figures(*job.source);
    const double host = models::peak_host_memory_mb(),
                 gpu = models::peak_device_memory_mb(job.trainer->device());
    json j = {{"bench", "e2e"},
              {"config", cfg.name},
              {"loader", loader},
              {"device", device},
              {"amp", job.trainer->config().train.amp},
              {"threads", job.trainer->intra_op_team().threads()},
              {"threads_reason", job.trainer->intra_op_team().reason()},
              {"channels_last", cfg.train.channels_last},
              {"batch_size", cfg.train.batch_size},
              {"first_epoch_s", first.seconds},
              {"first_epoch_decode_s", after_first.decode_s},
              {"cache_dtype", cfg.train.cache_dtype},
              {"cache_device", cfg.train.cache_device},
              {"peak_host_mb", host},
              {"peak_gpu_mb", gpu}};
    j.update(e2e.to_json());
    j.update(cache.to_json());
    put(j);
    bpv[loader] = j["bytes_per_cached_voxel"];
    host_mb[loader] = host;
    gpu_mb[loader] = gpu;
    peak_host = std::max(peak_host, host);
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
              {"amp", job.trainer->config().train.amp},
              {"threads", job.trainer->intra_op_team().threads()},
              {"batch_size", cfg.train.batch_size}};
    c.update(comp.to_json());
    put(c);
    const double e = e2e.to_json()["samples_per_s"].get<double>(),
                 cs = comp.to_json()["samples_per_s"].get<double>();
    eff[loader] = cs > 0 ? e / cs : 0.0;
    sps[loader] = e;
    peak_gpu = std::max(peak_gpu, gpu);
  }
  json s = {{"bench", "summary"},
            {"config", base.name},
            {"device", device},
            {"pipeline_efficiency", eff},
            {"samples_per_s", sps},
            {"bytes_per_cached_voxel", bpv},
            {"cache_dtype", base.train.cache_dtype},
            {"cache_device", base.train.cache_device},
            {"peak_host_mb", peak_host},
            {"peak_gpu_mb", peak_gpu},
            {"peak_host_mb_by_loader", host_mb},
            {"peak_gpu_mb_by_loader", gpu_mb}};
  if (!o.profile_path.empty()) s["profile"] = o.profile_path;
  if (sps.contains("actors") && sps.contains("simple") && sps["simple"].get<double>() > 0)
    s["actors_over_simple"] = sps["actors"].get<double>() / sps["simple"].get<double>();
  put(s);
  return out;
}

}  // namespace segflow::actors
