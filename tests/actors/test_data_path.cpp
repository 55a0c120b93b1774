// The actor data path (ActorBatchSource) against the synchronous reference (SimpleLoader):
// same batches for a fixed seed, disk cache across restarts, bounded prefetch and memory,
// failing cases skipped and reported, deterministic epochs, sharding by rank.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <yaml-cpp/yaml.h>  // complete YAML::Node: parse_pipeline_spec has a YAML overload
#include <caf/all.hpp>

#include <chrono>
#include <set>
#include <thread>

#include "actors/actor_batch_source.hpp"
#include "actors/augmenter.hpp"
#include "messages/caf_types.hpp"
#include "pipeline/cache/sample_cache.hpp"
#include "pipeline/simple_loader.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/synth.hpp"
#include "test_stages.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using segflow::actors::ActorBatchSource;
using segflow::actors::ActorSourceOptions;
using segflow::actors::MemorySink;
using segflow::testing::TempDir;

namespace {

struct EpochRun {
  std::vector<Batch> batches;
  std::vector<CaseFailure> failures;
  std::vector<std::string> ids() const {
    std::vector<std::string> v;
    for (const auto& b : batches) v.insert(v.end(), b.ids.begin(), b.ids.end());
    return v;
  }
};

EpochRun run_epoch(BatchSource& src, std::int64_t epoch, const std::function<void()>& after_each = {}) {
  EpochRun r;
  REQUIRE_OK(src.start_epoch(epoch));
  for (int guard = 0; guard < 10000; ++guard) {
    REQUIRE_OK_AND_ASSIGN(auto b, src.next());
    if (!b) break;
    r.batches.push_back(std::move(*b));
    if (after_each) after_each();
  }
  r.failures = src.take_failures();
  return r;
}

void check_same_batches(const EpochRun& a, const EpochRun& b) {
  REQUIRE(a.batches.size() == b.batches.size());
  for (std::size_t i = 0; i < a.batches.size(); ++i) {
    const Batch& x = a.batches[i];
    const Batch& y = b.batches[i];
    CHECK(x.ids == y.ids);
    REQUIRE(x.tensors.size() == y.tensors.size());
    for (const auto& [k, t] : x.tensors) {
      REQUIRE(y.tensors.count(k) == 1);
      const auto& key = k;  // clang 14 cannot capture a structured binding
      CHECK_MESSAGE(torch::equal(t.cpu(), y.tensors.at(k).cpu()), "batch ", i, " key ", key);
    }
  }
}

std::vector<std::string> failure_ids(const std::vector<CaseFailure>& f) {
  std::vector<std::string> v;
  for (const auto& x : f) v.push_back(x.case_id);
  return v;
}

LoaderOptions options_for(const std::vector<CaseEntry>& cases, const Pipeline& p) {
  LoaderOptions o;
  o.cases = cases;
  o.pipeline = &p;
  o.batch_size = 3;
  o.seed = 1234;
  o.decode_workers = 3;
  o.max_inflight_batches = 2;
  o.cache_rate = 1.0;
  return o;
}

std::unique_ptr<SimpleLoader> simple(const LoaderOptions& o) {
  REQUIRE_OK_AND_ASSIGN(auto r, SimpleLoader::make(o));
  return r;
}

std::unique_ptr<ActorBatchSource> actor(const LoaderOptions& o, ActorSourceOptions extra = {}) {
  REQUIRE_OK_AND_ASSIGN(auto r, ActorBatchSource::make(o, std::move(extra)));
  return r;
}

actors::PipelineStats stats_of(ActorBatchSource& s) {
  REQUIRE_OK_AND_ASSIGN(auto r, s.stats());
  return r;
}

Pipeline crop_pipeline() {
  return testing::make_pipeline(
      std::make_unique<testing::TestSource>(8), std::make_unique<testing::TestSlowScale>(0),
      std::make_unique<testing::TestJitter>(), std::make_unique<testing::TestCrops>());
}

}  // namespace

