#include "models/training/early_stopping.hpp"

#include <cmath>
#include <cstdio>

namespace segflow::models {

using nlohmann::json;

namespace {
json es_number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
}  // namespace

void early_stop_align(EarlyStopState& s, const EarlyStoppingSettings& o) {
  if (s.metric == o.metric && s.mode == o.mode) return;
  s = EarlyStopState{};
  s.metric = o.metric;
  s.mode = o.mode;
}

bool early_stop_update(EarlyStopState& s, const EarlyStoppingSettings& o, double value, std::int64_t epoch) {
  early_stop_align(s, o);
  bool better = false;
  if (std::isfinite(value)) {
    if (!std::isfinite(s.best))
      better = true;
    else
      better = o.mode == "min" ? value < s.best - o.min_delta : value > s.best + o.min_delta;
  }
  if (better) {
    s.best = value;
    s.best_epoch = epoch;
    s.bad_validations = 0;
  } else {
    ++s.bad_validations;
  }
  return better;
}

bool early_stop_reached(const EarlyStopState& s, const EarlyStoppingSettings& o) {
  return s.metric == o.metric && s.mode == o.mode && s.bad_validations >= o.patience;
}

EarlyStopInfo early_stop_info(const EarlyStopState& s, const EarlyStoppingSettings& o, std::int64_t epoch,
                              double value) {
  EarlyStopInfo i;
  i.epoch = epoch;
  i.metric = o.metric;
  i.mode = o.mode;
  i.value = value;
  i.best = s.best;
  i.best_epoch = s.best_epoch;
  i.patience = o.patience;
  i.min_delta = o.min_delta;
  i.validations_without_improvement = s.bad_validations;
  return i;
}

std::string early_stop_reason(const EarlyStopInfo& i) {
  char best[64];
  if (std::isfinite(i.best))
    std::snprintf(best, sizeof best, "best %.4f at epoch %lld", i.best,
                  static_cast<long long>(i.best_epoch + 1));
  else
    std::snprintf(best, sizeof best, "no finite value");
  char delta[32];
  std::snprintf(delta, sizeof delta, "%g", i.min_delta);
  return i.metric + " did not improve by more than " + delta + " for " +
         std::to_string(i.validations_without_improvement) + " validations (" + best + ", patience " +
         std::to_string(i.patience) + ")";
}

json early_stop_state_json(const EarlyStopState& s) {
  return {{"metric", s.metric},
          {"mode", s.mode},
          {"best", es_number_or_null(s.best)},
          {"best_epoch", s.best_epoch},
          {"validations_without_improvement", s.bad_validations}};
}

EarlyStopState early_stop_state_from_json(const json& j) {
  EarlyStopState s;
  if (!j.is_object()) return s;
  s.metric = j.value("metric", std::string());
  s.mode = j.value("mode", std::string());
  if (const auto it = j.find("best"); it != j.end() && it->is_number()) s.best = it->get<double>();
  s.best_epoch = j.value("best_epoch", std::int64_t{-1});
  s.bad_validations = j.value("validations_without_improvement", std::int64_t{0});
  return s;
}

json early_stop_info_json(const EarlyStopInfo& i) {
  return {{"epoch", i.epoch},
          {"metric", i.metric},
          {"mode", i.mode},
          {"value", es_number_or_null(i.value)},
          {"best", es_number_or_null(i.best)},
          {"best_epoch", i.best_epoch},
          {"patience", i.patience},
          {"min_delta", i.min_delta},
          {"validations_without_improvement", i.validations_without_improvement},
          {"reason", early_stop_reason(i)}};
}

}  // namespace segflow::models
