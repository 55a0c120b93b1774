#pragma once
// What the classes a job trains on are called, so that metrics.jsonl, TensorBoard and the
// CLI say "spleen" where they used to say "class 1". (Whether its map_labels stages fit the
// model's classes is checked with the config: check_label_mapping, job_config.hpp.)
//
// Where names come from, first found wins:
//   1. the `names` option of the job's last map_labels stage;
//   2. the dataset's label names (dataset.json `labels`, MSD {"1": "spleen"} or nnU-Net
//      {"spleen": 1}) carried through the map_labels stages: a target is named by its
//      sources ("kidney_right+kidney_left" when merged);
//   3. the dataset's label names as they are (no map_labels stage).
// The dataset's label names are dataset.json's `labels`, else (DICOM case folders) the segment
// labels of the first case whose label is a DICOM SEG (pipeline::read_dicom_seg_segments;
// segflow's placeholder "label_<v>" names nothing).

#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"

namespace segflow::models {

/// Names of the classes 0..K-1 of the job (see the header comment); `dataset_names` are the
/// dataset's label names by value (pipeline::DatasetIndex::label_names). Empty when unknown.
std::vector<std::string> job_class_names(const JobConfig& cfg, const std::vector<std::string>& dataset_names);

/// Names of the classes 0..K-1 of a trained job, for what it writes (segflow infer's DICOM
/// SEG segments): job_class_names over pipeline::dataset_label_names(data.root), data.root
/// taken relative to the config file's folder when it is not found as given. Empty when the
/// dataset is gone and no map_labels stage names the classes.
std::vector<std::string> job_class_names(const JobConfig& cfg);

/// Names of the classes 0..K-1 of a trained model: those its checkpoint carries (written at
/// training time), else, for checkpoints written before that, job_class_names(config). What
/// inference, packages and exports name the classes by.
std::vector<std::string> model_class_names(const Trainer& trainer);

/// A class name as metric keys and TensorBoard tags use it: letters, digits and "_-+." kept,
/// anything else becomes '_' ("Left Atrium" -> "Left_Atrium").
std::string metric_name(const std::string& name);

/// Key of `v.dice_per_class[k]` (class k + 1): the class's metric_name when it has a name,
/// else "class_<k+1>".
std::string class_key(const ValidationInfo& v, std::size_t k);

}  // namespace segflow::models
