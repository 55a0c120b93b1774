#pragma once
// ActorBatchSource: the BatchSource of the CAF pipeline. It spawns, for one LoaderOptions,
// a collector (unless given one), a cache with its pool of decode_workers decoders, and one
// augmenter; next() is a blocking request from a scoped_actor to the augmenter, which
// keeps up to max_inflight_batches batches prepared, so the decode and augment work of the
// next batches overlaps the trainer's step. For a fixed seed its batches equal
// SimpleLoader's (same ids in the same order, same tensors), and so do its failures.
//
// Concurrency: one trainer thread calls it (not thread-safe, like every BatchSource). The
// actors run on their own threads (see actors/interfaces.hpp for the graph and each
// actor's header for its bounds). Destroying the source stops its actors (decoders finish
// the case they are on first).

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/collector.hpp"
#include "actors/decoder.hpp"
#include "actors/interfaces.hpp"
#include "pipeline/batch_source.hpp"

namespace segflow::actors {

/// What an ActorBatchSource adds to LoaderOptions.
struct ActorSourceOptions {
  /// Use this collector instead of spawning one (e.g. the job's, shared with the trainer).
  collector_actor collector;
  /// Sinks of the collector this source spawns (ignored with `collector`).
  std::vector<std::shared_ptr<EventSink>> sinks;
  /// When set, also write events to this JSONL file (ignored with `collector`).
  std::filesystem::path events_jsonl;
  /// Worker threads of the actor system this source makes for itself (0: CAF's default,
  /// one per core). The scheduled actors (cache) are light; decoders and the augmenter
  /// have their own threads.
  std::size_t scheduler_threads = 2;
  /// Number of the augmenter in reports ("augmenter[N]"); usually the local rank.
  int augmenter_index = 0;
};

/// Counters of the whole pipeline (a snapshot).
struct PipelineStats {
  CacheStats cache;
  AugmentStats augment;
  CollectorStats collector;
};

/// The CAF pipeline as a BatchSource.
class ActorBatchSource : public pipeline::BatchSource {
 public:
  /// With an actor system of its own (registered with register_message_types).
  static Result<std::unique_ptr<ActorBatchSource>> make(const pipeline::LoaderOptions& options,
                                                        ActorSourceOptions extra = {});
  /// On `system` (which must outlive the source and have register_message_types applied).
  static Result<std::unique_ptr<ActorBatchSource>> make(caf::actor_system& system,
                                                        const pipeline::LoaderOptions& options,
                                                        ActorSourceOptions extra = {});
  ~ActorBatchSource() override;

  Status start_epoch(std::int64_t epoch) override;
  Result<std::optional<Batch>> next() override;
  std::vector<pipeline::CaseFailure> take_failures() override;
  /// Seconds the last next() waited for the augmenter (0 when a batch was ready).
  double last_wait_s() const override { return last_wait_s_; }

  /// Counters of the cache, the augmenter and the collector (three requests; the
  /// collector's reflects every report sent before this call).
  Result<PipelineStats> stats();
  /// The collector (subscribe to it, or report to it).
  const collector_actor& collector() const { return collector_; }
  caf::actor_system& system() { return *system_; }

  ActorBatchSource(const ActorBatchSource&) = delete;
  ActorBatchSource& operator=(const ActorBatchSource&) = delete;

 private:
  ActorBatchSource() = default;
  static Result<std::unique_ptr<ActorBatchSource>> build(std::unique_ptr<ActorBatchSource> self,
                                                         const pipeline::LoaderOptions& options,
                                                         ActorSourceOptions extra);

  struct OwnedSystem;
  std::unique_ptr<OwnedSystem> owned_;  // first member: destroyed last
  caf::actor_system* system_ = nullptr;
  std::unique_ptr<caf::scoped_actor> self_;
  std::shared_ptr<const DecodeContext> ctx_;
  collector_actor collector_;
  bool own_collector_ = false;
  cache_actor cache_;
  augmenter_actor augmenter_;
  std::vector<pipeline::CaseFailure> failures_;
  double last_wait_s_ = 0;
};

}  // namespace segflow::actors
