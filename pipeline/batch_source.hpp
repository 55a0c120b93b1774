#pragma once
// The contract between a data path and a trainer: the trainer pulls batches.
// Implementations: pipeline/simple_loader.hpp (synchronous, in the calling thread; the
// baseline and the reference for tests) and actors/actor_batch_source.hpp (the CAF
// pipeline: decode pool, cache, augmenter, with bounded in-flight batches).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::pipeline {

/// What a training data path is built from. Shared by every BatchSource implementation.
struct LoaderOptions {
  std::vector<CaseEntry> cases;          ///< training cases (already scanned)
  const Pipeline* pipeline = nullptr;    ///< built pipeline; must outlive the source
  std::int64_t batch_size = 2;           ///< samples per batch (after 1 -> N crops), >= 1
  std::uint64_t seed = 0;                ///< job seed (sampler order and per-sample Rng)
  std::int64_t rank = 0;                 ///< data-parallel rank
  std::int64_t world_size = 1;           ///< data-parallel world size
  std::string device = "cpu";            ///< where random stages run and batches land ("cuda:0")
  int decode_workers = 2;                ///< decode pool size (actors) / ignored (simple loader)
  int max_inflight_batches = 2;          ///< prefetch bound per trainer (actors)
  double cache_rate = 1.0;               ///< fraction of cases kept in the memory cache
  std::int64_t cache_bytes = 8LL << 30;  ///< memory cache budget (host or device bytes)
  std::string disk_cache_dir;            ///< persistent cache folder; empty = none
  /// Form of cached samples: exact | float16 | bfloat16 | none (pipeline/cache/compact.hpp).
  std::string cache_dtype = "exact";
  /// Where the memory cache lives: cpu, or cuda (the CUDA `device` itself, which then
  /// reads crops from device memory only; `device` must be a CUDA device).
  std::string cache_device = "cpu";
};

/// A case that failed (bad file, a stage that threw); it is skipped and reported.
struct CaseFailure {
  std::string case_id;
  std::string reason;
};

/// Pulls batches for one trainer. Not thread-safe: one trainer owns one source.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  /// Starts epoch `epoch` (sampler order from seed and epoch). Must be called first.
  virtual Status start_epoch(std::int64_t epoch) = 0;
  /// Next batch of the epoch, std::nullopt when the epoch is done. Failed cases are
  /// skipped (see failures()); an error only when nothing can be produced at all.
  virtual Result<std::optional<Batch>> next() = 0;
  /// Cases skipped so far, with reasons (drained by the caller).
  virtual std::vector<CaseFailure> take_failures() = 0;
  /// Seconds the last next() call waited for data (data-wait time).
  virtual double last_wait_s() const = 0;
};

}  // namespace segflow::pipeline
