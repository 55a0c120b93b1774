// segflowd end to end: the real daemon process, driven over ZeroMQ (and `segflow ctl`).
#include <sys/stat.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "daemon/daemon_harness.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

std::int64_t ok_cases(const std::string& control, const std::string& name) {
  json d = dataset_entry(control, name);
  return d.is_null() ? -1 : d["labelled"].get<std::int64_t>();
}

std::optional<json> bad_entry(const std::string& control, const std::string& name,
                              const std::string& case_id) {
  json d = dataset_entry(control, name);
  if (d.is_null()) return std::nullopt;
  for (const auto& b : d["bad_files"])
    if (b["case"] == case_id) return b;
  return std::nullopt;
}

std::int64_t start_job(const std::string& control, const std::string& yaml,
                       const std::vector<std::string>& set = {}) {
  json r = ok(control, {{"cmd", "start"}, {"config", yaml}, {"file", "tiny.yaml"}, {"set", set}});
  return r["job"].get<std::int64_t>();
}

}  // namespace

TEST_CASE("a job started over ZeroMQ is queued, paused, resumed and stopped, and reports its progress") {
  Setup s;
  s.write_config();
  make_dataset(s.data, "tiny", 5);
  auto d = s.start();

  // The control socket is owner-only.
  struct stat st {};
  REQUIRE(::stat((s.state / "control.sock").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  Events events(s.events);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the subscription reach the PUB socket

  // A bad config is refused at submission and changes nothing.
  const std::string job = tiny_job(s.data / "tiny", 400);  // long enough to be stopped, never to complete
  json bad = call(s.control, {{"cmd", "start"}, {"config", job}, {"set", {"train.epochs=0"}}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("train.epochs") != std::string::npos);
  bad = call(s.control, {{"cmd", "start"}, {"config", job}, {"set", {"stages.1.name=resampel"}}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("unknown stage 'resampel'") != std::string::npos);
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].empty());

  // Two jobs on the one CPU device: the second waits in the queue.
  const auto a = start_job(s.control, job);
  const auto b = start_job(s.control, job);
  json sa = wait_job(*d, s.control, a, "running", 120, [](const json& j) { return j["epoch"] >= 1; });
  CHECK(job_status(s.control, b)["state"] == "queued");
  CHECK(sa["devices"] == json::array({"cpu"}));
  CHECK(sa["dataset"] == "tiny");
  CHECK(sa["step"].get<int>() >= 4);
  CHECK(sa["loss"].is_number());
  CHECK(sa["samples_per_s"].get<double>() > 0);

  // Pause: a checkpoint is written and the device goes to the queued job.
  ok(s.control, {{"cmd", "pause"}, {"job", a}});
  json pa = wait_job(*d, s.control, a, "paused", 120);
  const fs::path run_a = pa["run_dir"].get<std::string>();
  CHECK(fs::exists(run_a / "last.pt"));
  CHECK(pa["checkpoint_epoch"] == pa["epoch"]);
  const auto paused_epoch = pa["epoch"].get<std::int64_t>();
  wait_job(*d, s.control, b, "running", 120);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK(job_status(s.control, a)["epoch"] == paused_epoch);  // paused means paused

  // Stop the second job, resume the first: it goes on from its checkpoint.
  ok(s.control, {{"cmd", "stop"}, {"job", b}});
  wait_job(*d, s.control, b, "stopped", 120);
  CHECK(call(s.control, {{"cmd", "resume"}, {"job", b}})["ok"] == false);  // stopped is final
  ok(s.control, {{"cmd", "resume"}, {"job", a}});
  wait_job(*d, s.control, a, "running", 120, [&](const json& j) { return j["epoch"] > paused_epoch; });

  // The client prints the same, readable or as JSON.
  auto out = run_segflow("ctl --endpoint " + s.control + " status");
  CHECK_MESSAGE(out.exit_code == 0, out.out);
  CHECK(out.out.find("tiny") != std::string::npos);
  CHECK(out.out.find("running") != std::string::npos);
  CHECK(out.out.find("stopped") != std::string::npos);
  out = run_segflow("ctl --endpoint " + s.control + " --json status " + std::to_string(a));
  REQUIRE_MESSAGE(out.exit_code == 0, out.out);
  CHECK(json::parse(out.out)["job"]["id"] == a);
  out = run_segflow("ctl --endpoint " + s.control + " stages");
  CHECK(out.out.find("rand_crop_pos_neg") != std::string::npos);
  out = run_segflow("ctl --endpoint " + s.control + " datasets");
  CHECK(out.out.find("tiny") != std::string::npos);
  out = run_segflow("ctl --endpoint " + s.control + " stop 999");
  CHECK(out.exit_code == 1);
  CHECK(out.out.find("no such job") != std::string::npos);

  out = run_segflow("ctl --endpoint " + s.control + " stop " + std::to_string(a));
  CHECK_MESSAGE(out.exit_code == 0, out.out);
  wait_job(*d, s.control, a, "stopped", 120);

  // Events: state changes on job.<id>, progress on metrics.<id>.
  events.drain(500);
  std::set<std::string> states;
  bool step = false, epoch = false;
  for (const auto& [topic, body] : events.got) {
    if (topic == "job." + std::to_string(a)) states.insert(body["state"].get<std::string>());
    if (topic == "metrics." + std::to_string(a) && body["type"] == "step") step = true;
    if (topic == "metrics." + std::to_string(a) && body["type"] == "epoch") epoch = true;
  }
  CHECK(states == std::set<std::string>{"queued", "running", "paused", "stopped"});
  CHECK(step);
  CHECK(epoch);

  out = run_segflow("ctl --endpoint " + s.control + " shutdown");
  CHECK_MESSAGE(out.exit_code == 0, out.out);
  CHECK_MESSAGE(d->wait_exit(60) == 0, d->log_tail());
  out = run_segflow("ctl --endpoint " + s.control + " --timeout 1 ping");
  CHECK(out.exit_code == 1);
  CHECK(out.out.find("no answer from") != std::string::npos);
}

TEST_CASE("new cases dropped into the watched folder are indexed and join a running job at its next epoch") {
  Setup s;
  s.write_config();
  make_dataset(s.data, "tiny", 5);
  TempDir src("segflowd_src");
  auto r = run_segflow("synth --cases 8 --size 24 --format nifti --seed 9 --out " +
                       shell_quote((src / "ds").string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto d = s.start();
  REQUIRE(eventually([&] { return ok_cases(s.control, "tiny") == 5; }, 60));

  Events events(s.events, "metrics.");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto id = start_job(s.control, tiny_job(s.data / "tiny", 200));
  const std::string topic = "metrics." + std::to_string(id);
  auto steps_are = [&](int n) {
    return [&, n](const std::string& t, const json& b) {
      return t == topic && b["type"] == "epoch" && b["steps"] == n;
    };
  };
  // 4 training cases x 2 crops / batch 2 = 4 steps per epoch.
  REQUIRE_MESSAGE(events.wait_for(steps_are(4), 120).has_value(), d->log_tail());

  auto copy_case = [&](const std::string& c) {
    fs::copy_file(src / "ds" / "imagesTr" / (c + "_0000.nii.gz"),
                  s.data / "tiny" / "imagesTr" / (c + "_0000.nii.gz"));
    fs::copy_file(src / "ds" / "labelsTr" / (c + ".nii.gz"), s.data / "tiny" / "labelsTr" / (c + ".nii.gz"));
  };
  copy_case("case_005");
  REQUIRE_MESSAGE(eventually([&] { return ok_cases(s.control, "tiny") == 6; }, 60), d->log_tail());
  // 5 training cases from the next epoch on.
  CHECK_MESSAGE(events.wait_for(steps_are(5), 120).has_value(), d->log_tail());
  ok(s.control, {{"cmd", "stop"}, {"job", id}});
  wait_job(*d, s.control, id, "stopped", 120);
  const auto epochs = epoch_records(job_status(s.control, id)["run_dir"].get<std::string>());
  CHECK(std::set<std::int64_t>(epochs.begin(), epochs.end()).size() == epochs.size());

  // A corrupt file is reported with the reason; the daemon goes on.
  write_file(s.data / "tiny" / "imagesTr" / "case_bad_0000.nii.gz", std::string(4000, 'x'));
  fs::copy_file(src / "ds" / "labelsTr" / "case_000.nii.gz",
                s.data / "tiny" / "labelsTr" / "case_bad.nii.gz");
  REQUIRE_MESSAGE(eventually([&] { return bad_entry(s.control, "tiny", "case_bad").has_value(); }, 60),
                  d->log_tail());
  CHECK_FALSE(bad_entry(s.control, "tiny", "case_bad")->at("reason").get<std::string>().empty());
  CHECK(ok_cases(s.control, "tiny") == 6);

  // A half-written file is not a case yet; once complete it is indexed.
  const std::string bytes = read_file(src / "ds" / "imagesTr" / "case_006_0000.nii.gz");
  fs::copy_file(src / "ds" / "labelsTr" / "case_006.nii.gz",
                s.data / "tiny" / "labelsTr" / "case_006.nii.gz");
  {
    std::ofstream half(s.data / "tiny" / "imagesTr" / "case_006_0000.nii.gz", std::ios::binary);
    half.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    half.flush();
    CHECK(eventually(
        [&] {
          json e = dataset_entry(s.control, "tiny");
          for (const auto& k : {"bad_files", "pending_files"})
            for (const auto& b : e[k])
              if (b["case"] == "case_006") return true;
          return false;
        },
        60));
    CHECK(ok_cases(s.control, "tiny") == 6);
    half.write(bytes.data() + bytes.size() / 2,
               static_cast<std::streamsize>(bytes.size() - bytes.size() / 2));
  }  // closed: IN_CLOSE_WRITE
  CHECK_MESSAGE(eventually([&] { return ok_cases(s.control, "tiny") == 7; }, 60), d->log_tail());
  CHECK_FALSE(bad_entry(s.control, "tiny", "case_006").has_value());

  // The corrupt file is retried on its next change: fixed, it becomes a case.
  fs::copy_file(src / "ds" / "labelsTr" / "case_007.nii.gz", s.data / "tiny" / "labelsTr" / "case_bad.nii.gz",
                fs::copy_options::overwrite_existing);
  fs::copy_file(src / "ds" / "imagesTr" / "case_007_0000.nii.gz",
                s.data / "tiny" / "imagesTr" / "case_bad_0000.nii.gz", fs::copy_options::overwrite_existing);
  CHECK_MESSAGE(eventually([&] { return ok_cases(s.control, "tiny") == 8; }, 60), d->log_tail());

  // Removed cases leave the index; a new dataset folder appears by itself.
  fs::remove(s.data / "tiny" / "imagesTr" / "case_005_0000.nii.gz");
  fs::remove(s.data / "tiny" / "labelsTr" / "case_005.nii.gz");
  CHECK_MESSAGE(eventually([&] { return ok_cases(s.control, "tiny") == 7; }, 60), d->log_tail());
  make_dataset(s.data, "more", 2, 4);
  CHECK_MESSAGE(eventually([&] { return ok_cases(s.control, "more") == 2; }, 60), d->log_tail());
  CHECK(d->alive());
}

TEST_CASE("a daemon killed with SIGKILL mid-training resumes the job from its checkpoint on restart") {
  Setup s;
  s.write_config();
  auto d = s.start("first.log");
  Events events(s.events, "metrics.");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The job makes its dataset on first use (data.synth), outside the watched folder.
  const int kEpochs = 40;  // the kill must land while it runs: epochs take ~0.1 s here
  const auto id = start_job(s.control, tiny_job(s.dir / "jobdata" / "tiny", kEpochs));
  const std::string topic = "metrics." + std::to_string(id);
  auto ckpt = events.wait_for(
      [&](const std::string& t, const json& b) {
        return t == topic && b["type"] == "checkpoint" && b["kind"] == "last" && b["epoch"] >= 2;
      },
      180);
  REQUIRE_MESSAGE(ckpt.has_value(), d->log_tail());
  d->kill();  // right after the checkpoint of epoch 2 (or later): mid-epoch
  const auto checkpointed = (*ckpt)["epoch"].get<std::int64_t>();

  auto d2 = s.start("second.log");
  json st = job_status(s.control, id);
  CHECK(st["name"] == "tiny");
  CHECK(st["epoch"].get<std::int64_t>() >= checkpointed);
  CHECK((st["state"] == "running" || st["state"] == "queued"));
  json done = wait_job(*d2, s.control, id, "completed", 240);
  CHECK(done["epoch"] == kEpochs);

  // The run folder's history: every epoch once, in order, none repeated.
  const auto epochs = epoch_records(done["run_dir"].get<std::string>());
  std::vector<std::int64_t> expect;
  for (int e = 0; e < kEpochs; ++e) expect.push_back(e);
  CHECK(epochs == expect);
  std::int64_t steps = 0;
  {
    std::ifstream f(fs::path(done["run_dir"].get<std::string>()) / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line))
      if (!line.empty() && json::parse(line).value("type", "") == "epoch")
        steps += json::parse(line)["steps"].get<std::int64_t>();
  }
  CHECK(done["step"] == steps);  // the optimizer step counter continued from the checkpoint
  CHECK(d2->log_tail(1 << 20).find("resumed from") != std::string::npos);

  // A graceful shutdown afterwards keeps the record.
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d2->wait_exit(60) == 0);
  auto d3 = s.start("third.log");
  CHECK(job_status(s.control, id)["state"] == "completed");
}

TEST_CASE("a burst of malformed and oversized requests gets error replies and leaves the daemon answering") {
  Setup s;
  s.write_config("max_request_bytes: 65536\n");
  auto d = s.start();
  struct Bad {
    std::string request;
    std::string expect;  // in the error
  };
  const std::vector<Bad> bad = {
      {"not json", "malformed JSON"},
      {"", "malformed JSON"},
      {"\xff\xfe{}", "malformed JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{}", "cmd: missing"},
      {R"({"cmd": 5})", "cmd: expected a string"},
      {R"({"cmd": "explode"})", "cmd: unknown command 'explode'"},
      {R"({"cmd": "stop"})", "job: missing"},
      {R"({"cmd": "stop", "job": "x"})", "job: expected an integer >= 1, got \"x\""},
      {R"({"cmd": "stop", "job": -1})", "job: expected an integer >= 1, got -1"},
      {R"({"cmd": "stop", "job": 1.5})", "job: expected an integer >= 1, got 1.5"},
      {R"({"cmd": "stop", "job": 999})", "job 999: no such job"},
      {R"({"cmd": "pause", "job": 1, "now": "yes"})", "now: expected true or false"},
      {R"({"cmd": "status", "bogus": 1})", "bogus: unknown field for status"},
      {R"({"cmd": "list", "job": 1})", "job: unknown field for list"},
      {R"({"cmd": "start"})", "config: missing"},
      {R"({"cmd": "start", "config": 5})", "config: expected a string"},
      {R"({"cmd": "start", "config": "a: [", "file": "j.yaml"})", "j.yaml: line"},
      {R"({"cmd": "start", "config": "x: 1", "path": "y"})", "give one of them"},
      {R"({"cmd": "start", "path": "/nonexistent/job.yaml"})", "path: /nonexistent/job.yaml"},
      {R"({"cmd": "start", "config": "x: 1", "set": [1]})", "set[0]: expected a string"},
      {R"({"cmd": "start", "config": "x: 1", "set": "a=b"})", "set: expected a list"},
      {std::string(40, '[') + std::string(40, ']'), "nested deeper"},
      {R"({"cmd": "ping", "pad": ")" + std::string(100000, 'x') + "\"}", "exceeds max_request_bytes (65536)"},
  };
  for (int round = 0; round < 5; ++round) {
    for (const auto& b : bad) {
      CAPTURE(b.request.substr(0, 80));
      auto r = request_frames(s.control, {b.request});
      REQUIRE_MESSAGE(r.has_value(), d->log_tail());
      json j = json::parse(*r);
      CHECK(j["ok"] == false);
      CHECK_MESSAGE(j["error"].get<std::string>().find(b.expect) != std::string::npos, j.dump());
    }
  }
  // Two frames, and a message far over the limit (dropped by libzmq, never buffered whole).
  auto two = request_frames(s.control, {R"({"cmd": "ping"})", "{}"});
  REQUIRE(two.has_value());
  CHECK(json::parse(*two)["error"].get<std::string>().find("one frame") != std::string::npos);
  CHECK_FALSE(request_frames(s.control, {std::string(1 << 20, 'x')}, 3000).has_value());
  // A client that sends and goes away does not wedge the socket.
  for (int i = 0; i < 20; ++i) {
    zmq::socket_t q(zmq_context(), zmq::socket_type::req);
    q.set(zmq::sockopt::linger, 0);
    q.connect(s.control);
    q.send(zmq::buffer(std::string(R"({"cmd": "list"})")), zmq::send_flags::none);
  }
  // Still answering, and nothing changed.
  CHECK(ok(s.control, {{"cmd", "ping"}})["pid"] == d->pid());
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].empty());
  CHECK(d->alive());

  // A second daemon on the same state folder is refused.
  auto second =
      run_command(shell_quote(segflowd_bin()) + " --config " + shell_quote(s.config.string()) + " 2>&1");
  CHECK(second.exit_code == 1);
  CHECK(second.out.find("another segflowd") != std::string::npos);
  CHECK(ok(s.control, {{"cmd", "ping"}})["pid"] == d->pid());
}

