#pragma once
// The subcommands of `segflow`. Each parses its own arguments (argv[2..]) and returns the
// process exit code: 0 ok, 2 bad usage, 1 failure (one line on stderr). Each has a table
// (`xxx_command()`, apps/cli_args.hpp) with its forms and options: what its parser accepts
// and what `segflow xxx --help` prints; apps/segflow_main.cpp lists the tables.

#include <filesystem>
#include <span>
#include <string>

#include "apps/cli_args.hpp"
#include "messages/status.hpp"
#include "models/planning/plan.hpp"

namespace segflow::apps {

// The commands' tables, in the order `segflow --help` lists them.
const Command& synth_command();        ///< apps/cmd_data.cpp
const Command& inspect_command();      ///< apps/cmd_data.cpp
const Command& stages_command();       ///< apps/cmd_train.cpp
const Command& plan_command();         ///< apps/cmd_plan.cpp
const Command& train_command();        ///< apps/cmd_train.cpp
const Command& ctl_command();          ///< apps/cmd_ctl.cpp
const Command& infer_command();        ///< apps/cmd_infer.cpp
const Command& eval_command();         ///< apps/cmd_eval.cpp
const Command& cv_command();           ///< apps/cmd_cv.cpp
const Command& postprocess_command();  ///< apps/cmd_postprocess.cpp
const Command& package_command();      ///< apps/cmd_package.cpp
const Command& select_command();       ///< apps/cmd_select.cpp
const Command& export_command();       ///< apps/cmd_export.cpp (a form per target)
const Command& import_command();       ///< apps/cmd_import.cpp
const Command& bench_command();        ///< apps/cmd_bench.cpp
const Form& export_onnx_form();        ///< apps/cmd_export_onnx.cpp: `export --to onnx`
const Form& export_nnunet_form();      ///< apps/cmd_export_nnunet.cpp: `export --to nnunet`

int cmd_synth(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_stages(int argc, char** argv);
int cmd_train(int argc, char** argv);
int cmd_infer(int argc, char** argv);
int cmd_bench(int argc, char** argv);   ///< apps/cmd_bench.cpp
int cmd_ctl(int argc, char** argv);     ///< apps/cmd_ctl.cpp: the daemon client
int cmd_cv(int argc, char** argv);      ///< apps/cmd_cv.cpp: pool the folds' out-of-fold scores
int cmd_eval(int argc, char** argv);    ///< apps/cmd_eval.cpp: score predictions against ground truth
int cmd_export(int argc, char** argv);  ///< apps/cmd_export.cpp: a checkpoint out (picks the --to target)
int cmd_export_onnx(int argc, char** argv);    ///< apps/cmd_export_onnx.cpp: `export --to onnx`
int cmd_export_nnunet(int argc, char** argv);  ///< apps/cmd_export_nnunet.cpp: `export --to nnunet`
int cmd_plan(int argc, char** argv);           ///< apps/cmd_plan.cpp: fingerprint and plan a dataset
int cmd_postprocess(int argc, char** argv);    ///< apps/cmd_postprocess.cpp: determine / apply postprocessing
int cmd_package(int argc, char** argv);        ///< apps/cmd_package.cpp: checkpoints into one model folder
int cmd_select(int argc, char** argv);         ///< apps/cmd_select.cpp: choose a configuration on cv evidence
int cmd_import(int argc, char** argv);  ///< apps/cmd_import.cpp: nnU-Net weights in as a segflow checkpoint

/// The planner's options that `segflow plan` and `segflow train DATASET` share (--device,
/// --memory-gb, --memory-model, --max-step-s, --amp, --threads); apps/cmd_plan.cpp.
std::span<const Option> planner_options();
/// The planner options of `segflow plan` / `segflow train DATASET` flags (planner_options(),
/// and plan's --configurations).
Result<models::planning::PlanOptions> plan_options_from_args(const Args& a);
/// models::planning::plan_or_reuse with its notes and a new plan's summary printed ("segflow
/// train: reusing the plan in DIR ..."); the YAML of configuration `kind`.
Result<std::filesystem::path> ensure_plan(const std::filesystem::path& dataset,
                                          const std::filesystem::path& out,
                                          models::planning::ConfigurationKind kind,
                                          models::planning::PlanOptions options);

/// --bootstrap, --confidence and --seed: the intervals of `segflow cv` and `segflow select`
/// (apps/cmd_cv.cpp); bootstrap_from_args reads them into the given fields.
std::span<const Option> bootstrap_options();
Status bootstrap_from_args(const Args& a, std::int64_t& bootstrap, double& confidence, std::uint64_t& seed);

/// Prints "segflow CMD: message" on stderr; returns 2 for invalid_argument and
/// invalid_config (bad usage: a bad flag, a bad config), else 1.
int fail(const std::string& cmd, const Status& st);

}  // namespace segflow::apps
