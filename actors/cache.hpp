#pragma once
// The cache actor: the deterministic samples of the cases, by dataset index.
//
// Hit: answered at once from memory. Miss: queued; sent to an idle decoder of its pool
// (each decoder consults and fills the disk cache on the cache's behalf, so that blocking
// file I/O stays off the scheduler); requests for a case already being decoded wait for
// that one decode. The sample is then admitted to memory when its index is cacheable
// (cache_rate) and it fits in what is left of the byte budget (pipeline::MemoryCache:
// admission, never eviction), and handed to every waiting requester.
//
// Concurrency: an event-based actor whose handlers are short and never block. ActorBatch-
// Source spawns it detached all the same: on CAF 0.17's work-stealing scheduler an idle
// worker polls with sleeps of up to 10 ms, which a scheduled cache would add to every fetch.
// The decoders are detached, spawned linked by the cache and replaced when one dies (its
// exit is trapped; a request that met a dead decoder is queued again, up to twice).
// Backpressure: at most one request per decoder in flight (decode_limit =
// decode_workers); the rest wait in the cache's queue, which is bounded by what its
// requesters have in flight (each augmenter's window). Memory: cached bytes <= budget,
// wherever the cache lives (host, or CUDA memory with cache_device cuda).

#include <caf/typed_response_promise.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "actors/decoder.hpp"
#include "actors/interfaces.hpp"
#include "pipeline/cache/sample_cache.hpp"

namespace segflow::actors {

/// Configuration of the cache actor.
struct CacheConfig {
  std::int64_t cacheable = 0;     ///< indices [0, cacheable) may stay in memory
  std::int64_t budget_bytes = 0;  ///< memory budget of the cached tensors (host or device)
  int decode_workers = 1;         ///< decoders to spawn, >= 1
  /// Where cached tensors live: the CPU, or a CUDA device (DecodeContext::cache_device; the
  /// decoders copy cacheable cases there, so admission copies nothing on this actor).
  c10::Device device{c10::kCPU};
  /// A host cache whose samples go to a CUDA augmenter: pinned once when admitted.
  bool pin = false;
};

/// One decoder of the pool, as the cache sees it.
struct DecoderSlot {
  decoder_actor handle;
  bool busy = false;             ///< a request is in flight
  bool alive = true;             ///< false after a request met it dead, until it is replaced
  std::uint64_t generation = 0;  ///< bumped on replacement (stale answers are ignored)
};

/// State of the cache actor.
struct CacheState {
  std::shared_ptr<const DecodeContext> ctx;
  collector_actor collector;
  pipeline::MemoryCache memory{0, 0};
  std::vector<DecoderSlot> decoders;
  std::deque<std::int64_t> queue;  ///< misses waiting for a decoder
  std::unordered_map<std::int64_t, std::vector<caf::typed_response_promise<Sample>>> waiting;
  std::unordered_map<std::int64_t, int> retries;
  CacheStats counters;
  static inline const char* name = "segflow.cache";
};

/// The cache's behaviour; spawns its decoder pool. Spawn detached (see above).
cache_actor::behavior_type cache(cache_actor::stateful_pointer<CacheState> self,
                                 std::shared_ptr<const DecodeContext> ctx, CacheConfig config,
                                 collector_actor collector);

}  // namespace segflow::actors
