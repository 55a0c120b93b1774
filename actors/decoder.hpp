#pragma once
// Decoders: the blocking part of the data path. One request = one case: the disk cache
// (when configured), else the reader and the deterministic stages, then the disk-cache
// write (pipeline/cache/sample_cache.hpp decode_case).
//
// Concurrency: each decoder is a detached CAF actor (its own thread) and handles one
// request at a time; a pool of LoaderOptions::decode_workers of them belongs to the cache
// actor, which spawns them linked and replaces one that dies.
// Backpressure: the cache sends a decoder a request only when it is idle, so a decoder's
// mailbox holds at most one request and the pool at most decode_workers.
// Errors: a failing case (bad file, a stage that returns an error or throws a
// std::exception) is answered with a segflow error and the decoder goes on; anything else
// escapes to the exception handler (reported; the decoder dies and is replaced).

#include <nlohmann/json.hpp>

#include <c10/core/Device.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "actors/detail/device_stream.hpp"
#include "actors/interfaces.hpp"
#include "pipeline/cache/compact.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::actors {

/// What every decoder shares (read-only).
struct DecodeContext {
  std::vector<pipeline::CaseEntry> cases;                         ///< by dataset index
  const pipeline::Pipeline* pipeline = nullptr;                   ///< must outlive the actors
  std::shared_ptr<pipeline::DiskCache> disk;                      ///< may be null
  nlohmann::json det_spec;                                        ///< deterministic_spec(*pipeline)
  pipeline::CacheDtype cache_dtype = pipeline::CacheDtype::none;  ///< form of decoded samples
  /// Where cacheable samples go (a CUDA cache): decoders copy cases with an index below
  /// `cacheable` there on a side stream of their own, and wait for the copy.
  c10::Device cache_device{c10::kCPU};
  std::int64_t cacheable = 0;
  /// Decoders alive (their state exists): the owner waits for 0 before the pipeline goes.
  mutable std::atomic<int> live_decoders{0};
};

/// Counts one live decoder in DecodeContext::live_decoders for its lifetime.
class LiveDecoder {
 public:
  explicit LiveDecoder(const DecodeContext& ctx) : n_(&ctx.live_decoders) { ++*n_; }
  ~LiveDecoder() { --*n_; }
  LiveDecoder(const LiveDecoder&) = delete;
  LiveDecoder& operator=(const LiveDecoder&) = delete;

 private:
  std::atomic<int>* n_;
};

/// State of a decoder.
struct DecoderState {
  std::shared_ptr<const DecodeContext> ctx;
  collector_actor collector;
  std::string source;                            ///< "decoder[i]"
  std::unique_ptr<LiveDecoder> live;             ///< released with the state, when the decoder exits
  std::unique_ptr<detail::DeviceStream> stream;  ///< copies to a CUDA cache device
  static inline const char* name = "segflow.decoder";
};

/// A decoder's behaviour. Spawn detached.
decoder_actor::behavior_type decoder(decoder_actor::stateful_pointer<DecoderState> self,
                                     std::shared_ptr<const DecodeContext> ctx, collector_actor collector,
                                     int index);

}  // namespace segflow::actors