TEST_CASE("the actor pipeline yields the same batches as SimpleLoader for a fixed seed") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(11));
  const Pipeline p = crop_pipeline();
  REQUIRE(p.cache_boundary() == 2);
  LoaderOptions o = options_for(cases, p);
  o.cache_rate = 0.5;  // some cases come from memory, the others are decoded every epoch
  auto ref = simple(o);
  auto act = actor(o);
  for (std::int64_t epoch : {0, 1, 2}) {
    CAPTURE(epoch);
    const EpochRun a = run_epoch(*ref, epoch);
    const EpochRun b = run_epoch(*act, epoch);
    CHECK(a.ids().size() == 22);              // 11 cases x 2 crops
    CHECK(a.batches.back().ids.size() == 1);  // 22 = 7 x 3 + 1: the partial batch is kept
    check_same_batches(a, b);
    CHECK(b.failures.empty());
  }
  const auto st = stats_of(*act);
  CHECK(st.cache.entries == cacheable_cases(11, 0.5));
  CHECK(st.augment.skipped == 0);
}

TEST_CASE("epochs are deterministic for a seed and differ between epochs") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(10));
  const Pipeline p = crop_pipeline();
  LoaderOptions o = options_for(cases, p);
  auto first = actor(o);
  auto second = actor(o);
  const EpochRun e0 = run_epoch(*first, 0);
  const EpochRun e1 = run_epoch(*first, 1);
  check_same_batches(e0, run_epoch(*second, 0));
  CHECK(e0.ids() != e1.ids());
  // Re-running an epoch gives it again, whatever ran in between.
  check_same_batches(e1, run_epoch(*second, 1));
  check_same_batches(e0, run_epoch(*first, 0));
  o.seed = 99;
  auto other_seed = actor(o);
  CHECK(run_epoch(*other_seed, 0).ids() != e0.ids());
}

TEST_CASE("each rank gets its own shard, the shards cover the dataset, and each matches SimpleLoader") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(9));
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8),
                                            std::make_unique<testing::TestJitter>());
  std::vector<std::string> all;
  for (std::int64_t rank : {0, 1}) {
    CAPTURE(rank);
    LoaderOptions o = options_for(cases, p);
    o.world_size = 2;
    o.rank = rank;
    o.batch_size = 2;
    const EpochRun a = run_epoch(*actor(o), 3);
    check_same_batches(run_epoch(*simple(o), 3), a);
    CHECK(a.ids().size() == 5);  // ceil(9 / 2), padded by wrap-around
    for (const auto& id : a.ids()) all.push_back(id);
  }
  const std::set<std::string> distinct(all.begin(), all.end());
  CHECK(distinct.size() == 9);
  CHECK(all.size() == 10);
}

TEST_CASE("a failing case is skipped, reported to the collector, and the epoch yields the other cases") {
  TempDir dir("segflow_actors");
  // 1: bad file, 3: the reader throws std::runtime_error, 5: the reader throws an int (the
  // decoder dies and is replaced), 7: a random stage returns an error, 8: one throws.
  const auto cases = testing::write_cases(
      dir.path(), {"ok 0", "bad", "ok 2", "throw", "ok 4", "throw_int", "ok 6", "ok 7", "ok 8", "ok 9"});
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8),
                                            std::make_unique<testing::TestFailRandom>("case_007", "case_008"),
                                            std::make_unique<testing::TestJitter>());
  LoaderOptions o = options_for(cases, p);
  o.batch_size = 2;
  o.decode_workers = 2;
  auto sink = std::make_shared<MemorySink>();
  ActorSourceOptions extra;
  extra.sinks.push_back(sink);
  auto ref = simple(o);
  auto act = actor(o, extra);
  const std::set<std::string> bad{"case_001", "case_003", "case_005", "case_007", "case_008"};
  for (std::int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    const EpochRun a = run_epoch(*ref, epoch);
    const EpochRun b = run_epoch(*act, epoch);
    check_same_batches(a, b);
    CHECK(b.ids().size() == 5);
    for (const auto& id : b.ids()) CHECK(bad.count(id) == 0);
    CHECK(failure_ids(a.failures) == failure_ids(b.failures));
    const auto skipped_ids = failure_ids(b.failures);
    CHECK(std::set<std::string>(skipped_ids.begin(), skipped_ids.end()) == bad);
    for (std::size_t i = 0; i < a.failures.size() && i < b.failures.size(); ++i) {
      CAPTURE(b.failures[i].case_id);
      CHECK(!b.failures[i].reason.empty());
      if (b.failures[i].case_id != "case_005") CHECK(a.failures[i].reason == b.failures[i].reason);
    }
  }
  const auto st = stats_of(*act);
  CHECK(st.collector.case_skipped == 10);
  CHECK(st.collector.actor_errors >= 2);  // the decoder that died, once per epoch
  CHECK(st.cache.decoder_restarts >= 1);
  CHECK(sink->count("case_skipped") == 10);
  std::set<std::string> reported;
  for (const auto& e : sink->events())
    if (e.kind == "case_skipped") reported.insert(e.case_id);
  CHECK(reported == bad);
}

