#pragma once
// Which files are cases and what the cases are called, for scan_dataset, `segflow eval` and
// `segflow infer`: case ids from file names (the endings come from the format table,
// image_formats.hpp), DICOM case folders, and the files beside scans that are no case.

#include <filesystem>
#include <string>

namespace segflow::pipeline {

/// A name starting with '.' (also macOS "._x.nii.gz" resource forks in MSD tarballs).
bool is_hidden(const std::filesystem::path& p);

/// The file name without the ending that names its format: "case_001_0000.nii.gz" ->
/// "case_001_0000"; other names lose their last extension (std::filesystem::path::stem).
std::string image_stem(const std::filesystem::path& path);

/// Case id of an image or label file: the name without the ending of its format or a case
/// suffix (".nii.gz", ".nrrd", ".seg.nrrd", ".dcm", ".seg.dcm", ...; image_formats.cpp); other
/// names are kept whole. A folder's id is its name.
std::string case_id_of(const std::filesystem::path& path);

/// `id` without a trailing nnU-Net channel suffix "_0000".
std::string strip_channel_zero(const std::string& id);

/// Files next to scans and label maps that are no case: reports and configs (.json, .csv,
/// .txt, .md, .yaml, .yml, .log, .svg, .pkl, .npz) and the probabilities `segflow infer
/// --save-probabilities` writes ("<id>_probabilities.nii.gz").
bool is_side_file(const std::filesystem::path& p);

/// The data file of a detached header (.nhdr -> x.raw / x.raw.gz, .mhd -> x.raw / x.zraw;
/// the table's data_extensions): read through its header, not a case of its own.
bool is_detached_data(const std::filesystem::path& p);

/// A folder that holds one case: a DICOM image series (possibly with a SEG or a NIfTI label
/// beside it). Reads the headers of the folder's files until it finds an image.
bool is_dicom_case_folder(const std::filesystem::path& dir);

}  // namespace segflow::pipeline
