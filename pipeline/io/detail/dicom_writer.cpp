// write_dicom_series: a float HU volume as a CT (or MR / secondary capture) series, one file
// per slice, optionally RLE, JPEG-LS lossless or JPEG lossless (process 14 SV1) compressed.
#include <torch/torch.h>

#include "pipeline/io/dicom.hpp"

#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmdata/dcvrda.h>
#include <dcmtk/dcmdata/dcvrtm.h>
#include <dcmtk/dcmjpeg/djrplol.h>
#include <dcmtk/dcmjpls/djrparam.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "pipeline/io/detail/dicom_common.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;
using namespace detail;

namespace {

struct Codec {
  E_TransferSyntax xfer = EXS_LittleEndianExplicit;
  std::unique_ptr<DcmRepresentationParameter> params;
};

Codec codec_for(DicomCompression c) {
  Codec k;
  switch (c) {
    case DicomCompression::none:
      k.xfer = EXS_LittleEndianExplicit;
      break;
    case DicomCompression::rle:
      k.xfer = EXS_RLELossless;
      break;
    case DicomCompression::jpeg_ls:
      k.xfer = EXS_JPEGLSLossless;
      k.params = std::make_unique<DJLSRepresentationParameter>(0, OFTrue);
      break;
    case DicomCompression::jpeg_lossless:
      k.xfer = EXS_JPEGProcess14SV1;
      k.params = std::make_unique<DJ_RPLossless>(1, 0);
      break;
  }
  return k;
}

#define SEGFLOW_PUT(call)                                                                          \
  do {                                                                                             \
    OFCondition _c = (call);                                                                       \
    if (_c.bad()) return internal_error(std::string("DICOM writer: ") + #call + ": " + _c.text()); \
  } while (0)

Status put(DcmDataset& ds, const DcmTagKey& tag, const std::string& value) {
  OFCondition c = ds.putAndInsertOFStringArray(tag, value.c_str());
  if (c.bad()) return internal_error("DICOM writer: " + tag_name(tag) + " = \"" + value + "\": " + c.text());
  return Status::ok();
}

Status put_ds(DcmDataset& ds, const DcmTagKey& tag, const double* v, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += '\\';
    s += format_ds(v[i]);
  }
  return put(ds, tag, s);
}

/// A single-channel volume of at most 65535 rows and columns, positive spacing, an
/// orthonormal direction.
Status check_volume(const std::string& where, const Image& image) {
  const at::Tensor& t = image.voxels;
  if (!t.defined() || t.dim() != 4)
    return invalid_argument(where + ": voxels: expected a (1, Z, Y, X) tensor, got " +
                            (t.defined() ? std::to_string(t.dim()) + " dimensions" : std::string("none")));
  if (t.size(0) != 1)
    return invalid_argument(where + ": voxels: expected 1 channel, got " + std::to_string(t.size(0)));
  const std::int64_t Z = t.size(1), Y = t.size(2), X = t.size(3);
  if (Z < 1 || Y < 1 || X < 1 || Y > 65535 || X > 65535)
    return invalid_argument(where +
                            ": voxels: expected 1..65535 rows and columns and at least one slice, got " +
                            std::to_string(Z) + " x " + std::to_string(Y) + " x " + std::to_string(X));
  const Geometry& g = image.geometry;
  for (double s : g.spacing)
    if (!(s > 0) || !std::isfinite(s))
      return invalid_argument(where + ": geometry.spacing: expected 3 positive numbers, got " +
                              format_numbers(g.spacing.data(), 3));
  if (!direction_is_orthonormal(g.direction))
    return invalid_argument(where + ": geometry.direction: expected an orthonormal matrix, got " +
                            format_numbers(g.direction.data(), 9));
  return Status::ok();
}

/// What every slice of the series shares.
struct SeriesTags {
  std::string study_uid, series_uid, for_uid;  ///< for_uid: FrameOfReferenceUID
  const char* sop_class = UID_CTImageStorage;
  OFString date, time;
  Vec3 axis{}, normal{};
  double orientation[6] = {};
  double pixel_spacing[2] = {};  ///< row\column = y\x
  double intercept = 0;
};

SeriesTags series_tags(const Geometry& g, const DicomWriteOptions& opt, double intercept) {
  SeriesTags s;
  const Vec3 row = column(g.direction, 0), col = column(g.direction, 1);
  s.axis = column(g.direction, 2);
  s.normal = normalized(cross(row, col));
  s.study_uid = opt.study_uid.empty() ? generate_uid(SITE_STUDY_UID_ROOT) : opt.study_uid;
  s.series_uid = opt.series_uid.empty() ? generate_uid(SITE_SERIES_UID_ROOT) : opt.series_uid;
  s.for_uid = generate_uid(SITE_INSTANCE_UID_ROOT);
  s.sop_class = opt.modality == "MR"   ? UID_MRImageStorage
                : opt.modality == "CT" ? UID_CTImageStorage
                                       : UID_SecondaryCaptureImageStorage;
  DcmDate::getCurrentDate(s.date);
  DcmTime::getCurrentTime(s.time);
  for (int i = 0; i < 3; ++i) {
    s.orientation[i] = row[i];
    s.orientation[3 + i] = col[i];
  }
  s.pixel_spacing[0] = g.spacing[1];
  s.pixel_spacing[1] = g.spacing[0];
  s.intercept = intercept;
  return s;
}

/// Patient, study, series, equipment and modality tags of one slice.
Status put_identity_tags(DcmDataset& ds, const SeriesTags& s, const DicomWriteOptions& opt) {
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SpecificCharacterSet, "ISO_IR 192"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ImageType, "DERIVED\\SECONDARY\\AXIAL"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SOPClassUID, s.sop_class));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SOPInstanceUID, generate_uid(SITE_INSTANCE_UID_ROOT)));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyDate, s.date.c_str()));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyTime, s.time.c_str()));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ContentDate, s.date.c_str()));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ContentTime, s.time.c_str()));
  SEGFLOW_PUT(ds.insertEmptyElement(DCM_AccessionNumber));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_Modality, opt.modality));
  if (std::string(s.sop_class) == UID_SecondaryCaptureImageStorage)
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ConversionType, "WSD"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_Manufacturer, "segflow"));
  SEGFLOW_PUT(ds.insertEmptyElement(DCM_ReferringPhysicianName));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SeriesDescription, opt.series_description));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_PatientName, opt.patient_name));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_PatientID, opt.patient_id));
  SEGFLOW_PUT(ds.insertEmptyElement(DCM_PatientBirthDate));
  SEGFLOW_PUT(ds.insertEmptyElement(DCM_PatientSex));
  if (std::string(s.sop_class) == UID_CTImageStorage) SEGFLOW_PUT(ds.insertEmptyElement(DCM_KVP));
  if (std::string(s.sop_class) == UID_MRImageStorage) {
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ScanningSequence, "RM"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SequenceVariant, "NONE"));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_ScanOptions));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_MRAcquisitionType, "3D"));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_EchoTime));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_EchoTrainLength));
  }
  return Status::ok();
}

