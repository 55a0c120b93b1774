// DICOM SEG on DCMTK's dcmseg: a label map (1, Z, Y, X) as a binary segmentation with one
// segment per label value (segment number = label value), and back onto a reference grid.
#include <torch/torch.h>

#include "pipeline/io/dicom.hpp"

#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmfg/fgderimg.h>
#include <dcmtk/dcmfg/fgfracon.h>
#include <dcmtk/dcmfg/fginterface.h>
#include <dcmtk/dcmfg/fgpixmsr.h>
#include <dcmtk/dcmfg/fgplanor.h>
#include <dcmtk/dcmfg/fgplanpo.h>
#include <dcmtk/dcmfg/fgseg.h>
#include <dcmtk/dcmiod/iodmacro.h>
#include <dcmtk/dcmiod/iodreferences.h>
#include <dcmtk/dcmseg/segdoc.h>
#include <dcmtk/dcmseg/segment.h>
#include <dcmtk/dcmseg/segutils.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "pipeline/io/detail/dicom_common.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;
using namespace detail;

namespace {

constexpr int kMaxLabel = 255;  // read_dicom_seg returns uint8

#define SEGFLOW_DCM(call, what)                                                               \
  do {                                                                                        \
    OFCondition _c = (call);                                                                  \
    if (_c.bad()) return internal_error(where + ": " + std::string(what) + ": " + _c.text()); \
  } while (0)

/// The source image of one slice of the label grid.
struct SourceRef {
  std::string sop_class, sop_instance;
  fs::path file;
};

/// A dataset's UID, else the meta header's copy (anonymisers blank the dataset's and leave
/// MediaStorageSOPClassUID/InstanceUID), as the reader takes them (parse_header).
std::string uid_or_meta(DcmFileFormat& ff, const DcmTagKey& tag, const DcmTagKey& meta_tag) {
  std::string v = get_string(*ff.getDataset(), tag).value_or("");
  if (v.empty() && ff.getMetaInfo()) v = get_string(*ff.getMetaInfo(), meta_tag).value_or("");
  return v;
}

/// "2.25." + a 128-bit FNV-1a hash of `text` in decimal: a UID (UUID-derived form, at most
/// 44 characters) that is the same every time for the same text.
std::string derived_uid(const std::string& text) {
  using u128 = unsigned __int128;
  u128 h = (static_cast<u128>(0x6c62272e07bb0142ULL) << 64) | 0x62b821756295c58dULL;
  const u128 prime = (static_cast<u128>(1) << 88) | 0x13BULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= prime;
  }
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(h % 10)));
    h /= 10;
  } while (h != 0);
  return "2.25." + digits;
}

/// Study, series and frame of reference of the source series: the files' own UIDs, else
/// (anonymised away) UIDs derived from what identifies the series: its FrameOfReferenceUID
/// and its SOP instance UIDs.
struct SourceIdentity {
  std::string patient_id, study_uid, series_uid, frame_of_reference_uid;
};

SourceIdentity source_identity(DcmDataset& first, const std::vector<SourceRef>& sources) {
  SourceIdentity id;
  id.patient_id = get_string(first, DCM_PatientID).value_or("");
  id.study_uid = get_string(first, DCM_StudyInstanceUID).value_or("");
  id.series_uid = get_string(first, DCM_SeriesInstanceUID).value_or("");
  id.frame_of_reference_uid = get_string(first, DCM_FrameOfReferenceUID).value_or("");
  std::vector<std::string> instances;
  for (const auto& r : sources) instances.push_back(r.sop_instance);
  std::sort(instances.begin(), instances.end());
  std::string key = id.frame_of_reference_uid;
  for (const auto& i : instances) key += "\\" + i;
  if (id.study_uid.empty()) id.study_uid = derived_uid("segflow study of " + key);
  if (id.series_uid.empty()) id.series_uid = derived_uid("segflow series of " + key);
  return id;
}

