#pragma once
// One inference request, as every front end states it: `segflow infer`'s flags, `segflow ctl
// infer`'s flags, the control server's `infer` fields, the job spec the daemon stores, and the
// options of an `auto_infer` rule. Its fields are one table (kInferFields in the .cpp: key,
// flag placeholder, help, kind) and one binding (InferRequest::bind, read by an OptionParser
// from a JSON mapping), so an option added there is parsed, checked, stored, listed in each
// command's --help and reachable from the daemon alike (docs/explanation/architecture.md,
// "where to change what").

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "messages/status.hpp"
#include "models/inference/box_inference.hpp"
#include "models/inference/inference.hpp"

namespace segflow::pipeline {
class OptionParser;
}

namespace segflow::models {

/// How a field is written on a command line (the JSON form follows from it).
enum class InferFieldKind {
  text,    ///< --key VALUE; a string
  path,    ///< --key PATH; a string, sent absolute by `segflow ctl`
  paths,   ///< --key PATH, repeatable; a list of strings (a single string is a list of one)
  names,   ///< --key a,b,c; a list of strings
  number,  ///< --key F; a number
  on_off,  ///< --key on|off; a boolean
  flag,    ///< --key; a boolean
};

/// Which requests a field belongs to.
enum class InferFieldScope {
  call,     ///< what one call names: model, input, output, device, TTA, format, prompts
  options,  ///< how a model runs: every request and an auto_infer rule's options
};

/// One field of an inference request.
struct InferField {
  std::string_view key;    ///< its JSON / config key (snake_case); the flag is the key with '-' for '_'
  std::string_view value;  ///< the flag's placeholder ("PATH", "none|mirror"); "" for a flag
  std::string_view help;   ///< what it does and its default
  std::string_view group;  ///< the help group of `segflow infer` ("" the common options)
  InferFieldKind kind;
  InferFieldScope scope = InferFieldScope::options;
};

/// Every field, in reading order.
std::span<const InferField> infer_fields();

/// "box_margin" -> "box-margin".
std::string flag_name(std::string_view key);

/// One inference request: the options of a sliding-window run (a checkpoint, an ensemble or a
/// package) or of a box-prompted one.
struct InferRequest {
  InferOptions options;  ///< checkpoint(s), model, input, output and every sliding-window option
  /// "" = the postprocessing.json beside the first checkpoint, when there is one; "none" = none;
  /// else a postprocessing.json file. A package's own plan is applied unless no_postprocess.
  std::string postprocess;
  /// Box prompts (a box-prompted, sam, checkpoint; one scan per request).
  std::string boxes, boxes_from;
  bool propagate = false;
  std::int64_t box_margin = -1;  ///< < 0: kDefaultBoxMargin

  bool box_prompted() const { return !boxes.empty() || !boxes_from.empty() || propagate || box_margin >= 0; }

  /// Reads every field given in `p`'s mapping (absent ones keep their value) and checks each
  /// one's type and range, and the rules between them (a package sets its checkpoints, TTA and
  /// postprocessing; box prompts take one checkpoint, no TTA, one source). `options_only`:
  /// only the fields of scope options (an auto_infer rule, which names the rest itself).
  void bind(pipeline::OptionParser& p, bool options_only = false);

  /// The rules between fields (bind checks them too): a package sets its checkpoints, TTA and
  /// postprocessing; box prompts take one source, one checkpoint, no TTA and no sliding-window
  /// option. Errors name the field ("model: ...").
  Status check() const;

  /// The fields that differ from a default request, by key (bind reads it back).
  nlohmann::json to_json() const;

  /// The options of a sliding-window run: `options` with the postprocessing resolved.
  InferOptions run_options() const;

  /// The box-prompted run's options.
  BoxInferOptions box_options() const;

  /// The postprocessing plan file to apply ("" none): `postprocess`, or the one beside the
  /// first checkpoint. Not for a package (run_inference applies its own).
  std::filesystem::path postprocess_file() const;
};

/// Reads a request from a JSON mapping (the control server's fields, a stored job spec).
/// Keys in `also` are left for the caller; any other unknown key is an error naming it.
/// Errors read "<where><key>: expected ...".
Result<InferRequest> read_infer_request(const nlohmann::json& fields, const std::string& where,
                                        std::initializer_list<const char*> also = {});

}  // namespace segflow::models