TEST_CASE("a second source with the same disk cache folder decodes nothing") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(10));
  const Pipeline p = crop_pipeline();
  LoaderOptions o = options_for(cases, p);
  o.disk_cache_dir = (dir.path() / "cache").string();
  EpochRun first;
  const int before = testing::decode_count().load();
  {
    auto a = actor(o);
    first = run_epoch(*a, 0);
    const auto st = stats_of(*a);
    CHECK(st.cache.decodes == 10);
    CHECK(st.cache.disk_hits == 0);
  }
  CHECK(testing::decode_count().load() - before == 10);
  const int mid = testing::decode_count().load();
  {
    auto b = actor(o);  // a restart: new actors, new memory cache, same folder
    check_same_batches(first, run_epoch(*b, 0));
    const auto st = stats_of(*b);
    CHECK(st.cache.decodes == 0);
    CHECK(st.cache.disk_hits == 10);
  }
  CHECK(testing::decode_count().load() == mid);
  // The synchronous loader reads the same folder, and agrees.
  auto s = simple(o);
  check_same_batches(first, run_epoch(*s, 0));
  CHECK(s->stats().decodes == 0);
  CHECK(s->stats().disk_hits == 10);
}

TEST_CASE("a slow consumer keeps at most max_inflight_batches prepared and the cache within its budget") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(14));
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8),
                                            std::make_unique<testing::TestJitter>());
  LoaderOptions o = options_for(cases, p);
  o.batch_size = 2;
  o.max_inflight_batches = 2;
  o.decode_workers = 2;
  const std::int64_t one = 8 * 8 * 8 * 4 + 8 * 8 * 8;  // float image + uint8 label
  o.cache_bytes = 3 * one + one / 2;                   // room for three samples
  auto act = actor(o);
  REQUIRE_OK(act->start_epoch(0));

  // Without a consumer the augmenter fills its prefetch, then stops.
  actors::PipelineStats st;
  for (int i = 0; i < 500; ++i) {
    st = stats_of(*act);
    if (st.augment.ready == o.max_inflight_batches) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(st.augment.ready == o.max_inflight_batches);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  st = stats_of(*act);
  CHECK(st.augment.ready == o.max_inflight_batches);
  CHECK(st.augment.requests_in_flight + st.augment.buffered <= st.augment.window);

  auto check_bounds = [&](const actors::PipelineStats& s) {
    CHECK(s.augment.ready <= o.max_inflight_batches);
    CHECK(s.augment.max_ready_seen <= o.max_inflight_batches);
    CHECK(s.augment.max_window_seen <= s.augment.window);
    CHECK(s.cache.bytes <= o.cache_bytes);
    CHECK(s.cache.max_bytes_seen <= o.cache_bytes);
    CHECK(s.cache.max_decodes_in_flight <= o.decode_workers);
  };
  int batches = 0;
  while (true) {
    REQUIRE_OK_AND_ASSIGN(auto b, act->next());
    if (!b) break;
    ++batches;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the "training step"
    check_bounds(stats_of(*act));
  }
  CHECK(batches == 7);
  st = stats_of(*act);
  check_bounds(st);
  CHECK(st.augment.window == actors::default_window(2, 2, 2));
  CHECK(st.cache.entries == 3);
  CHECK(st.cache.not_admitted > 0);
  CHECK(st.augment.max_ready_seen == o.max_inflight_batches);
  // A second epoch: the three cached cases are hits, the rest are decoded again.
  const auto before = st.cache.hits;
  run_epoch(*act, 1);
  st = stats_of(*act);
  CHECK(st.cache.hits - before == 3);
  check_bounds(st);
}

