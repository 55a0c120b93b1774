#pragma once
// The subcommands of `segflow`. Each parses its own arguments (argv[2..]) and returns the
// process exit code: 0 ok, 2 bad usage, 1 failure (one line on stderr).

#include <filesystem>
#include <string>

#include "messages/status.hpp"
#include "models/planning/plan.hpp"

namespace segflow::apps {

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

struct Args;
/// The planner options of `segflow plan` / `segflow train DATASET` flags (--device,
/// --memory-gb, --configurations, --memory-model, --max-step-s, --amp, --threads).
Result<models::planning::PlanOptions> plan_options_from_args(const Args& a);
/// models::planning::plan_or_reuse with its notes and a new plan's summary printed ("segflow
/// train: reusing the plan in DIR ..."); the YAML of configuration `kind`.
Result<std::filesystem::path> ensure_plan(const std::filesystem::path& dataset,
                                          const std::filesystem::path& out,
                                          models::planning::ConfigurationKind kind,
                                          models::planning::PlanOptions options);

/// Prints "segflow CMD: message" on stderr; returns 2 for invalid_argument and
/// invalid_config (bad usage: a bad flag, a bad config), else 1.
int fail(const std::string& cmd, const Status& st);

}  // namespace segflow::apps
