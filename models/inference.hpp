#pragma once
// `segflow infer`: a trained checkpoint applied to a DICOM series or a NIfTI volume; the
// label map comes back in the input's own geometry (NIfTI, or DICOM SEG for DICOM input).

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string>

#include "messages/geometry.hpp"
#include "messages/status.hpp"

namespace segflow::models {

/// Options of one inference run.
struct InferOptions {
  std::filesystem::path checkpoint;  ///< best.pt / last.pt of a run
  std::filesystem::path input;       ///< NIfTI file, DICOM file or folder with one series
  std::filesystem::path output;      ///< out.nii[.gz], out.dcm (DICOM SEG) or a folder
  std::string device = "auto";
};

/// What was written.
struct InferResult {
  std::filesystem::path output;
  Size3 size{0, 0, 0};               ///< of the written label map (= input size)
  std::vector<std::int64_t> labels;  ///< distinct values written
  double seconds = 0.0;
};

/// Runs inference. A folder output gets "<input name>_seg.nii.gz" (NIfTI input) or
/// "seg.dcm" (DICOM input).
Result<InferResult> run_inference(const InferOptions& options);

/// Resamples an integer label map or float maps (C, Z, Y, X) from grid `src` onto the grid
/// `dst` of size `dst_size` through patient coordinates (nearest for integer types, linear
/// otherwise); points outside `src` get 0.
at::Tensor resample_to_grid(const at::Tensor& data, const Geometry& src, const Geometry& dst,
                            const Size3& dst_size);

}  // namespace segflow::models
