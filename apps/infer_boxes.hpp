#pragma once
// `segflow infer --boxes FILE | --boxes-from LABELMAP [--propagate] [--box-margin N]`: the
// box-prompted path of cmd_infer (models/inference/box_inference.hpp).

#include "apps/cli_args.hpp"

namespace segflow::apps {

/// The box prompts' options (--boxes, --boxes-from, --propagate, --box-margin): any of them
/// asks for box-prompted inference.
std::span<const Option> box_prompt_options();

/// The sliding window's options (apps/cmd_infer.cpp), which box-prompted inference refuses.
std::span<const Option> sliding_window_options();

/// True when the arguments ask for box-prompted inference (one of box_prompt_options()).
bool wants_box_inference(const Args& a);

/// Runs it on the one scan of --input (one JSON line), or on every case of a folder of scans
/// with prompts from the folder given to --boxes / --boxes-from (one line per case); the exit code.
int infer_with_boxes(const Args& a);

}  // namespace segflow::apps
