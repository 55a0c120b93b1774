#include "actors/run_outputs.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace segflow::actors {

namespace fs = std::filesystem;

// ---- CRC-32C and the TFRecord framing ----

namespace {

std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

std::uint32_t masked_crc(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& s, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& s, std::uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

void put_bytes_field(std::string& s, int field, const std::string& bytes) {
  put_varint(s, (static_cast<std::uint64_t>(field) << 3) | 2);
  put_varint(s, bytes.size());
  s += bytes;
}

double now_seconds() {
  using namespace std::chrono;
  return duration_cast<duration<double>>(system_clock::now().time_since_epoch()).count();
}

/// tensorflow.Event with wall_time and step; the caller appends the payload field.
std::string event_header(std::int64_t step) {
  std::string e;
  e.push_back(0x09);  // wall_time: field 1, fixed64
  double wt = now_seconds();
  std::uint64_t bits;
  std::memcpy(&bits, &wt, 8);
  put_le(e, bits, 8);
  e.push_back(0x10);  // step: field 2, varint
  put_varint(e, static_cast<std::uint64_t>(step));
  return e;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n) {
  static const auto table = make_crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const auto t = static_cast<long long>(now_seconds());
  file_ = dir / ("events.out.tfevents." + std::to_string(t) + "." + host + "." + std::to_string(getpid()));
  out_.open(file_, std::ios::binary | std::ios::app);
  std::string e = event_header(0);
  put_bytes_field(e, 3, "brain.Event:2");  // file_version
  write_record(e);
  flush();
}

void TensorBoardWriter::write_record(const std::string& payload) {
  std::string rec;
  put_le(rec, payload.size(), 8);
  put_le(rec, masked_crc(rec.data(), 8), 4);
  rec += payload;
  put_le(rec, masked_crc(payload.data(), payload.size()), 4);
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
}

void TensorBoardWriter::scalar(const std::string& tag, std::int64_t step, double value) {
  std::string v;
  put_bytes_field(v, 1, tag);  // Summary.Value.tag
  v.push_back(0x15);           // simple_value: field 2, fixed32
  const float f = static_cast<float>(value);
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  put_le(v, bits, 4);
  std::string summary;
  put_bytes_field(summary, 1, v);  // Summary.value
  std::string e = event_header(step);
  put_bytes_field(e, 5, summary);  // Event.summary
  write_record(e);
}

// ---- TensorBoardObserver ----

TensorBoardObserver::TensorBoardObserver(const fs::path& dir, std::int64_t log_every, std::function<double()> gpu_peak_mb)
    : w_(dir), every_(std::max<std::int64_t>(1, log_every)), gpu_peak_mb_(std::move(gpu_peak_mb)) {}

void TensorBoardObserver::on_step(const models::StepInfo& i) {
  last_step_ = i.step;
  if (i.step % every_ != 0) return;
  w_.scalar("train/loss", i.step, i.loss);
  w_.scalar("train/lr", i.step, i.lr);
  w_.scalar("train/step_ms", i.step, i.step_s * 1e3);
  w_.scalar("train/data_wait_ms", i.step, i.data_wait_s * 1e3);
  if (i.step_s > 0) w_.scalar("train/samples_per_s", i.step, static_cast<double>(i.samples) / i.step_s);
  if (gpu_peak_mb_) w_.scalar("memory/gpu_peak_mb", i.step, gpu_peak_mb_());
  w_.flush();
}

void TensorBoardObserver::on_epoch_end(const models::EpochInfo& i) {
  w_.scalar("epoch/loss", i.epoch, i.loss);
  w_.scalar("epoch/samples_per_s", i.epoch, i.samples_per_s);
  w_.scalar("epoch/seconds", i.epoch, i.seconds);
  w_.scalar("epoch/data_wait_s", i.epoch, i.data_wait_s);
  w_.scalar("epoch/lr", i.epoch, i.lr);
  w_.flush();
}

void TensorBoardObserver::on_validation(const models::ValidationInfo& i) {
  if (std::isfinite(i.mean_dice)) w_.scalar("val/mean_dice", i.epoch, i.mean_dice);
  for (std::size_t k = 0; k < i.dice_per_class.size(); ++k)
    if (std::isfinite(i.dice_per_class[k])) w_.scalar("val/dice_class_" + std::to_string(k + 1), i.epoch, i.dice_per_class[k]);
  w_.flush();
}

// ---- progress.svg ----

void ProgressPlotObserver::on_epoch_end(const models::EpochInfo& i) {
  epoch_.push_back(static_cast<double>(i.epoch + 1));
  loss_.push_back(i.loss);
  lr_.push_back(i.lr);
  seconds_.push_back(i.seconds);
  write();
}

void ProgressPlotObserver::on_validation(const models::ValidationInfo& i) {
  if (!std::isfinite(i.mean_dice)) return;
  val_epoch_.push_back(static_cast<double>(i.epoch + 1));
  val_dice_.push_back(i.mean_dice);
  write();
}

namespace {

struct Series {
  const std::vector<double>* x;
  const std::vector<double>* y;
  const char* colour;
  const char* label;
  bool right_axis;  // plotted against [0, 1] on the right
};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, std::fabs(v) < 1e-2 && v != 0 ? "%.2e" : "%.3g", v);
  return b;
}

void panel(std::ostringstream& o, double top, const char* title, const std::vector<Series>& series, double xmax) {
  const double left = 70, width = 660, height = 170;
  double lo = 1e300, hi = -1e300;
  for (const auto& s : series)
    if (!s.right_axis)
      for (double v : *s.y)
        if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1), lo -= (hi - lo) * 0.5;
  o << "<text x='" << left << "' y='" << top - 8 << "' font-size='14' font-weight='bold'>" << title << "</text>\n";
  o << "<rect x='" << left << "' y='" << top << "' width='" << width << "' height='" << height
    << "' fill='none' stroke='#444'/>\n";
  auto X = [&](double x) { return left + width * (xmax <= 1 ? 0.5 : (x - 1) / (xmax - 1)); };
  for (int t = 0; t <= 4; ++t) {
    const double y = top + height - height * t / 4.0;
    o << "<line x1='" << left << "' x2='" << left + width << "' y1='" << y << "' y2='" << y
      << "' stroke='#ddd'/><text x='" << left - 6 << "' y='" << y + 4 << "' font-size='11' text-anchor='end'>"
      << fmt(lo + (hi - lo) * t / 4.0) << "</text>\n";
  }
  bool right = false;
  for (const auto& s : series) right |= s.right_axis;
  if (right)
    for (int t = 0; t <= 4; ++t)
      o << "<text x='" << left + width + 6 << "' y='" << top + height - height * t / 4.0 + 4
        << "' font-size='11'>" << fmt(t / 4.0) << "</text>\n";
  o << "<text x='" << left + width / 2 << "' y='" << top + height + 16 << "' font-size='11' text-anchor='middle'>epoch (1.."
    << fmt(xmax) << ")</text>\n";
  double ly = top + 14;
  for (const auto& s : series) {
    o << "<polyline fill='none' stroke='" << s.colour << "' stroke-width='2' points='";
    for (std::size_t k = 0; k < s.y->size() && k < s.x->size(); ++k) {
      const double v = (*s.y)[k];
      if (!std::isfinite(v)) continue;
      const double frac = s.right_axis ? std::clamp(v, 0.0, 1.0) : (v - lo) / (hi - lo);
      o << X((*s.x)[k]) << ',' << top + height - height * frac << ' ';
    }
    o << "'/>\n<text x='" << left + width - 8 << "' y='" << ly << "' font-size='12' text-anchor='end' fill='"
      << s.colour << "'>" << s.label;
    if (!s.y->empty()) o << " (last " << fmt(s.y->back()) << ")";
    o << "</text>\n";
    ly += 15;
  }
}

}  // namespace

std::string ProgressPlotObserver::render() const {
  std::ostringstream o;
  const double xmax = epoch_.empty() ? 1 : epoch_.back();
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='800' height='720' font-family='sans-serif'>\n"
    << "<rect width='800' height='720' fill='white'/>\n";
  panel(o, 40, "train loss / validation mean Dice (right axis)",
        {{&epoch_, &loss_, "#1f77b4", "train loss", false}, {&val_epoch_, &val_dice_, "#d62728", "val Dice", true}}, xmax);
  panel(o, 280, "learning rate", {{&epoch_, &lr_, "#2ca02c", "lr", false}}, xmax);
  panel(o, 520, "epoch time (s)", {{&epoch_, &seconds_, "#9467bd", "seconds", false}}, xmax);
  o << "</svg>\n";
  return o.str();
}

void ProgressPlotObserver::write() const {
  const fs::path tmp = file_.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << render();
    if (!f) return;
  }
  std::error_code ec;
  fs::rename(tmp, file_, ec);
}

}  // namespace segflow::actors
