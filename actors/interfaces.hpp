#pragma once
// The data-path protocol on one page (CAF 0.17.6 typed actors). Pull, not push: every arrow
// is a request answered once, and each requester bounds how many it has in flight.
//
//   ActorBatchSource (trainer thread, scoped_actor)
//     │ epoch_atom, e -> ok          next_atom -> BatchReply        (one next() at a time)
//     ▼
//   augmenter (detached, one per trainer device)
//     │ fetch_atom, case index -> Sample | error     (<= window requests + buffered cases)
//     ▼
//   cache (detached, non-blocking handlers; memory cache with a byte budget)
//     │ decode_atom, case index -> DecodeResult | error      (<= one per decoder)
//     ▼
//   decoder x N (detached; disk cache, reader, deterministic stages)
//
//   every actor ── report_atom, Event ──> collector (detached) ── event_atom, Event ──> subscribers
//                                                              └─> sinks (JSONL, memory)
//
// Errors travel as caf::error of segflow's category (messages/caf_types.hpp make_error,
// to_status). Every actor installs an exception handler that reports to the collector.

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>

#include "messages/caf_types.hpp"

namespace segflow::actors {

/// A subscriber of the collector: receives every event.
using event_listener = caf::typed_actor<caf::reacts_to<event_atom, Event>>;

/// The collector: events in, fan-out to sinks and subscribers.
using collector_actor =
    caf::typed_actor<caf::reacts_to<report_atom, Event>,          // one event (metric, failure, ...)
                     caf::reacts_to<watch_atom, event_listener>,  // subscribe an actor
                     caf::replies_to<flush_sinks_atom>::with<caf::ok_atom>,  // flush every sink
                     caf::replies_to<stats_atom>::with<CollectorStats>>;

/// A decoder: the deterministic sample of one case (blocking work; detached).
using decoder_actor = caf::typed_actor<caf::replies_to<decode_atom, std::int64_t>::with<DecodeResult>>;

/// The cache: the deterministic sample of a case by dataset index.
using cache_actor = caf::typed_actor<caf::replies_to<fetch_atom, std::int64_t>::with<Sample>,
                                     caf::replies_to<stats_atom>::with<CacheStats>>;

/// An augmenter: epochs of batches for one trainer.
using augmenter_actor = caf::typed_actor<caf::replies_to<epoch_atom, std::int64_t>::with<caf::ok_atom>,
                                         caf::replies_to<next_atom>::with<BatchReply>,
                                         caf::replies_to<stats_atom>::with<AugmentStats>>;

}  // namespace segflow::actors