/// The label map as (Z, Y, X) uint8, checked: (1, Z, Y, X), at most 65535 rows and columns,
/// integer values in 0..kMaxLabel, at least one > 0.
Result<at::Tensor> checked_label_map(const std::string& where, const Image& labels) {
  const at::Tensor& t = labels.voxels;
  if (!t.defined() || t.dim() != 4 || t.size(0) != 1)
    return invalid_argument(where + ": labels: expected a (1, Z, Y, X) label map, got " +
                            (t.defined() ? std::to_string(t.dim()) + " dimensions" : std::string("none")));
  const std::int64_t Z = t.size(1), Y = t.size(2), X = t.size(3);
  if (Y > 65535 || X > 65535 || Z < 1)
    return invalid_argument(where + ": labels: expected 1..65535 rows and columns, got " + std::to_string(Y) +
                            " x " + std::to_string(X));
  at::Tensor lab64 = t.select(0, 0).to(torch::kCPU, torch::kFloat64).contiguous();
  if (!torch::equal(lab64, lab64.round()) || lab64.min().item<double>() < 0 ||
      lab64.max().item<double>() > kMaxLabel)
    return invalid_argument(where + ": labels: expected integer label values in 0.." +
                            std::to_string(kMaxLabel) + ", got values in [" +
                            std::to_string(lab64.min().item<double>()) + ", " +
                            std::to_string(lab64.max().item<double>()) + "]");
  at::Tensor lab = lab64.to(torch::kUInt8).contiguous();
  if (lab.max().item<int>() == 0)
    return Status(ErrorCode::no_foreground,
                  where + ": labels: expected at least one label value > 0, got none");
  return lab;
}

/// The source images of the label grid: by slice (empty where the series has none) and
/// every file in the order given.
struct SourceSlices {
  std::vector<std::optional<SourceRef>> by_slice;
  std::vector<SourceRef> all;
};

/// Maps each source file to the slice of the label grid (geometry `g`, Z slices of Y x X)
/// at its position; a file off the grid or of another size is an error.
Result<SourceSlices> map_sources(const DicomSeriesInfo& series, const Geometry& g, std::int64_t Z,
                                 std::int64_t Y, std::int64_t X) {
  const Vec3 row = column(g.direction, 0), col = column(g.direction, 1), axis = column(g.direction, 2);
  SourceSlices out;
  out.by_slice.resize(static_cast<std::size_t>(Z));
  for (const fs::path& f : series.files) {
    SEGFLOW_ASSIGN_OR_RETURN(auto ff, load_file(f));
    DcmDataset& ds = *ff->getDataset();
    auto pos = get_doubles<3>(ds, DCM_ImagePositionPatient);
    if (!pos)
      return corrupt_data(f.string() + ": " + tag_name(DCM_ImagePositionPatient) +
                          ": required tag is missing");
    auto rows = get_integer(ds, DCM_Rows), cols = get_integer(ds, DCM_Columns);
    if (!rows || !cols || *rows != Y || *cols != X)
      return invalid_argument(f.string() + ": Rows x Columns: expected " + std::to_string(Y) + " x " +
                              std::to_string(X) + " like the label map, got " +
                              std::to_string(rows.value_or(0)) + " x " + std::to_string(cols.value_or(0)));
    Vec3 d = sub(Vec3{(*pos)[0], (*pos)[1], (*pos)[2]}, g.origin);
    double k = dot(d, axis) / g.spacing[2];
    long kz = std::lround(k);
    if (std::abs(k - static_cast<double>(kz)) > 1e-3 || std::abs(dot(d, row)) > 1e-3 * g.spacing[0] ||
        std::abs(dot(d, col)) > 1e-3 * g.spacing[1] || kz < 0 || kz >= Z)
      return invalid_argument(f.string() + ": " + tag_name(DCM_ImagePositionPatient) + ": " +
                              format_numbers(pos->data(), 3) + " is not a slice of the label map's grid (" +
                              describe(g) + ")");
    SourceRef r;
    r.sop_class = uid_or_meta(*ff, DCM_SOPClassUID, DCM_MediaStorageSOPClassUID);
    r.sop_instance = uid_or_meta(*ff, DCM_SOPInstanceUID, DCM_MediaStorageSOPInstanceUID);
    r.file = f;
    if (r.sop_class.empty() || r.sop_instance.empty())
      return corrupt_data(f.string() + ": SOPClassUID/SOPInstanceUID: required tags are missing " +
                          "(also in the file meta header)");
    out.by_slice[static_cast<std::size_t>(kz)] = r;
    out.all.push_back(r);
  }
  return out;
}

