#include "actors/run/progress_plot.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "messages/file_util.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;
using nlohmann::json;

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
