#include "actors/cache.hpp"

#include <torch/torch.h>

#include <caf/all.hpp>

#include <algorithm>

#include "actors/detail/guard.hpp"

namespace segflow::actors {

namespace {

using CacheSelf = cache_actor::stateful_pointer<CacheState>;

constexpr int kMaxRetries = 2;  // a case whose decoder died under it is tried this often again

decoder_actor spawn_decoder(CacheSelf self, int index) {
  return self->spawn<caf::detached + caf::linked>(decoder, self->state.ctx, self->state.collector, index);
}

void dispatch(CacheSelf self);

void finish(CacheSelf self, std::int64_t index, const Sample* sample, const caf::error* err) {
  auto& st = self->state;
  auto it = st.waiting.find(index);
  if (it == st.waiting.end()) return;
  auto promises = std::move(it->second);
  st.waiting.erase(it);
  st.retries.erase(index);
  for (auto& rp : promises) {
    if (sample)
      rp.deliver(*sample);
    else
      rp.deliver(*err);
  }
}

void on_decoded(CacheSelf self, std::size_t slot, std::uint64_t gen, std::int64_t index, DecodeResult& r) {
  auto& st = self->state;
  if (st.decoders[slot].generation == gen) st.decoders[slot].busy = false;
  --st.counters.decodes_in_flight;
  ++(r.from_disk ? st.counters.disk_hits : st.counters.decodes);
  st.counters.decode_seconds += r.seconds;
  st.memory.offer(index, r.sample);
  st.counters.max_bytes_seen = std::max(st.counters.max_bytes_seen, st.memory.bytes());
  finish(self, index, &r.sample, nullptr);
  dispatch(self);
}

void on_decode_error(CacheSelf self, std::size_t slot, std::uint64_t gen, std::int64_t index, caf::error& e) {
  auto& st = self->state;
  --st.counters.decodes_in_flight;
  DecoderSlot& d = st.decoders[slot];
  if (d.generation == gen) d.busy = false;
  if (e.category() != kErrorCategory) {
    // Not an answer from a decoder but CAF's (it was dead when the request came): use the
    // slot no more until its replacement, and try the case again.
    if (d.generation == gen) d.alive = false;
    if (++st.retries[index] <= kMaxRetries) {
      st.queue.push_front(index);
      dispatch(self);
      return;
    }
  }
  ++st.counters.failures;
  finish(self, index, nullptr, &e);
  dispatch(self);
}

void dispatch(CacheSelf self) {
  auto& st = self->state;
  while (!st.queue.empty()) {
    auto free = std::find_if(st.decoders.begin(), st.decoders.end(),
                             [](const DecoderSlot& d) { return d.alive && !d.busy; });
    if (free == st.decoders.end()) break;
    const std::int64_t index = st.queue.front();
    st.queue.pop_front();
    const auto slot = static_cast<std::size_t>(free - st.decoders.begin());
    const std::uint64_t gen = free->generation;
    free->busy = true;
    ++st.counters.decodes_in_flight;
    st.counters.max_decodes_in_flight =
        std::max(st.counters.max_decodes_in_flight, st.counters.decodes_in_flight);
    self->request(free->handle, caf::infinite, decode_atom::value, index)
        .then([self, slot, gen, index](DecodeResult& r) { on_decoded(self, slot, gen, index, r); },
              [self, slot, gen, index](caf::error& e) { on_decode_error(self, slot, gen, index, e); });
  }
  st.counters.queued = static_cast<std::int64_t>(st.queue.size());
}

}  // namespace

cache_actor::behavior_type cache(cache_actor::stateful_pointer<CacheState> self,
                                 std::shared_ptr<const DecodeContext> ctx, CacheConfig config,
                                 collector_actor collector) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.collector = std::move(collector);
  st.memory = pipeline::MemoryCache(config.cacheable, config.budget_bytes, config.device, config.pin);
  st.counters.budget_bytes = config.budget_bytes;
  st.counters.cacheable_cases = config.cacheable;
  st.counters.decode_limit = std::max(1, config.decode_workers);
  detail::install_exception_handler(self, st.collector, "cache");
  for (int i = 0; i < std::max(1, config.decode_workers); ++i) {
    DecoderSlot d;
    d.handle = spawn_decoder(self, i);
    st.decoders.push_back(std::move(d));
  }
  // Decoders are linked: a dying one sends its exit here. Replace it; any other exit (our
  // owner shutting the pipeline down) ends the cache, and the links end the decoders.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    auto& s = self->state;
    for (std::size_t i = 0; i < s.decoders.size(); ++i) {
      if (s.decoders[i].handle.address() != msg.source) continue;
      Event ev;
      ev.kind = "actor_restarted";
      ev.source = "cache";
      ev.message = "decoder[" + std::to_string(i) + "] died (" + caf::to_string(msg.reason) + "); replaced";
      detail::report(s.collector, std::move(ev));
      DecoderSlot& d = s.decoders[i];
      d.handle = spawn_decoder(self, static_cast<int>(i));
      d.busy = false;
      d.alive = true;
      ++d.generation;
      ++s.counters.decoder_restarts;
      dispatch(self);
      return;
    }
    self->quit(msg.reason);
  });
  return {
      [self](fetch_atom, std::int64_t index) -> caf::result<Sample> {
        auto& s = self->state;
        if (index < 0 || index >= static_cast<std::int64_t>(s.ctx->cases.size()))
          return make_error(ErrorCode::invalid_argument,
                            "cache: no case with index " + std::to_string(index));
        if (const Sample* hit = s.memory.find(index)) {
          ++s.counters.hits;
          return *hit;
        }
        ++s.counters.misses;
        auto rp = self->make_response_promise<Sample>();
        auto& w = s.waiting[index];
        w.push_back(rp);
        if (w.size() == 1) {
          s.queue.push_back(index);
          s.counters.max_queued = std::max(s.counters.max_queued, static_cast<std::int64_t>(s.queue.size()));
          dispatch(self);
        }
        return rp;
      },
      [self](stats_atom) -> CacheStats {
        auto& s = self->state;
        CacheStats c = s.counters;
        c.entries = s.memory.entries();
        c.bytes = s.memory.bytes();
        c.voxels = s.memory.voxels();
        c.not_admitted = s.memory.not_admitted();
        c.queued = static_cast<std::int64_t>(s.queue.size());
        return c;
      },
  };
}

}  // namespace segflow::actors
