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

#include "actors/interfaces.hpp"

namespace segflow::actors {

/// Something that takes events (the collector calls it from its own thread).
class EventSink {
 public:
  virtual ~EventSink() = default;
  /// One event. May throw; the collector logs and goes on.
  virtual void write(const Event& event) = 0;
  /// Makes written events durable (called on flush_sinks_atom and at shutdown).
  virtual void flush() {}
};

/// An event as a JSON object: {"time_ns", "kind", "source", ...}; empty fields left out.
nlohmann::json event_to_json(const Event& event);

/// An event stamped with the current wall-clock time.
Event make_event(std::string kind, std::string source, std::string message, std::string case_id = {},
                 std::int64_t epoch = -1);

/// Writes one JSON object per line (JSON Lines). Flushes on flush().
class JsonlSink : public EventSink {
 public:
  /// Opens `path` for appending (creating folders); io_error when it cannot.
  static Result<std::shared_ptr<JsonlSink>> open(const std::filesystem::path& path);
  void write(const Event& event) override;
  void flush() override;
  explicit JsonlSink(std::ofstream out) : out_(std::move(out)) {}  // use open()

 private:
  std::ofstream out_;
};

/// Keeps events in memory (tests, the CLI's summary). Thread-safe.
class MemorySink : public EventSink {
 public:
  void write(const Event& event) override;
  std::vector<Event> events() const;
  /// Events of kind `kind`.
  std::int64_t count(const std::string& kind) const;

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

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
