#pragma once
// The run's event bus: one fan-out for everything a training run reports, with one sink per
// output (metrics.jsonl, TensorBoard, progress.svg, the caller's observer: the daemon's PUB
// socket, the CLI's progress lines, a test).
//
// Two kinds of events travel on it: the trainer's (TrainObserver: steps, epochs, validations,
// checkpoints, failed cases), posted on the trainer's thread, and the data path's, which the
// CAF actors report to their collector (actors/collector.hpp, its sinks in actors/event_sink.hpp: per-epoch
// augmenter figures, failed batches, restarted or failed actors). The collector is a publisher on the bus:
// its sink is the bus's queue (collector_sink()), filled from the collector's thread and delivered on the
// trainer's thread at the bus's next trainer event, to the sinks that take data-path events
// (RunSink::on_data_event), so every sink runs on one thread.
//
// Not thread-safe apart from the queue: the trainer that owns the run posts from its thread.

#include <memory>
#include <mutex>
#include <vector>

#include "actors/event_sink.hpp"
#include "models/training/trainer.hpp"

namespace segflow::actors {

/// An output of a run: the trainer's events and, through on_data_event, the data path's.
class RunSink : public models::TrainObserver {
 public:
  /// One event the data path's collector published (never "case_skipped": a skipped case
  /// arrives once, as on_case_failure, through the batch source).
  virtual void on_data_event(const Event& event) {}
};

/// The collector's sink on the bus: keeps events until the bus takes them. Thread-safe.
class EventQueue : public EventSink {
 public:
  void write(const Event& event) override;
  /// The events written since the last call, in order.
  std::vector<Event> take();

 private:
  std::mutex mu_;
  std::vector<Event> events_;
};

/// The bus. Sinks are called in the order they were added; a sink that is a RunSink also
/// gets the data path's events.
class EventBus : public models::TrainObserver {
 public:
  EventBus() : queue_(std::make_shared<EventQueue>()) {}
  void add(models::TrainObserver* sink);
  /// What data-path collectors write to (ActorSourceOptions::sinks, RunOptions::data_events).
  const std::shared_ptr<EventQueue>& collector_sink() const { return queue_; }
  /// Delivers the queued data-path events now (also done before every trainer event).
  void deliver();

  void on_epoch_start(std::int64_t epoch, std::int64_t total) override;
  void on_step(const models::StepInfo& i) override;
  void on_epoch_end(const models::EpochInfo& i) override;
  void on_validation(const models::ValidationInfo& i) override;
  void on_checkpoint(const std::filesystem::path& p, const std::string& kind) override;
  void on_case_failure(const pipeline::CaseFailure& f) override;
  void on_early_stop(const models::EarlyStopInfo& i) override;
  /// Any sink asks to stop. Host state only: delivers nothing.
  bool should_stop() override;

 private:
  std::vector<models::TrainObserver*> sinks_;
  std::vector<RunSink*> data_sinks_;
  std::shared_ptr<EventQueue> queue_;
};

}  // namespace segflow::actors
