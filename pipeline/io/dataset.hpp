#pragma once
// Dataset layouts: the MSD / nnU-Net layout (dataset.json, imagesTr/, labelsTr/, _0000
// channel suffix; NIfTI, NRRD or MetaImage files, nnU-Net's `file_ending`), a folder of DICOM
// case folders (a series plus a DICOM SEG or a NIfTI/NRRD/MetaImage label beside it), and
// MedSAM's npy layout (imgs/ and gts/ with the same file names).

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
  std::vector<std::string> label_names;  ///< index = label value, from dataset.json when given
  /// nnU-Net v2 dataset.json `file_ending` (".nii.gz", ".nrrd", ".mha", ...): images and labels
  /// of the MSD layout must end with it. Empty: any of .nii.gz, .nii, .nrrd, .nhdr, .mha, .mhd.
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
/// the image grid (size and geometry within 1e-3 mm): otherwise a clear error.
Result<LoadedCase> load_case(const CaseEntry& entry);

}  // namespace segflow::pipeline
