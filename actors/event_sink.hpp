#pragma once
// What takes the data path's events: EventSink, and the plain sinks (a JSON Lines file,
// memory). Plain C++ without CAF: the collector (actors/collector.hpp) calls them from its
// thread, and the run's event bus (actors/run/event_bus.hpp) is one.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "messages/event.hpp"
#include "messages/status.hpp"

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

}  // namespace segflow::actors
