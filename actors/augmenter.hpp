#pragma once
// The augmenter: batches for one trainer. For each position p of the rank's epoch order it
// pulls the case's deterministic sample from the cache, runs the random stages on the
// trainer's device (Rng::for_sample(seed, rank, epoch, p)), and collates batch_size samples
// at a time, in epoch order. Its output equals SimpleLoader's for the same options
// (pipeline/simple_loader.hpp has the epoch semantics and the shared helpers).
//
// Concurrency: detached (its own thread): the random stages are real compute, and on CUDA
// the thread owns a side stream (CUDAStreamGuard) and stages copies through pinned memory;
// each batch's stream is synchronised before the batch is handed out. Samples may arrive
// from the cache in any order; they are augmented strictly in epoch order (a reorder
// buffer), so batches do not depend on timing.
// Backpressure (pull, counted, bounded):
//   - ready batches <= max_ready (LoaderOptions::max_inflight_batches): no case is
//     augmented and no batch cut while that many are waiting to be taken;
//   - case requests in flight + cases received but not yet augmented <= window;
//   - next requests that find nothing ready wait as response promises and are answered as
//     soon as a batch is cut (or the epoch ends).
// Failures: a case the cache could not produce, or whose random stages fail, is skipped,
// reported to the collector ("case_skipped") and listed in the next reply; a batch that
// cannot be collated is answered with an error in its place. The epoch goes on.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <caf/typed_response_promise.hpp>

#include "actors/detail/device_stream.hpp"
#include "actors/interfaces.hpp"
#include "pipeline/sampler.hpp"
#include "pipeline/simple_loader.hpp"

namespace segflow::actors {

/// Configuration of an augmenter.
struct AugmenterConfig {
  const pipeline::Pipeline* pipeline = nullptr;  ///< must outlive the actor
  std::shared_ptr<const pipeline::EpochSampler> sampler;
  std::vector<std::string> case_ids;  ///< by dataset index (for reports)
  std::uint64_t seed = 0;
  std::int64_t rank = 0;
  std::int64_t batch_size = 1;
  std::int64_t max_ready = 1;  ///< batches prepared ahead, >= 1
  std::int64_t window = 1;     ///< case requests in flight + buffered, >= 1
  std::string device = "cpu";
  int index = 0;  ///< augmenter number (names it in reports)
};

/// The window an ActorBatchSource uses: enough cases to fill the prefetch, and at least one
/// per decoder so that the pool is kept busy: max(batch_size * max_ready, decode_workers).
std::int64_t default_window(std::int64_t batch_size, std::int64_t max_ready, int decode_workers);

/// State of an augmenter.
struct AugmenterState {
  struct Arrived {
    bool ok = false;
    Sample sample;
    Status error;
  };
  struct Prepared {
    Batch batch;
    Status error;  ///< not ok: this batch could not be collated
  };

  AugmenterConfig cfg;
  cache_actor cache;
  collector_actor collector;
  std::string source;
  c10::Device device{c10::kCPU};
  std::unique_ptr<detail::DeviceStream> stream;

  std::int64_t epoch = -1;
  std::uint64_t generation = 0;            ///< bumped per epoch; older answers are ignored
  std::vector<std::int64_t> order;         ///< dataset indices of this epoch
  std::size_t next_request = 0;            ///< next position to ask the cache for
  std::size_t next_process = 0;            ///< next position to augment
  std::int64_t in_flight = 0;              ///< case requests at the cache
  std::map<std::size_t, Arrived> arrived;  ///< reorder buffer by position
  pipeline::BatchAssembler assembler;
  std::deque<Prepared> ready;
  std::vector<CaseSkip> skipped;  ///< since the last reply
  std::deque<caf::typed_response_promise<BatchReply>> waiting;
  bool epoch_reported = false;
  std::int64_t epoch_batches = 0, epoch_samples = 0, epoch_skipped = 0;
  AugmentStats counters;
  static inline const char* name = "segflow.augmenter";
};

/// The augmenter's behaviour. Spawn detached.
augmenter_actor::behavior_type augmenter(augmenter_actor::stateful_pointer<AugmenterState> self,
                                         AugmenterConfig config, cache_actor cache,
                                         collector_actor collector);

}  // namespace segflow::actors
