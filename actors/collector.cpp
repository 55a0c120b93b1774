#include "actors/collector.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>

#include "actors/detail/guard.hpp"
#include "messages/log.hpp"

namespace segflow::actors {

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
  if (event.time_ns == 0) event.time_ns = event_time_now_ns();
  if (collector) {
    caf::anon_send(collector, report_atom::value, std::move(event));
  } else {
    log::warn(event.kind + " from " + event.source + ": " + event.message);
  }
}

}  // namespace detail

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