/// Slice z's position and numbering, and the image pixel module (Y x X, 16 bits unsigned,
/// rescaled by the series' intercept).
Status put_slice_tags(DcmDataset& ds, const SeriesTags& s, const Geometry& g, std::int64_t z, std::int64_t Y,
                      std::int64_t X, const std::string& modality) {
  const Vec3 pos = add(g.origin, scale(s.axis, g.spacing[2] * static_cast<double>(z)));
  const double location = dot(pos, s.normal);
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_SliceThickness, &g.spacing[2], 1));
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_SpacingBetweenSlices, &g.spacing[2], 1));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyInstanceUID, s.study_uid));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SeriesInstanceUID, s.series_uid));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyID, "1"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SeriesNumber, "1"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_AcquisitionNumber, "1"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_InstanceNumber, std::to_string(z + 1)));
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_ImagePositionPatient, pos.data(), 3));
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_ImageOrientationPatient, s.orientation, 6));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_FrameOfReferenceUID, s.for_uid));
  SEGFLOW_PUT(ds.insertEmptyElement(DCM_PositionReferenceIndicator));
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_SliceLocation, &location, 1));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_SamplesPerPixel, 1));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_PhotometricInterpretation, "MONOCHROME2"));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_Rows, static_cast<Uint16>(Y)));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_Columns, static_cast<Uint16>(X)));
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_PixelSpacing, s.pixel_spacing, 2));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_BitsAllocated, 16));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_BitsStored, 16));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_HighBit, 15));
  SEGFLOW_PUT(ds.putAndInsertUint16(DCM_PixelRepresentation, 0));
  SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_RescaleIntercept, &s.intercept, 1));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_RescaleSlope, "1"));
  SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_RescaleType, modality == "CT" ? "HU" : "US"));
  return Status::ok();
}

