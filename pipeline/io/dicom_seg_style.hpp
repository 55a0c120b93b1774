#pragma once
// DICOM SEG segments with names and display colours: write_dicom_seg (pipeline/io/dicom.hpp)
// followed by SegmentLabel and RecommendedDisplayCIELabValue per segment. An overload in a
// file of its own, so the SEG writer itself stays as it is.

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// How one segment (one label value) is named and shown.
struct SegmentStyle {
  std::string label;                  ///< SegmentLabel (LO, at most 64 characters); "" = "label_<v>"
  std::array<std::uint8_t, 3> rgb{};  ///< sRGB display colour
};

/// A distinct display colour for label value `v` >= 1 (a fixed palette of 12, repeating).
std::array<std::uint8_t, 3> default_segment_colour(std::int64_t v);

/// sRGB (0..255) as DICOM-scaled CIELab (each 0..65535; D65), as RecommendedDisplayCIELabValue holds it.
std::array<std::uint16_t, 3> rgb_to_dicom_lab(const std::array<std::uint8_t, 3>& rgb);

/// Writes `labels` as a DICOM SEG like write_dicom_seg, then names, codes and colours segment v
/// from styles[v] (index = label value; index 0 unused): a named segment gets the category and
/// type codes of its name (segment_codes, pipeline/io/segment_codes.hpp). Values past the end of `styles`
/// (and entries with an empty label) keep the name "label_<v>"; past the end they get
/// default_segment_colour(v). Written to a temporary file and renamed.
Status write_dicom_seg(const std::filesystem::path& file, const Image& labels, const DicomSeriesInfo& series,
                       const std::vector<SegmentStyle>& styles);

}  // namespace segflow::pipeline
