#include "actors/augmenter.hpp"

#include <torch/torch.h>

#include <caf/all.hpp>

#include <algorithm>

#include "actors/collector.hpp"
#include "actors/detail/guard.hpp"
#include "actors/detail/intraop_threads.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::actors {

std::int64_t default_window(std::int64_t batch_size, std::int64_t max_ready, int decode_workers) {
  return std::max<std::int64_t>({1, batch_size * max_ready, decode_workers});
}

namespace {

using AugmenterSelf = augmenter_actor::stateful_pointer<AugmenterState>;

bool epoch_done(const AugmenterState& st) {
  return st.epoch >= 0 && st.next_process >= st.order.size() && st.assembler.pending() == 0 &&
         st.ready.empty();
}

void note_window(AugmenterState& st) {
  st.counters.requests_in_flight = st.in_flight;
  st.counters.buffered = static_cast<std::int64_t>(st.arrived.size());
  st.counters.max_window_seen =
      std::max(st.counters.max_window_seen, st.in_flight + static_cast<std::int64_t>(st.arrived.size()));
  st.counters.ready = static_cast<std::int64_t>(st.ready.size());
  st.counters.max_ready_seen = std::max(st.counters.max_ready_seen, st.counters.ready);
}

void skip(AugmenterSelf self, std::size_t position, const Status& why) {
  auto& st = self->state;
  const std::int64_t index = st.order[position];
  const std::string& id = st.cfg.case_ids[static_cast<std::size_t>(index)];
  st.skipped.push_back(CaseSkip{id, why.to_string(), st.epoch});
  ++st.counters.skipped;
  ++st.epoch_skipped;
  detail::report(st.collector, make_event("case_skipped", st.source, why.to_string(), id, st.epoch));
}

/// Answers waiting next requests from what is ready (or the end of the epoch).
void deliver(AugmenterSelf self) {
  auto& st = self->state;
  while (!st.waiting.empty()) {
    auto& rp = st.waiting.front();
    if (!st.ready.empty()) {
      AugmenterState::Prepared p = std::move(st.ready.front());
      st.ready.pop_front();
      if (!p.error.is_ok()) {
        rp.deliver(to_caf_error(p.error));
      } else {
        BatchReply r;
        r.epoch = st.epoch;
        r.batch = std::move(p.batch);
        r.skipped = std::exchange(st.skipped, {});
        rp.deliver(std::move(r));
      }
    } else if (epoch_done(st)) {
      BatchReply r;
      r.end_of_epoch = true;
      r.epoch = st.epoch;
      r.skipped = std::exchange(st.skipped, {});
      rp.deliver(std::move(r));
    } else {
      break;
    }
    st.waiting.pop_front();
  }
  note_window(st);
  if (epoch_done(st) && !st.epoch_reported) {
    st.epoch_reported = true;
    Event ev = make_event("epoch_done", st.source,
                          std::to_string(st.epoch_batches) + " batches, " + std::to_string(st.epoch_samples) +
                              " samples, " + std::to_string(st.epoch_skipped) + " cases skipped",
                          {}, st.epoch);
    detail::report(st.collector, std::move(ev));
  }
}

/// Collates one batch (full, or the epoch's partial rest) into the ready queue.
void cut(AugmenterSelf self, bool rest) {
  auto& st = self->state;
  AugmenterState::Prepared p;
  Result<Batch> b = rest ? st.assembler.take_rest() : st.assembler.take_full();
  if (b.is_ok()) {
    p.batch = std::move(b).value();
    if (st.stream && st.stream->active()) {
      // No host wait: the trainer's stream waits on this event (ActorBatchSource::next).
      p.batch.ready = st.stream->ready_fence();
      for (auto& [k, t] : p.batch.tensors) st.stream->hand_over(t);
    }
    ++st.counters.batches;
    ++st.epoch_batches;
    st.counters.samples += static_cast<std::int64_t>(p.batch.ids.size());
    st.epoch_samples += static_cast<std::int64_t>(p.batch.ids.size());
  } else {
    p.error = b.status();
    Event ev = make_event("batch_failed", st.source, p.error.to_string(), {}, st.epoch);
    detail::report(st.collector, std::move(ev));
  }
  st.ready.push_back(std::move(p));
  note_window(st);
}

/// Augments the case at position next_process (it has arrived).
void process(AugmenterSelf self, AugmenterState::Arrived& a) {
  auto& st = self->state;
  const std::size_t position = st.next_process;
  if (!a.ok) {
    skip(self, position, a.error);
    return;
  }
  const std::string& id = st.cfg.case_ids[static_cast<std::size_t>(st.order[position])];
  Result<std::vector<Sample>> r = internal_error("not augmented");
  try {
    r = pipeline::augment_case(*st.cfg.pipeline, a.sample, st.cfg.seed, st.cfg.rank, st.epoch,
                               static_cast<std::int64_t>(position), st.device,
                               st.stream && st.stream->active());
  } catch (const c10::Error& e) {  // the same messages as SimpleLoader's
    r = internal_error("case '" + id + "': " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    r = internal_error("case '" + id + "': " + e.what());
  } catch (...) {
    r = internal_error("case '" + id + "': unknown exception (not a std::exception)");
  }
  if (!r.is_ok()) {
    skip(self, position, r.status());
    return;
  }
  st.assembler.add(std::move(r).value());
}

void refill(AugmenterSelf self);

/// Makes as much progress as the bounds allow: cut batches, augment arrived cases in order.
void pump(AugmenterSelf self) {
  auto& st = self->state;
  const auto limit = static_cast<std::size_t>(st.cfg.max_ready);
  while (true) {
    if (st.ready.size() >= limit) break;
    if (st.stream) st.stream->enter();
    bool progressed = false;
    if (st.assembler.has_full()) {
      cut(self, false);
      progressed = true;
    } else if (auto it = st.arrived.find(st.next_process); it != st.arrived.end()) {
      AugmenterState::Arrived a = std::move(it->second);
      st.arrived.erase(it);
      process(self, a);
      ++st.next_process;
      progressed = true;
    } else if (st.next_process >= st.order.size() && st.assembler.pending() > 0) {
      cut(self, true);
      progressed = true;
    }
    if (st.stream) st.stream->leave();
    if (!progressed) break;
    deliver(self);  // a waiting trainer gets each batch as soon as it is cut
    refill(self);   // and the cache gets the next requests as soon as there is room
  }
  refill(self);
  deliver(self);
}

void on_arrival(AugmenterSelf self, std::uint64_t gen, std::size_t position, AugmenterState::Arrived a) {
  auto& st = self->state;
  if (gen != st.generation) return;  // an answer for an abandoned epoch
  --st.in_flight;
  st.arrived.emplace(position, std::move(a));
  note_window(st);
  pump(self);
}

/// Asks the cache for the next positions while the window has room.
void refill(AugmenterSelf self) {
  auto& st = self->state;
  while (st.next_request < st.order.size() &&
         st.in_flight + static_cast<std::int64_t>(st.arrived.size()) < st.cfg.window) {
    const std::size_t position = st.next_request++;
    const std::int64_t index = st.order[position];
    const std::uint64_t gen = st.generation;
    ++st.in_flight;
    note_window(st);
    self->request(st.cache, caf::infinite, fetch_atom::value, index)
        .then(
            [self, gen, position](Sample& s) {
              AugmenterState::Arrived a;
              a.ok = true;
              a.sample = std::move(s);
              on_arrival(self, gen, position, std::move(a));
            },
            [self, gen, position](caf::error& e) {
              AugmenterState::Arrived a;
              a.error = to_status(e);
              on_arrival(self, gen, position, std::move(a));
            });
  }
}

Status start_epoch(AugmenterSelf self, std::int64_t epoch) {
  auto& st = self->state;
  if (epoch < 0)
    return invalid_argument("augmenter: epoch: expected an integer >= 0, got " + std::to_string(epoch));
  for (auto& rp : st.waiting)
    rp.deliver(make_error(ErrorCode::invalid_argument, "augmenter: a new epoch started"));
  st.waiting.clear();
  ++st.generation;
  st.epoch = epoch;
  st.order = st.cfg.sampler->indices(epoch);
  st.next_request = st.next_process = 0;
  st.in_flight = 0;
  st.arrived.clear();
  st.assembler.clear();
  st.ready.clear();
  st.epoch_reported = false;
  st.epoch_batches = st.epoch_samples = st.epoch_skipped = 0;
  st.counters.epoch = epoch;
  refill(self);  // prefetch starts now, before the first next()
  note_window(st);
  return Status::ok();
}

}  // namespace

augmenter_actor::behavior_type augmenter(augmenter_actor::stateful_pointer<AugmenterState> self,
                                         AugmenterConfig config, cache_actor cache,
                                         collector_actor collector) {
  detail::use_one_intraop_thread();  // runs on the actor's own (detached) thread
  auto& st = self->state;
  st.cfg = std::move(config);
  st.cfg.max_ready = std::max<std::int64_t>(1, st.cfg.max_ready);
  st.cfg.window = std::max<std::int64_t>(1, st.cfg.window);
  st.cache = std::move(cache);
  st.collector = std::move(collector);
  st.source = "augmenter[" + std::to_string(st.cfg.index) + "]";
  st.device = c10::Device(st.cfg.device);
  st.stream = std::make_unique<detail::DeviceStream>(st.device);
  st.assembler = pipeline::BatchAssembler(st.cfg.batch_size);
  st.counters.ready_limit = st.cfg.max_ready;
  st.counters.window = st.cfg.window;
  detail::install_exception_handler(self, st.collector, st.source);
  return {
      [self](epoch_atom, std::int64_t epoch) -> caf::result<caf::ok_atom> {
        Status s = start_epoch(self, epoch);
        if (!s.is_ok()) return to_caf_error(s);
        return caf::ok_atom::value;
      },
      [self](next_atom) -> caf::result<BatchReply> {
        auto& s = self->state;
        if (s.epoch < 0)
          return make_error(ErrorCode::invalid_argument, "augmenter: next before the first epoch");
        s.waiting.push_back(self->make_response_promise<BatchReply>());
        deliver(self);
        pump(self);
        return caf::delegated<BatchReply>{};  // answered through the promise
      },
      [self](stats_atom) -> AugmentStats {
        note_window(self->state);
        return self->state.counters;
      },
  };
}

}  // namespace segflow::actors
