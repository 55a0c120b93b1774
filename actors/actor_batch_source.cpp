#include "actors/actor_batch_source.hpp"

#include <torch/torch.h>

#include <caf/all.hpp>

#include <chrono>
#include <thread>

#include "actors/augmenter.hpp"
#include "actors/cache.hpp"
#include "messages/log.hpp"
#include "pipeline/cache/disk_cache.hpp"
#include "pipeline/cache/sample_cache.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/simple_loader.hpp"

namespace segflow::actors {

struct ActorBatchSource::OwnedSystem {
  caf::actor_system_config cfg;  // must outlive the system
  std::unique_ptr<caf::actor_system> system;
};

Result<std::unique_ptr<ActorBatchSource>> ActorBatchSource::make(const pipeline::LoaderOptions& options,
                                                                 ActorSourceOptions extra) {
  SEGFLOW_RETURN_IF_ERROR(pipeline::validate_loader_options(options));
  std::unique_ptr<ActorBatchSource> self(new ActorBatchSource());
  self->owned_ = std::make_unique<OwnedSystem>();
  register_message_types(self->owned_->cfg);
  if (extra.scheduler_threads > 0)
    self->owned_->cfg.set("scheduler.max-threads", static_cast<std::int64_t>(extra.scheduler_threads));
  self->owned_->system = std::make_unique<caf::actor_system>(self->owned_->cfg);
  self->system_ = self->owned_->system.get();
  return build(std::move(self), options, std::move(extra));
}

Result<std::unique_ptr<ActorBatchSource>> ActorBatchSource::make(caf::actor_system& system,
                                                                 const pipeline::LoaderOptions& options,
                                                                 ActorSourceOptions extra) {
  SEGFLOW_RETURN_IF_ERROR(pipeline::validate_loader_options(options));
  std::unique_ptr<ActorBatchSource> self(new ActorBatchSource());
  self->system_ = &system;
  return build(std::move(self), options, std::move(extra));
}

Result<std::unique_ptr<ActorBatchSource>> ActorBatchSource::build(std::unique_ptr<ActorBatchSource> self,
                                                                  const pipeline::LoaderOptions& o,
                                                                  ActorSourceOptions extra) {
  caf::actor_system& sys = *self->system_;
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::EpochSampler sampler, pipeline::loader_sampler(o));

  auto ctx = std::make_shared<DecodeContext>();
  ctx->cases = o.cases;
  ctx->pipeline = o.pipeline;
  ctx->det_spec = pipeline::deterministic_spec(*o.pipeline);
  SEGFLOW_ASSIGN_OR_RETURN(ctx->cache_dtype, pipeline::loader_cache_dtype(o));
  SEGFLOW_ASSIGN_OR_RETURN(ctx->cache_device, pipeline::loader_cache_device(o));
  ctx->cacheable = pipeline::cacheable_cases(static_cast<std::int64_t>(o.cases.size()), o.cache_rate);
  if (!o.disk_cache_dir.empty()) {
    pipeline::DiskCacheOptions dco;
    dco.dir = o.disk_cache_dir;
    SEGFLOW_ASSIGN_OR_RETURN(ctx->disk, pipeline::DiskCache::open(dco));
  }
  self->ctx_ = ctx;

  if (extra.collector) {
    self->collector_ = extra.collector;
  } else {
    if (!extra.events_jsonl.empty()) {
      SEGFLOW_ASSIGN_OR_RETURN(std::shared_ptr<JsonlSink> jsonl, JsonlSink::open(extra.events_jsonl));
      extra.sinks.push_back(std::move(jsonl));
    }
    self->collector_ = sys.spawn<caf::detached>(segflow::actors::collector, std::move(extra.sinks));
    self->own_collector_ = true;
  }

  CacheConfig cc;
  cc.cacheable = pipeline::cacheable_cases(static_cast<std::int64_t>(o.cases.size()), o.cache_rate);
  cc.budget_bytes = o.cache_bytes;
  cc.decode_workers = o.decode_workers;
  cc.device = ctx->cache_device;
  cc.pin = c10::Device(o.device).is_cuda();
  // Detached too: CAF 0.17's work-stealing workers, when idle, poll their queues with sleeps
  // of up to 10 ms (scheduler.relaxed-sleep-duration), which a scheduled cache would add to
  // every fetch; a detached actor wakes on its mailbox at once.
  self->cache_ =
      sys.spawn<caf::detached>(cache, std::shared_ptr<const DecodeContext>(ctx), cc, self->collector_);

