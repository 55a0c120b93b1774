#pragma once
// Exception handling shared by the actors. Handlers catch what they expect (a Status, a
// std::exception from LibTorch) and answer with an error; anything that still escapes goes
// to the handler installed here: it is reported to the collector, and the actor exits with
// the error (CAF 0.17 terminates an actor whose handler threw, whatever the exception
// handler returns; the request being handled receives the returned error). Supervisors
// (the cache for its decoders) replace what died.

#include <caf/scheduled_actor.hpp>
#include <caf/send.hpp>

#include <exception>
#include <string>

#include "actors/interfaces.hpp"

namespace segflow::actors::detail {

/// what() of the exception, or "unknown exception (not a std::exception)".
std::string describe_exception(const std::exception_ptr& ep);

/// Sends an event to the collector when it is valid; logs it otherwise.
void report(const collector_actor& collector, Event event);

/// Installs the exception handler described above on `self`; `source` names the actor.
template <class Self>
void install_exception_handler(Self* self, collector_actor collector, std::string source) {
  self->set_exception_handler([collector = std::move(collector), source = std::move(source)](
                                  caf::scheduled_actor*, std::exception_ptr& ep) -> caf::error {
    const std::string what = describe_exception(ep);
    Event ev;
    ev.kind = "actor_error";
    ev.source = source;
    ev.message = "uncaught exception: " + what;
    report(collector, std::move(ev));
    return make_error(ErrorCode::internal, source + ": uncaught exception: " + what);
  });
}

}  // namespace segflow::actors::detail