/// An empty binary SEG of Y x X frames imported from the first source file, in the study of
/// its source series (derived when anonymised away) and sharing its frame of reference
/// (imported when the source has one).
Result<std::unique_ptr<DcmSegmentation>> create_seg(const std::string& where, const DicomSeriesInfo& series,
                                                    const SourceIdentity& source, std::int64_t Y,
                                                    std::int64_t X) {
  IODGeneralEquipmentModule::EquipmentInfo equipment("segflow", "segflow", "0", "0.1");
  ContentIdentificationMacro content("1", "SEGFLOW", "segflow label map", "segflow");
  DcmSegmentation* raw = nullptr;
  SEGFLOW_DCM(DcmSegmentation::createBinarySegmentation(raw, static_cast<Uint16>(Y), static_cast<Uint16>(X),
                                                        equipment, content),
              "createBinarySegmentation");
  std::unique_ptr<DcmSegmentation> seg(raw);
  SEGFLOW_DCM(seg->importFromSourceImage(OFString(series.files.front().c_str())),
              "importFromSourceImage(" + series.files.front().string() + ")");
  SEGFLOW_DCM(seg->getStudy().setStudyInstanceUID(source.study_uid.c_str()), "StudyInstanceUID");
  SEGFLOW_DCM(seg->getSeries().setSeriesInstanceUID(generate_uid(SITE_SERIES_UID_ROOT).c_str()),
              "SeriesInstanceUID");
  SEGFLOW_DCM(seg->getSeries().setSeriesDescription("segflow labels"), "SeriesDescription");
  SEGFLOW_DCM(seg->getSegmentationSeriesModule().setSeriesNumber("100"), "SeriesNumber");
  return seg;
}

/// Segments 1..max_label, so that segment number == label value; values absent from the
/// map get a segment too (with one empty frame, add_frames).
Status add_segments(const std::string& where, DcmSegmentation& seg, int max_label) {
  const CodeSequenceMacro category("85756007", "SCT", "Tissue");
  const CodeSequenceMacro type("85756007", "SCT", "Tissue");
  for (int v = 1; v <= max_label; ++v) {
    DcmSegment* segment = nullptr;
    SEGFLOW_DCM(DcmSegment::create(segment, ("label_" + std::to_string(v)).c_str(), category, type,
                                   DcmSegTypes::SAT_AUTOMATIC, "segflow"),
                "DcmSegment::create");
    Uint16 number = 0;
    OFCondition c = seg.addSegment(segment, number);
    if (c.bad()) {
      delete segment;
      return internal_error(where + ": addSegment: " + c.text());
    }
    if (number != v)
      return internal_error(where + ": addSegment: expected segment number " + std::to_string(v) + ", got " +
                            std::to_string(number));
  }
  return Status::ok();
}

/// The groups every frame shares (pixel measures, orientation) and the two dimension
/// indices (segment number, position).
Status add_shared_groups(const std::string& where, DcmSegmentation& seg, const Geometry& g) {
  const Vec3 row = column(g.direction, 0), col = column(g.direction, 1);
  FGPixelMeasures measures;
  SEGFLOW_DCM(measures.setPixelSpacing((format_ds(g.spacing[1]) + "\\" + format_ds(g.spacing[0])).c_str()),
              "PixelSpacing");
  SEGFLOW_DCM(measures.setSliceThickness(format_ds(g.spacing[2]).c_str()), "SliceThickness");
  SEGFLOW_DCM(measures.setSpacingBetweenSlices(format_ds(g.spacing[2]).c_str()), "SpacingBetweenSlices");
  SEGFLOW_DCM(seg.addForAllFrames(measures), "addForAllFrames(PixelMeasures)");
  FGPlaneOrientationPatient orientation;
  SEGFLOW_DCM(orientation.setImageOrientationPatient(format_ds(row[0]).c_str(), format_ds(row[1]).c_str(),
                                                     format_ds(row[2]).c_str(), format_ds(col[0]).c_str(),
                                                     format_ds(col[1]).c_str(), format_ds(col[2]).c_str()),
              "ImageOrientationPatient");
  SEGFLOW_DCM(seg.addForAllFrames(orientation), "addForAllFrames(PlaneOrientation)");

  const std::string dim_uid = generate_uid(SITE_INSTANCE_UID_ROOT);
  IODMultiframeDimensionModule& dims = seg.getDimensions();
  SEGFLOW_DCM(dims.addDimensionIndex(DCM_ReferencedSegmentNumber, dim_uid.c_str(),
                                     DCM_SegmentIdentificationSequence, "ReferencedSegmentNumber"),
              "addDimensionIndex(ReferencedSegmentNumber)");
  SEGFLOW_DCM(dims.addDimensionIndex(DCM_ImagePositionPatient, dim_uid.c_str(), DCM_PlanePositionSequence,
                                     "ImagePositionPatient"),
              "addDimensionIndex(ImagePositionPatient)");
  return Status::ok();
}

