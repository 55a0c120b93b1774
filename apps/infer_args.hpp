#pragma once
// The flags of an inference request (models/inference/infer_request.hpp) on segflow's command
// line: `segflow infer` and `segflow ctl infer` list them from the request's field table and
// read them through its one binding, so both accept, check and describe the same options.

#include <nlohmann/json.hpp>

#include <span>
#include <string_view>

#include "apps/cli_args.hpp"
#include "models/inference/infer_request.hpp"

namespace segflow::apps {

/// The request's flags of one help group ("" the common ones, "sliding window (not with box
/// prompts)", "model package", "box prompts (a sam checkpoint)"), without those in `leave_out`.
std::span<const Option> infer_flags(std::string_view group,
                                    std::initializer_list<std::string_view> leave_out = {});

/// Every request flag given in `a` as the request's JSON fields ("--box-margin 2" ->
/// "box_margin": 2); with `absolute`, paths made absolute (a daemon's working folder is not
/// the client's). A value that is not of the field's kind is an error naming the flag.
Result<nlohmann::json> infer_fields_from_args(const Args& a, bool absolute);

/// The request from the flags, read by the request's binding; errors name the flag and quote
/// the value as typed ("--overlap: expected a number in [0, 1), got '1.0'").
Result<models::InferRequest> infer_request_from_args(const Args& a);

/// The JSON line of one written case: case, output, also_output (when any), size, labels,
/// seconds, probabilities (when saved) and the mirrored axes.
nlohmann::json infer_result_json(const models::InferResult& r);

}  // namespace segflow::apps
