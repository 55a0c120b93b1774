#pragma once
// segflowd's configuration (configs/daemon.yaml): where the data and the state live, the
// devices jobs run on, the control and event endpoints and their security. Every key is
// optional; the defaults give a daemon on ipc sockets in ./state watching ./data.
//
//   data_root: data                # watched; each top-level folder is a dataset
//   state_dir: state               # state.db (SQLite, WAL), runs/, control.sock, events.sock
//   plugin_dir: plugins            # stage plugins (*.so); a missing folder means none
//   devices: [auto]                # one running job per device; auto = cuda:0 or cpu
//   control: ipc://state/control.sock   # REP; or tcp://127.0.0.1:PORT
//   events: ipc://state/events.sock     # PUB
//   max_request_bytes: 1048576
//   rescan_interval_s: 10          # periodic full rescan (inotify fallback)
//   settle_s: 1                    # a file whose size stays put this long is complete
//   log_level: info
//   malloc_arena_max: 2            # glibc malloc arenas; 0 = glibc's default (8 per core)
//   curve: {server_secret_key_file, server_public_key_file, authorized_clients_dir}
//   dicom: {port, ae_title, dataset, allowed_calling_aes, ...}   # daemon/dicom/config.hpp
//   auto_infer:                    # models run on each new case of a dataset (auto_infer.hpp)
//     - {dataset: NAME, checkpoint: PATH | model: PACKAGE_DIR, output: DIR, tta: none|mirror|mirror-all,
//     device: auto,
//        output_format: seg|nifti|both, send_to: DESTINATION, quiet_seconds: 5,
//        prompts: boxes|label_map, boxes_dir: DIR, propagate: false, box_margin: 3}  # sam only
//   auto_train:                    # datasets planned and trained when they appear (auto_train.hpp)
//     - {dataset: NAME|PATH|"*", configuration: 3d_fullres, folds: [0] | all, set: {key: value},
//        memory_gb: 8, memory_model: measured, preset: default, device: auto}
//
// Relative paths are relative to the daemon's working folder; finalize_daemon_config makes
// them absolute. A tcp endpoint on a non-loopback address is refused without CURVE keys.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon/dicom/config.hpp"
#include "messages/status.hpp"
#include "models/inference/infer_request.hpp"

namespace segflow::pipeline {
class OptionParser;
}

