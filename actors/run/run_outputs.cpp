#include "actors/run/run_outputs.hpp"

#include <unistd.h>

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "messages/log.hpp"
#include "models/training/class_names.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- metrics.jsonl ----

struct JsonlMetricsObserver::Impl {
  std::ofstream out;
  std::int64_t every = 10;
  std::mutex mu;
  void write(const json& j) {
    std::lock_guard<std::mutex> lock(mu);
    out << j.dump() << '\n';
    out.flush();
  }
};

JsonlMetricsObserver::JsonlMetricsObserver(const fs::path& file, std::int64_t log_every)
    : impl_(std::make_unique<Impl>()) {
  impl_->out.open(file, std::ios::app);
  impl_->every = std::max<std::int64_t>(1, log_every);
}
JsonlMetricsObserver::~JsonlMetricsObserver() = default;

namespace {
/// train.amp as the config says it (auto, say), before the trainer resolved it.
std::string amp_setting(const models::JobConfig& c) {
  const json& r = c.resolved;
  if (r.is_object() && r.contains("train") && r["train"].is_object() && r["train"].contains("amp") &&
      r["train"]["amp"].is_string())
    return r["train"]["amp"].get<std::string>();
  return c.train.amp;
}
}  // namespace

void JsonlMetricsObserver::on_run_start(const models::Trainer& t, const std::string& resumed_from) {
  impl_->write({{"type", "run"},
                {"device", t.device().str()},
                {"amp", t.config().train.amp},
                {"amp_setting", amp_setting(t.config())},
                {"amp_reason", t.amp_reason()},
                {"threads", at::get_num_threads()},
                {"torch", TORCH_VERSION},
                {"resumed_from", resumed_from.empty() ? json(nullptr) : json(resumed_from)},
                {"epoch", t.state().epoch}});
}

void JsonlMetricsObserver::on_step(const models::StepInfo& i) {
  if (i.step % impl_->every != 0 && !i.skipped) return;
  impl_->write({{"type", "step"},
                {"epoch", i.epoch},
                {"step", i.step},
                {"loss", i.loss},
                {"lr", i.lr},
                {"step_ms", i.step_s * 1e3},
                {"data_wait_ms", i.data_wait_s * 1e3},
                {"samples", i.samples},
                {"skipped", i.skipped},
                {"skipped_steps", i.skipped_steps},
                {"loss_scale", i.loss_scale}});
}
void JsonlMetricsObserver::on_epoch_end(const models::EpochInfo& i) {
  impl_->write({{"type", "epoch"},
                {"epoch", i.epoch},
                {"steps", i.steps},
                {"loss", i.loss},
                {"seconds", i.seconds},
                {"samples_per_s", i.samples_per_s},
                {"data_wait_s", i.data_wait_s},
                {"lr", i.lr},
                {"skipped_steps", i.skipped_steps}});
}
void JsonlMetricsObserver::on_validation(const models::ValidationInfo& i) {
  json per = json::array();
  for (double d : i.dice_per_class) per.push_back(std::isfinite(d) ? json(d) : json(nullptr));
  json named = json::object();  // the same Dice keyed by class name (models/training/class_names.hpp)
  for (std::size_t k = 0; k < i.dice_per_class.size(); ++k) named[models::class_key(i, k)] = per[k];
  impl_->write({{"type", "validation"},
                {"epoch", i.epoch},
                {"mean_dice", std::isfinite(i.mean_dice) ? json(i.mean_dice) : json(nullptr)},
                {"dice_per_class", per},
                {"dice_by_class", named},
                {"cases", i.cases},
                {"seconds", i.seconds},
                {"best", i.best}});
}
void JsonlMetricsObserver::on_checkpoint(const fs::path& p, const std::string& kind) {
  impl_->write({{"type", "checkpoint"}, {"kind", kind}, {"path", p.string()}});
}
void JsonlMetricsObserver::on_case_failure(const pipeline::CaseFailure& f) {
  impl_->write({{"type", "case_failure"}, {"case", f.case_id}, {"reason", f.reason}});
}
void JsonlMetricsObserver::on_early_stop(const models::EarlyStopInfo& i) {
  if (i.earlier) return;
  json j = {{"type", "early_stop"}};
  j.update(models::early_stop_info_json(i));
  impl_->write(j);
}
void JsonlMetricsObserver::on_data_event(const Event& e) {
  json j = event_to_json(e);
  j["type"] = "data_event";
  impl_->write(j);
}

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

