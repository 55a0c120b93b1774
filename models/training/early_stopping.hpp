#pragma once
// Early stopping (train.early_stopping), as MONAI's EarlyStopHandler and MONAI Label's
// early_stop_patience: patience counts validations, not epochs. After each validation the
// watched figure improves when it beats the best so far by more than min_delta (mode max:
// value > best + min_delta; min: value < best - min_delta; the first finite value always
// does, NaN never); otherwise one more validation without improvement. When that count
// reaches patience, Trainer::fit stops after the epoch (last.pt written as at a normal end)
// and tells its observers (TrainObserver::on_early_stop).
//
// The state is part of the checkpoint (meta "early_stop"), so a resumed run counts on where
// the interrupted one was. A run that had stopped early stays stopped when resumed with the
// same patience, whatever train.epochs says; a larger patience (or no early_stopping) trains
// on. A checkpoint whose state watched another metric or mode starts counting again.
// Plain functions on host values; not thread-safe (the trainer's thread only).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "models/training/job_config.hpp"

namespace segflow::models {

/// Early stopping's progress, as the checkpoint keeps it.
struct EarlyStopState {
  std::string metric;  ///< what `best` is a value of; "" = nothing watched yet
  std::string mode;    ///< max | min, as when `best` was set
  double best = std::numeric_limits<double>::quiet_NaN();  ///< NaN: no finite value yet
  std::int64_t best_epoch = -1;                            ///< 0-based epoch of `best`; -1 = none
  std::int64_t bad_validations = 0;  ///< validations since the best without an improvement
};

/// Why training stopped early: metrics.jsonl's "early_stop" record, the daemon's event.
struct EarlyStopInfo {
  std::int64_t epoch = 0;  ///< 0-based epoch of the validation that reached the patience
  std::string metric;
  std::string mode;
  double value = 0.0;  ///< the metric at that validation (NaN when not a number)
  double best = 0.0;   ///< best so far (NaN: never a finite value)
  std::int64_t best_epoch = -1;
  std::int64_t patience = 0;
  double min_delta = 0.0;
  std::int64_t validations_without_improvement = 0;
  /// The run had stopped before this attempt (a resume): nothing was trained, and the
  /// metrics.jsonl record is already there from the attempt that stopped.
  bool earlier = false;
};

/// Starts `s` again when it watched another metric or mode than `o` (or nothing yet).
void early_stop_align(EarlyStopState& s, const EarlyStoppingSettings& o);
/// Counts one validation value of the watched metric at `epoch` (0-based); true when it
/// was an improvement (a new best).
bool early_stop_update(EarlyStopState& s, const EarlyStoppingSettings& o, double value, std::int64_t epoch);
/// True when `patience` validations in a row brought no improvement.
bool early_stop_reached(const EarlyStopState& s, const EarlyStoppingSettings& o);
/// The report of a stop at `epoch` with the last `value`.
EarlyStopInfo early_stop_info(const EarlyStopState& s, const EarlyStoppingSettings& o, std::int64_t epoch,
                              double value);
/// One line for people: "val/dice_mean did not improve by more than 0 for 2 validations
/// (best 0.4123 at epoch 3)" (epochs 1-based, as the CLI prints them).
std::string early_stop_reason(const EarlyStopInfo& i);

/// The state as the checkpoint's meta holds it: {metric, mode, best (null: none),
/// best_epoch, validations_without_improvement}.
nlohmann::json early_stop_state_json(const EarlyStopState& s);
/// Back from early_stop_state_json; null or missing fields (older checkpoints) = fresh.
EarlyStopState early_stop_state_from_json(const nlohmann::json& j);
/// {epoch, metric, mode, value, best, best_epoch, patience, min_delta,
/// validations_without_improvement, reason}; NaN as null. The caller adds "type".
nlohmann::json early_stop_info_json(const EarlyStopInfo& i);

}  // namespace segflow::models
