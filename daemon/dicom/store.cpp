#include "daemon/dicom/store.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcitem.h>
#include <dcmtk/dcmdata/dcuid.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "daemon/dicom/tags.hpp"
#include "messages/log.hpp"
#include "pipeline/io/dicom.hpp"

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;

namespace {

constexpr std::uint16_t kCannotUnderstand = 0xC000;
constexpr std::uint16_t kDoesNotMatchSopClass = 0xA900;
constexpr std::uint16_t kOutOfResources = 0xA700;

bool is_hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.empty() || n[0] == '.';
}

std::string errno_text() { return std::strerror(errno); }

/// True when two files hold the same bytes.
bool same_file_bytes(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  const auto na = fs::file_size(a, ec);
  if (ec || na != fs::file_size(b, ec) || ec) return false;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 16), bb(1 << 16);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() ||
        std::memcmp(ba.data(), bb.data(), static_cast<std::size_t>(fa.gcount())) != 0)
      return false;
  }
  return !fa.bad() && !fb.bad();
}

/// Removes a folder tree; logs (never throws) when it cannot.
void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) log::warn("dicom: cannot remove " + p.string() + ": " + ec.message());
}

}  // namespace

const std::vector<std::string>& stored_sop_classes() {
  static const std::vector<std::string> classes = {UID_CTImageStorage, UID_EnhancedCTImageStorage,
                                                   UID_MRImageStorage, UID_EnhancedMRImageStorage,
                                                   UID_SegmentationStorage};
  return classes;
}

std::string safe_component(const std::string& text) {
  std::string s;
  for (char c : text) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    s += ok ? c : '_';
    if (s.size() == 64) break;
  }
  if (s.empty() || s[0] == '.') s = "x" + s;
  return s;
}

DicomStore::DicomStore(fs::path data_root, std::string dataset)
    : dataset_dir_(data_root / dataset), staging_(data_root / ".segflow-dicom") {}

Status DicomStore::prepare() {
  std::error_code ec;
  if (fs::exists(staging_, ec)) {
    for (const auto& e : fs::directory_iterator(staging_, ec)) {
      log::info("dicom: removing " + e.path().string() + " (left by an association that did not finish)");
      remove_tree(e.path());
    }
  }
  fs::create_directories(staging_, ec);
  if (!fs::is_directory(staging_, ec))
    return io_error(staging_.string() + ": cannot create the DICOM staging folder");
  return Status::ok();
}

Result<std::unique_ptr<DicomStore::Batch>> DicomStore::begin(const std::string& name) {
  const fs::path dir = staging_ / (safe_component(name) + ".partial");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir.string() + ": cannot create: " + ec.message());
  return std::unique_ptr<Batch>(new Batch(*this, dir));
}

DicomStore::Batch::~Batch() { discard(); }

void DicomStore::Batch::discard() {
  if (done_) return;
  done_ = true;
  remove_tree(dir_);
}

fs::path DicomStore::Batch::incoming_path() { return dir_ / (".incoming-" + std::to_string(next_file_++)); }

StoredInstance DicomStore::Batch::add(const fs::path& received, const std::string& sop_class_uid,
                                      const std::string& sop_instance_uid) {
  StoredInstance out;
  std::error_code ec;
  auto refuse = [&](std::uint16_t status, std::string why) {
    fs::remove(received, ec);
    out.status = status;
    out.error = std::move(why);
    return out;
  };
  out.bytes = static_cast<std::int64_t>(fs::file_size(received, ec));
  if (ec) return refuse(kOutOfResources, "received instance vanished: " + ec.message());
  DcmFileFormat ff;
  // Values longer than 256 bytes (pixel data) stay on disk: only the header is read.
  OFCondition c = ff.loadFile(OFFilename(received.c_str()), EXS_Unknown, EGL_noChange, 256);
  if (c.bad()) return refuse(kCannotUnderstand, std::string("cannot parse the data set: ") + c.text());
  DcmDataset& ds = *ff.getDataset();
  // Blank SOP UIDs in the data set (exports that keep them only in the file meta header, as
  // the reader accepts): the C-STORE request's. Given ones must match the request.
  std::string sop_class = tag_text(ds, DCM_SOPClassUID);
  std::string sop_instance = tag_text(ds, DCM_SOPInstanceUID);
  if (sop_class.empty()) sop_class = sop_class_uid;
  if (sop_instance.empty()) sop_instance = sop_instance_uid;
  if (sop_class != sop_class_uid)
    return refuse(kDoesNotMatchSopClass, "SOP class of the data set differs from the C-STORE request's: " +
                                             sop_class + " vs " + sop_class_uid);
  if (sop_instance.empty() || sop_instance != sop_instance_uid)
    return refuse(kCannotUnderstand, "SOP instance of the data set differs from the C-STORE request's: '" +
                                         sop_instance + "' vs '" + sop_instance_uid + "'");
  out.seg = sop_class == UID_SegmentationStorage;
  std::string series = tag_text(ds, DCM_SeriesInstanceUID);
  if (out.seg) {
    DcmItem* ref = nullptr;
    series.clear();
    if (ds.findAndGetSequenceItem(DCM_ReferencedSeriesSequence, ref, 0).good() && ref)
      series = tag_text(*ref, DCM_SeriesInstanceUID);
    if (series.empty())
      return refuse(
          kCannotUnderstand,
          "SEG " + sop_instance + " has no ReferencedSeriesSequence: the series it labels is unknown");
  } else if (series.empty()) {
    // The reader's series identity without a SeriesInstanceUID: the frame of reference.
    series = tag_text(ds, DCM_FrameOfReferenceUID);
    if (series.empty())
      return refuse(kCannotUnderstand,
                    "no SeriesInstanceUID and no FrameOfReferenceUID: the series is unknown "
                    "(instance " +
                        sop_instance + ")");
    out.derived_series = "frame of reference " + series;
  }
  std::string study = tag_text(ds, DCM_StudyInstanceUID);
  if (study.empty()) study = tag_text(ds, DCM_PatientID);
  if (study.empty()) study = "unknown";
  out.case_id = safe_component(study) + "_" + safe_component(series);
  const fs::path case_dir = dir_ / out.case_id;
  fs::create_directories(case_dir, ec);
  const fs::path target = case_dir / ((out.seg ? "SEG_" : "") + safe_component(sop_instance) + ".dcm");
  fs::rename(received, target, ec);
  if (ec) return refuse(kOutOfResources, "cannot stage " + target.string() + ": " + ec.message());
  cases_[out.case_id] = cases_[out.case_id] || out.seg;
  ++instances_;
  return out;
}