/// One frame: `mask` (Y x X, 0/1) of segment v at slice z, referencing that slice's source.
Status add_frame(const std::string& where, DcmSegmentation& seg, std::vector<Uint8>& mask, int v,
                 std::int64_t z, const std::optional<SourceRef>& ref, const Geometry& g,
                 const std::string& series_uid) {
  if (!ref)
    return invalid_argument(where + ": series: expected a source image at slice " + std::to_string(z) +
                            " of the label map, the series " + series_uid + " has none there");
  const Vec3 p = add(g.origin, scale(column(g.direction, 2), g.spacing[2] * static_cast<double>(z)));
  FGPlanePosPatient position;
  SEGFLOW_DCM(position.setImagePositionPatient(format_ds(p[0]).c_str(), format_ds(p[1]).c_str(),
                                               format_ds(p[2]).c_str()),
              "ImagePositionPatient");
  FGFrameContent frame_content;
  SEGFLOW_DCM(frame_content.setDimensionIndexValues(static_cast<Uint32>(v), 0), "DimensionIndexValues");
  SEGFLOW_DCM(frame_content.setDimensionIndexValues(static_cast<Uint32>(z + 1), 1), "DimensionIndexValues");
  OFVector<ImageSOPInstanceReferenceMacro> sources(1);
  SEGFLOW_DCM(sources[0].setReferencedSOPClassUID(ref->sop_class.c_str()), "ReferencedSOPClassUID");
  SEGFLOW_DCM(sources[0].setReferencedSOPInstanceUID(ref->sop_instance.c_str()), "ReferencedSOPInstanceUID");
  std::unique_ptr<FGDerivationImage> derivation(
      DcmSegmentation::createDerivationImageFG(sources, "segflow label map"));
  if (!derivation) return internal_error(where + ": createDerivationImageFG failed");
  OFVector<FGBase*> per_frame;
  per_frame.push_back(&position);
  per_frame.push_back(&frame_content);
  per_frame.push_back(derivation.get());
  SEGFLOW_DCM(seg.addFrame(mask.data(), static_cast<Uint16>(v), per_frame),
              "addFrame(segment " + std::to_string(v) + ", slice " + std::to_string(z) + ")");
  return Status::ok();
}

/// A frame per segment and slice where the segment is present; a segment absent from the
/// map gets one empty frame.
Status add_frames(const std::string& where, DcmSegmentation& seg, const at::Tensor& lab, int max_label,
                  const SourceSlices& sources, const Geometry& g, const std::string& series_uid) {
  const std::int64_t Z = lab.size(0);
  const std::uint8_t* data = lab.data_ptr<std::uint8_t>();
  const std::int64_t plane = lab.size(1) * lab.size(2);
  std::vector<Uint8> mask(static_cast<std::size_t>(plane));
  const auto& refs = sources.by_slice;
  for (int v = 1; v <= max_label; ++v) {
    bool added = false;
    for (std::int64_t z = 0; z < Z; ++z) {
      const std::uint8_t* s = data + z * plane;
      bool any = false;
      for (std::int64_t i = 0; i < plane; ++i) {
        mask[static_cast<std::size_t>(i)] = s[i] == v ? 1 : 0;
        any = any || s[i] == v;
      }
      if (!any) continue;
      SEGFLOW_RETURN_IF_ERROR(
          add_frame(where, seg, mask, v, z, refs[static_cast<std::size_t>(z)], g, series_uid));
      added = true;
    }
    if (!added) {
      // dcmseg wants at least as many frames as segments: a value absent from the map gets
      // one empty frame on the first slice that has a source image.
      std::fill(mask.begin(), mask.end(), Uint8{0});
      std::int64_t z0 = 0;
      while (z0 + 1 < Z && !refs[static_cast<std::size_t>(z0)]) ++z0;
      SEGFLOW_RETURN_IF_ERROR(
          add_frame(where, seg, mask, v, z0, refs[static_cast<std::size_t>(z0)], g, series_uid));
    }
  }
  return Status::ok();
}

/// ReferencedSeriesSequence: every source instance, with the UIDs the frames use.
Status add_references(const std::string& where, DcmSegmentation& seg, const std::vector<SourceRef>& sources,
                      const SourceIdentity& source) {
  IODReferences references;
  for (const auto& r : sources) {
    auto* ref = new IODImageReference(source.patient_id.c_str(), source.study_uid.c_str(),
                                      source.series_uid.c_str(), r.sop_instance.c_str(), r.sop_class.c_str());
    ref->m_Level = IODReference::LEVEL_SERIES;
    if (!references.add(ref)) {
      delete ref;
      return internal_error(where + ": " + r.file.string() + ": cannot reference SOP instance \"" +
                            r.sop_instance + "\" of series " + source.series_uid);
    }
  }
  if (seg.getCommonInstanceReference().addReferences(references, source.study_uid.c_str()) != sources.size())
    return internal_error(where + ": ReferencedSeriesSequence: expected " + std::to_string(sources.size()) +
                          " referenced instances");
  return Status::ok();
}

