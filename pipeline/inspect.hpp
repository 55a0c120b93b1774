#pragma once
// `segflow inspect`: the geometry and value summary of a file, a folder or a case.

#include <nlohmann/json_fwd.hpp>

#include <filesystem>

#include "messages/status.hpp"

namespace segflow::pipeline {

/// The contract of DESIGN.md: size, spacing, origin, direction (9, row-major), dtype, min,
/// max, mean, and labels (sorted distinct values) when PATH is or has a label map. For a
/// case folder with an image and a label, image statistics plus the label's values.
Result<nlohmann::json> inspect_path(const std::filesystem::path& path);

}  // namespace segflow::pipeline