TEST_CASE("events reach a JSONL file, one JSON object per line") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), {"ok 0", "bad", "ok 2"});
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8));
  LoaderOptions o = options_for(cases, p);
  ActorSourceOptions extra;
  extra.events_jsonl = dir.path() / "logs" / "events.jsonl";
  {
    auto act = actor(o, extra);
    const EpochRun r = run_epoch(*act, 0);
    CHECK(r.ids().size() == 2);
    CHECK(failure_ids(r.failures) == std::vector<std::string>{"case_001"});
  }  // the collector flushes its sinks when it stops
  std::ifstream in(extra.events_jsonl);
  std::string line;
  int skipped = 0, epochs = 0, lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    const auto j = nlohmann::json::parse(line);
    CHECK(j.contains("time_ns"));
    if (j["kind"] == "case_skipped") {
      ++skipped;
      CHECK(j["case_id"] == "case_001");
      CHECK(j["message"].get<std::string>().find("corrupt_data") != std::string::npos);
    }
    if (j["kind"] == "epoch_done") ++epochs;
  }
  CHECK(lines >= 2);
  CHECK(skipped == 1);
  CHECK(epochs == 1);
}

TEST_CASE("invalid loader options are rejected naming the field, for both sources") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(2));
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8));
  auto expect_error = [&](LoaderOptions o, const std::string& field) {
    CAPTURE(field);
    auto a = SimpleLoader::make(o);
    auto b = ActorBatchSource::make(o);
    REQUIRE(!a.is_ok());
    REQUIRE(!b.is_ok());
    CHECK(a.status().message().find(field) != std::string::npos);
    CHECK(b.status().message() == a.status().message());
  };
  LoaderOptions o = options_for(cases, p);
  auto bad = o;
  bad.batch_size = 0;
  expect_error(bad, "batch_size");
  bad = o;
  bad.pipeline = nullptr;
  expect_error(bad, "pipeline");
  bad = o;
  bad.cache_rate = 1.5;
  expect_error(bad, "cache_rate");
  bad = o;
  bad.device = "tpu:3";
  expect_error(bad, "device");
  bad = o;
  bad.rank = 2;
  expect_error(bad, "rank");
  bad = o;
  bad.cases.clear();
  expect_error(bad, "cases");
}

TEST_CASE("next() before start_epoch() is an error, not a hang") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(2));
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8));
  auto act = actor(options_for(cases, p));
  auto r = act->next();
  REQUIRE(!r.is_ok());
  CHECK(r.status().code() == ErrorCode::invalid_argument);
  CHECK(act->start_epoch(-1).code() == ErrorCode::invalid_argument);
  CHECK(run_epoch(*act, 0).ids().size() == 2);
}

