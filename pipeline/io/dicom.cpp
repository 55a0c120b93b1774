// DICOM reading on DCMTK: folder scanning and pixel decoding. Headers, stacks and series
// geometry (ordering, spacing, tilt, the tolerance rules) are in detail/dicom_series.cpp, the
// JPEG 2000 codec in detail/dicom_j2k.cpp, the series writer in detail/dicom_writer.cpp,
// DICOM SEG in detail/dicom_seg.cpp, shared DCMTK helpers and codec registration in
// detail/dicom_common.cpp.
#include <torch/torch.h>

#include "pipeline/io/dicom.hpp"

#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmimage/diregist.h>  // registers colour (RGB, YBR, palette) support in DicomImage
#include <dcmtk/dcmimgle/dcmimage.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>

#include "messages/log.hpp"
#include "pipeline/io/detail/dicom_common.hpp"
#include "pipeline/io/detail/dicom_series.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;
using namespace detail;

namespace {

/// Bytes of native pixel data a header asks for.
std::uint64_t expected_pixel_bytes(const Header& h) {
  // YBR_FULL_422 / YBR_PARTIAL_422 store two chroma samples per two pixels: 2 a pixel.
  const bool subsampled = h.samples == 3 && h.photometric.size() > 4 &&
                          h.photometric.compare(h.photometric.size() - 4, 4, "_422") == 0;
  std::uint64_t px = static_cast<std::uint64_t>(*h.rows) * static_cast<std::uint64_t>(*h.columns) *
                     static_cast<std::uint64_t>(h.frames) *
                     static_cast<std::uint64_t>(subsampled ? 2 : h.samples);
  if (h.bits_allocated == 1) return (px + 7) / 8;
  return px * static_cast<std::uint64_t>((h.bits_allocated + 7) / 8);
}

template <class T>
void copy_frames(const DiPixel& px, const Header& h, const std::vector<std::int64_t>& z_of_frame,
                 bool rescale, float* out, std::int64_t Z) {
  const std::int64_t plane = static_cast<std::int64_t>(*h.rows) * *h.columns;
  const int planes = px.getPlanes();
  for (long f = 0; f < h.frames; ++f) {
    const std::int64_t z = z_of_frame[static_cast<std::size_t>(f)];
    if (z < 0) continue;  // a frame of another stack
    const FrameInfo& fi = h.frame_info[static_cast<std::size_t>(f)];
    const double slope = rescale ? fi.slope : 1.0, intercept = rescale ? fi.intercept : 0.0;
    for (int c = 0; c < planes; ++c) {
      const T* src =
          planes == 1 ? static_cast<const T*>(px.getData()) : static_cast<const T* const*>(px.getData())[c];
      src += static_cast<std::int64_t>(f) * plane;
      float* dst = out + (static_cast<std::int64_t>(c) * Z + z) * plane;
      if (slope == 1.0 && intercept == 0.0) {
        for (std::int64_t i = 0; i < plane; ++i) dst[i] = static_cast<float>(src[i]);
      } else {
        for (std::int64_t i = 0; i < plane; ++i)
          dst[i] = static_cast<float>(static_cast<double>(src[i]) * slope + intercept);
      }
    }
  }
}

/// Decodes every frame of one file into the output volume (C, Z, Y, X) at z_of_frame[frame].
Status decode_file(DcmFileFormat& ff, const Header& h, const std::vector<std::int64_t>& z_of_frame,
                   float* out, std::int64_t Z) {
  const std::string file = h.file.string();
  DcmDataset* ds = ff.getDataset();
  E_TransferSyntax xfer = ds->getOriginalXfer();
  DcmXfer x(xfer);
  if (x.isEncapsulated()) {
    OFCondition c = ds->chooseRepresentation(EXS_LittleEndianExplicit, nullptr);
    if (c.bad() || !ds->canWriteXfer(EXS_LittleEndianExplicit))
      return corrupt_data(file + ": " + tag_name(DCM_PixelData) + ": cannot decode " +
                          describe_transfer_syntax(transfer_syntax_uid(ff)) + ": " +
                          (c.bad() ? condition_text(c) : std::string("the codec failed")) +
                          " (truncated or corrupt compressed data?)");
    xfer = EXS_LittleEndianExplicit;
  } else {
    DcmElement* pd = nullptr;
    if (ds->findAndGetElement(DCM_PixelData, pd).bad() || !pd)
      return corrupt_data(file + ": " + tag_name(DCM_PixelData) + ": required tag is missing");
    std::uint64_t want = expected_pixel_bytes(h);
    std::uint64_t got = pd->getLength();
    if (got < want)
      return corrupt_data(file + ": " + tag_name(DCM_PixelData) + ": expected " + std::to_string(want) +
                          " bytes for " + std::to_string(*h.rows) + " rows x " + std::to_string(*h.columns) +
                          " columns x " + std::to_string(h.frames) + " frames x " +
                          std::to_string(h.samples) + " samples of " + std::to_string(h.bits_allocated) +
                          " bits, got " + std::to_string(got) + " (truncated pixel data)");
    // DCMTK swaps big-endian OW data in 16-bit words; 32-bit samples then have their halves
    // swapped (rtdose_expb.dcm): put them back before DicomImage reads the words.
    if (DcmXfer(ds->getOriginalXfer()).isBigEndian() && h.bits_allocated == 32 && pd->getVR() == EVR_OW) {
      Uint16* words = nullptr;
      if (pd->getUint16Array(words).good() && words) {
        const std::uint64_t n = want / 2;
        for (std::uint64_t i = 0; i + 1 < n; i += 2) std::swap(words[i], words[i + 1]);
      }
    }
  }
  DicomImage img(ds, xfer, CIF_IgnoreModalityTransformation, 0, static_cast<unsigned long>(h.frames));
  if (img.getStatus() != EIS_Normal)
    return corrupt_data(file + ": cannot decode pixel data: " + DicomImage::getString(img.getStatus()));
  const DiPixel* px = img.getInterData();
  if (!px) return corrupt_data(file + ": cannot decode pixel data: DCMTK returned no pixels");
  const std::uint64_t plane = static_cast<std::uint64_t>(*h.rows) * static_cast<std::uint64_t>(*h.columns);
  if (img.getFrameCount() < static_cast<unsigned long>(h.frames) ||
      px->getCount() < plane * static_cast<std::uint64_t>(h.frames))
    return corrupt_data(file + ": " + tag_name(DCM_PixelData) + ": expected " + std::to_string(h.frames) +
                        " frames of " + std::to_string(*h.rows) + " x " + std::to_string(*h.columns) +
                        ", DCMTK decoded " + std::to_string(px->getCount()) + " pixels");
  if (px->getPlanes() != static_cast<int>(h.samples))
    return unsupported(file + ": " + tag_name(DCM_SamplesPerPixel) + ": expected " +
                       std::to_string(h.samples) + " planes, DCMTK decoded " +
                       std::to_string(px->getPlanes()));
  const bool rescale = h.samples == 1;
  switch (px->getRepresentation()) {
    case EPR_Uint8:
      copy_frames<Uint8>(*px, h, z_of_frame, rescale, out, Z);
      break;
    case EPR_Sint8:
      copy_frames<Sint8>(*px, h, z_of_frame, rescale, out, Z);
      break;
    case EPR_Uint16:
      copy_frames<Uint16>(*px, h, z_of_frame, rescale, out, Z);
      break;
    case EPR_Sint16:
      copy_frames<Sint16>(*px, h, z_of_frame, rescale, out, Z);
      break;
    case EPR_Uint32:
      copy_frames<Uint32>(*px, h, z_of_frame, rescale, out, Z);
      break;
    case EPR_Sint32:
      copy_frames<Sint32>(*px, h, z_of_frame, rescale, out, Z);
      break;
  }
  return Status::ok();
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join_steps(const SpacingStats& s) {
  std::ostringstream os;
  os << "steps " << s.min_step << " to " << s.max_step << " mm, mean " << s.mean_step
     << " mm, largest deviation " << s.max_deviation << " mm";
  return os.str();
}

/// What a read decides before any pixel is decoded: the headers, the stack chosen, its
/// slices in order and the volume geometry.
struct SeriesPlan {
  std::vector<std::unique_ptr<DcmFileFormat>> ffs;  ///< pixel data still on disk
  std::vector<Header> hs;
  StackChoice choice;
  std::vector<Slice> slices;  ///< of the chosen stack, ordered along the normal
  SpacingStats stats;
  Geometry geometry;
};

/// `st` (the chosen stack does not make a volume: a gap, uneven steps) with the stacks set
/// aside named: a slice of the series with another orientation or size leaves a gap in the
/// stack read, and the gap alone would hide why.
Status with_set_aside(const Status& st, const StackChoice& choice) {
  if (choice.skipped.empty()) return st;
  std::string msg = st.message() + "; set aside as another stack:";
  for (std::size_t i = 0; i < choice.skipped.size() && i < 3; ++i) {
    const StackSkip& s = choice.skipped[i];
    msg +=
        std::string(i ? ";" : "") + " " + std::to_string(s.slices) + (s.slices == 1 ? " slice" : " slices") +
        (s.files.empty() ? std::string() : " (" + s.files.front().filename().string() + ")") + ", " + s.key;
  }
  if (choice.skipped.size() > 3) msg += "; ...";
  return {st.code(), msg};
}

Result<SeriesPlan> plan_series(const std::vector<fs::path>& files) {
  ensure_dcmtk_ready();
  if (files.empty()) return invalid_argument("read_dicom_series: expected at least one file, got none");
  SeriesPlan plan;
  plan.ffs.reserve(files.size());
  plan.hs.reserve(files.size());
  for (const fs::path& f : files) {
    SEGFLOW_ASSIGN_OR_RETURN(auto ff, load_file(f));
    SEGFLOW_ASSIGN_OR_RETURN(Header h, parse_header(f, *ff));
    if (!h.rows || *h.rows <= 0)
      return corrupt_data(f.string() + ": " + tag_name(DCM_Rows) + ": required tag is missing");
    if (!h.columns || *h.columns <= 0)
      return corrupt_data(f.string() + ": " + tag_name(DCM_Columns) + ": required tag is missing");
    if (!h.has_pixel_data)
      return corrupt_data(f.string() + ": " + tag_name(DCM_PixelData) +
                          ": required tag is missing (not an image?)");
    if (h.samples != 1 && h.samples != 3)
      return unsupported(f.string() + ": " + tag_name(DCM_SamplesPerPixel) + ": expected 1 or 3, got " +
                         std::to_string(h.samples));
    plan.ffs.push_back(std::move(ff));
    plan.hs.push_back(std::move(h));
  }
  SEGFLOW_ASSIGN_OR_RETURN(plan.choice, choose_stack(plan.hs));
  plan.slices = std::move(plan.choice.chosen.slices);
  auto geometry = assemble_geometry(plan.hs, plan.slices, plan.stats);
  if (!geometry.is_ok()) return with_set_aside(geometry.status(), plan.choice);
  plan.geometry = std::move(*geometry);
  return plan;
}

/// What a plan reads and skips, with its warnings (not yet logged).
DicomReadReport plan_report(const std::vector<fs::path>& files, SeriesPlan& plan) {
  const std::vector<Header>& hs = plan.hs;
  const std::vector<Slice>& slices = plan.slices;
  const SpacingStats& stats = plan.stats;
  StackChoice& choice = plan.choice;
  const Header& h0 = hs[slices.front().file];
  DicomReadReport rep;
  rep.series = h0.series_uid.empty() ? series_identity(h0) : h0.series_uid;
  rep.identity = !h0.series_uid.empty()               ? "SeriesInstanceUID"
                 : !h0.frame_of_reference_uid.empty() ? "FrameOfReferenceUID + orientation + geometry"
                                                      : "orientation + geometry";
  rep.slices = slices.size();
  rep.slice_spacing_mm = plan.geometry.spacing[2];
  rep.slice_spacing_max_deviation_mm = stats.max_deviation;
  rep.split_tag = choice.chosen.split_tag;
  rep.split_value = choice.chosen.split_value;
  for (const Slice& s : slices)
    if (rep.files.empty() || rep.files.back() != hs[s.file].file) rep.files.push_back(hs[s.file].file);
  for (auto& s : choice.skipped) rep.skipped_stacks.push_back({s.key, s.files, s.slices, s.reason});
  for (auto& [path, reason] : choice.duplicate_files) rep.skipped_files.push_back({path, reason});
  const std::string where = files.size() == 1 ? files.front().string() : files.front().parent_path().string();
  const FrameInfo& fi = *slices.front().info;
  if (fi.pixel_spacing && ((*fi.pixel_spacing)[0] <= 0 || (*fi.pixel_spacing)[1] <= 0))
    rep.warnings.push_back(slice_name(hs, slices.front()) + ": " + tag_name(DCM_PixelSpacing) + ": " +
                           format_numbers(fi.pixel_spacing->data(), 2) +
                           " is not a spacing; using 1 mm as GDCM does");
  if (slices.size() > 1 && stats.max_deviation > kSpacingWarnRelative * stats.mean_step)
    rep.warnings.push_back(where + ": slice spacing is not uniform (" + join_steps(stats) +
                           "); within the tolerance of " +
                           std::to_string(static_cast<int>(kStepTolerance * 100)) +
                           " % of the median step, the mean step is used");
  if (!rep.split_tag.empty())
    rep.warnings.push_back(where + ": slices repeat at each position; split by " + rep.split_tag + ", read " +
                           rep.split_tag + " " + number_text(rep.split_value));
  if (!rep.skipped_stacks.empty()) {
    std::string w = where + ": read " + std::to_string(rep.slices) + " slices (" + choice.chosen.key +
                    "); skipped " + std::to_string(rep.skipped_stacks.size()) + " other stack(s): ";
    for (std::size_t i = 0; i < rep.skipped_stacks.size() && i < 3; ++i)
      w += std::string(i ? "; " : "") + rep.skipped_stacks[i].stack + ": " + rep.skipped_stacks[i].reason;
    if (rep.skipped_stacks.size() > 3) w += "; ... (inspect lists them all)";
    rep.warnings.push_back(std::move(w));
  }
  return rep;
}

Result<Image> read_series_impl(const std::vector<fs::path>& files, DicomReadReport* report) {
  SEGFLOW_ASSIGN_OR_RETURN(SeriesPlan plan, plan_series(files));
  std::vector<Header>& hs = plan.hs;
  const std::vector<Slice>& slices = plan.slices;

  std::vector<std::vector<std::int64_t>> z_of(hs.size());
  for (std::size_t z = 0; z < slices.size(); ++z) {
    auto& zs = z_of[slices[z].file];
    if (zs.empty()) zs.assign(static_cast<std::size_t>(hs[slices[z].file].frames), -1);
    zs[static_cast<std::size_t>(slices[z].frame)] = static_cast<std::int64_t>(z);
  }
  const Header& h0 = hs[slices.front().file];
  for (std::size_t i = 0; i < hs.size(); ++i)
    if (!z_of[i].empty()) SEGFLOW_RETURN_IF_ERROR(check_transfer_syntax(hs[i].file, *plan.ffs[i]));

  const std::int64_t C = h0.samples, Z = static_cast<std::int64_t>(slices.size()), Y = *h0.rows,
                     X = *h0.columns;
  at::Tensor voxels = torch::empty({C, Z, Y, X}, torch::kFloat32);
  float* out = voxels.data_ptr<float>();
  for (std::size_t i = 0; i < hs.size(); ++i) {
    if (!z_of[i].empty()) SEGFLOW_RETURN_IF_ERROR(decode_file(*plan.ffs[i], hs[i], z_of[i], out, Z));
    plan.ffs[i].reset();  // frees the decoded pixel data of this file
  }

  // What was read and what was not: a report for inspect, warnings for logs.
  DicomReadReport rep = plan_report(files, plan);
  for (const auto& w : rep.warnings) log::warn(w);
  if (report) *report = std::move(rep);

  Image img;
  img.voxels = std::move(voxels);
  img.geometry = plan.geometry;
  img.source = files.size() == 1 ? files.front() : files.front().parent_path();
  img.modality = h0.modality;
  return img;
}

/// Series of SOP classes / modalities that carry no image to train on.
bool is_non_image(const DicomSeriesInfo& s) {
  static const char* kModalities[] = {"SEG", "RTSTRUCT", "RTPLAN", "RTRECORD", "SR",
                                      "PR",  "KO",       "REG",    "DOC"};
  for (const char* m : kModalities)
    if (s.modality == m) return true;
  return s.sop_class_uid == UID_SegmentationStorage;
}

}  // namespace

bool looks_like_dicom(const fs::path& path) {
  try {
    switch (sniff_dicom_prefix(path)) {
      case DicomPrefix::preamble:
        return true;
      case DicomPrefix::maybe_dataset:
        return load_file(path).is_ok();
      case DicomPrefix::none:
        return false;
    }
    return false;
  } catch (const std::exception&) {
    return false;
  }
}

Result<std::vector<DicomSeriesInfo>> scan_dicom_folder(const fs::path& dir,
                                                       std::vector<SkippedFile>* skipped) {
  try {
    ensure_dcmtk_ready();
    std::error_code ec;
    if (!fs::exists(dir, ec)) return not_found(dir.string() + ": no such folder");
    if (!fs::is_directory(dir, ec)) return invalid_argument(dir.string() + ": expected a folder, got a file");
    std::vector<fs::path> paths;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file(ec)) paths.push_back(it->path());
    if (ec) return io_error(dir.string() + ": cannot list folder: " + ec.message());
    std::sort(paths.begin(), paths.end());

    std::vector<DicomSeriesInfo> series;
    std::map<std::string, std::size_t> index;
    std::vector<std::pair<std::size_t, Header>> fallback;  // series without a UID: index, first header
    auto skip = [&](const fs::path& p, std::string reason) {
      if (skipped) skipped->push_back({p, std::move(reason)});
    };
    for (const fs::path& p : paths) {
      // Rejects empty and non-DICOM files; values over 4 KiB (pixel data) are not read.
      auto ff = load_file(p);
      if (!ff) {
        skip(p, ff.status().message());
        continue;
      }
      DcmDataset& ds = *(*ff)->getDataset();
      DcmMetaInfo* meta = (*ff)->getMetaInfo();
      const std::string media = meta ? get_string(*meta, DCM_MediaStorageSOPClassUID).value_or("") : "";
      auto uid = get_string(ds, DCM_SeriesInstanceUID);
      if (!uid && media == UID_MediaStorageDirectoryStorage) {
        skip(p, p.string() + ": " + tag_name(DCM_SeriesInstanceUID) +
                    ": required tag is missing (a DICOMDIR, not an image)");
        continue;
      }
      std::size_t at = series.size();
      if (uid) {
        auto [it, inserted] = index.emplace(*uid, series.size());
        at = it->second;
      } else {
        // No SeriesInstanceUID (blanked by an anonymiser): one series per FrameOfReferenceUID,
        // modality, orientation and geometry.
        auto h = parse_header(p, **ff);
        if (!h) {
          skip(p, h.status().message());
          continue;
        }
        for (std::size_t k = 0; k < fallback.size(); ++k)
          if (same_series_without_uid(fallback[k].second, *h)) at = fallback[k].first;
        if (at == series.size()) fallback.emplace_back(at, std::move(*h));
      }
      if (at == series.size()) {
        DicomSeriesInfo s;
        s.series_uid = uid.value_or("");
        s.identity = uid ? "SeriesInstanceUID " + *uid
                     : fallback.back().second.frame_of_reference_uid.empty()
                         ? std::string("orientation + geometry (no SeriesInstanceUID or FrameOfReferenceUID)")
                         : "FrameOfReferenceUID " + fallback.back().second.frame_of_reference_uid +
                               " + orientation + geometry (no SeriesInstanceUID)";
        s.modality = get_string(ds, DCM_Modality).value_or("");
        s.sop_class_uid = get_string(ds, DCM_SOPClassUID).value_or(media);
        series.push_back(std::move(s));
      }
      series[at].files.push_back(p);
    }
    return series;
  } catch (const c10::Error& e) {
    return internal_error(dir.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(dir.string() + ": " + e.what());
  }
}

Result<Image> read_dicom_series(const std::vector<fs::path>& files, DicomReadReport* report) {
  const std::string where = files.empty() ? std::string("read_dicom_series") : files.front().string();
  try {
    return read_series_impl(files, report);
  } catch (const c10::Error& e) {
    return internal_error(where + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(where + ": " + e.what());
  }
}

namespace {

/// The files of the image series of a folder (SEG, RTSTRUCT, SR, ... left out), sorted: what
/// read_dicom assembles the volume from. `skipped` gets the files that are no DICOM.
Result<std::vector<fs::path>> image_files_of(const fs::path& dir, std::vector<SkippedFile>& skipped) {
  SEGFLOW_ASSIGN_OR_RETURN(auto all, scan_dicom_folder(dir, &skipped));
  std::vector<fs::path> files;
  for (auto& s : all)
    if (!is_non_image(s)) files.insert(files.end(), s.files.begin(), s.files.end());
  if (files.empty()) {
    std::string msg = dir.string() + ": expected one DICOM image series, found none";
    if (!skipped.empty())
      msg += " (" + std::to_string(skipped.size()) + " files skipped; first: " + skipped.front().reason + ")";
    return not_found(msg);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

Result<Image> read_dicom(const fs::path& file_or_dir, DicomReadReport* report) {
  std::error_code ec;
  if (!fs::exists(file_or_dir, ec)) return not_found(file_or_dir.string() + ": no such file or folder");
  if (!fs::is_directory(file_or_dir, ec)) {
    if (is_dicom_seg_file(file_or_dir)) return read_dicom_seg(file_or_dir);
    return read_dicom_series({file_or_dir}, report);
  }
  std::vector<SkippedFile> skipped;
  SEGFLOW_ASSIGN_OR_RETURN(auto files, image_files_of(file_or_dir, skipped));
  DicomReadReport local;
  DicomReadReport& rep = report ? *report : local;
  SEGFLOW_ASSIGN_OR_RETURN(Image img, read_dicom_series(files, &rep));
  rep.skipped_files.insert(rep.skipped_files.end(), skipped.begin(), skipped.end());
  img.source = file_or_dir;
  return img;
}

Result<DicomReadReport> probe_dicom(const fs::path& file_or_dir) {
  try {
    std::error_code ec;
    if (!fs::exists(file_or_dir, ec)) return not_found(file_or_dir.string() + ": no such file or folder");
    std::vector<SkippedFile> skipped;
    std::vector<fs::path> files;
    if (fs::is_directory(file_or_dir, ec)) {
      SEGFLOW_ASSIGN_OR_RETURN(files, image_files_of(file_or_dir, skipped));
    } else {
      files = {file_or_dir};
    }
    SEGFLOW_ASSIGN_OR_RETURN(SeriesPlan plan, plan_series(files));
    DicomReadReport rep = plan_report(files, plan);
    rep.skipped_files.insert(rep.skipped_files.end(), skipped.begin(), skipped.end());
    return rep;
  } catch (const c10::Error& e) {
    return internal_error(file_or_dir.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(file_or_dir.string() + ": " + e.what());
  }
}

Result<DicomSeriesInfo> dicom_source_series(const fs::path& file_or_dir) {
  SEGFLOW_ASSIGN_OR_RETURN(DicomReadReport rep, probe_dicom(file_or_dir));
  try {
    DicomSeriesInfo info;
    info.files = rep.files;
    SEGFLOW_ASSIGN_OR_RETURN(auto ff, load_file(rep.files.front()));
    SEGFLOW_ASSIGN_OR_RETURN(Header h, parse_header(rep.files.front(), *ff));
    info.series_uid = h.series_uid;
    info.identity = series_identity(h);
    info.modality = h.modality;
    info.sop_class_uid = h.sop_class_uid;
    return info;
  } catch (const std::exception& e) {
    return internal_error(file_or_dir.string() + ": " + e.what());
  }
}

void to_json(nlohmann::json& j, const DicomReadReport& r) {
  j = nlohmann::json::object();
  j["dicom_series"] = r.series;
  j["dicom_series_identity"] = r.identity;
  j["slices"] = r.slices;
  j["slice_spacing_mm"] = r.slice_spacing_mm;
  j["slice_spacing_max_deviation_mm"] = r.slice_spacing_max_deviation_mm;
  if (!r.split_tag.empty()) j["split_by"] = {{"tag", r.split_tag}, {"value", r.split_value}};
  j["skipped_stacks"] = nlohmann::json::array();
  for (const auto& s : r.skipped_stacks) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : s.files) files.push_back(f.string());
    j["skipped_stacks"].push_back(
        {{"stack", s.stack}, {"slices", s.slices}, {"files", files}, {"reason", s.reason}});
  }
  j["skipped"] = nlohmann::json::array();
  for (const auto& s : r.skipped_files)
    j["skipped"].push_back({{"path", s.path.string()}, {"reason", s.reason}});
  j["warnings"] = r.warnings;
}

Result<DicomCompression> parse_dicom_compression(const std::string& s) {
  if (s == "none") return DicomCompression::none;
  if (s == "rle") return DicomCompression::rle;
  if (s == "jpeg-ls") return DicomCompression::jpeg_ls;
  if (s == "jpeg-lossless") return DicomCompression::jpeg_lossless;
  return invalid_argument("compression: expected one of none, rle, jpeg-ls, jpeg-lossless, got \"" + s +
                          "\"");
}

}  // namespace segflow::pipeline
