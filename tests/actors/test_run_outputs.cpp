// The run outputs people look at: TensorBoard's framing and the progress plot.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "actors/run/run_outputs.hpp"
#include "test_util.hpp"

using namespace segflow;

TEST_CASE("crc32c matches the Castagnoli check value") {
  const char* s = "123456789";
  CHECK(actors::crc32c(s, 9) == 0xE3069283u);
  CHECK(actors::crc32c("", 0) == 0u);
}

TEST_CASE("event records are framed as TFRecord: length, masked CRCs, payload") {
  segflow::testing::TempDir dir("tb_frame");
  std::filesystem::path file;
  {
    actors::TensorBoardWriter w(dir.path());
    REQUIRE(w.ok());
    w.scalar("a/b", 7, 0.5);
    file = w.file();
  }
  std::ifstream f(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Walk the records and check both CRCs of each.
  auto le = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
    return v;
  };
  auto masked = [](std::uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  std::size_t at = 0;
  int records = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    const auto len = le(at, 8);
    CHECK(le(at + 8, 4) == masked(actors::crc32c(bytes.data() + at, 8)));
    REQUIRE(at + 12 + len + 4 <= bytes.size());
    CHECK(le(at + 12 + len, 4) == masked(actors::crc32c(bytes.data() + at + 12, len)));
    at += 12 + len + 4;
    ++records;
  }
  CHECK(records == 2);  // file_version + one scalar
  CHECK(bytes.find("brain.Event:2") != std::string::npos);
  CHECK(bytes.find("a/b") != std::string::npos);
}

TEST_CASE("the progress plot has a curve per series and is rewritten every epoch") {
  segflow::testing::TempDir dir("plot");
  actors::ProgressPlotObserver plot(dir / "progress.svg");
  for (int e = 0; e < 3; ++e) {
    models::EpochInfo i;
    i.epoch = e;
    i.loss = 1.0 / (e + 1);
    i.lr = 0.01;
    i.seconds = 2.0;
    plot.on_epoch_end(i);
  }
  models::ValidationInfo v;
  v.epoch = 2;
  v.mean_dice = 0.75;
  plot.on_validation(v);
  const std::string svg = plot.render();
  std::size_t polylines = 0;
  for (std::size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++polylines;
  CHECK(polylines == 4);  // loss, val Dice, lr, seconds
  CHECK(svg.find("train loss (last 0.333)") != std::string::npos);
  CHECK(svg.find("val Dice (last 0.75)") != std::string::npos);
  std::ifstream f(dir / "progress.svg");
  std::string on_disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(on_disk == svg);
}

TEST_CASE("a resumed run drops what the interrupted run wrote past its checkpoint, and TensorBoard agrees") {
  segflow::testing::TempDir dir("trim");
  const auto tb = dir / "tb";
  std::filesystem::path first;
  {
    // The interrupted run: epochs 0-2 of 4 steps done and validated, epoch 3 cut after step 14;
    // the checkpoint it resumes from was written after epoch 1 (next epoch 2, step 8), as
    // with checkpoint_interval 2 and a crash before the next one.
    actors::TensorBoardWriter w(tb);
    for (int s = 1; s <= 14; ++s) w.scalar("train/loss", s, 1.0 / s);
    for (int e = 0; e < 3; ++e) {
      w.scalar("epoch/loss", e, 1.0 / (e + 1));
      w.scalar("val/mean_dice", e, 0.1 * (e + 1));
    }
    first = w.file();
  }
  {
    std::ofstream torn(first, std::ios::binary | std::ios::app);
    torn << std::string("\x30\x00\x00\x00\x00\x00\x00\x00\x01\x02", 10);  // a record cut short by the crash
    std::ofstream m(dir / "metrics.jsonl");
    for (int s = 1; s <= 14; ++s)
      m << nlohmann::json{{"type", "step"}, {"epoch", (s - 1) / 4}, {"step", s}}.dump() << '\n';
    for (int e = 0; e < 3; ++e) {
      m << nlohmann::json{{"type", "epoch"},
                          {"epoch", e},
                          {"loss", 1.0 / (e + 1)},
                          {"lr", 0.01},
                          {"seconds", 1.0}}
               .dump()
        << '\n';
      m << nlohmann::json{{"type", "validation"}, {"epoch", e}, {"mean_dice", 0.1 * (e + 1)}}.dump() << '\n';
    }
    m << nlohmann::json{{"type", "checkpoint"}, {"kind", "last"}, {"path", "last.pt"}}.dump() << '\n';
    m << "{\"type\": \"step\", \"ep";  // torn line
  }
  models::TrainState at;
  at.epoch = 2;
  at.step = 8;
  REQUIRE_OK_AND_ASSIGN(auto dropped, actors::trim_run_outputs(dir.path(), at));
  // TensorBoard: 6 steps + 1 epoch + 1 validation + the torn record; metrics: 6 + 1 + 1 + torn.
  CHECK(dropped == 9 + 9);

  std::map<std::string, std::vector<std::int64_t>> steps;
  for (const auto& [tag, step] : actors::read_scalar_steps(first)) steps[tag].push_back(step);
  CHECK(steps["train/loss"] == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(steps["epoch/loss"] == std::vector<std::int64_t>{0, 1});
  CHECK(steps["val/mean_dice"] == std::vector<std::int64_t>{0, 1});

  std::ifstream m(dir / "metrics.jsonl");
  int step_lines = 0, epoch_lines = 0, other = 0;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);  // every line left is whole
    if (j["type"] == "step") {
      CHECK(j["step"].get<int>() <= 8);
      ++step_lines;
    } else if (j["type"] == "epoch" || j["type"] == "validation") {
      CHECK(j["epoch"].get<int>() < 2);
      ++epoch_lines;
    } else {
      ++other;
    }
  }
  CHECK(step_lines == 8);
  CHECK(epoch_lines == 4);
  CHECK(other == 1);

  // The resumed run writes epoch 2 again into a new event file; TensorBoard sees each step once.
  {
    actors::TensorBoardWriter w(tb);
    for (int s = 9; s <= 12; ++s) w.scalar("train/loss", s, 0.5 / s);
    w.scalar("epoch/loss", 2, 0.3);
  }
  auto r = segflow::testing::run_command(
      segflow::testing::shell_quote(segflow::testing::python()) + " " +
      segflow::testing::shell_quote(segflow::testing::source_path("tests/tools/tb_read.py").string()) + " " +
      segflow::testing::shell_quote(tb.string()) + " 2>/dev/null");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  auto scalars = nlohmann::json::parse(r.out);
  std::vector<std::int64_t> seen;
  for (const auto& e : scalars["train/loss"]) seen.push_back(e[0].get<std::int64_t>());
  CHECK(seen == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  REQUIRE(scalars["epoch/loss"].size() == 3);
  CHECK(scalars["epoch/loss"][2][1].get<double>() == doctest::Approx(0.3));

  // A second trim at the same point finds nothing more to drop and leaves the files alone.
  REQUIRE_OK_AND_ASSIGN(auto again,
                        actors::trim_run_outputs(dir.path(), models::TrainState{.epoch = 3, .step = 12}));
  CHECK(again == 0);

  // The progress plot of the resumed run starts from the history that was kept.
  actors::ProgressPlotObserver plot(dir / "progress.svg");
  plot.replay(dir / "metrics.jsonl");
  const std::string svg = plot.render();
  CHECK(svg.find("train loss (last 0.5") != std::string::npos);
}
