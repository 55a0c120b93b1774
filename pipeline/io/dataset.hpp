#pragma once
// Dataset layouts: the MSD / nnU-Net layout (dataset.json, imagesTr/, labelsTr/, _0000
// channel suffix; NIfTI, NRRD or MetaImage files, nnU-Net's `file_ending`), a folder of DICOM
// case folders (a series plus a DICOM SEG or a NIfTI/NRRD/MetaImage label beside it; a folder
// with several series or localizers is the volume read_dicom reads, the largest consistent
// stack, and the other stacks are listed as skipped), and MedSAM's npy layout (imgs/ and
// gts/ with the same file names).

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

enum class DatasetLayout { msd, dicom, medsam_npy };
const char* to_string(DatasetLayout l);

/// One case as indexed: where its image channels and its label are.
struct CaseEntry {
  std::string id;                              ///< case id ("case_000")
  std::vector<std::filesystem::path> images;   ///< one path per channel (file or folder)
  std::optional<std::filesystem::path> label;  ///< label file, when there is one
};

/// What a scan found: the cases, and what it skipped with the reason.
struct DatasetIndex {
  std::filesystem::path root;
  DatasetLayout layout = DatasetLayout::msd;
  std::vector<CaseEntry> cases;
  std::vector<SkippedFile> skipped;
  /// Index = label value: from dataset.json's `labels` when given; else, for DICOM case
  /// folders, the segment labels of the first case whose label is a DICOM SEG
  /// (segment_class_names), unless a case before it has a NIfTI/NRRD/MetaImage label. Empty
  /// when neither names anything.
  std::vector<std::string> label_names;
  /// nnU-Net v2 dataset.json `file_ending` (".nii.gz", ".nrrd", ".mha", ...): images and labels
  /// of the MSD layout must end with it. Empty: any ending of a format with geometry in the
  /// format table (image_formats.cpp): .nii.gz, .nii, .nrrd, .nhdr, .mha, .mhd.
  std::string file_ending;
};

/// Scan options.
struct ScanOptions {
  /// Read each case's headers (geometry) and reject cases whose image and label grids differ
  /// or whose files are unreadable. Costs one header read per file.
  bool validate = true;
};

/// Label names from a dataset.json `labels` object: MSD {"0": "background", "1": "spleen"} or
/// nnU-Net v2 {"background": 0, "spleen": 1}; index = label value, "" where a value has no
/// name (nnU-Net region lists are skipped). Empty when nothing usable.
std::vector<std::string> label_names_from_json(const nlohmann::json& labels);

/// The label names scan_dataset gives `root` (DatasetIndex::label_names) without indexing
/// it: dataset.json's `labels`; else, in a folder of DICOM case folders, the segment labels of
/// the first case folder (by name) that holds a DICOM SEG (the search ends at a case folder
/// whose label is a NIfTI/NRRD/MetaImage file). Empty when nothing names a label.
std::vector<std::string> dataset_label_names(const std::filesystem::path& root);

/// One case of files grouped by their channel suffix.
struct ChannelCase {
  std::string id;                               ///< the stem without "_NNNN"
  std::vector<std::filesystem::path> channels;  ///< channel 0, 1, ... in order
};

/// True when `stem` ends in nnU-Net's 4-digit channel suffix ("case_0000").
bool has_channel_suffix(const std::string& stem);

/// Files grouped into cases by nnU-Net's channel suffix, the one rule of the MSD layout and of
/// `segflow infer` on a folder: a stem "<case>_<NNNN>" is channel NNNN of case <case>, a stem
/// without the suffix a one-channel case of its own. `files` are (stem, path) pairs; the cases
/// come back sorted by id. A case whose channels have a gap is left out and listed in
/// `skipped`: its first file, "case X: channel _0001 is missing (channels must be _0000,
/// _0001, ...)".
std::vector<ChannelCase> group_channels(
    const std::vector<std::pair<std::string, std::filesystem::path>>& files,
    std::vector<SkippedFile>& skipped);

/// Detects the layout and indexes the cases of `root`. Bad cases are skipped and listed in
/// `skipped`; only an unreadable root or an unknown layout is an error.
Result<DatasetIndex> scan_dataset(const std::filesystem::path& root, const ScanOptions& opts = {});

/// A loaded case: image (C, Z, Y, X) float32 and label (1, Z, Y, X) on the same grid.
struct LoadedCase {
  std::string id;
  Image image;
  std::optional<Image> label;
};

/// Loads a case; channels are stacked (they must share one grid) and the label must share
/// the image grid (size and geometry within 1e-3 mm): otherwise a clear error. A label on
/// the image's lattice with flipped or permuted axes (the same voxel centres in patient
/// space, e.g. a row axis stored bottom-up) is reindexed onto the image grid first.
Result<LoadedCase> load_case(const CaseEntry& entry);

}  // namespace segflow::pipeline
