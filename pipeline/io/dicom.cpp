// DICOM reading on DCMTK: folder scanning, series assembly (ordering, spacing, LPS geometry),
// pixel decoding. The series writer is in detail/dicom_writer.cpp, DICOM SEG in
// detail/dicom_seg.cpp, shared DCMTK helpers and codec registration in detail/dicom_common.cpp.
#include <torch/torch.h>

#include "pipeline/io/dicom.hpp"

#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmimage/diregist.h>  // registers colour (RGB, YBR, palette) support in DicomImage
#include <dcmtk/dcmimgle/dcmimage.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>

#include "messages/log.hpp"
#include "pipeline/io/detail/dicom_common.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;
using namespace detail;

namespace {

/// Geometry and rescale of one frame, from top-level tags overridden by the shared and then
/// the per-frame functional groups.
struct FrameInfo {
  std::optional<Vec3> position;                        ///< ImagePositionPatient
  std::optional<std::array<double, 6>> orientation;    ///< ImageOrientationPatient
  std::optional<std::array<double, 2>> pixel_spacing;  ///< PixelSpacing: row\column = y\x
  std::optional<double> slice_thickness;
  std::optional<double> spacing_between_slices;
  double slope = 1.0;
  double intercept = 0.0;
};

/// What the reader needs from one file's header.
struct Header {
  fs::path file;
  std::string series_uid, modality, sop_class_uid, photometric;
  std::optional<long> rows, columns;
  long samples = 1;
  long frames = 1;
  long bits_allocated = 16;
  bool has_pixel_data = false;
  std::vector<FrameInfo> frame_info;  ///< one per frame
};

/// One slice of the output: frame `frame` of file `file`.
struct Slice {
  std::size_t file = 0;
  long frame = 0;
  const FrameInfo* info = nullptr;
};

void read_plain_tags(DcmItem& item, FrameInfo& g) {
  if (auto v = get_doubles<3>(item, DCM_ImagePositionPatient)) g.position = Vec3{(*v)[0], (*v)[1], (*v)[2]};
  if (auto v = get_doubles<6>(item, DCM_ImageOrientationPatient)) g.orientation = *v;
  if (auto v = get_doubles<2>(item, DCM_PixelSpacing)) g.pixel_spacing = *v;
  if (auto v = get_double(item, DCM_SliceThickness)) g.slice_thickness = *v;
  if (auto v = get_double(item, DCM_SpacingBetweenSlices)) g.spacing_between_slices = *v;
  if (auto v = get_double(item, DCM_RescaleSlope)) g.slope = *v;
  if (auto v = get_double(item, DCM_RescaleIntercept)) g.intercept = *v;
}

/// Reads the functional-group macros of one item of the Shared or PerFrame sequence.
void read_functional_groups(DcmItem& fg, FrameInfo& g) {
  if (DcmItem* it = sequence_item(fg, DCM_PlanePositionSequence))
    if (auto v = get_doubles<3>(*it, DCM_ImagePositionPatient)) g.position = Vec3{(*v)[0], (*v)[1], (*v)[2]};
  if (DcmItem* it = sequence_item(fg, DCM_PlaneOrientationSequence))
    if (auto v = get_doubles<6>(*it, DCM_ImageOrientationPatient)) g.orientation = *v;
  if (DcmItem* it = sequence_item(fg, DCM_PixelMeasuresSequence)) {
    if (auto v = get_doubles<2>(*it, DCM_PixelSpacing)) g.pixel_spacing = *v;
    if (auto v = get_double(*it, DCM_SliceThickness)) g.slice_thickness = *v;
    if (auto v = get_double(*it, DCM_SpacingBetweenSlices)) g.spacing_between_slices = *v;
  }
  if (DcmItem* it = sequence_item(fg, DCM_PixelValueTransformationSequence)) {
    if (auto v = get_double(*it, DCM_RescaleSlope)) g.slope = *v;
    if (auto v = get_double(*it, DCM_RescaleIntercept)) g.intercept = *v;
  }
}

Vec3 row_cosine(const std::array<double, 6>& o) { return normalized({o[0], o[1], o[2]}); }
Vec3 col_cosine(const std::array<double, 6>& o) { return normalized({o[3], o[4], o[5]}); }
Vec3 slice_normal(const std::array<double, 6>& o) { return normalized(cross(row_cosine(o), col_cosine(o))); }

/// Slice spacing of a slice without neighbours: SpacingBetweenSlices, else SliceThickness, else 1.
double lone_slice_spacing(const FrameInfo& g) {
  if (g.spacing_between_slices && *g.spacing_between_slices > 0) return *g.spacing_between_slices;
  if (g.slice_thickness && *g.slice_thickness > 0) return *g.slice_thickness;
  return 1.0;
}

Result<Header> parse_header(const fs::path& file, DcmFileFormat& ff) {
  DcmDataset& ds = *ff.getDataset();
  Header h;
  h.file = file;
  h.series_uid = get_string(ds, DCM_SeriesInstanceUID).value_or("");
  h.modality = get_string(ds, DCM_Modality).value_or("");
  h.sop_class_uid = get_string(ds, DCM_SOPClassUID).value_or("");
  h.photometric = get_string(ds, DCM_PhotometricInterpretation).value_or("");
  if (auto v = get_integer(ds, DCM_Rows)) h.rows = *v;
  if (auto v = get_integer(ds, DCM_Columns)) h.columns = *v;
  h.samples = get_integer(ds, DCM_SamplesPerPixel).value_or(1);
  h.bits_allocated = get_integer(ds, DCM_BitsAllocated).value_or(16);
  if (ds.tagExists(DCM_NumberOfFrames)) {
    auto n = get_integer(ds, DCM_NumberOfFrames);
    if (!n || *n < 1)
      return corrupt_data(file.string() + ": " + tag_name(DCM_NumberOfFrames) +
                          ": expected a positive integer, got \"" +
                          get_string(ds, DCM_NumberOfFrames).value_or("") + "\"");
    h.frames = *n;
  }
  h.has_pixel_data = ds.tagExists(DCM_PixelData);

  FrameInfo base;
  read_plain_tags(ds, base);
  if (DcmItem* shared = sequence_item(ds, DCM_SharedFunctionalGroupsSequence))
    read_functional_groups(*shared, base);
  h.frame_info.assign(static_cast<std::size_t>(h.frames), base);
  bool per_frame_positions = false;
  DcmSequenceOfItems* per_frame = nullptr;
  if (ds.findAndGetSequence(DCM_PerFrameFunctionalGroupsSequence, per_frame).good() && per_frame) {
    if (per_frame->card() != static_cast<unsigned long>(h.frames))
      return corrupt_data(file.string() + ": " + tag_name(DCM_PerFrameFunctionalGroupsSequence) +
                          ": expected " + std::to_string(h.frames) + " items (NumberOfFrames), got " +
                          std::to_string(per_frame->card()));
    for (long f = 0; f < h.frames; ++f) {
      DcmItem* it = per_frame->getItem(static_cast<unsigned long>(f));
      if (!it) continue;
      std::optional<Vec3> before = h.frame_info[f].position;
      h.frame_info[f].position.reset();
      read_functional_groups(*it, h.frame_info[f]);
      if (h.frame_info[f].position)
        per_frame_positions = true;
      else
        h.frame_info[f].position = before;
    }
  }
  // Classic multi-frame (RT Dose, NM, ...): one top-level position for the first frame, the
  // others along the slice normal at GridFrameOffsetVector or a constant spacing.
  if (h.frames > 1 && !per_frame_positions && base.position && base.orientation) {
    Vec3 n = slice_normal(*base.orientation);
    std::vector<double> offsets(static_cast<std::size_t>(h.frames));
    if (value_count(ds, DCM_GridFrameOffsetVector) == static_cast<unsigned long>(h.frames)) {
      for (long f = 0; f < h.frames; ++f) {
        auto v = get_double(ds, DCM_GridFrameOffsetVector, static_cast<unsigned long>(f));
        if (!v)
          return corrupt_data(file.string() + ": " + tag_name(DCM_GridFrameOffsetVector) + ": value " +
                              std::to_string(f + 1) + " is not a number");
        offsets[f] = *v;
      }
      // A first offset that is not zero means the offsets are absolute (PS3.3 C.8.8.3.2).
      double first = offsets[0];
      for (double& o : offsets) o -= first;
    } else {
      double dz = lone_slice_spacing(base);
      for (long f = 0; f < h.frames; ++f) offsets[f] = dz * static_cast<double>(f);
    }
    for (long f = 0; f < h.frames; ++f) h.frame_info[f].position = add(*base.position, scale(n, offsets[f]));
  }
  return h;
}

std::string slice_name(const std::vector<Header>& hs, const Slice& s) {
  const Header& h = hs[s.file];
  if (h.frames > 1) return h.file.string() + " frame " + std::to_string(s.frame + 1);
  return h.file.string();
}

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

bool same_orientation(const std::array<double, 6>& a, const std::array<double, 6>& b) {
  for (int i = 0; i < 6; ++i)
    if (std::abs(a[i] - b[i]) > 1e-4) return false;
  return true;
}

/// Orders the slices along the normal and computes the geometry; fills z_of[file][frame].
Result<Geometry> assemble_geometry(const std::vector<Header>& hs, std::vector<Slice>& slices) {
  Geometry g;
  const FrameInfo& first = *slices.front().info;
  if (first.pixel_spacing) {
    if ((*first.pixel_spacing)[0] <= 0 || (*first.pixel_spacing)[1] <= 0) {
      // Radiographs write 0\0 (RG1_*.dcm); GDCM and SimpleITK then use 1 mm, as segflow does.
      log::warn(hs[slices.front().file].file.string() + ": " + tag_name(DCM_PixelSpacing) + ": " +
                format_numbers(first.pixel_spacing->data(), 2) + " is not a spacing; using 1 mm");
    } else {
      g.spacing[0] = (*first.pixel_spacing)[1];  // column spacing: x
      g.spacing[1] = (*first.pixel_spacing)[0];  // row spacing: y
    }
  }
  for (const Slice& s : slices) {
    const auto& ps = s.info->pixel_spacing;
    bool same = ps.has_value() == first.pixel_spacing.has_value() &&
                (!ps || (std::abs((*ps)[0] - (*first.pixel_spacing)[0]) <= 1e-4 * (*ps)[0] &&
                         std::abs((*ps)[1] - (*first.pixel_spacing)[1]) <= 1e-4 * (*ps)[1]));
    if (!same)
      return corrupt_data(slice_name(hs, s) + ": " + tag_name(DCM_PixelSpacing) + ": expected " +
                          (first.pixel_spacing ? format_numbers(first.pixel_spacing->data(), 2) : "none") +
                          " as in " + slice_name(hs, slices.front()) + ", got " +
                          (ps ? format_numbers(ps->data(), 2) : "none") +
                          " (mixed pixel spacing in one series)");
  }

  auto check_orientation = [&](const Slice& s) -> Status {
    const auto& o = *s.info->orientation;
    Vec3 r{o[0], o[1], o[2]}, c{o[3], o[4], o[5]};
    if (std::abs(norm(r) - 1) > 1e-2 || std::abs(norm(c) - 1) > 1e-2 || std::abs(dot(r, c)) > 1e-2)
      return corrupt_data(slice_name(hs, s) + ": " + tag_name(DCM_ImageOrientationPatient) +
                          ": expected two orthogonal unit vectors, got " + format_numbers(o.data(), 6));
    return Status::ok();
  };
  auto set_direction = [&](const std::array<double, 6>& o) {
    Vec3 r = row_cosine(o), c = col_cosine(o), n = slice_normal(o);
    for (int i = 0; i < 3; ++i) {
      g.direction[i * 3 + 0] = r[i];
      g.direction[i * 3 + 1] = c[i];
      g.direction[i * 3 + 2] = n[i];
    }
  };

  if (slices.size() == 1) {
    if (first.orientation) {
      SEGFLOW_RETURN_IF_ERROR(check_orientation(slices.front()));
      set_direction(*first.orientation);
    }
    if (first.position) g.origin = *first.position;
    g.spacing[2] = lone_slice_spacing(first);
    return g;
  }

  bool all = true, any = false;
  const Slice* missing = nullptr;
  for (const Slice& s : slices) {
    bool has = s.info->position && s.info->orientation;
    any = any || has;
    if (!has && !missing) missing = &s;
    all = all && has;
  }
  if (!all) {
    if (hs.size() == 1 && !any) {
      // A multi-frame file without any position (secondary capture): frames in file order.
      g.spacing[2] = lone_slice_spacing(first);
      return g;
    }
    const DcmTagKey tag = missing->info->position ? DCM_ImageOrientationPatient : DCM_ImagePositionPatient;
    return corrupt_data(slice_name(hs, *missing) + ": " + tag_name(tag) +
                        ": required tag is missing (needed to order " + std::to_string(slices.size()) +
                        " slices)");
  }

  SEGFLOW_RETURN_IF_ERROR(check_orientation(slices.front()));
  const auto& o0 = *first.orientation;
  for (const Slice& s : slices)
    if (!same_orientation(*s.info->orientation, o0))
      return corrupt_data(slice_name(hs, s) + ": " + tag_name(DCM_ImageOrientationPatient) + ": expected " +
                          format_numbers(o0.data(), 6) + " as in " + slice_name(hs, slices.front()) +
                          ", got " + format_numbers(s.info->orientation->data(), 6) +
                          " (mixed orientations in one series)");
  const Vec3 n = slice_normal(o0);
  std::vector<double> proj(slices.size());
  for (std::size_t i = 0; i < slices.size(); ++i) proj[i] = dot(*slices[i].info->position, n);
  std::vector<std::size_t> idx(slices.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return proj[a] < proj[b]; });
  std::vector<Slice> sorted;
  std::vector<double> s;
  for (std::size_t i : idx) {
    sorted.push_back(slices[i]);
    s.push_back(proj[i]);
  }
  std::vector<double> gaps;
  for (std::size_t k = 0; k + 1 < sorted.size(); ++k) {
    double d = s[k + 1] - s[k];
    if (d < 1e-3) {
      const Vec3& p = *sorted[k + 1].info->position;
      return corrupt_data(slice_name(hs, sorted[k + 1]) + ": " + tag_name(DCM_ImagePositionPatient) +
                          ": duplicate slice position " + format_numbers(p.data(), 3) + ", also in " +
                          slice_name(hs, sorted[k]));
    }
    gaps.push_back(d);
  }
  std::vector<double> sorted_gaps = gaps;
  std::nth_element(sorted_gaps.begin(), sorted_gaps.begin() + sorted_gaps.size() / 2, sorted_gaps.end());
  const double median = sorted_gaps[sorted_gaps.size() / 2];
  for (std::size_t k = 0; k < gaps.size(); ++k) {
    if (std::abs(gaps[k] - median) > 0.01 * median) {
      std::ostringstream os;
      os << slice_name(hs, sorted[k + 1]) << ": " << tag_name(DCM_ImagePositionPatient)
         << ": expected the slice " << median << " mm after " << slice_name(hs, sorted[k])
         << " along the slice normal, got " << gaps[k] << " mm ("
         << (gaps[k] > median ? "a slice is missing: gap in the series" : "uneven slice spacing") << ")";
      return corrupt_data(os.str());
    }
  }
  set_direction(o0);
  g.origin = *sorted.front().info->position;
  g.spacing[2] = (s.back() - s.front()) / static_cast<double>(sorted.size() - 1);
  slices = std::move(sorted);
  return g;
}