/// PixelData of one slice (n values, HU - intercept as uint16), then the transfer syntax's
/// encoding.
Status put_pixels(const std::string& where, DcmDataset& ds, const double* slice, std::int64_t n,
                  double intercept, std::int64_t z, const Codec& codec, std::vector<Uint16>& stored) {
  for (std::int64_t i = 0; i < n; ++i) {
    double s = std::nearbyint(slice[i] - intercept);
    stored[static_cast<std::size_t>(i)] = static_cast<Uint16>(std::clamp(s, 0.0, 65535.0));
  }
  SEGFLOW_PUT(ds.putAndInsertUint16Array(DCM_PixelData, stored.data(), static_cast<unsigned long>(n)));
  if (codec.xfer != EXS_LittleEndianExplicit) {
    OFCondition c = ds.chooseRepresentation(codec.xfer, codec.params.get());
    if (c.bad() || !ds.canWriteXfer(codec.xfer))
      return internal_error(where + ": cannot compress slice " + std::to_string(z) + " as " +
                            DcmXfer(codec.xfer).getXferName() + ": " +
                            (c.bad() ? condition_text(c) : std::string("the encoder failed")));
  }
  return Status::ok();
}

Status write_impl(const fs::path& dir, const Image& image, const DicomWriteOptions& opt,
                  DicomSeriesInfo& info) {
  ensure_dcmtk_ready();
  const std::string where = dir.string();
  SEGFLOW_RETURN_IF_ERROR(check_volume(where, image));
  const at::Tensor& t = image.voxels;
  const std::int64_t Z = t.size(1), Y = t.size(2), X = t.size(3);
  at::Tensor vol = t.select(0, 0).to(torch::kCPU, torch::kFloat64).contiguous();
  if (!torch::isfinite(vol).all().item<bool>())
    return invalid_argument(where + ": voxels: expected finite values, got NaN or infinity");
  const double vmin = vol.min().item<double>();
  // Unsigned 16-bit storage of HU - intercept: -1024 unless the volume goes lower.
  const double intercept = std::min(-1024.0, std::floor(vmin));

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(where + ": cannot create folder: " + ec.message());

  const SeriesTags tags = series_tags(image.geometry, opt, intercept);
  const Codec codec = codec_for(opt.compression);
  info.series_uid = tags.series_uid;
  info.modality = opt.modality;
  info.sop_class_uid = tags.sop_class;
  info.files.clear();

  const double* v = vol.data_ptr<double>();
  std::vector<Uint16> stored(static_cast<std::size_t>(Y * X));
  for (std::int64_t z = 0; z < Z; ++z) {
    DcmFileFormat ff;
    DcmDataset& ds = *ff.getDataset();
    SEGFLOW_RETURN_IF_ERROR(put_identity_tags(ds, tags, opt));
    SEGFLOW_RETURN_IF_ERROR(put_slice_tags(ds, tags, image.geometry, z, Y, X, opt.modality));
    SEGFLOW_RETURN_IF_ERROR(put_pixels(where, ds, v + z * Y * X, Y * X, intercept, z, codec, stored));
    char name[32];
    std::snprintf(name, sizeof name, "IM_%04lld.dcm", static_cast<long long>(z));
    const fs::path file = dir / name;
    SEGFLOW_RETURN_IF_ERROR(save_atomically(ff, file, codec.xfer));
    info.files.push_back(file);
  }
  return Status::ok();
}

}  // namespace

Result<DicomSeriesInfo> write_dicom_series(const fs::path& dir, const Image& image,
                                           const DicomWriteOptions& options) {
  try {
    DicomSeriesInfo info;
    SEGFLOW_RETURN_IF_ERROR(write_impl(dir, image, options, info));
    return info;
  } catch (const c10::Error& e) {
    return internal_error(dir.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(dir.string() + ": " + e.what());
  }
}

}  // namespace segflow::pipeline
