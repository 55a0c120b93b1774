#pragma once
// DICOM series reader and writer on DCMTK, and DICOM SEG label maps (dcmseg).

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// One series found in a folder.
struct DicomSeriesInfo {
  std::string series_uid;                    ///< SeriesInstanceUID; empty when the files have none
  std::string identity;                      ///< how it was told apart: "SeriesInstanceUID x", or
                                             ///< "FrameOfReferenceUID x + orientation + geometry ..."
  std::string modality;                      ///< Modality (CT, MR, SEG, ...)
  std::string sop_class_uid;                 ///< SOPClassUID of the first file
  std::vector<std::filesystem::path> files;  ///< files of the series (unordered)
};

/// A file that was skipped, and why (names the file and what is wrong).
struct SkippedFile {
  std::filesystem::path path;
  std::string reason;
};

/// A stack of slices a read did not use, and why.
struct DicomSkippedStack {
  std::string stack;                         ///< series identity, orientation, size (and split tag)
  std::vector<std::filesystem::path> files;  ///< its files, sorted
  std::size_t slices = 0;
  std::string reason;
};

/// What read_dicom decided: the stack it read, how even its slices are, what it skipped.
/// The rules are in docs/reference/readers-and-datasets.md ("DICOM series: tolerance rules").
struct DicomReadReport {
  std::string series;                         ///< SeriesInstanceUID, else the fallback identity
  std::string identity;                       ///< "SeriesInstanceUID", "FrameOfReferenceUID + ..."
  std::size_t slices = 0;                     ///< slices read
  double slice_spacing_mm = 0;                ///< the z spacing used (mean step)
  double slice_spacing_max_deviation_mm = 0;  ///< largest |step - mean step|, mm
  std::string split_tag;                      ///< tag repeats were split by (empty: none)
  double split_value = 0;                     ///< its value in the stack read
  std::vector<std::filesystem::path> files;   ///< the files read, in slice order (each once)
  std::vector<DicomSkippedStack> skipped_stacks;
  std::vector<SkippedFile> skipped_files;  ///< unreadable files, copies of one instance
  std::vector<std::string> warnings;       ///< also logged (warn)
};

/// The report as inspect prints it: dicom_series, dicom_series_identity, slices,
/// slice_spacing_mm, slice_spacing_max_deviation_mm, split_by, skipped_stacks, skipped,
/// warnings.
void to_json(nlohmann::json& j, const DicomReadReport& r);

/// Registers DCMTK's decoders and encoders (RLE, JPEG, JPEG-LS) and segflow's JPEG 2000
/// decoder (OpenJPEG). Idempotent, thread-safe.
void register_dicom_codecs();

/// Groups the DICOM files of a folder (not recursive) by SeriesInstanceUID; files without
/// one by FrameOfReferenceUID, modality, orientation and geometry. Files that are not DICOM
/// or cannot be parsed (and DICOMDIRs) go to `skipped` when given.
Result<std::vector<DicomSeriesInfo>> scan_dicom_folder(const std::filesystem::path& dir,
                                                       std::vector<SkippedFile>* skipped = nullptr);

/// Reads the volume of a set of files: slices are grouped into stacks (series identity,
/// orientation, size, pixel spacing; repeats at one position split by echo, b-value,
/// temporal position or acquisition), the largest stack is read, ordered along the slice
/// normal from ImagePositionPatient/ImageOrientationPatient, RescaleSlope/Intercept applied
/// (float32), spacing the mean step, LPS geometry. Multi-frame files are supported. Errors
/// on gaps, uneven spacing beyond the tolerance, gantry tilt, repeats no tag tells apart,
/// missing tags, unsupported transfer syntaxes (naming the syntax). `report`, when given,
/// says what was read and skipped.
Result<Image> read_dicom_series(const std::vector<std::filesystem::path>& files,
                                DicomReadReport* report = nullptr);

/// Reads a DICOM file or the volume of a folder (all image series of the folder compete as
/// stacks, see read_dicom_series; SEG, RTSTRUCT, SR and other non-image series ignored).
Result<Image> read_dicom(const std::filesystem::path& file_or_dir, DicomReadReport* report = nullptr);

/// What read_dicom would read from a file or folder, and what it would skip, decided from
/// the headers alone (no pixel data decoded): the same rules, the same errors for gaps,
/// uneven spacing, tilt and repeats. Warnings are returned, not logged.
Result<DicomReadReport> probe_dicom(const std::filesystem::path& file_or_dir);

