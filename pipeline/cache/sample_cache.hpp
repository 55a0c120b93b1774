#pragma once
// The pieces of the cached data path that the synchronous SimpleLoader and the actor
// pipeline share, so that both decide the same way: which cases may stay in memory
// (cache_rate, byte budget), how a case is decoded (disk cache first) and compacted
// (pipeline/cache/compact.hpp), where the memory cache lives (host or a CUDA device), and
// how big a sample is.

#include <nlohmann/json.hpp>

#include <c10/core/Device.h>

#include <cstdint>
#include <unordered_map>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/cache/compact.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::pipeline {

/// Bytes of a sample's tensors (numel * element size, summed).
std::int64_t sample_bytes(const Sample& sample);

/// Cases allowed in the memory cache for `rate` (MONAI CacheDataset: floor(n * rate),
/// clamped to [0, n]). Cases with a dataset index below it are cacheable.
std::int64_t cacheable_cases(std::int64_t n, double rate);

/// A decoded case and where it came from.
struct DecodedCase {
  Sample sample;
  bool from_disk = false;  ///< read back from the disk cache (no reader, no stages)
};

/// The deterministic sample of a case: from `disk` when it holds a valid entry, else read,
/// run through the stages before the cache boundary and compacted as `dtype` says
/// (compact_sample), then written to `disk` (a failed write is counted by the cache, not an
/// error). Disk entries are keyed by the deterministic spec and, unless dtype is none, by
/// dtype too: every source (memory, disk, a fresh decode) hands out the same form.
/// `det_spec` is deterministic_spec(pipeline) (computed once by the caller). `disk` may be
/// null. Thread-safe; blocking.
Result<DecodedCase> decode_case(const CaseEntry& entry, const Pipeline& pipeline, const DiskCache* disk,
                                const nlohmann::json& det_spec, CacheDtype dtype = CacheDtype::none);

/// `sample` with every tensor but the host-resident ones (host_resident_key: crop-centre
/// sets, compact markers) on `device`; CPU devices and tensors already there are shared.
/// Blocking copies on the current stream.
Result<Sample> move_to_cache_device(const Sample& sample, const c10::Device& device);

/// An in-memory cache of deterministic samples keyed by dataset index, with a byte budget.
/// Admission, not eviction: a sample is kept when its index is cacheable and it fits in
/// what is left of the budget, and then for good (an evicting cache would thrash under a
/// shuffled epoch order). Admitted tensors are compacted (a view of a larger storage is
/// cloned) so that the counted bytes are the bytes held. With a CUDA `device` the admitted
/// tensors live in that device's memory (move_to_cache_device; the budget counts them all,
/// host-resident ones included). A host cache that feeds a CUDA device (`pin`) keeps its
/// tensors in pinned (page-locked) memory, pinned once when admitted, so that each epoch's
/// copies to the device are asynchronous DMA without a staging copy. Not thread-safe: one owner.
class MemoryCache {
 public:
  /// `cacheable`: indices [0, cacheable) may be kept; `budget_bytes` >= 0; `device`: where
  /// admitted tensors live (CPU or CUDA); `pin`: pin host tensors (a CUDA consumer).
  MemoryCache(std::int64_t cacheable, std::int64_t budget_bytes, c10::Device device = c10::Device(c10::kCPU),
              bool pin = false)
      : cacheable_(cacheable), budget_(budget_bytes), device_(device), pin_(pin && device.is_cpu()) {}

  /// The cached sample of `index`, or nullptr.
  const Sample* find(std::int64_t index) const;
  /// Offers a sample; returns true when it was admitted. `not_admitted()` counts cacheable
  /// samples left out for the budget.
  bool offer(std::int64_t index, const Sample& sample);

  bool cacheable(std::int64_t index) const { return index >= 0 && index < cacheable_; }
  std::int64_t cacheable_count() const { return cacheable_; }
  std::int64_t entries() const { return static_cast<std::int64_t>(map_.size()); }
  std::int64_t bytes() const { return bytes_; }
  /// Spatial voxels of the cached samples (sample_voxels, summed): bytes() / voxels() is
  /// the bytes per cached voxel.
  std::int64_t voxels() const { return voxels_; }
  std::int64_t budget() const { return budget_; }
  std::int64_t not_admitted() const { return not_admitted_; }
  const c10::Device& device() const { return device_; }

 private:
  std::int64_t cacheable_;
  std::int64_t budget_;
  c10::Device device_;
  bool pin_ = false;
  std::int64_t bytes_ = 0;
  std::int64_t voxels_ = 0;
  std::int64_t not_admitted_ = 0;
  std::unordered_map<std::int64_t, Sample> map_;
};

}  // namespace segflow::pipeline
