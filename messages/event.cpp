#include "messages/event.hpp"

#include <nlohmann/json.hpp>

#include <chrono>

namespace segflow {

std::int64_t event_time_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::json event_to_json(const Event& e) {
  nlohmann::json j;
  j["time_ns"] = e.time_ns;
  j["kind"] = e.kind;
  if (!e.source.empty()) j["source"] = e.source;
  if (!e.case_id.empty()) j["case_id"] = e.case_id;
  if (!e.message.empty()) j["message"] = e.message;
  if (!e.name.empty()) {
    j["name"] = e.name;
    j["value"] = e.value;
  }
  if (e.epoch >= 0) j["epoch"] = e.epoch;
  return j;
}

Event make_event(std::string kind, std::string source, std::string message, std::string case_id,
                 std::int64_t epoch) {
  Event e;
  e.kind = std::move(kind);
  e.source = std::move(source);
  e.message = std::move(message);
  e.case_id = std::move(case_id);
  e.epoch = epoch;
  e.time_ns = event_time_now_ns();
  return e;
}

}  // namespace segflow