Status write_seg_impl(const fs::path& file, const Image& labels, const DicomSeriesInfo& series) {
  ensure_dcmtk_ready();
  const std::string where = file.string();
  SEGFLOW_ASSIGN_OR_RETURN(const at::Tensor lab, checked_label_map(where, labels));
  if (series.files.empty())
    return invalid_argument(where + ": series: expected the files of the source series, got none");
  const int max_label = lab.max().item<int>();
  const std::int64_t Z = lab.size(0), Y = lab.size(1), X = lab.size(2);
  const Geometry& g = labels.geometry;
  SEGFLOW_ASSIGN_OR_RETURN(const SourceSlices sources, map_sources(series, g, Z, Y, X));
  SEGFLOW_ASSIGN_OR_RETURN(auto first_file, load_file(series.files.front()));
  const SourceIdentity source = source_identity(*first_file->getDataset(), sources.all);

  SEGFLOW_ASSIGN_OR_RETURN(std::unique_ptr<DcmSegmentation> seg, create_seg(where, series, source, Y, X));
  SEGFLOW_RETURN_IF_ERROR(add_segments(where, *seg, max_label));
  SEGFLOW_RETURN_IF_ERROR(add_shared_groups(where, *seg, g));
  SEGFLOW_RETURN_IF_ERROR(add_frames(where, *seg, lab, max_label, sources, g, series.series_uid));
  SEGFLOW_RETURN_IF_ERROR(add_references(where, *seg, sources.all, source));

  std::error_code ec;
  if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
  DcmFileFormat ff;
  SEGFLOW_DCM(seg->writeDataset(*ff.getDataset()), "writing the segmentation");
  return save_atomically(ff, file, EXS_LittleEndianExplicit);
}

/// Column-major `row\col` orientation of a frame, from its per-frame or shared group.
std::optional<std::array<double, 6>> frame_orientation(FGInterface& fgs, Uint32 frame) {
  FGBase* fg = fgs.get(frame, DcmFGTypes::EFG_PLANEORIENTPATIENT);
  if (!fg) return std::nullopt;
  auto* o = static_cast<FGPlaneOrientationPatient*>(fg);
  std::array<double, 6> v{};
  Float64 a, b, c, d, e, f;
  if (o->getImageOrientationPatient(a, b, c, d, e, f).bad()) return std::nullopt;
  v = {a, b, c, d, e, f};
  return v;
}

/// A SEG file opened with dcmseg, after a plain read that gives clear errors for missing or
/// non-DICOM files and checks the SOP class; with the header values dcmseg does not expose.
struct OpenedSeg {
  std::unique_ptr<DcmSegmentation> seg;
  long max_fractional = 255;
  std::int64_t rows = 0, cols = 0;
};

Result<OpenedSeg> open_seg(const fs::path& file) {
  const std::string where = file.string();
  OpenedSeg out;
  {
    SEGFLOW_ASSIGN_OR_RETURN(auto probe, load_file(file));
    out.max_fractional = get_integer(*probe->getDataset(), DCM_MaximumFractionalValue).value_or(255);
    out.rows = get_integer(*probe->getDataset(), DCM_Rows).value_or(0);
    out.cols = get_integer(*probe->getDataset(), DCM_Columns).value_or(0);
    auto sop = get_string(*probe->getDataset(), DCM_SOPClassUID).value_or("");
    if (sop != UID_SegmentationStorage)
      return invalid_argument(where + ": " + tag_name(DCM_SOPClassUID) + ": expected Segmentation Storage (" +
                              UID_SegmentationStorage + "), got \"" + sop + "\"");
  }
  DcmSegmentation* raw = nullptr;
  OFCondition c = DcmSegmentation::loadFile(OFString(file.c_str()), raw);
  out.seg.reset(raw);
  if (c.bad() || !out.seg) return corrupt_data(where + ": cannot read DICOM SEG: " + c.text());
  return out;
}

