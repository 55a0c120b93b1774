#pragma once
// The dataset fingerprint (`segflow plan`'s first step, nnU-Net v2's
// DatasetFingerprintExtractor and verify_dataset_integrity in one pass): every case is read
// once, in parallel, through the dataset readers (MSD / nnU-Net NIfTI, NRRD or MetaImage,
// DICOM case folders with a SEG, MedSAM npy), checked, and summarised: size, spacing,
// orientation, the shape after cropping to the non-zero region (nnU-Net's crop_to_nonzero),
// class voxel counts, and per channel the foreground intensities (label > 0) pooled over the
// dataset (percentiles 0.5 / 50 / 99.5, mean, std, min, max).
//
// Sampling rule of the pooled intensities (nnU-Net's, fingerprint_extractor.py): nnU-Net
// draws floor(10e7 / cases) foreground voxels per case, with replacement, and pools them,
// so every case weighs the same whatever its foreground size. segflow computes the quantity
// that sample estimates: each case keeps all its foreground voxels, or a seeded random
// subset of max(10000, floor(2e7 / cases)) of them when it has more, every kept voxel
// weighted 1 / (kept voxels of its case); the statistics are the weighted ones (weighted
// percentiles by linear interpolation between weighted midpoints, std with ddof 0). Min and
// max are over every foreground voxel.
//
// Integrity (each error names the file and the field): label values outside dataset.json's
// `labels`, NaN or infinite voxels, an image whose label is on another grid, a channel count
// that disagrees with `channel_names`, a case without a label: that case is listed in
// `excluded` and left out. Dataset-level errors end the fingerprint: `numTraining` that does
// not match the cases found, no case with a label, no case left.
//
// Thread safety: compute_fingerprint has no global state; it starts its own worker threads
// and may run beside other calls (the daemon plans datasets while jobs train).

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::pipeline {

/// How compute_fingerprint reads and samples.
struct FingerprintOptions {
  int threads = 0;            ///< reader threads, >= 0; 0 = min(hardware threads, cases)
  std::uint64_t seed = 1234;  ///< foreground subsampling seed (nnU-Net's 1234); case i uses (seed, i)
  /// Foreground voxels kept per case (at most): max(min_samples_per_case,
  /// floor(samples_total / cases)); cases with fewer keep all.
  std::int64_t samples_total = 20'000'000;
  std::int64_t min_samples_per_case = 10'000;  ///< >= 1
};

/// Intensity statistics of one channel's foreground voxels.
struct IntensityStats {
  double mean = 0, median = 0, std = 0, min = 0, max = 0;
  double percentile_00_5 = 0, percentile_99_5 = 0;
  std::int64_t voxels = 0;  ///< foreground voxels it describes (all of them, not the kept sample)
};

/// One case as the fingerprint saw it. Sizes, spacing and shapes in (x, y, z) order.
struct CaseFingerprint {
  std::string id;
  std::vector<std::filesystem::path> images;  ///< one per channel (file or folder)
  std::filesystem::path label;
  Size3 size{};                               ///< voxels (x, y, z)
  std::array<double, 3> spacing{};            ///< mm (x, y, z)
  std::array<double, 9> direction{};          ///< row-major, LPS
  std::string orientation;                    ///< axis codes, e.g. "LPS" (where x, y, z point)
  Size3 shape_after_crop{};                   ///< bounding box of the non-zero region (x, y, z)
  double relative_size_after_cropping = 1.0;  ///< voxels after / before cropping
  std::vector<std::int64_t> class_voxels;     ///< index = label value (0..num_classes-1)
  std::vector<IntensityStats> foreground;     ///< per channel, this case's foreground voxels
};

/// A case left out of the fingerprint, and why.
struct ExcludedCase {
  std::string id;
  std::filesystem::path file;  ///< the file at fault
  std::string field;           ///< what is wrong ("label values", "voxels", "channels", ...)
  std::string message;         ///< "<file>: <field>: expected ..., got ..."
};

/// The whole fingerprint. Per-channel vectors are indexed by channel.
struct DatasetFingerprint {
  std::filesystem::path root;
  DatasetLayout layout = DatasetLayout::msd;
  std::vector<std::string> channel_names;  ///< dataset.json channel_names (or the images' modality)
  std::vector<std::string> label_names;    ///< index = label value ("" where unnamed)
  std::int64_t num_classes = 0;            ///< label values 0..num_classes-1, background included
  std::vector<CaseFingerprint> cases;      ///< sorted by id
  std::vector<ExcludedCase> excluded;
  std::vector<SkippedFile> skipped;                  ///< files the dataset scan did not index
  std::vector<IntensityStats> foreground_intensity;  ///< pooled, per channel (rule above)
  double median_relative_size_after_cropping = 1.0;
  std::int64_t samples_per_case = 0;  ///< the cap the sampling used
  std::uint64_t seed = 0;
  std::string data_signature;  ///< dataset_signature() of the files it read

  /// Everything above as JSON, with nnU-Net's dataset_fingerprint.json fields too
  /// (`spacings`, `shapes_after_crop` in array order z, y, x;
  /// `foreground_intensity_properties_per_channel`, `median_relative_size_after_cropping`).
  nlohmann::json to_json() const;
};

/// Reads `j` (what to_json wrote); `file` names it in errors.
Result<DatasetFingerprint> fingerprint_from_json(const nlohmann::json& j, const std::string& file);

/// Fingerprints the dataset at `root` (any layout scan_dataset knows). Errors: an unreadable
/// root or unknown layout, dataset.json errors (invalid JSON, numTraining), no case with a
/// label, no case left after the integrity checks. Bad cases are listed in `excluded`.
Result<DatasetFingerprint> compute_fingerprint(const std::filesystem::path& root,
                                               const FingerprintOptions& options = {});

/// A hex digest of what the dataset is made of: dataset.json's bytes and, for every file
/// the scan indexes (images, labels; DICOM folders file by file), its path relative to the
/// root, size and modification time. Two fingerprints of the same files have the same
/// signature; a reused plan is checked with it. Reads headers of nothing.
Result<std::string> dataset_signature(const std::filesystem::path& root);

/// Writes `fp.to_json()` to `file` atomically (temporary + rename).
Status write_fingerprint(const DatasetFingerprint& fp, const std::filesystem::path& file);

/// Reads a fingerprint.json.
Result<DatasetFingerprint> read_fingerprint(const std::filesystem::path& file);

/// Weighted percentile (q in [0, 100]) of `values` with `weights` (same length, > 0):
/// linear interpolation between the weighted midpoints of the sorted values; with equal
/// weights it is numpy's default percentile. Sorts its copies.
double weighted_percentile(std::vector<float> values, std::vector<double> weights, double q);

}  // namespace segflow::pipeline
