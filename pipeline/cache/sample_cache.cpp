#include "pipeline/cache/sample_cache.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "pipeline/cache/disk_cache.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::pipeline {

std::int64_t sample_bytes(const Sample& sample) {
  std::int64_t n = 0;
  for (const auto& [k, t] : sample.tensors)
    if (t.defined()) n += t.numel() * static_cast<std::int64_t>(t.element_size());
  return n;
}

std::int64_t cacheable_cases(std::int64_t n, double rate) {
  if (!(rate > 0)) return 0;
  if (rate >= 1) return n;
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(static_cast<double>(n) * rate)), 0, n);
}

Result<DecodedCase> decode_case(const CaseEntry& entry, const Pipeline& pipeline, const DiskCache* disk,
                                const nlohmann::json& det_spec, CacheDtype dtype) {
  std::optional<std::string> key;
  if (disk) {
    // A case whose files cannot be described is decoded without the disk cache; the reader
    // then reports the real problem. Uncompacted entries keep the keys they always had.
    const nlohmann::json spec =
        dtype == CacheDtype::none
            ? det_spec
            : nlohmann::json{{"deterministic", det_spec}, {"cache_dtype", cache_dtype_name(dtype)}};
    if (auto k = disk->key_for(entry, spec); k.is_ok()) key = std::move(k).value();
  }
  if (key) {
    auto hit = disk->load(*key);
    if (hit.is_ok() && hit.value()) return DecodedCase{std::move(*hit.value()), true};
  }
  SEGFLOW_ASSIGN_OR_RETURN(Sample s, pipeline.run_deterministic(entry));
  SEGFLOW_ASSIGN_OR_RETURN(s, compact_sample(s, dtype));
  if (key) (void)disk->store(*key, s);  // failures are counted in DiskCache::stats()
  return DecodedCase{std::move(s), false};
}

Result<Sample> move_to_cache_device(const Sample& sample, const c10::Device& device) {
  if (device.is_cpu()) return sample;
  Sample out = sample;
  try {
    // Through pinned memory, asynchronously on the current stream: the copy is ordered before
    // any later work on that stream, and the host does not wait for it.
    for (auto& [k, t] : out.tensors)
      if (t.defined() && !host_resident_key(k) && t.device() != device)
        t = device.is_cuda() && t.is_cpu() ? t.pin_memory().to(device, /*non_blocking=*/true) : t.to(device);
  } catch (const c10::Error& e) {
    return internal_error("cache: sample '" + sample.id + "' to " + device.str() + ": " +
                          e.what_without_backtrace());
  }
  return out;
}

const Sample* MemoryCache::find(std::int64_t index) const {
  auto it = map_.find(index);
  return it == map_.end() ? nullptr : &it->second;
}

bool MemoryCache::offer(std::int64_t index, const Sample& sample) {
  if (!cacheable(index) || map_.count(index)) return false;
  const std::int64_t n = sample_bytes(sample);
  if (bytes_ + n > budget_) {
    ++not_admitted_;
    return false;
  }
  auto moved = move_to_cache_device(sample, device_);
  if (!moved.is_ok()) {  // e.g. out of device memory: served, not kept
    ++not_admitted_;
    return false;
  }
  Sample kept = std::move(moved).value();
  for (auto& [k, t] : kept.tensors) {
    if (!t.defined()) continue;
    const auto held = static_cast<std::int64_t>(t.storage().nbytes());
    if (pin_ && t.is_cpu() && !host_resident_key(k)) {
      try {
        t = t.pin_memory();  // a contiguous copy of its own
        continue;
      } catch (const c10::Error&) {  // no page-locked memory left: kept pageable
      }
    }
    if (!t.is_contiguous() || held > t.numel() * static_cast<std::int64_t>(t.element_size())) t = t.clone();
  }
  bytes_ += n;
  voxels_ += sample_voxels(kept);
  map_.emplace(index, std::move(kept));
  return true;
}

}  // namespace segflow::pipeline