/// The label map of an opened SEG on the grid of `reference`.
Result<Image> read_seg_frames(const fs::path& file, OpenedSeg& opened, const Image& reference) {
  const std::string where = file.string();
  const at::Tensor& rt = reference.voxels;
  if (!rt.defined() || rt.dim() != 4)
    return invalid_argument(where + ": reference: expected a (C, Z, Y, X) image, got none");
  const std::int64_t Z = rt.size(1), Y = rt.size(2), X = rt.size(3);
  const long max_fractional = opened.max_fractional;
  const Uint16 rows = static_cast<Uint16>(opened.rows), cols = static_cast<Uint16>(opened.cols);
  DcmSegmentation* seg = opened.seg.get();

  const bool fractional = seg->getSegmentationType() == DcmSegTypes::ST_FRACTIONAL;
  if (seg->getSegmentationType() != DcmSegTypes::ST_BINARY && !fractional)
    return unsupported(where + ": SegmentationType: expected BINARY or FRACTIONAL");
  if (rows != Y || cols != X)
    return invalid_argument(where + ": Rows x Columns: expected " + std::to_string(Y) + " x " +
                            std::to_string(X) + " like the reference image, got " + std::to_string(rows) +
                            " x " + std::to_string(cols));

  const Geometry& g = reference.geometry;
  const Vec3 row = column(g.direction, 0), col = column(g.direction, 1), axis = column(g.direction, 2);
  at::Tensor out = torch::zeros({1, Z, Y, X}, torch::kUInt8);
  std::uint8_t* dst = out.data_ptr<std::uint8_t>();
  const std::int64_t plane = Y * X;
  FGInterface& fgs = seg->getFunctionalGroups();
  const std::size_t n_frames = seg->getNumberOfFrames();
  for (std::size_t f = 0; f < n_frames; ++f) {
    const Uint32 fu = static_cast<Uint32>(f);
    const std::string frame_name = where + ": frame " + std::to_string(f + 1);
    auto* seg_fg = static_cast<FGSegmentation*>(fgs.get(fu, DcmFGTypes::EFG_SEGMENTATION));
    Uint16 number = 0;
    if (!seg_fg || seg_fg->getReferencedSegmentNumber(number).bad() || number == 0)
      return corrupt_data(frame_name + ": " + tag_name(DCM_ReferencedSegmentNumber) +
                          ": required tag is missing");
    if (number > kMaxLabel)
      return unsupported(frame_name + ": " + tag_name(DCM_ReferencedSegmentNumber) + ": expected at most " +
                         std::to_string(kMaxLabel) + " (uint8 label map), got " + std::to_string(number));
    auto* pos_fg = static_cast<FGPlanePosPatient*>(fgs.get(fu, DcmFGTypes::EFG_PLANEPOSPATIENT));
    Float64 px = 0, py = 0, pz = 0;
    if (!pos_fg || pos_fg->getImagePositionPatient(px, py, pz).bad())
      return corrupt_data(frame_name + ": PlanePositionSequence " + tag_name(DCM_ImagePositionPatient) +
                          ": required tag is missing");
    auto o = frame_orientation(fgs, fu);
    if (!o)
      return corrupt_data(frame_name + ": PlaneOrientationSequence " + tag_name(DCM_ImageOrientationPatient) +
                          ": required tag is missing");
    const double want[6] = {row[0], row[1], row[2], col[0], col[1], col[2]};
    for (int i = 0; i < 6; ++i)
      if (std::abs((*o)[i] - want[i]) > 1e-4)
        return invalid_argument(frame_name + ": " + tag_name(DCM_ImageOrientationPatient) + ": expected " +
                                format_numbers(want, 6) + " as in the reference image, got " +
                                format_numbers(o->data(), 6));
    const Vec3 p{px, py, pz};
    const Vec3 d = sub(p, g.origin);
    const double k = dot(d, axis) / g.spacing[2];
    const long kz = std::lround(k);
    if (std::abs(k - static_cast<double>(kz)) > 1e-3 || kz < 0 || kz >= Z ||
        std::abs(dot(d, row)) > 1e-3 * g.spacing[0] || std::abs(dot(d, col)) > 1e-3 * g.spacing[1])
      return invalid_argument(frame_name + ": " + tag_name(DCM_ImagePositionPatient) +
                              ": expected the position of a slice of the reference image (" + describe(g) +
                              "), got " + format_numbers(p.data(), 3));

    const DcmIODTypes::Frame* frame = seg->getFrame(f);
    if (!frame || !frame->pixData) return corrupt_data(frame_name + ": no pixel data");
    std::unique_ptr<DcmIODTypes::Frame> unpacked;
    const Uint8* bits = frame->pixData;
    if (!fractional && frame->length < static_cast<std::size_t>(plane)) {
      // dcmseg keeps binary frames packed (8 pixels a byte) in memory.
      unpacked.reset(DcmSegUtils::unpackBinaryFrame(frame, rows, cols));
      if (!unpacked) return corrupt_data(frame_name + ": cannot unpack the binary frame");
      bits = unpacked->pixData;
    }
    const std::size_t len = unpacked ? unpacked->length : frame->length;
    if (len < static_cast<std::size_t>(plane))
      return corrupt_data(frame_name + ": expected " + std::to_string(plane) + " pixels, got " +
                          std::to_string(len));
    std::uint8_t* slice = dst + kz * plane;
    // Fractional frames: a pixel belongs to the segment from half of the maximum up.
    const long threshold = fractional ? std::max(1L, (max_fractional + 1) / 2) : 1L;
    for (std::int64_t i = 0; i < plane; ++i)
      if (bits[i] >= threshold) slice[i] = static_cast<std::uint8_t>(number);
  }

  Image img;
  img.voxels = out;
  img.geometry = g;
  img.source = file;
  img.modality = "SEG";
  return img;
}