namespace segflow::daemon {

/// ZeroMQ CURVE keys of the server (Z85 text files written by `segflow ctl keygen`).
struct CurveSettings {
  std::filesystem::path server_secret_key_file;  ///< the server's secret key (mode 0600)
  std::filesystem::path server_public_key_file;  ///< optional: checked against the secret key
  std::filesystem::path authorized_clients_dir;  ///< one client public key per file
  /// True when CURVE is configured (a secret key file is named).
  bool enabled() const { return !server_secret_key_file.empty(); }
  /// Reads the `curve` section (pipeline/options.hpp).
  void bind(pipeline::OptionParser& p);
};

/// One `auto_infer` entry: run a checkpoint on every new case of a dataset of data_root.
struct AutoInferRule {
  std::string dataset;               ///< folder name under data_root
  std::filesystem::path checkpoint;  ///< best.pt / last.pt of a run; must exist at start
  /// A model package folder (`segflow package`) instead of `checkpoint`: its members, TTA,
  /// overlap, class names and postprocessing (InferJobSpec::model); must exist at start.
  std::filesystem::path model;
  std::filesystem::path output;  ///< label maps go here; "" = <state_dir>/inferred/<dataset>
  std::string tta = "none";      ///< none | mirror | mirror-all
  std::string device = "auto";   ///< a device of the pool (cpu, cuda:N) or auto
  /// seg | nifti | both; "" = per case: seg (DICOM SEG) for a DICOM series, nifti otherwise.
  std::string output_format;
  /// The DICOM destination the SEGs are queued for: a name of dicom.destinations, or the AE
  /// title of dicom.send_to; "" = none. Checked at start: a name not configured stops the daemon.
  std::string send_to;
  /// send_to resolved by finalize_daemon_config: the dicom.destinations name, or "" for
  /// dicom.send_to (DicomSendRecord::target).
  std::string send_target;
  /// A DICOM series is complete when no instance of it arrived for this long (seconds since
  /// the newest file of the case); the node files instances at the end of their association,
  /// so 0 = complete at the association's end. NIfTI cases are not held back.
  double quiet_seconds = 5.0;
  /// Box-prompted (sam) checkpoints only, required with one: where each case's box prompts
  /// come from. "boxes": the box file <case id>.json or .csv in boxes_dir (the format of
  /// `segflow infer --boxes`); "label_map": the case's label file (`--boxes-from`). "" = none
  /// (a UNet checkpoint or a package). Checked against the checkpoint at start.
  std::string prompts;
  /// prompts: boxes: the folder of the box files; "" = <data_root>/<dataset>/boxes.
  std::filesystem::path boxes_dir;
  bool propagate = false;  ///< one seed box per label, propagated slice by slice (`--propagate`)
  /// propagate: voxels added per side to the previous slice's mask box; -1 = the default of
  /// `--box-margin` (3, models::kDefaultBoxMargin).
  std::int64_t box_margin = -1;
  /// How the model runs on each case: every option of an inference request that is not the
  /// call's own (class_names, amp, overlap, stitch_device, postprocess, channels_last,
  /// save_probabilities, no_postprocess; models/inference/infer_request.hpp), as `segflow infer`.
  models::InferRequest options;
  /// Reads one entry (pipeline/options.hpp): dataset and one of checkpoint or model are required.
  void bind(pipeline::OptionParser& p);
  /// The prompt keys: prompts, boxes_dir, propagate, box_margin (each only where it applies).
  void bind_prompts(pipeline::OptionParser& p);
};

/// One `auto_train` entry: plan a dataset of data_root when it appears (or its files change)
/// and train folds of one configuration, once per dataset signature.
struct AutoTrainRule {
  std::string dataset;                       ///< folder name under data_root, or "*": any other dataset
  std::string configuration = "3d_fullres";  ///< 2d | 3d_fullres | 3d_lowres
  std::vector<std::int64_t> folds = {0};     ///< folds to train, each >= 0 (< the plan's data.folds)
  bool all_folds = false;                    ///< folds: all (every fold of the plan)
  std::vector<std::string> set;              ///< overrides of the training jobs, "key=value"
  double memory_gb = 0;                      ///< the plan's memory target, GB; 0 = the planner's (8)
  std::string memory_model;                  ///< nnunet | measured; "" = the planner's (measured)
  std::string preset;                        ///< default | resenc-m | resenc-l | resenc-xl; "" = default
  std::string device = "auto";               ///< a device of the pool (cpu, cuda:N) or auto
  /// Reads one entry (pipeline/options.hpp): dataset is required; configuration, folds and
  /// the set keys are checked (a job config with the overrides must parse).
  void bind(pipeline::OptionParser& p);
  /// True when this entry names `dataset` (or is "*").
  bool matches(const std::string& dataset) const { return this->dataset == "*" || this->dataset == dataset; }
};

/// The whole daemon configuration.
struct DaemonConfig {
  std::filesystem::path file;                    ///< where it came from ("" = defaults)
  std::filesystem::path data_root = "data";      ///< watched data folder
  std::filesystem::path state_dir = "state";     ///< database, run folders, ipc sockets
  std::filesystem::path plugin_dir = "plugins";  ///< stage plugins; missing = none
  std::vector<std::string> devices = {"auto"};   ///< device pool for jobs with device auto
  std::string control;                           ///< REP endpoint; "" = ipc://<state_dir>/control.sock
  std::string events;                            ///< PUB endpoint; "" = ipc://<state_dir>/events.sock
  std::int64_t max_request_bytes = 1 << 20;      ///< larger requests get an error reply, >= 256
  double rescan_interval_s = 10.0;               ///< full rescan period in seconds, > 0
  double settle_s = 1.0;                         ///< seconds between size-stability checks, > 0
  std::string log_level = "info";                ///< trace|debug|info|warn|error|off
  /// glibc malloc arenas (mallopt M_ARENA_MAX) set before the daemon's threads start; 0 keeps
  /// glibc's default. The MALLOC_ARENA_MAX environment variable, when set, wins.
  std::int64_t malloc_arena_max = 2;
  CurveSettings curve;
  dicom::DicomSettings dicom;             ///< DICOM storage node and result sender; off by default
  std::vector<AutoInferRule> auto_infer;  ///< models run on new cases; at most one per dataset
  std::vector<AutoTrainRule> auto_train;  ///< datasets planned and trained; at most one per dataset

  /// Reads every key but `file` (pipeline/options.hpp): unknown keys and bad values are
  /// errors naming the file and the key.
  void bind(pipeline::OptionParser& p);

 private:
  void bind_auto_train(pipeline::OptionParser& p);
};

/// Reads a daemon config from a YAML file. Unknown keys and bad values are errors naming
/// the file and the key ("daemon.yaml: devices: expected a list of device names").
Result<DaemonConfig> load_daemon_config(const std::filesystem::path& file);
/// The same from YAML text (`file` names it in messages).
Result<DaemonConfig> parse_daemon_config(const std::string& yaml_text, const std::string& file);

/// Makes paths absolute, checks the files of the dicom section (dicom::check_dicom_files:
/// TLS certificates and keys, password and token files), fills the default endpoints and
/// checks them: ipc or tcp only; a
/// tcp endpoint on an address other than loopback needs CURVE keys. Each auto_infer
/// checkpoint must be an existing file; a missing output becomes <state_dir>/inferred/<dataset>;
/// an auto_infer send_to must name a configured destination (a name of dicom.destinations or
/// dicom.send_to.ae_title; resolved into send_target) and
/// its output_format must write a SEG (seg or both, or "" which becomes seg for DICOM input).
/// An auto_infer checkpoint that is box-prompted (sam) needs prompts and one that is not
/// takes none (read from the checkpoint's meta record); boxes_dir defaults to
/// <data_root>/<dataset>/boxes.
/// An auto_train dataset given as a path must be a folder of data_root (it becomes its name).
Status finalize_daemon_config(DaemonConfig& cfg);

/// "ipc://<state_dir>/control.sock" (absolute when state_dir is).
std::string default_control_endpoint(const std::filesystem::path& state_dir);
/// "ipc://<state_dir>/events.sock".
std::string default_events_endpoint(const std::filesystem::path& state_dir);
/// True for ipc endpoints and tcp endpoints on 127.0.0.0/8, localhost or ::1.
bool is_local_endpoint(const std::string& endpoint);
/// Checks the form of an endpoint (ipc://PATH or tcp://HOST:PORT); `what` names it.
Status check_endpoint(const std::string& endpoint, const std::string& what);

}  // namespace segflow::daemon