Result<Image> read_series_impl(const std::vector<fs::path>& files) {
  ensure_dcmtk_ready();
  if (files.empty()) return invalid_argument("read_dicom_series: expected at least one file, got none");
  std::vector<std::unique_ptr<DcmFileFormat>> ffs;
  std::vector<Header> hs;
  ffs.reserve(files.size());
  hs.reserve(files.size());
  for (const fs::path& f : files) {
    SEGFLOW_ASSIGN_OR_RETURN(auto ff, load_file(f));
    SEGFLOW_RETURN_IF_ERROR(check_transfer_syntax(f, *ff));
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
    if (files.size() > 1 && h.frames > 1)
      return unsupported(f.string() + ": " + tag_name(DCM_NumberOfFrames) +
                         ": expected 1 in a series of several files, got " + std::to_string(h.frames));
    if (!hs.empty()) {
      const Header& h0 = hs.front();
      if (*h.rows != *h0.rows || *h.columns != *h0.columns)
        return corrupt_data(f.string() + ": Rows x Columns: expected " + std::to_string(*h0.rows) + " x " +
                            std::to_string(*h0.columns) + " as in " + h0.file.string() + ", got " +
                            std::to_string(*h.rows) + " x " + std::to_string(*h.columns) +
                            " (mixed image sizes in one series)");
      if (h.samples != h0.samples)
        return corrupt_data(f.string() + ": " + tag_name(DCM_SamplesPerPixel) + ": expected " +
                            std::to_string(h0.samples) + " as in " + h0.file.string() + ", got " +
                            std::to_string(h.samples));
    }
    ffs.push_back(std::move(ff));
    hs.push_back(std::move(h));
  }

  std::vector<Slice> slices;
  for (std::size_t i = 0; i < hs.size(); ++i)
    for (long f = 0; f < hs[i].frames; ++f)
      slices.push_back({i, f, &hs[i].frame_info[static_cast<std::size_t>(f)]});
  SEGFLOW_ASSIGN_OR_RETURN(Geometry geometry, assemble_geometry(hs, slices));

  std::vector<std::vector<std::int64_t>> z_of(hs.size());
  for (std::size_t i = 0; i < hs.size(); ++i) z_of[i].assign(static_cast<std::size_t>(hs[i].frames), -1);
  for (std::size_t z = 0; z < slices.size(); ++z)
    z_of[slices[z].file][static_cast<std::size_t>(slices[z].frame)] = static_cast<std::int64_t>(z);

  const Header& h0 = hs.front();
  const std::int64_t C = h0.samples, Z = static_cast<std::int64_t>(slices.size()), Y = *h0.rows,
                     X = *h0.columns;
  at::Tensor voxels = torch::empty({C, Z, Y, X}, torch::kFloat32);
  float* out = voxels.data_ptr<float>();
  for (std::size_t i = 0; i < hs.size(); ++i) {
    SEGFLOW_RETURN_IF_ERROR(decode_file(*ffs[i], hs[i], z_of[i], out, Z));
    ffs[i].reset();  // frees the decoded pixel data of this file
  }

  Image img;
  img.voxels = std::move(voxels);
  img.geometry = geometry;
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
      auto uid = get_string(ds, DCM_SeriesInstanceUID);
      if (!uid) {
        std::string media;
        if ((*ff)->getMetaInfo())
          media = get_string(*(*ff)->getMetaInfo(), DCM_MediaStorageSOPClassUID).value_or("");
        skip(p, p.string() + ": " + tag_name(DCM_SeriesInstanceUID) + ": required tag is missing" +
                    (media == UID_MediaStorageDirectoryStorage ? " (a DICOMDIR, not an image)" : ""));
        continue;
      }
      auto [it, inserted] = index.emplace(*uid, series.size());
      if (inserted) {
        DicomSeriesInfo s;
        s.series_uid = *uid;
        s.modality = get_string(ds, DCM_Modality).value_or("");
        s.sop_class_uid = get_string(ds, DCM_SOPClassUID).value_or("");
        series.push_back(std::move(s));
      }
      series[it->second].files.push_back(p);
    }
    return series;
  } catch (const c10::Error& e) {
    return internal_error(dir.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(dir.string() + ": " + e.what());
  }
}