/// The grid the frames of a SEG lie on, when no source image is at hand: orientation and
/// pixel spacing from the functional groups, slices from the frame positions along the
/// normal (from the first to the last slice that has a frame).
Result<Image> seg_own_grid(const fs::path& file, OpenedSeg& opened) {
  const std::string where = file.string();
  const std::int64_t rows = opened.rows, cols = opened.cols;
  if (rows <= 0 || cols <= 0)
    return corrupt_data(where + ": " + tag_name(DCM_Rows) + " x " + tag_name(DCM_Columns) +
                        ": expected positive values, got " + std::to_string(rows) + " x " +
                        std::to_string(cols));
  DcmSegmentation* seg = opened.seg.get();
  const std::size_t n_frames = seg->getNumberOfFrames();
  if (n_frames == 0) return corrupt_data(where + ": NumberOfFrames: expected at least one frame, got 0");
  FGInterface& fgs = seg->getFunctionalGroups();
  auto o = frame_orientation(fgs, 0);
  if (!o)
    return corrupt_data(where + ": frame 1: PlaneOrientationSequence " +
                        tag_name(DCM_ImageOrientationPatient) + ": required tag is missing");
  const Vec3 row = normalized({(*o)[0], (*o)[1], (*o)[2]}), col = normalized({(*o)[3], (*o)[4], (*o)[5]});
  const Vec3 normal = normalized(cross(row, col));
  auto* pm = static_cast<FGPixelMeasures*>(fgs.get(0, DcmFGTypes::EFG_PIXELMEASURES));
  Float64 sy = 0, sx = 0, sz = 0;
  if (!pm || pm->getPixelSpacing(sy, 0).bad() || pm->getPixelSpacing(sx, 1).bad() || sx <= 0 || sy <= 0)
    return corrupt_data(where + ": PixelMeasuresSequence " + tag_name(DCM_PixelSpacing) +
                        ": required tag is missing or not positive");
  std::vector<std::pair<double, Vec3>> positions;  // (distance along the normal, position)
  for (std::size_t f = 0; f < n_frames; ++f) {
    auto* pos_fg =
        static_cast<FGPlanePosPatient*>(fgs.get(static_cast<Uint32>(f), DcmFGTypes::EFG_PLANEPOSPATIENT));
    Float64 px = 0, py = 0, pz = 0;
    if (!pos_fg || pos_fg->getImagePositionPatient(px, py, pz).bad())
      return corrupt_data(where + ": frame " + std::to_string(f + 1) + ": PlanePositionSequence " +
                          tag_name(DCM_ImagePositionPatient) + ": required tag is missing");
    const Vec3 p{px, py, pz};
    positions.emplace_back(dot(p, normal), p);
  }
  std::sort(positions.begin(), positions.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  if (pm->getSpacingBetweenSlices(sz, 0).bad() || sz <= 0) {
    sz = 0;  // the smallest step between distinct slice positions
    for (std::size_t i = 1; i < positions.size(); ++i) {
      const double step = positions[i].first - positions[i - 1].first;
      if (step > 1e-3 && (sz == 0 || step < sz)) sz = step;
    }
    if (sz == 0) sz = 1.0;
  }
  const double extent = positions.back().first - positions.front().first;
  const auto Z = static_cast<std::int64_t>(std::lround(extent / sz)) + 1;
  Image ref;
  ref.voxels = torch::zeros({1, Z, rows, cols}, torch::kUInt8);
  ref.geometry.spacing = {sx, sy, sz};
  ref.geometry.origin = positions.front().second;
  ref.geometry.direction = {row[0], col[0], normal[0], row[1], col[1], normal[1], row[2], col[2], normal[2]};
  return ref;
}

}  // namespace

