#pragma once
// The real DICOM files the suites read, in one place: Debian's pydicom test files (package
// python3-pydicom, which scripts/setup.sh installs) and the pydicom-data files that
// scripts/fetch-test-data.sh fetches. A missing file fails the test that needs it, with
// what to install or run; nothing is skipped. Also the helpers the DICOM tests share: list a
// folder, copy a series, read a tag, edit a file, read a file or folder that must read (or must fail).

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "pipeline/io/dicom.hpp"
#include "test_util.hpp"

namespace segflow::testing {

/// Where Debian's python3-pydicom installs its test files.
inline const std::filesystem::path kDebianPydicomDir =
    "/usr/lib/python3/dist-packages/pydicom/data/test_files";

/// A file (or folder) of Debian's pydicom test files; throws (the test fails, it is not
/// skipped) with what to install when it is missing.
inline std::filesystem::path debian_pydicom_path(const std::string& rel) {
  auto p = kDebianPydicomDir / rel;
  if (!std::filesystem::exists(p))
    throw std::runtime_error("missing Debian pydicom test file " + p.string() +
                             ": this test fails without it; install Debian's python3-pydicom "
                             "(scripts/setup.sh does)");
  return p;
}

/// A file of pydicom-data 1.0.0 (dcmqi SEGs, an Enhanced CT, JPEG 2000 files); throws with
/// the command that fetches it when it is missing (testdata_path).
inline std::filesystem::path pydicom_data_path(const std::string& name) {
  return testdata_path("pydicom-data/" + name);
}

/// Five axial 16 x 16 CT slices, 2.5 mm apart (InstanceNumber runs against position).
inline std::filesystem::path ct5n_series() { return debian_pydicom_path("dicomdirtests/98892001/CT5N"); }

/// Seven MR localizer slices in three series and three orientations.
inline std::filesystem::path mr_scouts_series() { return debian_pydicom_path("dicomdirtests/98892003/MR2"); }

/// The regular files of a folder, sorted.
inline std::vector<std::filesystem::path> files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Copies the files of `from` into `to` (created), keeping their names after `prefix`;
/// returns the copies, sorted as files_in(from).
inline std::vector<std::filesystem::path> copy_series(const std::filesystem::path& from,
                                                      const std::filesystem::path& to,
                                                      const std::string& prefix = "") {
  std::filesystem::create_directories(to);
  std::vector<std::filesystem::path> out;
  for (const auto& f : files_in(from)) {
    out.push_back(to / (prefix + f.filename().string()));
    std::filesystem::copy_file(f, out.back());
  }
  return out;
}

/// The text of `tag` in a DICOM file: from its meta header (TransferSyntaxUID, ...), else from
/// its dataset; empty when neither has it.
inline std::string dicom_tag_text(const std::filesystem::path& file, const DcmTagKey& tag) {
  DcmFileFormat ff;
  REQUIRE(ff.loadFile(file.c_str()).good());
  OFString v;
  if (ff.getMetaInfo()->findAndGetOFString(tag, v).bad()) ff.getDataset()->findAndGetOFString(tag, v);
  return v.c_str();
}

/// Loads a DICOM file, lets `edit` change it (called with the dataset, or with the dataset and
/// the meta header) and saves it in its own transfer syntax: over `file`, or to `save_as`.
template <class F>
void edit_dicom_file(const std::filesystem::path& file, F edit, const std::filesystem::path& save_as = {}) {
  DcmFileFormat ff;
  REQUIRE(ff.loadFile(file.c_str()).good());
  REQUIRE(ff.loadAllDataIntoMemory().good());
  if constexpr (std::is_invocable_v<F, DcmDataset&, DcmMetaInfo&>)
    edit(*ff.getDataset(), *ff.getMetaInfo());
  else
    edit(*ff.getDataset());
  const std::filesystem::path out = save_as.empty() ? file : save_as;
  REQUIRE(ff.saveFile(out.c_str(), ff.getDataset()->getOriginalXfer()).good());
}

/// segflow's reading of a DICOM file or folder, which must succeed (the case stops with the
/// path and the Status otherwise).
inline pipeline::Image read_dicom_ok(const std::filesystem::path& p,
                                     pipeline::DicomReadReport* report = nullptr) {
  INFO("reading " << p.string());
  REQUIRE_OK_AND_ASSIGN(pipeline::Image img, pipeline::read_dicom(p, report));
  return img;
}

/// The error message of reading a DICOM file or folder that must fail.
inline std::string read_dicom_error(const std::filesystem::path& p) {
  auto r = pipeline::read_dicom(p);
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

}  // namespace segflow::testing
