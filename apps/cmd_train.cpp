// segflow train, segflow stages (segflow infer: apps/cmd_infer.cpp).
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "actors/jobs/job_runner.hpp"
#include "actors/parallel/data_parallel.hpp"
#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/log.hpp"
#include "models/planning/plan.hpp"
#include "models/training/class_names.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/plugin.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::apps {

namespace {

/// The progress bar of `segflow train`: one updating line on a terminal (a line per epoch
/// otherwise), with epoch, step, loss, samples/s and ETA; a line per validation; why
/// train.early_stopping ended the run (summary(), printed with the run folder at the end).
class ProgressObserver : public models::TrainObserver {
 public:
  ProgressObserver(std::int64_t steps_hint, bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {
    (void)steps_hint;
  }
  void on_epoch_start(std::int64_t epoch, std::int64_t total) override {
    epoch_ = epoch;
    total_ = total;
    if (!started_) {
      start_ = std::chrono::steady_clock::now();
      first_epoch_ = epoch;
      started_ = true;
    }
  }
  void on_step(const models::StepInfo& i) override {
    samples_ += i.samples;
    last_steps_ = std::max(last_steps_, i.step_in_epoch);
    if (quiet_ || !tty_) return;
    const double el = elapsed();
    std::fprintf(stderr, "\r\033[Kepoch %lld/%lld step %lld loss %.4f lr %.3g %.1f samples/s ETA %s",
                 static_cast<long long>(i.epoch + 1), static_cast<long long>(total_),
                 static_cast<long long>(i.step_in_epoch), i.loss, i.lr, el > 0 ? samples_ / el : 0.0,
                 clock_text(eta(i.step_in_epoch)).c_str());
    std::fflush(stderr);
  }
  void on_epoch_end(const models::EpochInfo& i) override {
    steps_per_epoch_ = std::max(steps_per_epoch_, i.steps);
    if (quiet_) return;
    std::fprintf(
        stderr,
        "%sepoch %lld/%lld: %lld steps, loss %.4f, %.1f s, %.1f samples/s, data wait %.1f s, ETA %s\n",
        tty_ ? "\r\033[K" : "", static_cast<long long>(i.epoch + 1), static_cast<long long>(total_),
        static_cast<long long>(i.steps), i.loss, i.seconds, i.samples_per_s, i.data_wait_s,
        clock_text(eta(i.steps)).c_str());
  }
  void on_validation(const models::ValidationInfo& v) override {
    if (quiet_) return;
    std::string per;
    for (std::size_t k = 0; k < v.dice_per_class.size(); ++k) {
      char buf[24];
      std::snprintf(buf, sizeof buf, "%.3f", v.dice_per_class[k]);
      if (!per.empty()) per += ' ';
      if (!v.class_names.empty()) per += models::class_key(v, k) + ' ';  // "spleen 0.912"
      per += buf;
    }
    std::fprintf(stderr, "validation epoch %lld: mean Dice %.4f [%s] over %lld cases (%.1f s)%s\n",
                 static_cast<long long>(v.epoch + 1), v.mean_dice, per.c_str(),
                 static_cast<long long>(v.cases), v.seconds, v.best ? " (best)" : "");
  }
  void on_early_stop(const models::EarlyStopInfo& i) override {
    const std::string after = "stopped early after epoch " + std::to_string(i.epoch + 1);
    summary_ = i.earlier ? "nothing to train: the run had " + after : after + " of " + std::to_string(total_);
    summary_ += ": " + models::early_stop_reason(i);
  }
  /// "stopped early after epoch 3 of 10: val/dice_mean did not improve ..."; "" = it did not.
  const std::string& summary() const { return summary_; }
  void on_case_failure(const pipeline::CaseFailure& f) override {
    std::fprintf(stderr, "%sskipped %s: %s\n", tty_ ? "\r\033[K" : "", f.case_id.c_str(), f.reason.c_str());
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  /// Seconds left, from the average time per step so far.
  double eta(std::int64_t step_in_epoch) const {
    const std::int64_t spe = std::max(steps_per_epoch_, last_steps_);
    const double done = static_cast<double>((epoch_ - first_epoch_) * spe + step_in_epoch);
    const double left = static_cast<double>((total_ - epoch_) * spe - step_in_epoch);
    return done > 0 ? elapsed() / done * left : NAN;
  }
  bool quiet_, tty_;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
  std::int64_t epoch_ = 0, total_ = 0, first_epoch_ = 0, steps_per_epoch_ = 0, last_steps_ = 0;
  double samples_ = 0;
  std::string summary_;
};

}  // namespace

namespace {

/// The configs `segflow train` runs: one, or one per --fold (K, or "all" for 0..folds-1),
/// each read with data.fold=K after the --set overrides; all read and checked before any runs.
Result<std::vector<models::JobConfig>> train_configs(const Args& a, const std::string& file) {
  std::vector<std::string> sets = a.all("set");
  SEGFLOW_ASSIGN_OR_RETURN(models::JobConfig base, models::load_job_config(file, sets));
  if (!a.has("fold")) return std::vector<models::JobConfig>{std::move(base)};
  std::vector<std::int64_t> folds;
  for (const std::string& v : a.all("fold")) {
    if (v == "all") {
      for (std::int64_t k = 0; k < base.data.folds; ++k) folds.push_back(k);
      continue;
    }
    auto k = parse_int("--fold", v);
    if (!k.is_ok())
      return invalid_argument("--fold: expected a fold number 0.." + std::to_string(base.data.folds - 1) +
                              " or all, got '" + v + "'");
    folds.push_back(*k);
  }
  if (folds.size() > 1 && a.has("resume"))
    return invalid_argument("--resume names one checkpoint: train one --fold with it, or use --resume-last");
  if (folds.size() > 1 && a.has("run-dir"))
    return invalid_argument("--run-dir names one folder: train one --fold with it");
  std::vector<models::JobConfig> out;
  for (std::int64_t k : folds) {
    std::vector<std::string> with_fold = sets;
    with_fold.push_back("data.fold=" + std::to_string(k));
    SEGFLOW_ASSIGN_OR_RETURN(models::JobConfig c, models::load_job_config(file, with_fold));
    out.push_back(std::move(c));
  }
  return out;
}

int train_one(const Args& a, Result<models::JobConfig> cfg);

/// `segflow train DATASET`: the YAML of the plan of --configuration (default 3d_fullres) in
/// --plans DIR (default DATASET/.segflow-plans), planned first unless current.
Result<std::string> planned_config(const Args& a, const std::filesystem::path& dataset) {
  SEGFLOW_ASSIGN_OR_RETURN(const auto kind,
                           models::planning::parse_configuration(a.get("configuration", "3d_fullres")));
  SEGFLOW_ASSIGN_OR_RETURN(auto options, plan_options_from_args(a));
  const std::filesystem::path out =
      a.has("plans") ? std::filesystem::path(a.get("plans")) : dataset / ".segflow-plans";
  SEGFLOW_ASSIGN_OR_RETURN(const auto yaml, ensure_plan(dataset, out, kind, options));
  return yaml.string();
}

/// The run folder `segflow train` is about to use: --run-dir, else the config's.
std::filesystem::path run_folder(const Args& a, const models::JobConfig& cfg) {
  return a.has("run-dir") ? std::filesystem::path(a.get("run-dir"))
                          : std::filesystem::path(cfg.runs_dir) / models::run_name(cfg);
}

constexpr Option kTrainOptions[] = {
    {"set", "key=value",
     "override a config key (repeatable; dotted paths and list indices, the value read as YAML)"},
    {"resume", "PATH", "continue from a checkpoint (one fold)"},
    {"resume-last", "", "continue from the run folder's last.pt when there is one"},
    {"run-dir", "DIR", "write the run here instead of the deterministic folder under runs/ (one fold)"},
    {"plugins", "DIR", "load stage plugins from DIR first"},
    {"ranks", "N", "N data-parallel ranks in this process (CPU ranks over Gloo, or one per --devices entry)"},
    {"devices", "cuda:0,cuda:1",
     "one rank per listed device; --ranks must match their count; default the config's train.devices"},
    {"fold", "K|all",
     "train cross-validation fold K of data.folds (repeatable), or every fold, one run each"},
    {"quiet", "", "no progress lines"},
};
/// The options of `segflow train DATASET` (with planner_options()); refused with a CONFIG.
constexpr Option kTrainDatasetOptions[] = {
    {"configuration", "2d|3d_fullres|3d_lowres", "the planned configuration to train; default 3d_fullres"},
    {"plans", "DIR",
     "the plan folder to reuse when its fingerprint matches, else to plan into; default "
     "DATASET/.segflow-plans"},
};
constexpr Option kStagesOptions[] = {
    {"plugins", "DIR", "load stage plugins from DIR first"},
    {"json", "", "the stages as JSON"},
};

/// The option of a DATASET that `a` gives, or null.
const Option* dataset_option_given(const Args& a) {
  for (std::span<const Option> group : {std::span<const Option>(kTrainDatasetOptions), planner_options()})
    for (const Option& o : group)
      if (a.given(o.name)) return &o;
  return nullptr;
}

}  // namespace

const Command& train_command() {
  static const Command c{
      "train",
      cmd_train,
      {{"",
        "train CONFIG [--set key=value ...] [--resume PATH | --resume-last] [--run-dir DIR] [--plugins DIR] "
        "[--ranks N | --devices cuda:0,cuda:1] [--fold K ... | --fold all] [--quiet]\n"
        "train DATASET [--configuration 3d_fullres] [--plans DIR] [planner options] [train options]",
        "train in the foreground; writes a run folder under runs/",
        "Prints `run folder: PATH` at the end (docs/how-to/train-and-infer.md). With WORLD_SIZE or "
        "SLURM_NTASKS above 1 in the environment it is one rank of a multi-process job "
        "(docs/how-to/data-parallel.md).",
        {{"CONFIG", "a job config (docs/reference/job-config.md)"},
         {"DATASET",
          "a dataset folder instead: planned first (or the plan in --plans reused when its fingerprint "
          "matches), then --configuration trained; the run folder gets the plan under plan/"}},
        {{"", kTrainOptions},
         {"with a DATASET", kTrainDatasetOptions},
         {"planner (with a DATASET; as segflow plan)", planner_options()}}}}};
  return c;
}

const Command& stages_command() {
  static const Command c{"stages",
                         cmd_stages,
                         {{"",
                           "stages [--json] [--plugins DIR]",
                           "every pipeline stage with its options and defaults",
                           "Options with their types, ranges, units and defaults (docs/reference/stages.md).",
                           {},
                           {{"", kStagesOptions}}}}};
  return c;
}

int cmd_train(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, train_command().forms.front());
  if (!a.is_ok()) return fail("train", a.status());
  if (a->positional.size() != 1)
    return fail("train", invalid_argument("expected one CONFIG file or DATASET folder, got " +
                                          std::to_string(a->positional.size())));
  std::string file = a->positional[0];
  const bool dataset = std::filesystem::is_directory(file);
  if (const Option* o = dataset_option_given(*a); !dataset && o != nullptr)
    return fail("train", invalid_argument("--" + std::string(o->name) +
                                          ": only with a DATASET folder, got the config " + file));
  if (dataset) {
    auto yaml = planned_config(*a, file);
    if (!yaml.is_ok()) return fail("train", yaml.status());
    file = *yaml;
  }
  auto cfgs = train_configs(*a, file);
  if (!cfgs.is_ok()) return fail("train", cfgs.status());
  for (std::size_t i = 0; i < cfgs->size(); ++i) {
    if (cfgs->size() > 1)
      std::fprintf(stderr, "fold %lld (%zu of %zu)\n", static_cast<long long>((*cfgs)[i].data.fold), i + 1,
                   cfgs->size());
    if (dataset)
      if (Status st = models::planning::copy_plan_into_run(file, run_folder(*a, (*cfgs)[i])); !st.is_ok())
        return fail("train", st);
    if (const int rc = train_one(*a, std::move((*cfgs)[i])); rc != 0) return rc;
  }
  return 0;
}

namespace {

int train_one(const Args& args, Result<models::JobConfig> cfg) {
  const Args* a = &args;
  actors::RunOptions ro;
  if (a->has("resume")) ro.resume = a->get("resume");
  if (a->has("run-dir")) ro.run_dir = a->get("run-dir");
  ro.resume_last = a->flag("resume-last");
  ro.plugin_dir = a->get("plugins");
  ProgressObserver progress(0, a->flag("quiet"));
  // Data parallel: --ranks N / --devices a,b in this process, or one rank of a job that a
  // launcher (torchrun, srun, a PyTorchJob) started (`launched` below).
  actors::DataParallelOptions dp;
  if (a->has("devices")) {
    std::string list = a->get("devices");
    for (std::size_t p = 0; p <= list.size();) {
      const std::size_t q = std::min(list.find(',', p), list.size());
      if (q > p) dp.devices.push_back(list.substr(p, q - p));
      p = q + 1;
    }
    dp.world_size = static_cast<std::int64_t>(dp.devices.size());
  }
  if (a->has("ranks")) {
    auto n = parse_int("--ranks", a->get("ranks"));
    if (!n.is_ok()) return fail("train", n.status());
    if (*n < 1)
      return fail("train", invalid_argument("--ranks: expected an integer >= 1, got " + a->get("ranks")));
    if (!dp.devices.empty() && *n != dp.world_size)
      return fail("train", invalid_argument("--ranks " + a->get("ranks") + " does not match the " +
                                            std::to_string(dp.devices.size()) + " --devices given"));
    dp.world_size = *n;
  }
  // The config's train.devices, when the command line names none.
  if (!a->has("ranks") && !a->has("devices") && cfg->train.devices.size() == 1)
    cfg->train.device = cfg->train.devices[0];
  const bool config_parallel = !a->has("ranks") && !a->has("devices") && cfg->train.devices.size() > 1;
  if (config_parallel) {
    dp.devices = cfg->train.devices;
    dp.world_size = static_cast<std::int64_t>(dp.devices.size());
  }
  // The whole config (stages, model, loss, optimizer), built without data, before any data
  // or run folder is made.
  {
    pipeline::StageRegistry registry = pipeline::builtin_registry();
    if (!ro.plugin_dir.empty()) {
      auto p = pipeline::load_plugins(ro.plugin_dir, registry);
      if (!p.is_ok()) return fail("train", p.status());
    }
    if (Status st = models::validate_job_config(*cfg, registry); !st.is_ok()) return fail("train", st);
  }
  auto env_world = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atoll(v) : 0LL;
  };
  Result<std::filesystem::path> run = std::filesystem::path();
  // A launcher's environment: WORLD_SIZE above 1, or WORLD_SIZE with MASTER_ADDR (torchrun
  // --nproc-per-node 1 still makes a process group of one rank: NCCL or Gloo really runs), or
  // SLURM_NTASKS above 1 (a one-task SLURM job trains as one process).
  const bool launched = env_world("WORLD_SIZE") > 1 || env_world("SLURM_NTASKS") > 1 ||
                        (env_world("WORLD_SIZE") == 1 && std::getenv("MASTER_ADDR") != nullptr);
  if (launched)
    run = actors::run_distributed_from_env(*cfg, ro, progress, dp);
  else if (a->has("ranks") || a->has("devices") || config_parallel)
    run = actors::run_data_parallel(*cfg, ro, progress, dp);
  else
    run = actors::run_training(*cfg, ro, progress);
  if (!run.is_ok()) return fail("train", run.status());
  if (!run->empty()) std::printf("run folder: %s\n", run->string().c_str());
  if (!progress.summary().empty()) std::printf("%s\n", progress.summary().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int cmd_stages(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, stages_command().forms.front());
  if (!a.is_ok()) return fail("stages", a.status());
  pipeline::StageRegistry registry = pipeline::builtin_registry();
  if (a->has("plugins")) {
    auto p = pipeline::load_plugins(a->get("plugins"), registry);
    if (!p.is_ok()) return fail("stages", p.status());
  }
  if (a->flag("json"))
    std::cout << pipeline::describe_stages(registry).dump(2) << '\n';
  else
    std::cout << pipeline::format_stages(registry);
  return 0;
}

}  // namespace segflow::apps