TEST_CASE("a source can share an actor system and a collector with other actors") {
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), {"ok 0", "bad", "ok 2", "ok 3"});
  const Pipeline p = testing::make_pipeline(std::make_unique<testing::TestSource>(8),
                                            std::make_unique<testing::TestJitter>());
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  auto sink = std::make_shared<MemorySink>();
  auto coll =
      sys.spawn<caf::detached>(actors::collector, std::vector<std::shared_ptr<actors::EventSink>>{sink});
  // A subscribed actor sees every event as well. The counter is a spawn argument, not a
  // capture: CAF 0.17 dereferences a null std::shared_ptr<std::tuple<>> to start a function
  // actor spawned with no arguments (undefined behaviour that the asan preset's UBSan stops on).
  auto heard = std::make_shared<std::atomic<int>>(0);
  auto listener = sys.spawn(
      [](actors::event_listener::pointer,
         std::shared_ptr<std::atomic<int>> count) -> actors::event_listener::behavior_type {
        return {[count](event_atom, const Event& e) {
          if (e.kind == "case_skipped") ++*count;
        }};
      },
      heard);
  caf::anon_send(coll, watch_atom::value, listener);
  LoaderOptions o = options_for(cases, p);
  o.batch_size = 1;
  ActorSourceOptions extra;
  extra.collector = coll;
  EpochRun a, b;
  {
    REQUIRE_OK_AND_ASSIGN(auto s0, ActorBatchSource::make(sys, o, extra));
    a = run_epoch(*s0, 0);
    auto s1 = ActorBatchSource::make(sys, o, extra);  // a second trainer's source
    REQUIRE_OK(s1);
    b = run_epoch(*s1.value(), 0);
  }
  check_same_batches(a, b);
  caf::scoped_actor self{sys};
  self->request(coll, caf::infinite, stats_atom::value)
      .receive([&](CollectorStats& s) { CHECK(s.case_skipped == 2); },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(sink->count("case_skipped") == 2);
  for (int i = 0; i < 500 && heard->load() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(heard->load() == 2);
  caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(coll, caf::exit_reason::user_shutdown);
}

TEST_CASE("the actor pipeline matches SimpleLoader on a synthesized NIfTI dataset with built-in stages") {
  TempDir dir("segflow_actors");
  SynthOptions so;
  so.cases = 4;
  so.size = 24;
  so.format = "nifti";
  so.out = dir.path() / "data";
  Status made = synthesize_dataset(so);
  REQUIRE_OK(made);
  REQUIRE_OK_AND_ASSIGN(auto index, scan_dataset(so.out));
  REQUIRE(index.cases.size() == 4);
  const StageRegistry registry = builtin_registry();
  REQUIRE_OK_AND_ASSIGN(auto spec, parse_pipeline_spec(nlohmann::json::parse(R"([
        "load",
        {"name": "rand_crop_pos_neg", "options": {"spatial_size": [16, 16, 8], "num_samples": 2}},
        {"name": "rand_flip", "options": {"prob": 0.5}}
      ])"),
                                                       "test"));
  REQUIRE_OK_AND_ASSIGN(auto built, build_pipeline(spec, registry));
  const Pipeline& p = built;
  LoaderOptions o = options_for(index.cases, p);
  o.batch_size = 3;
  o.disk_cache_dir = (dir.path() / "cache").string();
  auto ref = simple(o);
  auto act = actor(o);
  for (std::int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    const EpochRun a = run_epoch(*ref, epoch);
    CHECK(a.failures.empty());
    CHECK(a.ids().size() == 8);
    check_same_batches(a, run_epoch(*act, epoch));
  }
}

TEST_CASE("on a CUDA device the actor pipeline matches SimpleLoader (skipped without CUDA)") {
  if (!segflow::testing::cuda_or_skip()) return;
  TempDir dir("segflow_actors");
  const auto cases = testing::write_cases(dir.path(), testing::good_contents(7));
  const Pipeline p = crop_pipeline();
  LoaderOptions o = options_for(cases, p);
  o.device = "cuda:0";
  auto ref = simple(o);
  auto act = actor(o);
  const EpochRun a = run_epoch(*ref, 0);
  const EpochRun b = run_epoch(*act, 0);
  REQUIRE(!b.batches.empty());
  CHECK(b.batches.front().tensors.at("image").is_cuda());
  check_same_batches(a, b);
}
