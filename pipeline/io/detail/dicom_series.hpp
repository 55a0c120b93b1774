#pragma once
// Private to the DICOM reader: what a file's header says about its frames, and series
// assembly: stacks (slices that can form one volume), the rule that picks the volume of a
// folder, slice ordering and the tolerance rules for spacing and tilt. The rules (also in
// docs/reference/readers-and-datasets.md, "DICOM series: tolerance rules" and "JPEG 2000"):
// - A stack is the slices of one series identity (SeriesInstanceUID; without one,
//   FrameOfReferenceUID, else nothing) with one ImageOrientationPatient (each cosine within
//   kOrientationTolerance), one Rows x Columns, SamplesPerPixel and PixelSpacing (within a
//   relative kPixelSpacingTolerance). A multi-frame file is a stack of its own.
// - Slices of a stack at the same position along the normal (within kSamePositionMm) are
//   split by the first tag of kSplitTags whose values tell every repeat apart; the stack of
//   the lowest value is kept (first echo, lowest b-value, first temporal position, first
//   acquisition), the others are skipped. No such tag: an error naming the tags tried.
// - The volume is the stack with the most slices; ties go to the smaller identity text
//   (series, orientation, size), then to the first file name. The others are skipped with
//   their reason. A folder whose stacks are all single slices (localizers) is refused.
// - Steps between neighbouring slices along the normal may deviate from their median by
//   kStepTolerance (10 %) of it; the slice spacing is then the mean step and the largest
//   deviation from it is reported. A step beyond that is refused: as a gap ("a slice is
//   missing") when longer than 1.5 median steps, as "uneven slice spacing" otherwise.
// - Slice positions must run along the normal: an in-plane drift of more than
//   kTiltDriftPixels pixels between the first and any other slice is refused as gantry tilt,
//   naming the angle (segflow does not resample).

#include <array>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "pipeline/io/detail/dicom_common.hpp"

namespace segflow::pipeline::detail {

inline constexpr double kOrientationTolerance = 1e-3;   ///< per direction cosine
inline constexpr double kPixelSpacingTolerance = 1e-4;  ///< relative
inline constexpr double kSamePositionMm = 0.01;         ///< along the normal
inline constexpr double kStepTolerance = 0.10;          ///< of the median step
inline constexpr double kTiltDriftPixels = 0.5;         ///< in-plane drift, in pixels
inline constexpr double kSpacingWarnRelative = 1e-3;    ///< deviation/mean that gets a warning

/// Tags that tell apart slices repeated at one position, in the order they are tried.
struct SplitTag {
  DcmTagKey tag;
  const char* name;
};
inline const std::array<SplitTag, 7> kSplitTags = {{
    {DCM_EchoNumbers, "EchoNumbers"},
    {DCM_EffectiveEchoTime, "EffectiveEchoTime"},
    {DCM_EchoTime, "EchoTime"},
    {DCM_DiffusionBValue, "DiffusionBValue"},
    {DCM_TemporalPositionIdentifier, "TemporalPositionIdentifier"},
    {DCM_TemporalPositionIndex, "TemporalPositionIndex"},
    {DCM_AcquisitionNumber, "AcquisitionNumber"},
}};

/// Geometry, rescale and split-tag values of one frame, from top-level tags overridden by
/// the shared and then the per-frame functional groups.
struct FrameInfo {
  std::optional<Vec3> position;                        ///< ImagePositionPatient
  std::optional<std::array<double, 6>> orientation;    ///< ImageOrientationPatient
  std::optional<std::array<double, 2>> pixel_spacing;  ///< PixelSpacing: row\column = y\x
  std::optional<double> slice_thickness;
  std::optional<double> spacing_between_slices;
  double slope = 1.0;
  double intercept = 0.0;
  std::array<std::optional<double>, kSplitTags.size()> split;  ///< values of kSplitTags
};

/// What the reader needs from one file's header.
struct Header {
  std::filesystem::path file;
  std::string series_uid;              ///< SeriesInstanceUID (may be empty)
  std::string frame_of_reference_uid;  ///< FrameOfReferenceUID (may be empty)
  std::string sop_instance_uid;        ///< SOPInstanceUID, else the meta header's
  std::string modality, sop_class_uid, photometric;
  std::optional<long> rows, columns;
  long samples = 1;
  long frames = 1;
  long bits_allocated = 16;
  bool has_pixel_data = false;
  std::optional<double> gantry_tilt;  ///< GantryDetectorTilt, degrees
  std::vector<FrameInfo> frame_info;  ///< one per frame
};

/// Parses a loaded file's header (pixel data untouched).
Result<Header> parse_header(const std::filesystem::path& file, DcmFileFormat& ff);

/// "FrameOfReferenceUID x" or "SeriesInstanceUID x": how a series is told apart.
std::string series_identity(const Header& h);

/// True when two headers without SeriesInstanceUID belong to one series: same
/// FrameOfReferenceUID, Modality, Rows x Columns, SamplesPerPixel, orientation and pixel
/// spacing (first frames, within the stack tolerances).
bool same_series_without_uid(const Header& a, const Header& b);

/// One slice of the output: frame `frame` of file `file` (an index into the headers).
struct Slice {
  std::size_t file = 0;
  long frame = 0;
  const FrameInfo* info = nullptr;
};

/// Slices that may form one volume.
struct Stack {
  std::string key;  ///< identity, orientation and size, for ordering and messages
  std::vector<Slice> slices;
  std::string split_tag;   ///< the tag it was split off by (empty when not split)
  double split_value = 0;  ///< its value of split_tag
  std::string problem;     ///< why it cannot be read (repeats no tag tells apart); else empty
};

/// A stack that was not read, and why.
struct StackSkip {
  std::string key;
  std::vector<std::filesystem::path> files;
  std::size_t slices = 0;
  std::string reason;
};

/// The stack chosen for the volume and the others.
struct StackChoice {
  Stack chosen;
  std::vector<StackSkip> skipped;
  std::vector<std::pair<std::filesystem::path, std::string>> duplicate_files;  ///< copies dropped
};

/// Groups the slices of `hs` into stacks, splits repeats and picks the volume by the rules
/// above. Errors when no stack can be chosen.
Result<StackChoice> choose_stack(const std::vector<Header>& hs);

/// How even the slices of an assembled stack are.
struct SpacingStats {
  double mean_step = 0;      ///< mm, the slice spacing used
  double min_step = 0;       ///< mm
  double max_step = 0;       ///< mm
  double max_deviation = 0;  ///< mm, largest |step - mean_step|
};

/// Orders `slices` along the normal and computes the volume geometry (LPS), enforcing the
/// spacing and tilt rules. Fills `stats` for stacks of two or more slices.
Result<Geometry> assemble_geometry(const std::vector<Header>& hs, std::vector<Slice>& slices,
                                   SpacingStats& stats);

/// "file" or "file frame N", for messages.
std::string slice_name(const std::vector<Header>& hs, const Slice& s);

}  // namespace segflow::pipeline::detail
