// The run outputs people look at: TensorBoard's framing and the progress plot.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

#include "actors/run_outputs.hpp"
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
  for (std::size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++polylines;
  CHECK(polylines == 4);  // loss, val Dice, lr, seconds
  CHECK(svg.find("train loss (last 0.333)") != std::string::npos);
  CHECK(svg.find("val Dice (last 0.75)") != std::string::npos);
  std::ifstream f(dir / "progress.svg");
  std::string on_disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(on_disk == svg);
}
