#include "actors/run/event_bus.hpp"

#include <exception>
#include <string>

#include "messages/log.hpp"

namespace segflow::actors {

void EventQueue::write(const Event& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
}

std::vector<Event> EventQueue::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(events_, {});
}

void EventBus::add(models::TrainObserver* sink) {
  sinks_.push_back(sink);
  if (auto* rs = dynamic_cast<RunSink*>(sink)) data_sinks_.push_back(rs);
}

void EventBus::deliver() {
  for (const Event& e : queue_->take()) {
    if (e.kind == "case_skipped") continue;  // on_case_failure carries it
    for (auto* s : data_sinks_) s->on_data_event(e);
  }
}

void EventBus::on_epoch_start(std::int64_t epoch, std::int64_t total) {
  deliver();
  for (auto* s : sinks_) s->on_epoch_start(epoch, total);
}
void EventBus::on_step(const models::StepInfo& i) {
  deliver();
  for (auto* s : sinks_) s->on_step(i);
}
void EventBus::on_epoch_end(const models::EpochInfo& i) {
  deliver();
  for (auto* s : sinks_) s->on_epoch_end(i);
}
void EventBus::on_validation(const models::ValidationInfo& i) {
  deliver();
  for (auto* s : sinks_) s->on_validation(i);
}
void EventBus::on_checkpoint(const std::filesystem::path& p, const std::string& kind) {
  deliver();
  for (auto* s : sinks_) s->on_checkpoint(p, kind);
}
void EventBus::on_case_failure(const pipeline::CaseFailure& f) {
  deliver();
  for (auto* s : sinks_) s->on_case_failure(f);
}
void EventBus::on_early_stop(const models::EarlyStopInfo& i) {
  deliver();
  for (auto* s : sinks_) s->on_early_stop(i);
}
bool EventBus::should_stop() {
  bool stop = false;
  for (auto* s : sinks_) stop |= s->should_stop();
  return stop;
}

}  // namespace segflow::actors
