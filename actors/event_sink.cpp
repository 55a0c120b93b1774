#include "actors/event_sink.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace segflow::actors {

Result<std::shared_ptr<JsonlSink>> JsonlSink::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::app);
  if (!out) return io_error("events: cannot open " + path.string() + " for appending");
  return std::make_shared<JsonlSink>(std::move(out));
}

void JsonlSink::write(const Event& event) { out_ << event_to_json(event).dump() << '\n'; }

void JsonlSink::flush() { out_.flush(); }

void MemorySink::write(const Event& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
}

std::vector<Event> MemorySink::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::int64_t MemorySink::count(const std::string& kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(events_.begin(), events_.end(), [&](const Event& e) { return e.kind == kind; });
}

}  // namespace segflow::actors