  AugmenterConfig ac;
  ac.pipeline = o.pipeline;
  ac.sampler = std::make_shared<const pipeline::EpochSampler>(std::move(sampler));
  for (const auto& c : o.cases) ac.case_ids.push_back(c.id);
  ac.seed = o.seed;
  ac.rank = o.rank;
  ac.batch_size = o.batch_size;
  ac.max_ready = o.max_inflight_batches;
  ac.window = default_window(o.batch_size, o.max_inflight_batches, o.decode_workers);
  ac.device = o.device;
  ac.index = extra.augmenter_index;
  self->augmenter_ = sys.spawn<caf::detached>(augmenter, std::move(ac), self->cache_, self->collector_);

  self->self_ = std::make_unique<caf::scoped_actor>(sys);
  return self;
}

ActorBatchSource::~ActorBatchSource() {
  if (!system_) return;
  if (!self_) self_ = std::make_unique<caf::scoped_actor>(*system_);  // build() stopped early
  caf::scoped_actor& self = *self_;
  // Stop the actors and wait for them: they use the caller's pipeline, which may go away
  // right after this destructor (on a shared system nothing else would wait for them).
  if (augmenter_) {
    caf::anon_send_exit(augmenter_, caf::exit_reason::user_shutdown);
    self->wait_for(augmenter_);
  }
  if (cache_) {
    caf::anon_send_exit(cache_, caf::exit_reason::user_shutdown);  // its links end the decoders
    self->wait_for(cache_);
  }
  // Each decoder stops after the case it is on (bounded wait: a decoder stuck in a read
  // for minutes is left behind with a warning rather than hanging the trainer).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ctx_ && ctx_->live_decoders.load() > 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (ctx_ && ctx_->live_decoders.load() > 0)
    log::warn("ActorBatchSource: " + std::to_string(ctx_->live_decoders.load()) +
              " decoder(s) still busy at shutdown");
  if (collector_ && own_collector_) {
    caf::anon_send_exit(collector_, caf::exit_reason::user_shutdown);  // flushes its sinks
    self->wait_for(collector_);
  }
  self_.reset();
  // owned_ (when set) goes last: the system's destructor waits for anything left.
}

Status ActorBatchSource::start_epoch(std::int64_t epoch) {
  Status st;
  (*self_)
      ->request(augmenter_, caf::infinite, epoch_atom::value, epoch)
      .receive([&](caf::ok_atom) { st = Status::ok(); }, [&](caf::error& e) { st = to_status(e); });
  return st;
}

Result<std::optional<Batch>> ActorBatchSource::next() {
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::optional<Batch>> out = internal_error("no answer from the augmenter");
  (*self_)
      ->request(augmenter_, caf::infinite, next_atom::value)
      .receive(
          [&](BatchReply& r) {
            for (auto& s : r.skipped) failures_.push_back({std::move(s.case_id), std::move(s.reason)});
            if (r.end_of_epoch) {
              out = std::optional<Batch>();
            } else {
              // This is the trainer's thread: its stream waits for the augmenter's side stream.
              if (r.batch.ready) std::exchange(r.batch.ready, nullptr)();
              out = std::optional<Batch>(std::move(r.batch));
            }
          },
          [&](caf::error& e) { out = to_status(e); });
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::vector<pipeline::CaseFailure> ActorBatchSource::take_failures() { return std::exchange(failures_, {}); }

Result<PipelineStats> ActorBatchSource::stats() {
  PipelineStats s;
  Status st;
  auto on_error = [&](caf::error& e) { st = to_status(e); };
  (*self_)
      ->request(cache_, caf::infinite, stats_atom::value)
      .receive([&](CacheStats& c) { s.cache = c; }, on_error);
  (*self_)
      ->request(augmenter_, caf::infinite, stats_atom::value)
      .receive([&](AugmentStats& a) { s.augment = a; }, on_error);
  (*self_)
      ->request(collector_, caf::infinite, stats_atom::value)
      .receive([&](CollectorStats& c) { s.collector = c; }, on_error);
  if (!st.is_ok()) return st;
  return s;
}

}  // namespace segflow::actors
