#pragma once
// Where the DICOM node (and a DICOMweb fetch) puts received instances, so that the dataset
// watcher only ever sees whole series. Each association stages its instances under
//   data_root/.segflow-dicom/<association>.partial/<case>/<file>
// (hidden: neither the watcher nor the dataset layouts look there). A case is
//   <StudyInstanceUID, else PatientID>_<SeriesInstanceUID>
// of an image instance, and of the series a SEG references (ReferencedSeriesSequence) for a
// SEG, so a SEG lands beside the series it labels and the DICOM dataset layout
// (pipeline/io/dataset.hpp) takes it as the case's label. Files are named
// <SOPInstanceUID>.dcm, SEG_<SOPInstanceUID>.dcm for a SEG.
//
// When the association ends normally, commit() moves each staged case into
// data_root/<dataset>/<case>: a new case by one rename; a case that exists already by
// building its merged folder (old files hard-linked, the new instances beside them; a new
// SEG replaces the old SEG files) and swapping it in with one renameat2(RENAME_EXCHANGE).
// An aborted or timed-out association is discarded: nothing of it reaches the dataset.
//
// Threading: a Batch belongs to one association (or fetch) thread; commits of all batches of
// a store are serialised (two associations may carry instances of one series), so the node
// and the fetcher share one store.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::daemon::dicom {

/// What became of one received instance.
struct StoredInstance {
  std::uint16_t status = 0;  ///< DIMSE C-STORE status: 0 success, 0xA900, 0xC000, 0xA700
  std::string error;         ///< why it was refused (empty on success)
  std::string case_id;       ///< the case folder it goes to
  bool seg = false;          ///< a DICOM SEG (the case's label)
  std::int64_t bytes = 0;    ///< file size
  /// The series identity when the instance has no SeriesInstanceUID ("frame of reference
  /// UID", the reader's rule); empty otherwise.
  std::string derived_series;
};

class DicomStore {
 public:
  /// `data_root` absolute; `dataset` the folder name under it.
  DicomStore(std::filesystem::path data_root, std::string dataset);

  /// Removes what earlier runs left in the staging folder and creates it.
  Status prepare();

  /// One association's staged instances; discarded on destruction unless committed.
  class Batch {
   public:
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

    /// A fresh path in the staging folder for the next instance to be received into.
    std::filesystem::path incoming_path();
    /// Files an instance received at `received` (moved or removed): reads its header,
    /// checks it against the request's SOP class and instance UIDs and stages it.
    StoredInstance add(const std::filesystem::path& received, const std::string& sop_class_uid,
                       const std::string& sop_instance_uid);
    /// Moves every staged case into the dataset; returns the number of cases written.
    Result<std::int64_t> commit();
    /// Removes everything staged. Idempotent.
    void discard();
    /// Instances staged so far.
    std::int64_t instances() const { return instances_; }

   private:
    friend class DicomStore;
    Batch(DicomStore& store, std::filesystem::path dir) : store_(store), dir_(std::move(dir)) {}
    DicomStore& store_;
    std::filesystem::path dir_;          ///< <staging>/<association>.partial
    std::map<std::string, bool> cases_;  ///< staged case -> holds a SEG
    std::int64_t instances_ = 0;
    std::uint64_t next_file_ = 0;
    bool done_ = false;
  };

  /// Starts a batch for association `name` (unique among the running associations).
  Result<std::unique_ptr<Batch>> begin(const std::string& name);

  /// data_root/<dataset>.
  const std::filesystem::path& dataset_dir() const { return dataset_dir_; }
  /// data_root/.segflow-dicom.
  const std::filesystem::path& staging_dir() const { return staging_; }

 private:
  Status commit_case(const std::filesystem::path& staged, const std::string& case_id, bool has_seg);
  std::filesystem::path dataset_dir_;
  std::filesystem::path staging_;
  std::mutex commit_mu_;
};

/// The storage SOP classes the dataset takes (the node negotiates them, a fetch keeps them):
/// CT, Enhanced CT, MR, Enhanced MR and Segmentation Storage.
const std::vector<std::string>& stored_sop_classes();

/// A name safe as one path component: [A-Za-z0-9._-] kept, others '_', at most 64
/// characters, never empty or starting with '.'.
std::string safe_component(const std::string& text);

}  // namespace segflow::daemon::dicom