/// The image series read_dicom reads from a file or folder, as write_dicom_seg references it:
/// the files of the stack read (in slice order; localizers and other series left out), its
/// SeriesInstanceUID (empty when the files have none), identity, modality and SOP class.
Result<DicomSeriesInfo> dicom_source_series(const std::filesystem::path& file_or_dir);

/// Reads a DICOM SEG file as a label map (1, Z, Y, X) uint8 on the grid of `reference`
/// (segment number = label value). Errors when frames do not fit the reference grid.
Result<Image> read_dicom_seg(const std::filesystem::path& seg_file, const Image& reference);

/// Reads a DICOM SEG file on its own grid: orientation and pixel spacing from its
/// functional groups, slices from the first to the last frame position along the normal.
Result<Image> read_dicom_seg(const std::filesystem::path& seg_file);

/// True when the file is a DICOM SEG (SOPClassUID Segmentation Storage).
bool is_dicom_seg_file(const std::filesystem::path& path);

/// One segment of a DICOM SEG, as its SegmentSequence item describes it.
struct DicomSegment {
  int number = 0;              ///< SegmentNumber: the label value read_dicom_seg gives its pixels
  std::string label;           ///< SegmentLabel
  std::string description;     ///< SegmentDescription ("" when absent)
  std::string algorithm_type;  ///< SegmentAlgorithmType: AUTOMATIC, SEMIAUTOMATIC or MANUAL
  std::string category;        ///< CodeMeaning of SegmentedPropertyCategoryCodeSequence ("" when absent)
  std::string type;            ///< CodeMeaning of SegmentedPropertyTypeCodeSequence ("" when absent)
};

/// The segments of a DICOM SEG file in file order, from its header (pixel data not read).
/// Errors name the file and the tag: not a SEG, no SegmentSequence, a segment without a
/// SegmentNumber or with one outside 1..65535, a number used twice.
Result<std::vector<DicomSegment>> read_dicom_seg_segments(const std::filesystem::path& seg_file);

/// Class names by label value from segments: index = SegmentNumber, "background" at 0, ""
/// where no segment has that number and for segflow's placeholder "label_<number>" (an
/// unnamed class). Empty when no segment has a name.
std::vector<std::string> segment_class_names(const std::vector<DicomSegment>& segments);

/// Compression for written series.
enum class DicomCompression { none, rle, jpeg_ls, jpeg_lossless };
/// Parses "none|rle|jpeg-ls|jpeg-lossless".
Result<DicomCompression> parse_dicom_compression(const std::string& s);

/// Identity and UIDs of a written series (UIDs generated when empty).
struct DicomWriteOptions {
  DicomCompression compression = DicomCompression::none;
  std::string patient_id = "SEGFLOW";
  std::string patient_name = "Segflow^Phantom";
  std::string study_uid;   ///< generated when empty
  std::string series_uid;  ///< generated when empty
  std::string modality = "CT";
  std::string series_description = "segflow synthetic";
};

/// Writes a single-channel float HU volume as a CT series, one file per slice
/// (IM_0000.dcm, ...), int16/uint16 storage with RescaleSlope 1 and RescaleIntercept chosen
/// so values round-trip exactly for integer HU; all geometry tags set. Returns the series
/// (with UIDs) so a SEG can reference it.
Result<DicomSeriesInfo> write_dicom_series(const std::filesystem::path& dir, const Image& image,
                                           const DicomWriteOptions& options = {});

/// Writes a label map (1, Z, Y, X) integer as a DICOM SEG (binary, one segment per label
/// value > 0, labeled "label_<v>") referencing `series` (as returned by write_dicom_series or
/// dicom_source_series, whose files it reads for the UIDs), on the geometry of `labels`.
/// UIDs the source files leave empty are taken as the reader takes them: SOPClassUID and
/// SOPInstanceUID from the file meta header (MediaStorageSOPClassUID/InstanceUID); a missing
/// StudyInstanceUID or SeriesInstanceUID is derived from the series' FrameOfReferenceUID and
/// SOP instance UIDs ("2.25." + a 128-bit FNV-1a hash), the same for every SEG of that series.
/// A label map without a value > 0 is ErrorCode::no_foreground (a SEG holds >= 1 segment).
Status write_dicom_seg(const std::filesystem::path& file, const Image& labels, const DicomSeriesInfo& series);

/// True when the file starts with the DICM preamble (or parses as DICOM without meta).
bool looks_like_dicom(const std::filesystem::path& path);

}  // namespace segflow::pipeline
