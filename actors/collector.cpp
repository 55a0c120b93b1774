#include "actors/collector.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>

#include "actors/detail/guard.hpp"
#include "messages/log.hpp"

namespace segflow::actors {

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace detail {

std::string describe_exception(const std::exception_ptr& ep) {
  if (!ep) return "no exception";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not a std::exception)";
  }
}

void report(const collector_actor& collector, Event event) {
  if (event.time_ns == 0) event.time_ns = now_ns();
  if (collector) {
    caf::anon_send(collector, report_atom::value, std::move(event));
  } else {
    log::warn(event.kind + " from " + event.source + ": " + event.message);
  }
}

}  // namespace detail

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
  e.time_ns = now_ns();
  return e;
}

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

namespace {

void flush_all(const std::vector<std::shared_ptr<EventSink>>& sinks) {
  for (const auto& s : sinks) {
    try {
      s->flush();
    } catch (const std::exception& e) {
      log::error(std::string("collector: a sink failed to flush: ") + e.what());
    }
  }
}

}  // namespace

collector_actor::behavior_type collector(collector_actor::stateful_pointer<CollectorState> self,
                                         std::vector<std::shared_ptr<EventSink>> sinks) {
  self->state.sinks = std::move(sinks);
  self->state.counters.sinks = static_cast<std::int64_t>(self->state.sinks.size());
  // The collector has nobody to report to: an escaped exception goes to the log.
  detail::install_exception_handler(self, collector_actor{}, "collector");
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& subs = self->state.subscribers;
    subs.erase(std::remove_if(subs.begin(), subs.end(),
                              [&](const event_listener& l) { return l.address() == msg.source; }),
               subs.end());
    self->state.counters.subscribers = static_cast<std::int64_t>(subs.size());
  });
  // At exit (the state may already be gone then): flush a copy of the sink list.
  self->attach_functor([sinks = self->state.sinks](const caf::error&) { flush_all(sinks); });
  return {
      [self](report_atom, Event& ev) {
        auto& st = self->state;
        ++st.counters.events;
        if (ev.kind == "case_skipped") ++st.counters.case_skipped;
        if (ev.kind == "actor_error") ++st.counters.actor_errors;
        for (const auto& s : st.sinks) {
          try {
            s->write(ev);
          } catch (const std::exception& e) {
            log::error(std::string("collector: a sink failed: ") + e.what());
          }
        }
        for (const auto& sub : st.subscribers) self->send(sub, event_atom::value, ev);
      },
      [self](watch_atom, event_listener& who) {
        self->monitor(who);
        self->state.subscribers.push_back(std::move(who));
        self->state.counters.subscribers = static_cast<std::int64_t>(self->state.subscribers.size());
      },
      [self](flush_sinks_atom) -> caf::ok_atom {
        flush_all(self->state.sinks);
        return caf::ok_atom::value;
      },
      [self](stats_atom) -> CollectorStats { return self->state.counters; },
  };
}

}  // namespace segflow::actors