TEST_CASE("a client without an authorized CURVE key is refused while an authorized one works") {
  Setup s;
  const fs::path keys = s.dir / "keys";
  for (const char* who : {"server", "alice", "mallory"}) {
    auto r = run_segflow(std::string("ctl keygen --out ") + shell_quote((keys / who).string()));
    REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  }
  struct stat st {};
  REQUIRE(::stat((keys / "alice" / "secret.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(run_segflow("ctl keygen --out " + shell_quote((keys / "alice").string())).exit_code !=
        0);  // never overwrites
  fs::create_directories(keys / "authorized");
  fs::copy_file(keys / "alice" / "public.key", keys / "authorized" / "alice.key");

  const std::string control = "tcp://127.0.0.1:" + std::to_string(free_port());
  const std::string events = "tcp://127.0.0.1:" + std::to_string(free_port());
  s.control = control;
  s.events = events;
  s.write_config("control: " + control + "\nevents: " + events +
                 "\ncurve:\n  server_secret_key_file: " + (keys / "server" / "secret.key").string() +
                 "\n  server_public_key_file: " + (keys / "server" / "public.key").string() +
                 "\n  authorized_clients_dir: " + (keys / "authorized").string() + "\n");
  auto key = [&](const char* who, const char* which) { return trim_key(read_file(keys / who / which)); };
  const CurveClient alice{key("server", "public.key"), key("alice", "public.key"),
                          key("alice", "secret.key")};
  const CurveClient mallory{key("server", "public.key"), key("mallory", "public.key"),
                            key("mallory", "secret.key")};

  ChildProcess d = start_segflowd({"--config", s.config.string()}, s.dir / "segflowd.log");
  REQUIRE_MESSAGE(eventually(
                      [&] {
                        REQUIRE_MESSAGE(d.alive(), d.log_tail());
                        auto r = request(control, {{"cmd", "ping"}}, 1000, &alice);
                        return r && r->value("ok", false);
                      },
                      120),
                  d.log_tail());
  CHECK_FALSE(request(control, {{"cmd", "ping"}}, 3000, &mallory).has_value());
  CHECK_FALSE(request(control, {{"cmd", "ping"}}, 3000, nullptr).has_value());
  CHECK(request(control, {{"cmd", "list"}}, 10000, &alice).value()["ok"] == true);

  const std::string curve_args =
      " --curve-server-key " + shell_quote((keys / "server" / "public.key").string());
  auto out = run_segflow("ctl --endpoint " + control + curve_args + " --curve-client-keys " +
                         shell_quote((keys / "alice").string()) + " ping");
  CHECK_MESSAGE(out.exit_code == 0, out.out);
  out = run_segflow("ctl --endpoint " + control + curve_args + " --curve-client-keys " +
                    shell_quote((keys / "mallory").string()) + " --timeout 2 ping");
  CHECK(out.exit_code == 1);
  CHECK(out.out.find("no answer") != std::string::npos);

  // Keys are read on each connection: authorizing mallory lets her in without a restart.
  fs::copy_file(keys / "mallory" / "public.key", keys / "authorized" / "mallory.key");
  CHECK(request(control, {{"cmd", "ping"}}, 10000, &mallory).has_value());
  CHECK(d.alive());
}

TEST_CASE("segflowd refuses a non-loopback control address without CURVE keys and a bad config") {
  Setup s;
  s.write_config("control: tcp://0.0.0.0:" + std::to_string(free_port()) + "\n");
  auto r = run_command(shell_quote(segflowd_bin()) + " --config " + shell_quote(s.config.string()) + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.out.find("needs CURVE keys") != std::string::npos, r.out);
  s.write_config("devices: cpu\n");
  r = run_command(shell_quote(segflowd_bin()) + " --config " + shell_quote(s.config.string()) + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.out.find("devices: expected a non-empty list") != std::string::npos, r.out);
  s.write_config("bogus: 1\n");
  r = run_command(shell_quote(segflowd_bin()) + " --config " + shell_quote(s.config.string()) + " 2>&1");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.out.find("bogus: unknown key") != std::string::npos, r.out);
}

TEST_CASE("segflowd caps glibc's malloc arenas at malloc_arena_max and MALLOC_ARENA_MAX wins") {
  // The soak (bench/daemon_soak.py) showed RSS climbing with glibc's default arenas while
  // control clients and a job ran together; the daemon sets the cap before its threads start
  // and reports the value in effect in `ping`.
  Setup s;
  s.write_config("malloc_arena_max: -1\n");
  auto bad =
      run_command(shell_quote(segflowd_bin()) + " --config " + shell_quote(s.config.string()) + " 2>&1");
  CHECK(bad.exit_code == 2);
  CHECK_MESSAGE(
      bad.out.find("malloc_arena_max: expected an integer in [0, 1024], got -1") != std::string::npos,
      bad.out);
  struct Case {
    std::string config_line;
    const char* env;  ///< MALLOC_ARENA_MAX for the daemon; nullptr = unset
    std::int64_t expect;
  };
  const Case cases[] = {{"", nullptr, 2},
                        {"malloc_arena_max: 3\n", nullptr, 3},
                        {"malloc_arena_max: 0\n", nullptr, 0},
                        {"malloc_arena_max: 3\n", "5", 5}};
  for (const auto& c : cases) {
    CAPTURE(c.config_line);
    s.write_config(c.config_line);
    if (c.env != nullptr) ::setenv("MALLOC_ARENA_MAX", c.env, 1);
    auto d = s.start();
    ::unsetenv("MALLOC_ARENA_MAX");
    json r = ok(s.control, {{"cmd", "ping"}});
    CHECK(r["malloc_arena_max"] == c.expect);
    ok(s.control, {{"cmd", "shutdown"}});
    CHECK(d->wait_exit(60) == 0);
  }
}
