#include "pipeline/simple_loader.hpp"

#include <torch/torch.h>

#include <chrono>
#include <utility>

#include "pipeline/cache/compact.hpp"
#include "pipeline/cache/disk_cache.hpp"
#include "pipeline/collate.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::pipeline {

namespace {

Status bad(const std::string& field, const std::string& expected, const std::string& got) {
  return invalid_argument("loader: " + field + ": expected " + expected + ", got " + got);
}

}  // namespace

Result<c10::Device> loader_device(const LoaderOptions& o) {
  try {
    c10::Device d(o.device);
    if (d.is_cuda()) {
      if (!torch::cuda::is_available())
        return unsupported("loader: device: '" + o.device + "' needs CUDA, which is not available here");
      if (d.has_index() && d.index() >= static_cast<c10::DeviceIndex>(torch::cuda::device_count()))
        return invalid_argument("loader: device: '" + o.device + "' does not exist (" +
                                std::to_string(torch::cuda::device_count()) + " CUDA devices)");
    } else if (!d.is_cpu()) {
      return unsupported("loader: device: expected cpu or cuda[:N], got '" + o.device + "'");
    }
    return d;
  } catch (const std::exception&) {
    return bad("device", "cpu or cuda[:N]", "'" + o.device + "'");
  }
}

Result<CacheDtype> loader_cache_dtype(const LoaderOptions& o) {
  return parse_cache_dtype(o.cache_dtype, "loader: cache_dtype");
}

Result<c10::Device> loader_cache_device(const LoaderOptions& o) {
  if (o.cache_device == "cpu") return c10::Device(c10::kCPU);
  if (o.cache_device != "cuda") return bad("cache_device", "cpu or cuda", "'" + o.cache_device + "'");
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device d, loader_device(o));
  if (!d.is_cuda())
    return invalid_argument("loader: cache_device: cuda keeps the cache on the training device, which is " +
                            d.str() + "; expected a CUDA device or cache_device cpu");
  return d;
}

Status validate_loader_options(const LoaderOptions& o) {
  if (!o.pipeline) return invalid_argument("loader: pipeline: expected a built pipeline, got none");
  if (o.cases.empty()) return bad("cases", "at least one case", "none");
  if (o.batch_size < 1) return bad("batch_size", "an integer >= 1", std::to_string(o.batch_size));
  if (o.world_size < 1) return bad("world_size", "an integer >= 1", std::to_string(o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    return bad("rank", "an integer in [0, " + std::to_string(o.world_size - 1) + "]", std::to_string(o.rank));
  if (o.decode_workers < 1) return bad("decode_workers", "an integer >= 1", std::to_string(o.decode_workers));
  if (o.max_inflight_batches < 1)
    return bad("max_inflight_batches", "an integer >= 1", std::to_string(o.max_inflight_batches));
  if (!(o.cache_rate >= 0 && o.cache_rate <= 1))
    return bad("cache_rate", "a number in [0, 1]", std::to_string(o.cache_rate));
  if (o.cache_bytes < 0) return bad("cache_bytes", "bytes >= 0", std::to_string(o.cache_bytes));
  SEGFLOW_RETURN_IF_ERROR(loader_cache_dtype(o).status());
  SEGFLOW_RETURN_IF_ERROR(loader_cache_device(o).status());
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device d, loader_device(o));
  SEGFLOW_RETURN_IF_ERROR(o.pipeline->check_device(d).with_context("loader: device"));
  return Status::ok();
}

Result<EpochSampler> loader_sampler(const LoaderOptions& o) {
  SamplerOptions so;
  so.dataset_size = static_cast<std::int64_t>(o.cases.size());
  so.rank = o.rank;
  so.world_size = o.world_size;
  so.seed = o.seed;
  return EpochSampler::make(so);
}

Result<Sample> sample_to_device(const Sample& s, const c10::Device& device, bool pinned) {
  Sample out;
  out.id = s.id;
  out.geometry = s.geometry;
  try {
    for (const auto& [k, t] : s.tensors) {
      if (!t.defined() || t.device() == device || host_resident_key(k)) {
        out.tensors[k] = t;
      } else if (pinned && device.is_cuda() && t.device().is_cpu()) {
        // A cached tensor was pinned once when the cache admitted it (MemoryCache `pin`).
        out.tensors[k] = (t.is_pinned() ? t : t.pin_memory()).to(device, /*non_blocking=*/true);
      } else {
        out.tensors[k] = t.to(device);
      }
    }
  } catch (const c10::Error& e) {
    return internal_error("sample '" + s.id + "' to " + device.str() + ": " + e.what_without_backtrace());
  }
  return out;
}

Result<std::vector<Sample>> augment_case(const Pipeline& pipeline, const Sample& cached, std::uint64_t seed,
                                         std::int64_t rank, std::int64_t epoch, std::int64_t position,
                                         const c10::Device& device, bool pinned) {
  std::vector<Sample> v;
  SEGFLOW_ASSIGN_OR_RETURN(Sample on_device, sample_to_device(cached, device, pinned));
  if (is_compact(on_device) && !reads_compact(pipeline)) {
    SEGFLOW_ASSIGN_OR_RETURN(on_device, expand_sample(std::move(on_device)));
  }
  v.push_back(std::move(on_device));
  Rng rng = Rng::for_sample(seed, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(epoch),
                            static_cast<std::uint64_t>(position));
  SEGFLOW_RETURN_IF_ERROR(pipeline.run_random(v, rng));
  return v;
}

// ----------------------------------------------------------------------- BatchAssembler

void BatchAssembler::add(std::vector<Sample> samples) {
  for (auto& s : samples) pending_.push_back(std::move(s));
}

Result<Batch> BatchAssembler::take(std::int64_t n) {
  std::vector<Sample> v;
  v.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    v.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  try {
    return collate(v);
  } catch (const c10::Error& e) {
    return internal_error(std::string("collate: ") + e.what_without_backtrace());
  }
}

Result<Batch> BatchAssembler::take_full() {
  if (!has_full()) return internal_error("batch assembler: no full batch");
  return take(batch_size_);
}

Result<Batch> BatchAssembler::take_rest() {
  if (pending_.empty()) return internal_error("batch assembler: nothing pending");
  return take(static_cast<std::int64_t>(pending_.size()));
}

// ------------------------------------------------------------------------- SimpleLoader

SimpleLoader::SimpleLoader(const LoaderOptions& options, EpochSampler sampler, c10::Device device,
                           std::shared_ptr<DiskCache> disk, c10::Device cache_device, CacheDtype cache_dtype)
    : options_(options),
      sampler_(std::move(sampler)),
      device_(device),
      disk_(std::move(disk)),
      det_spec_(deterministic_spec(*options.pipeline)),
      cache_dtype_(cache_dtype),
      memory_(cacheable_cases(static_cast<std::int64_t>(options.cases.size()), options.cache_rate),
              options.cache_bytes, cache_device, /*pin=*/device.is_cuda()),
      assembler_(options.batch_size) {}

Result<std::unique_ptr<SimpleLoader>> SimpleLoader::make(const LoaderOptions& options) {
  SEGFLOW_RETURN_IF_ERROR(validate_loader_options(options));
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device device, loader_device(options));
  SEGFLOW_ASSIGN_OR_RETURN(EpochSampler sampler, loader_sampler(options));
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device cache_device, loader_cache_device(options));
  SEGFLOW_ASSIGN_OR_RETURN(CacheDtype cache_dtype, loader_cache_dtype(options));
  std::shared_ptr<DiskCache> disk;
  if (!options.disk_cache_dir.empty()) {
    DiskCacheOptions dco;
    dco.dir = options.disk_cache_dir;
    SEGFLOW_ASSIGN_OR_RETURN(disk, DiskCache::open(dco));
  }
  return std::make_unique<SimpleLoader>(options, std::move(sampler), device, std::move(disk), cache_device,
                                        cache_dtype);
}

