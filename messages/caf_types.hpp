#pragma once
// CAF glue of segflow's messages (CAF 0.17.6, Debian's): the atoms of the data-path
// protocol, the small message structs the data-path actors exchange (actors/interfaces.hpp
// has the protocol on one page), segflow's CAF type-id block and register_message_types().
//
// CAF 0.17 notes (many 1.x idioms do not exist here):
// - Atoms are `caf::atom_constant<caf::atom("text")>` (text <= 10 characters), sent as
//   `foo_atom::value`; they need no type id.
// - Plain structs have a free `inspect(Inspector&, T&)` in the 0.17 form
//   (`typename Inspector::result_type`, `caf::meta::type_name`).
// - Types that carry tensors (Sample, Batch, DecodeResult, BatchReply) never leave the
//   process: CAF_ALLOW_UNSAFE_MESSAGE_TYPE, no inspect().
// - 0.17.6 has a transitional CAF_BEGIN_TYPE_ID_BLOCK (it backs add_message_types<Block>());
//   messages are still matched by RTTI, the ids only name the types.
//
// Only the actors layer (and apps) include this header; target segflow_caf_types.

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "messages/event.hpp"
#include "messages/sample.hpp"
#include "messages/status.hpp"

namespace caf {
class actor_system_config;
}

namespace segflow {

// ------------------------------------------------------------------------------ atoms

using decode_atom = caf::atom_constant<caf::atom("decode")>;           ///< decoder: decode a case
using fetch_atom = caf::atom_constant<caf::atom("fetch")>;             ///< cache: get a case's sample
using epoch_atom = caf::atom_constant<caf::atom("epoch")>;             ///< augmenter: start an epoch
using next_atom = caf::atom_constant<caf::atom("next")>;               ///< augmenter: next batch
using stats_atom = caf::atom_constant<caf::atom("stats")>;             ///< any actor: counters
using report_atom = caf::atom_constant<caf::atom("report")>;           ///< collector: an event
using event_atom = caf::atom_constant<caf::atom("event")>;             ///< collector -> subscriber
using watch_atom = caf::atom_constant<caf::atom("watch")>;             ///< collector: subscribe an actor
using flush_sinks_atom = caf::atom_constant<caf::atom("flushsinks")>;  ///< collector: flush sinks

// ---------------------------------------------------------------------- plain messages

/// A case the data path skipped (bad file, a stage that threw), with the reason.
struct CaseSkip {
  std::string case_id;
  std::string reason;  ///< Status::to_string() of the failure
  std::int64_t epoch = -1;
};

/// Counters of the cache actor (a snapshot).
struct CacheStats {
  std::int64_t entries = 0;                ///< samples held in memory
  std::int64_t bytes = 0;                  ///< tensor bytes held in memory
  std::int64_t budget_bytes = 0;           ///< LoaderOptions::cache_bytes
  std::int64_t max_bytes_seen = 0;         ///< high-water mark of `bytes`
  std::int64_t cacheable_cases = 0;        ///< cases allowed in memory (cache_rate)
  std::int64_t hits = 0;                   ///< requests answered from memory
  std::int64_t misses = 0;                 ///< requests that went to the decode pool
  std::int64_t not_admitted = 0;           ///< cacheable samples left out for the budget
  std::int64_t decodes = 0;                ///< full decodes (reader + deterministic stages)
  std::int64_t disk_hits = 0;              ///< samples read back from the disk cache
  std::int64_t failures = 0;               ///< decode requests that failed
  std::int64_t decodes_in_flight = 0;      ///< requests at decoders now
  std::int64_t max_decodes_in_flight = 0;  ///< high-water mark of the above
  std::int64_t decode_limit = 0;           ///< bound on decodes in flight (pool size)
  std::int64_t queued = 0;                 ///< misses waiting for a free decoder
  std::int64_t max_queued = 0;             ///< high-water mark of the above
  std::int64_t decoder_restarts = 0;       ///< decoders respawned after dying
  std::int64_t voxels = 0;                 ///< spatial voxels of the samples held (bytes / voxels)
  double decode_seconds = 0;               ///< decoder time of the answered decodes, summed
};

/// Counters of one augmenter (a snapshot).
struct AugmentStats {
  std::int64_t epoch = -1;
  std::int64_t ready = 0;               ///< batches prepared, not yet taken
  std::int64_t max_ready_seen = 0;      ///< high-water mark of `ready` (<= ready_limit)
  std::int64_t ready_limit = 0;         ///< LoaderOptions::max_inflight_batches
  std::int64_t requests_in_flight = 0;  ///< case requests at the cache now
  std::int64_t buffered = 0;            ///< cases received, waiting to be augmented in order
  std::int64_t max_window_seen = 0;     ///< high-water mark of in flight + buffered
  std::int64_t window = 0;              ///< bound on in flight + buffered
  std::int64_t batches = 0;             ///< batches made (all epochs)
  std::int64_t samples = 0;             ///< samples made (all epochs)
  std::int64_t skipped = 0;             ///< cases skipped (all epochs)
};

/// Counters of the collector.
struct CollectorStats {
  std::int64_t events = 0;        ///< events received
  std::int64_t case_skipped = 0;  ///< of which kind "case_skipped"
  std::int64_t actor_errors = 0;  ///< of which kind "actor_error"
  std::int64_t subscribers = 0;   ///< actors subscribed
  std::int64_t sinks = 0;         ///< sinks attached
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CaseSkip& x) {
  return f(caf::meta::type_name("CaseSkip"), x.case_id, x.reason, x.epoch);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Event& x) {
  return f(caf::meta::type_name("Event"), x.kind, x.source, x.case_id, x.message, x.name, x.value, x.epoch,
           x.time_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CacheStats& x) {
  return f(caf::meta::type_name("CacheStats"), x.entries, x.bytes, x.budget_bytes, x.max_bytes_seen,
           x.cacheable_cases, x.hits, x.misses, x.not_admitted, x.decodes, x.disk_hits, x.failures,
           x.decodes_in_flight, x.max_decodes_in_flight, x.decode_limit, x.queued, x.max_queued,
           x.decoder_restarts, x.voxels, x.decode_seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AugmentStats& x) {
  return f(caf::meta::type_name("AugmentStats"), x.epoch, x.ready, x.max_ready_seen, x.ready_limit,
           x.requests_in_flight, x.buffered, x.max_window_seen, x.window, x.batches, x.samples, x.skipped);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CollectorStats& x) {
  return f(caf::meta::type_name("CollectorStats"), x.events, x.case_skipped, x.actor_errors, x.subscribers,
           x.sinks);
}

// --------------------------------------------------------- in-process (tensor) messages

/// A decoder's answer: the deterministic sample of one case.
struct DecodeResult {
  Sample sample;
  bool from_disk = false;  ///< read back from the disk cache (no decode)
  double seconds = 0;      ///< time spent in the decoder
};

/// An augmenter's answer to next_atom: a batch, or the end of the epoch. `skipped` lists
/// the cases skipped since the previous answer, in epoch order.
struct BatchReply {
  bool end_of_epoch = false;
  std::int64_t epoch = -1;
  Batch batch;  ///< empty at the end of the epoch
  std::vector<CaseSkip> skipped;
};

// ------------------------------------------------------------------ errors at the boundary

/// Category atom of segflow's errors in a caf::error.
inline constexpr caf::atom_value kErrorCategory = caf::atom("segflow");

/// A caf::error of segflow's category; the context holds the message. Found by ADL, so
/// `caf::result<T>` and `caf::error` accept an ErrorCode directly.
caf::error make_error(ErrorCode code, std::string message = {});
/// The Status as a caf::error (none when ok).
caf::error to_caf_error(const Status& status);
/// Back from a caf::error: segflow's category keeps code and message; CAF's own errors
/// (an actor that died, a timeout) become ErrorCode::internal with CAF's text.
Status to_status(const caf::error& error);

/// Registers segflow's message types and error category with a CAF config. Call once per
/// config, before the actor_system is made from it (apps and tests).
void register_message_types(caf::actor_system_config& cfg);

}  // namespace segflow

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(segflow::Sample)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(segflow::Batch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(segflow::DecodeResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(segflow::BatchReply)

CAF_BEGIN_TYPE_ID_BLOCK(segflow, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(segflow, (::segflow::CaseSkip))
CAF_ADD_TYPE_ID(segflow, (::segflow::Event))
CAF_ADD_TYPE_ID(segflow, (::segflow::CacheStats))
CAF_ADD_TYPE_ID(segflow, (::segflow::AugmentStats))
CAF_ADD_TYPE_ID(segflow, (::segflow::CollectorStats))
CAF_ADD_TYPE_ID(segflow, (::segflow::Sample))
CAF_ADD_TYPE_ID(segflow, (::segflow::Batch))
CAF_ADD_TYPE_ID(segflow, (::segflow::DecodeResult))
CAF_ADD_TYPE_ID(segflow, (::segflow::BatchReply))
CAF_END_TYPE_ID_BLOCK(segflow)