Result<Image> read_dicom_series(const std::vector<fs::path>& files) {
  const std::string where = files.empty() ? std::string("read_dicom_series") : files.front().string();
  try {
    return read_series_impl(files);
  } catch (const c10::Error& e) {
    return internal_error(where + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(where + ": " + e.what());
  }
}

Result<Image> read_dicom(const fs::path& file_or_dir) {
  std::error_code ec;
  if (!fs::exists(file_or_dir, ec)) return not_found(file_or_dir.string() + ": no such file or folder");
  if (!fs::is_directory(file_or_dir, ec)) {
    if (is_dicom_seg_file(file_or_dir)) return read_dicom_seg(file_or_dir);
    return read_dicom_series({file_or_dir});
  }
  std::vector<SkippedFile> skipped;
  SEGFLOW_ASSIGN_OR_RETURN(auto all, scan_dicom_folder(file_or_dir, &skipped));
  std::vector<DicomSeriesInfo> images;
  for (auto& s : all)
    if (!is_non_image(s)) images.push_back(std::move(s));
  if (images.empty()) {
    std::string msg = file_or_dir.string() + ": expected one DICOM image series, found none";
    if (!skipped.empty())
      msg += " (" + std::to_string(skipped.size()) + " files skipped; first: " + skipped.front().reason + ")";
    return not_found(msg);
  }
  if (images.size() > 1) {
    std::string msg = file_or_dir.string() + ": expected one DICOM image series, got " +
                      std::to_string(images.size()) + ":";
    for (std::size_t i = 0; i < images.size(); ++i)
      msg += std::string(i ? "," : "") + " " + images[i].series_uid + " (" + images[i].modality + ", " +
             std::to_string(images[i].files.size()) + (images[i].files.size() == 1 ? " file)" : " files)");
    return invalid_argument(msg + "; read one with read_dicom_series");
  }
  SEGFLOW_ASSIGN_OR_RETURN(Image img, read_dicom_series(images.front().files));
  img.source = file_or_dir;
  return img;
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
