#pragma once
// Event: what the data path reports (metrics, events, failures: a case skipped, an actor's
// exception) as plain data, for everyone who takes events: the collector and its sinks
// (actors/), the run's event bus and the daemon's training job observer. The CAF glue
// (inspect, type id) is in messages/caf_types.hpp, which only the actors layer includes.

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace segflow {

/// What actors report to the collector: metrics, events and failures. One JSON line each in
/// the JSONL sink.
struct Event {
  std::string kind;          ///< "case_skipped", "actor_error", "epoch_done", "metric", ...
  std::string source;        ///< reporting actor ("augmenter[0]", "decoder[1]", "cache")
  std::string case_id;       ///< when about one case; else empty
  std::string message;       ///< human-readable detail
  std::string name;          ///< metric name (kind "metric")
  double value = 0;          ///< metric value
  std::int64_t epoch = -1;   ///< epoch when known
  std::int64_t time_ns = 0;  ///< wall clock (system_clock, ns since the epoch)
};

/// An event as a JSON object: {"time_ns", "kind", "source", ...}; empty fields left out.
nlohmann::json event_to_json(const Event& event);

/// An event stamped with the current wall-clock time.
Event make_event(std::string kind, std::string source, std::string message, std::string case_id = {},
                 std::int64_t epoch = -1);

/// The current wall-clock time in nanoseconds since the Unix epoch (Event::time_ns).
std::int64_t event_time_now_ns();

}  // namespace segflow
