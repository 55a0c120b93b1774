#pragma once
// How `segflow eval` and `segflow infer` name and find cases in folders: case ids from file
// names, DICOM case folders, files beside label maps that are not cases.

#include <filesystem>
#include <string>

namespace segflow::models::detail {

/// A name starting with '.' (also macOS "._x" resource forks).
bool is_hidden(const std::filesystem::path& p);

/// Case id of an image or label file: the name without .nii.gz, .nii, .npy, .nrrd, .nhdr,
/// .mha, .mhd, .dcm, .seg.nrrd or .seg.dcm. A folder's id is its name.
std::string case_id_of(const std::filesystem::path& path);

/// `id` without a trailing nnU-Net channel suffix "_0000".
std::string strip_channel_zero(const std::string& id);

/// Files next to scans and label maps that are no case: reports and configs (.json, .csv,
/// .txt, .md, .yaml, .yml, .log, .svg, .pkl, .npz) and the probabilities `segflow infer
/// --save-probabilities` writes ("<id>_probabilities.nii.gz").
bool is_side_file(const std::filesystem::path& p);

/// A folder that holds one case: a DICOM image series (possibly with a SEG or a NIfTI label
/// beside it). Reads the headers of the folder's files until it finds an image.
bool is_dicom_case_folder(const std::filesystem::path& dir);

}  // namespace segflow::models::detail
