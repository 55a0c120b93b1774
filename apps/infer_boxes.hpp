#pragma once
// `segflow infer --boxes FILE | --boxes-from LABELMAP [--propagate] [--box-margin N]`: the
// box-prompted path of cmd_infer (models/box_inference.hpp).

#include "apps/cli_args.hpp"

namespace segflow::apps {

/// True when the arguments ask for box-prompted inference.
bool wants_box_inference(const Args& a);

/// Runs it on the one scan of --input (one JSON line), or on every case of a folder of scans
/// with prompts from the folder given to --boxes / --boxes-from (one line per case); the exit code.
int infer_with_boxes(const Args& a);

}  // namespace segflow::apps
