// The run's event bus (actors/run/event_bus.hpp): the data path's collector publishes on it,
// and a run's outputs (metrics.jsonl, the caller's sink) get the data path's events beside
// the trainer's, on the trainer's thread.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/collector.hpp"
#include "actors/detail/guard.hpp"
#include "actors/interfaces.hpp"
#include "actors/jobs/job_runner.hpp"
#include "actors/run/event_bus.hpp"
#include "job_yaml.hpp"
#include "messages/caf_types.hpp"
#include "models/training/job_config.hpp"
#include "models/training/run_layout.hpp"
#include "test_util.hpp"

namespace {

namespace sa = segflow::actors;

/// Records what reaches it through the bus.
class Recorder : public sa::RunSink {
 public:
  void on_step(const segflow::models::StepInfo&) override { order.push_back("step"); }
  void on_epoch_end(const segflow::models::EpochInfo&) override { order.push_back("epoch"); }
  void on_case_failure(const segflow::pipeline::CaseFailure& f) override {
    order.push_back("case:" + f.case_id);
  }
  void on_data_event(const segflow::Event& e) override { order.push_back("data:" + e.kind); }
  std::vector<std::string> order;
};

}  // namespace

TEST_CASE("a collector writing to the bus reaches its run sinks on the next trainer event, skips once") {
  caf::actor_system_config cfg;
  segflow::register_message_types(cfg);
  caf::actor_system sys(cfg);
  sa::EventBus bus;
  Recorder rec;
  segflow::models::TrainObserver plain;  // not a RunSink: gets the trainer's events only
  bus.add(&rec);
  bus.add(&plain);
  auto coll = sys.spawn<caf::detached>(sa::collector,
                                       std::vector<std::shared_ptr<sa::EventSink>>{bus.collector_sink()});
  sa::detail::report(coll, segflow::make_event("epoch_done", "augmenter[0]", "3 batches", {}, 0));
  sa::detail::report(coll, segflow::make_event("case_skipped", "augmenter[0]", "bad file", "case_7", 0));
  sa::detail::report(coll, segflow::make_event("actor_restarted", "cache", "decoder[1] died; replaced"));
  // The collector handles its mailbox in order: once it answers a flush, all three are queued.
  caf::scoped_actor self(sys);
  bool flushed = false;
  self->request(coll, caf::infinite, segflow::flush_sinks_atom::value)
      .receive([&](caf::ok_atom) { flushed = true; }, [&](caf::error&) {});
  REQUIRE(flushed);
  CHECK(rec.order.empty());  // nothing is delivered from the collector's thread
  bus.on_case_failure({"case_7", "bad file"});
  bus.on_step(segflow::models::StepInfo{});
  // Delivered before the trainer event that came next; the skipped case once, as a failure.
  const std::vector<std::string> want{"data:epoch_done", "data:actor_restarted", "case:case_7", "step"};
  CHECK(rec.order == want);
  bus.on_epoch_end(segflow::models::EpochInfo{});
  CHECK(rec.order.size() == want.size() + 1);  // nothing delivered twice
  self->send_exit(coll, caf::exit_reason::user_shutdown);
  self->wait_for(coll);
}

TEST_CASE("a training run with the actors loader writes the data path's per-epoch figures to metrics.jsonl") {
  segflow::testing::TempDir dir("segflow_event_bus");
  segflow::testing::JobYaml job;
  job.name = "busjob";
  job.root = dir.path() / "data";
  job.synth = "{cases: 4, size: 24, format: nifti, seed: 9}";
  job.stages = {segflow::testing::kLoadStage, segflow::testing::kCtWindowStage, segflow::testing::kFgBgStage,
                segflow::testing::crop_stage("[16, 16, 16]", 1, 1, 2)};
  job.model = segflow::testing::unet3d(5, "channels: [4, 8], strides: [2], num_res_units: 1");
  job.schedule = "";
  job.epochs = 2;
  job.train = "batch_size: 2, device: cpu, val_interval: 0, loader: actors, decode_workers: 1, threads: 1";
  job.validation = "{roi_size: [16, 16, 16]}";
  job.runs_dir = dir.path() / "runs";
  const std::string yaml = job.yaml();
  REQUIRE_OK_AND_ASSIGN(auto cfg, segflow::models::parse_job_config(yaml, "busjob.yaml"));
  Recorder rec;
  REQUIRE_OK_AND_ASSIGN(auto run, sa::run_training(cfg, {}, rec));
  // The files the run wrote are where RunLayout, the readers' one name for them, says.
  const segflow::models::RunLayout layout(run);
  for (const auto& p : {layout.config(), layout.last_checkpoint(), layout.metrics(), layout.progress_plot()})
    CHECK_MESSAGE(std::filesystem::is_regular_file(p), p.string());
  CHECK(std::filesystem::is_directory(layout.tensorboard()));
  std::ifstream in(layout.metrics());
  std::map<std::int64_t, std::int64_t> epoch_done;  // epoch -> records
  std::int64_t epochs = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "epoch") ++epochs;
    if (j.value("type", "") == "data_event" && j.value("kind", "") == "epoch_done") {
      CHECK(j.value("source", "") == "augmenter[0]");
      CHECK(j.value("message", "").find("batches") != std::string::npos);
      ++epoch_done[j.value("epoch", std::int64_t{-1})];
    }
  }
  CHECK(epochs == 2);
  // The augmenter's figures of each epoch, once each, also the last one (delivered when the
  // run ends, after the data path has stopped and flushed its collector).
  CHECK(epoch_done == std::map<std::int64_t, std::int64_t>{{0, 1}, {1, 1}});
  std::int64_t seen = 0;
  for (const auto& s : rec.order) seen += s == "data:epoch_done";
  CHECK(seen == 2);  // the caller's sink got them too
}