Result<std::int64_t> DicomStore::Batch::commit() {
  if (done_) return internal_error("dicom: batch " + dir_.string() + " is already finished");
  std::int64_t written = 0;
  Status first = Status::ok();
  for (const auto& [case_id, has_seg] : cases_) {
    Status st = store_.commit_case(dir_ / case_id, case_id, has_seg);
    if (st.is_ok())
      ++written;
    else if (first.is_ok())
      first = st;
  }
  discard();
  if (!first.is_ok()) return first;
  return written;
}

Status DicomStore::commit_case(const fs::path& staged, const std::string& case_id, bool has_seg) {
  std::lock_guard<std::mutex> lock(commit_mu_);
  std::error_code ec;
  fs::create_directories(dataset_dir_, ec);
  const fs::path target = dataset_dir_ / case_id;
  if (::rename(staged.c_str(), target.c_str()) == 0) return Status::ok();
  if (errno != EEXIST && errno != ENOTEMPTY)
    return io_error("cannot move " + staged.string() + " to " + target.string() + ": " + errno_text());

  // The case exists: complete the staged folder with its files (hard links; a new SEG
  // replaces the old ones), then swap the two folders in one step.
  std::vector<fs::path> replaced;
  fs::directory_iterator listing(target, ec);
  if (ec) return io_error("cannot list " + target.string() + ": " + ec.message());
  for (const auto& e : listing) {
    if (is_hidden(e.path()) || !e.is_regular_file(ec)) continue;
    const fs::path mine = staged / e.path().filename();
    if (fs::exists(mine, ec)) {
      // The same instance received again: the new copy wins, unless it is byte for byte the
      // old one, which then stays (same mtime: auto_infer's series signature is unchanged).
      if (same_file_bytes(mine, e.path()) && fs::remove(mine, ec) &&
          ::link(e.path().c_str(), mine.c_str()) != 0)
        return io_error("cannot keep " + e.path().string() + " in " + staged.string() + ": " + errno_text());
      continue;
    }
    if (has_seg && pipeline::is_dicom_seg_file(e.path())) {
      replaced.push_back(e.path().filename());
      continue;
    }
    if (::link(e.path().c_str(), mine.c_str()) != 0) {
      fs::copy_file(e.path(), mine, ec);
      if (ec)
        return io_error("cannot merge " + e.path().string() + " into " + staged.string() + ": " +
                        ec.message());
    }
  }
  for (const auto& r : replaced)
    log::info("dicom: " + case_id + ": the new SEG replaces " + r.string() + " as the case's label");
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree(staged);  // now the old folder
    return Status::ok();
  }
  if (errno != EINVAL && errno != ENOSYS)
    return io_error("cannot swap " + staged.string() + " with " + target.string() + ": " + errno_text());
  // A file system without RENAME_EXCHANGE: move the new files in one by one.
  log::debug("dicom: " + target.string() + ": no RENAME_EXCHANGE here, merging file by file");
  for (const auto& r : replaced) fs::remove(target / r, ec);
  for (const auto& e : fs::directory_iterator(staged, ec)) {
    const fs::path dest = target / e.path().filename();
    if (fs::exists(dest, ec) && fs::equivalent(dest, e.path(), ec)) continue;
    if (::rename(e.path().c_str(), dest.c_str()) != 0)
      return io_error("cannot move " + e.path().string() + " to " + dest.string() + ": " + errno_text());
  }
  remove_tree(staged);
  return Status::ok();
}

}  // namespace segflow::daemon::dicom