Status SimpleLoader::start_epoch(std::int64_t epoch) {
  if (epoch < 0)
    return invalid_argument("loader: epoch: expected an integer >= 0, got " + std::to_string(epoch));
  epoch_ = epoch;
  order_ = sampler_.indices(epoch);
  position_ = 0;
  assembler_.clear();
  return Status::ok();
}

Result<Sample> SimpleLoader::deterministic(std::int64_t index) {
  if (const Sample* s = memory_.find(index)) {
    ++stats_.memory_hits;
    return *s;
  }
  const auto t0 = std::chrono::steady_clock::now();
  SEGFLOW_ASSIGN_OR_RETURN(DecodedCase d,
                           decode_case(options_.cases[static_cast<std::size_t>(index)], *options_.pipeline,
                                       disk_.get(), det_spec_, cache_dtype_));
  stats_.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++(d.from_disk ? stats_.disk_hits : stats_.decodes);
  if (memory_.offer(index, d.sample)) return *memory_.find(index);  // (on the cache device)
  return std::move(d.sample);
}

Result<std::optional<Batch>> SimpleLoader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  struct Timer {
    std::chrono::steady_clock::time_point t0;
    double& out;
    ~Timer() { out = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } timer{t0, last_wait_s_};
  if (epoch_ < 0) return invalid_argument("loader: next() before start_epoch()");
  while (true) {
    if (assembler_.has_full()) {
      SEGFLOW_ASSIGN_OR_RETURN(Batch b, assembler_.take_full());
      return std::optional<Batch>(std::move(b));
    }
    if (position_ >= order_.size()) {
      if (assembler_.pending() == 0) return std::optional<Batch>();
      SEGFLOW_ASSIGN_OR_RETURN(Batch b, assembler_.take_rest());
      return std::optional<Batch>(std::move(b));
    }
    const std::int64_t p = static_cast<std::int64_t>(position_++);
    const std::int64_t index = order_[static_cast<std::size_t>(p)];
    const std::string& id = options_.cases[static_cast<std::size_t>(index)].id;
    // Pipeline turns std::exceptions into a Status; anything else is caught here, so that
    // one bad case never ends the epoch.
    Result<std::vector<Sample>> samples = internal_error("not augmented");
    try {
      auto det = deterministic(index);
      if (det.is_ok()) {
        samples =
            augment_case(*options_.pipeline, det.value(), options_.seed, options_.rank, epoch_, p, device_);
      } else {
        samples = det.status();
      }
    } catch (const c10::Error& e) {
      samples = internal_error("case '" + id + "': " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      samples = internal_error("case '" + id + "': " + e.what());
    } catch (...) {
      samples = internal_error("case '" + id + "': unknown exception (not a std::exception)");
    }
    if (!samples.is_ok()) {
      failures_.push_back({id, samples.status().to_string()});
      continue;
    }
    assembler_.add(std::move(samples).value());
  }
}

std::vector<CaseFailure> SimpleLoader::take_failures() { return std::exchange(failures_, {}); }

SimpleLoaderStats SimpleLoader::stats() const {
  SimpleLoaderStats s = stats_;
  s.cache_entries = memory_.entries();
  s.cache_bytes = memory_.bytes();
  s.cache_voxels = memory_.voxels();
  s.not_admitted = memory_.not_admitted();
  return s;
}

}  // namespace segflow::pipeline