namespace {

std::string frame_record(std::string_view payload) {
  std::string rec;
  put_le(rec, payload.size(), 8);
  put_le(rec, masked_crc(rec.data(), 8), 4);
  rec += payload;
  put_le(rec, masked_crc(payload.data(), payload.size()), 4);
  return rec;
}

std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

/// The payloads of an event file's records, up to the first torn or corrupt one
/// (`complete` says whether the whole file was whole records).
std::vector<std::string_view> split_records(std::string_view data, bool& complete) {
  std::vector<std::string_view> out;
  complete = true;
  std::size_t at = 0;
  while (at < data.size()) {
    if (data.size() - at < 12) break;
    const std::uint64_t len = get_le(data.data() + at, 8);
    if (get_le(data.data() + at + 8, 4) != masked_crc(data.data() + at, 8)) break;
    if (len > data.size() - at - 12 || data.size() - at - 12 - len < 4) break;
    std::string_view payload = data.substr(at + 12, len);
    if (get_le(data.data() + at + 12 + len, 4) != masked_crc(payload.data(), payload.size())) break;
    out.push_back(payload);
    at += 12 + len + 4;
  }
  complete = at == data.size();
  return out;
}

/// Protobuf fields, just enough to walk an Event: varints, fixed 32/64, length-delimited.
struct ProtoReader {
  std::string_view s;
  std::size_t at = 0;
  bool varint(std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && at < s.size(); shift += 7) {
      const auto b = static_cast<unsigned char>(s[at++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  /// Next field: number, wire type; length-delimited contents in `bytes`, varints in `value`.
  bool next(int& field, int& wire, std::uint64_t& value, std::string_view& bytes) {
    std::uint64_t key = 0;
    if (at >= s.size() || !varint(key)) return false;
    field = static_cast<int>(key >> 3);
    wire = static_cast<int>(key & 7);
    switch (wire) {
      case 0:
        return varint(value);
      case 1:
        if (s.size() - at < 8) return false;
        at += 8;
        return true;
      case 5:
        if (s.size() - at < 4) return false;
        at += 4;
        return true;
      case 2: {
        std::uint64_t n = 0;
        if (!varint(n) || n > s.size() - at) return false;
        bytes = s.substr(at, n);
        at += n;
        return true;
      }
      default:
        return false;
    }
  }
};

/// Step and first summary tag of an Event payload (tag empty: not a summary).
std::pair<std::string, std::int64_t> event_tag_step(std::string_view payload) {
  ProtoReader r{payload};
  std::string tag;
  std::int64_t step = 0;
  int field = 0, wire = 0;
  std::uint64_t value = 0;
  std::string_view bytes;
  while (r.next(field, wire, value, bytes)) {
    if (field == 2 && wire == 0) step = static_cast<std::int64_t>(value);
    if (field == 5 && wire == 2 && tag.empty()) {  // Event.summary -> Summary.value -> Value.tag
      ProtoReader sr{bytes};
      int f2 = 0, w2 = 0;
      std::string_view v;
      while (tag.empty() && sr.next(f2, w2, value, v))
        if (f2 == 1 && w2 == 2) {
          ProtoReader vr{v};
          int f3 = 0, w3 = 0;
          std::string_view t;
          while (vr.next(f3, w3, value, t))
            if (f3 == 1 && w3 == 2) {
              tag = std::string(t);
              break;
            }
        }
    }
  }
  return {tag, step};
}

bool keep_record(const std::string& tag, std::int64_t step, const models::TrainState& at) {
  if (tag.empty()) return true;  // file_version and other non-scalar events
  if (tag.rfind("epoch/", 0) == 0 || tag.rfind("val/", 0) == 0) return step < at.epoch;
  return step <= at.step;  // train/*, memory/*: per optimizer step
}

bool keep_metrics_line(const std::string& line, const models::TrainState& at) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;  // torn by the crash
  const std::string type = j.value("type", "");
  if (type == "step") return j.value("step", std::int64_t{0}) <= at.step;
  if (type == "epoch" || type == "validation" || type == "early_stop")
    return j.value("epoch", std::int64_t{0}) < at.epoch;
  if (type == "data_event") return j.value("epoch", std::int64_t{-1}) < at.epoch;
  return true;  // checkpoints written, cases skipped: facts of the earlier run
}

std::string read_all(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

void trim_for_resume(const fs::path& run_dir, const models::TrainState& at) {
  auto dropped = trim_run_outputs(run_dir, at);
  if (!dropped.is_ok())
    log::warn("resume: cannot drop the interrupted run's records past the checkpoint: " +
              dropped.status().message());
  else if (*dropped > 0)
    log::info("resume: dropped " + std::to_string(*dropped) +
              " metric records written after the checkpoint (epoch " + std::to_string(at.epoch) + ", step " +
              std::to_string(at.step) + ")");
}

void TensorBoardWriter::write_record(const std::string& payload) {
  const std::string rec = frame_record(payload);
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
}

std::vector<std::pair<std::string, std::int64_t>> read_scalar_steps(const fs::path& event_file) {
  const std::string data = read_all(event_file);
  bool complete = true;
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (std::string_view p : split_records(data, complete)) {
    auto ts = event_tag_step(p);
    if (!ts.first.empty()) out.push_back(std::move(ts));
  }
  return out;
}

Result<std::int64_t> trim_run_outputs(const fs::path& run_dir, const models::TrainState& at) {
  std::int64_t dropped = 0;
  std::error_code ec;
  const fs::path metrics = run_dir / "metrics.jsonl";
  if (fs::exists(metrics, ec)) {
    std::istringstream in(read_all(metrics));
    std::string kept;
    std::int64_t n = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      if (keep_metrics_line(line, at))
        kept += line + '\n';
      else
        ++n;
    }
    if (n > 0) SEGFLOW_RETURN_IF_ERROR(write_file_atomically(metrics, kept));
    dropped += n;
  }
  const fs::path tb = run_dir / "tb";
  if (!fs::is_directory(tb, ec)) return dropped;
  for (const auto& entry : fs::directory_iterator(tb, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name.find("tfevents") == std::string::npos ||
        name.find(".tmp") != std::string::npos)
      continue;
    const std::string data = read_all(entry.path());
    bool complete = true;
    const auto records = split_records(data, complete);
    std::string kept;
    std::int64_t n = complete ? 0 : 1;  // a torn tail counts as one dropped record
    for (std::string_view p : records) {
      const auto [tag, step] = event_tag_step(p);
      if (keep_record(tag, step, at))
        kept += frame_record(p);
      else
        ++n;
    }
    if (n > 0) SEGFLOW_RETURN_IF_ERROR(write_file_atomically(entry.path(), kept));
    dropped += n;
  }
  if (ec) return io_error(tb.string() + ": cannot list the event files: " + ec.message());
  return dropped;
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

TensorBoardObserver::TensorBoardObserver(const fs::path& dir, std::int64_t log_every,
                                         std::function<double()> gpu_peak_mb)
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
    if (std::isfinite(i.dice_per_class[k])) {
      w_.scalar("val/dice_class_" + std::to_string(k + 1), i.epoch, i.dice_per_class[k]);
      if (k + 1 < i.class_names.size() && !i.class_names[k + 1].empty())  // val/dice_spleen
        w_.scalar("val/dice_" + models::class_key(i, k), i.epoch, i.dice_per_class[k]);
    }
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

void ProgressPlotObserver::replay(const fs::path& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) continue;
    const std::string type = j.value("type", "");
    const auto epoch = static_cast<double>(j.value("epoch", std::int64_t{0}) + 1);
    auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN; };
    if (type == "epoch") {
      epoch_.push_back(epoch);
      loss_.push_back(num("loss"));
      lr_.push_back(num("lr"));
      seconds_.push_back(num("seconds"));
    } else if (type == "validation" && std::isfinite(num("mean_dice"))) {
      val_epoch_.push_back(epoch);
      val_dice_.push_back(num("mean_dice"));
    }
  }
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

void panel(std::ostringstream& o, double top, const char* title, const std::vector<Series>& series,
           double xmax) {
  const double left = 70, width = 660, height = 170;
  double lo = 1e300, hi = -1e300;
  for (const auto& s : series)
    if (!s.right_axis)
      for (double v : *s.y)
        if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1), lo -= (hi - lo) * 0.5;
  o << "<text x='" << left << "' y='" << top - 8 << "' font-size='14' font-weight='bold'>" << title
    << "</text>\n";
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
  o << "<text x='" << left + width / 2 << "' y='" << top + height + 16
    << "' font-size='11' text-anchor='middle'>epoch (1.." << fmt(xmax) << ")</text>\n";
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
        {{&epoch_, &loss_, "#1f77b4", "train loss", false},
         {&val_epoch_, &val_dice_, "#d62728", "val Dice", true}},
        xmax);
  panel(o, 280, "learning rate", {{&epoch_, &lr_, "#2ca02c", "lr", false}}, xmax);
  panel(o, 520, "epoch time (s)", {{&epoch_, &seconds_, "#9467bd", "seconds", false}}, xmax);
  o << "</svg>\n";
  return o.str();
}

void ProgressPlotObserver::write() const {
  if (Status st = write_file_atomically(file_, render()); !st.is_ok())
    log::warn("progress plot: " + st.message());
}

}  // namespace segflow::actors
