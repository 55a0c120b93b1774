#pragma once
// DICOM series reader and writer on DCMTK, and DICOM SEG label maps (dcmseg).

#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// One series found in a folder.
struct DicomSeriesInfo {
  std::string series_uid;                    ///< SeriesInstanceUID
  std::string modality;                      ///< Modality (CT, MR, SEG, ...)
  std::string sop_class_uid;                 ///< SOPClassUID of the first file
  std::vector<std::filesystem::path> files;  ///< files of the series (unordered)
};

/// A file that was skipped, and why (names the file and what is wrong).
struct SkippedFile {
  std::filesystem::path path;
  std::string reason;
};

/// Registers DCMTK's decoders and encoders (RLE, JPEG, JPEG-LS). Idempotent, thread-safe.
void register_dicom_codecs();

/// Groups the DICOM files of a folder (not recursive) by SeriesInstanceUID. Files that are
/// not DICOM or cannot be parsed go to `skipped` when given.
Result<std::vector<DicomSeriesInfo>> scan_dicom_folder(const std::filesystem::path& dir,
                                                       std::vector<SkippedFile>* skipped = nullptr);

/// Reads one image series: slices ordered along the slice normal from
/// ImagePositionPatient/ImageOrientationPatient, RescaleSlope/Intercept applied (float32),
/// spacing from positions, LPS geometry. Multi-frame files are supported (one file).
/// Errors on gaps, mixed orientation, duplicate positions, missing tags, unsupported
/// transfer syntaxes (naming the syntax, e.g. JPEG 2000).
Result<Image> read_dicom_series(const std::vector<std::filesystem::path>& files);

/// Reads a DICOM file or a folder holding exactly one image series (SEG files ignored).
Result<Image> read_dicom(const std::filesystem::path& file_or_dir);

/// Reads a DICOM SEG file as a label map (1, Z, Y, X) uint8 on the grid of `reference`
/// (segment number = label value). Errors when frames do not fit the reference grid.
Result<Image> read_dicom_seg(const std::filesystem::path& seg_file, const Image& reference);

/// Reads a DICOM SEG file on its own grid: orientation and pixel spacing from its
/// functional groups, slices from the first to the last frame position along the normal.
Result<Image> read_dicom_seg(const std::filesystem::path& seg_file);

/// True when the file is a DICOM SEG (SOPClassUID Segmentation Storage).
bool is_dicom_seg_file(const std::filesystem::path& path);

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
/// value > 0, labeled "label_<v>") referencing `series` (as returned by write_dicom_series,
/// whose files it reads for the UIDs), on the geometry of `labels`.
Status write_dicom_seg(const std::filesystem::path& file, const Image& labels, const DicomSeriesInfo& series);

/// True when the file starts with the DICM preamble (or parses as DICOM without meta).
bool looks_like_dicom(const std::filesystem::path& path);

}  // namespace segflow::pipeline
