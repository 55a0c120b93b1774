#include "actors/run/tensorboard.hpp"

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

std::string read_all(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

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

Result<std::int64_t> trim_tensorboard(const fs::path& tb, const models::TrainState& at) {
  std::int64_t dropped = 0;
  std::error_code ec;
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

}  // namespace segflow::actors
