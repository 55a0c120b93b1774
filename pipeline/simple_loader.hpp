#pragma once
// SimpleLoader: the synchronous BatchSource. Everything happens in the calling thread
// inside next(): no overlap of I/O and compute. It is the baseline of the benchmarks and
// the reference the actor pipeline (actors/actor_batch_source.hpp) must match exactly.
//
// Epoch semantics, shared by every BatchSource (the helpers below are what both use):
//   1. The rank's order is EpochSampler{n, rank, world, seed}.indices(epoch) (shuffled,
//      padded by wrap-around to a multiple of world_size).
//   2. For position p of that order (case index i = order[p]) the deterministic sample of
//      case i comes from the memory cache (cases i < cacheable_cases(n, cache_rate), while
//      the byte budget lasts), else from the disk cache, else from the reader and the
//      stages before the cache boundary (decode_case).
//   3. The random stages run on LoaderOptions::device with Rng::for_sample(seed, rank,
//      epoch, p) (augment_case); a case may give several samples (crops).
//   4. Samples are appended in epoch order and cut into batches of batch_size; the last,
//      partial batch of the epoch is kept.
//   A case that fails in 2 or 3 is skipped and recorded (take_failures()); the epoch goes
//   on with the other cases. A failed case is tried again in later epochs.

#include <nlohmann/json.hpp>

#include <c10/core/Device.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/batch_source.hpp"
#include "pipeline/cache/sample_cache.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/sampler.hpp"

namespace segflow::pipeline {

/// Checks LoaderOptions (pipeline set, cases present, batch_size >= 1, decode_workers >= 1,
/// max_inflight_batches >= 1, cache_rate in [0, 1], cache_bytes >= 0, a known cache_dtype,
/// cache_device cpu or cuda (cuda only with a CUDA device), a device that exists and on
/// which every random stage can run). Errors name the field:
/// "loader: batch_size: expected an integer >= 1, got 0".
Status validate_loader_options(const LoaderOptions& options);

/// The device of LoaderOptions::device (validated by validate_loader_options).
Result<c10::Device> loader_device(const LoaderOptions& options);
/// Where the memory cache lives: the CPU, or `device` for cache_device cuda.
Result<c10::Device> loader_cache_device(const LoaderOptions& options);
/// LoaderOptions::cache_dtype parsed.
Result<CacheDtype> loader_cache_dtype(const LoaderOptions& options);

/// The sampler of LoaderOptions (shuffle on, drop_last off).
Result<EpochSampler> loader_sampler(const LoaderOptions& options);

/// A cached sample on `device`, ready for the random stages. On the CPU the tensors are
/// shared, not copied (stages never write their inputs); so are tensors already on `device`
/// (a CUDA cache), and host-resident ones (host_resident_key: crop-centre sets and compact
/// markers, read on the host) stay where they are. To a CUDA device with `pinned`, tensors
/// are staged through pinned host memory and copied asynchronously on the current stream
/// (the caller synchronizes that stream before handing results to another one).
Result<Sample> sample_to_device(const Sample& sample, const c10::Device& device, bool pinned = false);

/// Step 3 of the epoch semantics for position `position` of `epoch`: the cached sample on
/// `device` (expanded from its compact form first unless the first random stage reads it:
/// reads_compact), then Pipeline::run_random with Rng::for_sample(seed, rank, epoch,
/// position). Thread-safe (const pipeline, own Rng).
Result<std::vector<Sample>> augment_case(const Pipeline& pipeline, const Sample& cached, std::uint64_t seed,
                                         std::int64_t rank, std::int64_t epoch, std::int64_t position,
                                         const c10::Device& device, bool pinned = false);

/// Step 4: cuts samples, in the order added, into batches of `batch_size`.
class BatchAssembler {
 public:
  explicit BatchAssembler(std::int64_t batch_size = 1) : batch_size_(batch_size) {}
  void add(std::vector<Sample> samples);
  /// True when a full batch can be taken.
  bool has_full() const { return static_cast<std::int64_t>(pending_.size()) >= batch_size_; }
  /// Samples waiting (fewer than batch_size unless has_full()).
  std::int64_t pending() const { return static_cast<std::int64_t>(pending_.size()); }
  /// The next full batch (requires has_full()).
  Result<Batch> take_full();
  /// The last, partial batch of an epoch (requires pending() > 0).
  Result<Batch> take_rest();
  void clear() { pending_.clear(); }

 private:
  Result<Batch> take(std::int64_t n);
  std::int64_t batch_size_;
  std::deque<Sample> pending_;
};

/// Counters of a SimpleLoader.
struct SimpleLoaderStats {
  std::int64_t decodes = 0;        ///< cases read and run through the deterministic stages
  std::int64_t disk_hits = 0;      ///< cases read back from the disk cache
  std::int64_t memory_hits = 0;    ///< cases served from the memory cache
  std::int64_t cache_entries = 0;  ///< samples in the memory cache
  std::int64_t cache_bytes = 0;    ///< their tensor bytes
  std::int64_t cache_voxels = 0;   ///< their spatial voxels (MemoryCache::voxels)
  std::int64_t not_admitted = 0;   ///< cacheable samples left out for the budget
  double decode_seconds = 0;       ///< time spent in decode_case (disk reads included)
};

/// The synchronous BatchSource (see the header comment). Not thread-safe: one owner.
class SimpleLoader : public BatchSource {
 public:
  /// Validates the options and opens the disk cache when disk_cache_dir is set.
  static Result<std::unique_ptr<SimpleLoader>> make(const LoaderOptions& options);

  Status start_epoch(std::int64_t epoch) override;
  Result<std::optional<Batch>> next() override;
  std::vector<CaseFailure> take_failures() override;
  /// The whole time of the last next() (it does all the work while the caller waits).
  double last_wait_s() const override { return last_wait_s_; }

  SimpleLoaderStats stats() const;

  SimpleLoader(const LoaderOptions& options, EpochSampler sampler, c10::Device device,
               std::shared_ptr<DiskCache> disk, c10::Device cache_device = c10::Device(c10::kCPU),
               CacheDtype cache_dtype = CacheDtype::none);  // use make()

 private:
  Result<Sample> deterministic(std::int64_t index);

  LoaderOptions options_;
  EpochSampler sampler_;
  c10::Device device_;
  std::shared_ptr<DiskCache> disk_;
  nlohmann::json det_spec_;
  CacheDtype cache_dtype_;
  MemoryCache memory_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
  std::size_t position_ = 0;
  BatchAssembler assembler_;
  std::vector<CaseFailure> failures_;
  double last_wait_s_ = 0;
  SimpleLoaderStats stats_;
};

}  // namespace segflow::pipeline
