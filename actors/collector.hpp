#pragma once
// The collector: receives metrics, events and failures (a case skipped, with the reason; an
// actor's exception) from every actor and fans them out to sinks (plain objects: JSONL
// file, memory) and to subscribed actors (event_listener).
//
// Concurrency: detached (its own thread), because sinks do blocking file I/O. Sinks are
// called from that thread only, one event at a time, in arrival order.
// Backpressure: none is needed upstream: reports are small and rare (per case skipped, per
// epoch, per error), so the mailbox stays short; a sink that throws is reported on stderr
// and keeps being called.

#include <nlohmann/json.hpp>

#include <caf/fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/event_sink.hpp"
#include "actors/interfaces.hpp"

namespace segflow::actors {

/// State of the collector actor.
struct CollectorState {
  std::vector<std::shared_ptr<EventSink>> sinks;
  std::vector<event_listener> subscribers;
  CollectorStats counters;
  static inline const char* name = "segflow.collector";
};

/// The collector's behaviour. Spawn detached: `sys.spawn<caf::detached>(collector, sinks)`.
collector_actor::behavior_type collector(collector_actor::stateful_pointer<CollectorState> self,
                                         std::vector<std::shared_ptr<EventSink>> sinks);

}  // namespace segflow::actors