Status write_dicom_seg(const fs::path& file, const Image& labels, const DicomSeriesInfo& series) {
  try {
    return write_seg_impl(file, labels, series);
  } catch (const c10::Error& e) {
    return internal_error(file.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(file.string() + ": " + e.what());
  }
}

Result<Image> read_dicom_seg(const fs::path& seg_file, const Image& reference) {
  try {
    ensure_dcmtk_ready();
    SEGFLOW_ASSIGN_OR_RETURN(OpenedSeg opened, open_seg(seg_file));
    return read_seg_frames(seg_file, opened, reference);
  } catch (const c10::Error& e) {
    return internal_error(seg_file.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(seg_file.string() + ": " + e.what());
  }
}

Result<Image> read_dicom_seg(const fs::path& seg_file) {
  try {
    ensure_dcmtk_ready();
    SEGFLOW_ASSIGN_OR_RETURN(OpenedSeg opened, open_seg(seg_file));
    SEGFLOW_ASSIGN_OR_RETURN(Image grid, seg_own_grid(seg_file, opened));
    return read_seg_frames(seg_file, opened, grid);
  } catch (const c10::Error& e) {
    return internal_error(seg_file.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(seg_file.string() + ": " + e.what());
  }
}

Result<std::vector<DicomSegment>> read_dicom_seg_segments(const fs::path& seg_file) {
  try {
    ensure_dcmtk_ready();
    const std::string where = seg_file.string();
    SEGFLOW_ASSIGN_OR_RETURN(auto ff, load_file(seg_file));  // pixel data stays on disk
    DcmDataset& ds = *ff->getDataset();
    const std::string sop = uid_or_meta(*ff, DCM_SOPClassUID, DCM_MediaStorageSOPClassUID);
    if (sop != UID_SegmentationStorage)
      return invalid_argument(where + ": " + tag_name(DCM_SOPClassUID) + ": expected Segmentation Storage (" +
                              UID_SegmentationStorage + "), got \"" + sop + "\"");
    DcmSequenceOfItems* seq = nullptr;
    if (ds.findAndGetSequence(DCM_SegmentSequence, seq).bad() || !seq || seq->card() == 0)
      return corrupt_data(where + ": " + tag_name(DCM_SegmentSequence) +
                          ": expected at least one segment, got none");
    std::vector<DicomSegment> out;
    std::map<long, std::size_t> seen;
    for (unsigned long i = 0; i < seq->card(); ++i) {
      DcmItem& item = *seq->getItem(i);
      const std::string at = where + ": " + tag_name(DCM_SegmentSequence) + " item " + std::to_string(i + 1);
      auto number = get_integer(item, DCM_SegmentNumber);
      if (!number) return corrupt_data(at + ": " + tag_name(DCM_SegmentNumber) + ": required tag is missing");
      if (*number < 1 || *number > 65535)
        return corrupt_data(at + ": " + tag_name(DCM_SegmentNumber) + ": expected 1..65535, got " +
                            std::to_string(*number));
      if (auto [it, inserted] = seen.emplace(*number, i); !inserted)
        return corrupt_data(at + ": " + tag_name(DCM_SegmentNumber) + ": expected each number once, got " +
                            std::to_string(*number) + " also in item " + std::to_string(it->second + 1));
      DicomSegment s;
      s.number = static_cast<int>(*number);
      s.label = get_string(item, DCM_SegmentLabel).value_or("");
      s.description = get_string(item, DCM_SegmentDescription).value_or("");
      s.algorithm_type = get_string(item, DCM_SegmentAlgorithmType).value_or("");
      if (DcmItem* c = sequence_item(item, DCM_SegmentedPropertyCategoryCodeSequence))
        s.category = get_string(*c, DCM_CodeMeaning).value_or("");
      if (DcmItem* t = sequence_item(item, DCM_SegmentedPropertyTypeCodeSequence))
        s.type = get_string(*t, DCM_CodeMeaning).value_or("");
      out.push_back(std::move(s));
    }
    return out;
  } catch (const std::exception& e) {
    return internal_error(seg_file.string() + ": " + e.what());
  }
}

std::vector<std::string> segment_class_names(const std::vector<DicomSegment>& segments) {
  std::vector<std::string> names;
  bool any = false;
  for (const auto& s : segments) {
    if (s.number < 1 || s.label.empty() || s.label == "label_" + std::to_string(s.number)) continue;
    if (names.size() <= static_cast<std::size_t>(s.number))
      names.resize(static_cast<std::size_t>(s.number) + 1);
    names[static_cast<std::size_t>(s.number)] = s.label;
    any = true;
  }
  if (!any) return {};
  names[0] = "background";  // no segment: what no segment covers
  return names;
}

bool is_dicom_seg_file(const fs::path& path) {
  try {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec) || !looks_like_dicom(path)) return false;
    auto ff = load_file(path);
    return ff.is_ok() &&
           get_string(*(*ff)->getDataset(), DCM_SOPClassUID).value_or("") == UID_SegmentationStorage;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace segflow::pipeline
