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

Status write_impl(const fs::path& dir, const Image& image, const DicomWriteOptions& opt,
                  DicomSeriesInfo& info) {
  ensure_dcmtk_ready();
  const std::string where = dir.string();
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

  at::Tensor vol = t.select(0, 0).to(torch::kCPU, torch::kFloat64).contiguous();
  if (!torch::isfinite(vol).all().item<bool>())
    return invalid_argument(where + ": voxels: expected finite values, got NaN or infinity");
  const double vmin = vol.min().item<double>();
  // Unsigned 16-bit storage of HU - intercept: -1024 unless the volume goes lower.
  const double intercept = std::min(-1024.0, std::floor(vmin));

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(where + ": cannot create folder: " + ec.message());

  const Vec3 row = column(g.direction, 0), col = column(g.direction, 1), axis = column(g.direction, 2);
  const Vec3 normal = normalized(cross(row, col));
  const std::string study_uid = opt.study_uid.empty() ? generate_uid(SITE_STUDY_UID_ROOT) : opt.study_uid;
  const std::string series_uid = opt.series_uid.empty() ? generate_uid(SITE_SERIES_UID_ROOT) : opt.series_uid;
  const std::string for_uid = generate_uid(SITE_INSTANCE_UID_ROOT);  // FrameOfReferenceUID
  const char* sop_class = opt.modality == "MR"   ? UID_MRImageStorage
                          : opt.modality == "CT" ? UID_CTImageStorage
                                                 : UID_SecondaryCaptureImageStorage;
  OFString date, time;
  DcmDate::getCurrentDate(date);
  DcmTime::getCurrentTime(time);
  const double orientation[6] = {row[0], row[1], row[2], col[0], col[1], col[2]};
  const double pixel_spacing[2] = {g.spacing[1], g.spacing[0]};  // row\column = y\x
  Codec codec = codec_for(opt.compression);

  info.series_uid = series_uid;
  info.modality = opt.modality;
  info.sop_class_uid = sop_class;
  info.files.clear();

  const double* v = vol.data_ptr<double>();
  std::vector<Uint16> stored(static_cast<std::size_t>(Y * X));
  for (std::int64_t z = 0; z < Z; ++z) {
    DcmFileFormat ff;
    DcmDataset& ds = *ff.getDataset();
    const std::string sop_uid = generate_uid(SITE_INSTANCE_UID_ROOT);
    const Vec3 pos = add(g.origin, scale(axis, g.spacing[2] * static_cast<double>(z)));
    const double location = dot(pos, normal);
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SpecificCharacterSet, "ISO_IR 192"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ImageType, "DERIVED\\SECONDARY\\AXIAL"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SOPClassUID, sop_class));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SOPInstanceUID, sop_uid));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyDate, date.c_str()));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyTime, time.c_str()));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ContentDate, date.c_str()));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ContentTime, time.c_str()));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_AccessionNumber));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_Modality, opt.modality));
    if (std::string(sop_class) == UID_SecondaryCaptureImageStorage)
      SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ConversionType, "WSD"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_Manufacturer, "segflow"));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_ReferringPhysicianName));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SeriesDescription, opt.series_description));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_PatientName, opt.patient_name));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_PatientID, opt.patient_id));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_PatientBirthDate));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_PatientSex));
    if (std::string(sop_class) == UID_CTImageStorage) SEGFLOW_PUT(ds.insertEmptyElement(DCM_KVP));
    if (std::string(sop_class) == UID_MRImageStorage) {
      SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_ScanningSequence, "RM"));
      SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SequenceVariant, "NONE"));
      SEGFLOW_PUT(ds.insertEmptyElement(DCM_ScanOptions));
      SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_MRAcquisitionType, "3D"));
      SEGFLOW_PUT(ds.insertEmptyElement(DCM_EchoTime));
      SEGFLOW_PUT(ds.insertEmptyElement(DCM_EchoTrainLength));
    }
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_SliceThickness, &g.spacing[2], 1));
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_SpacingBetweenSlices, &g.spacing[2], 1));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyInstanceUID, study_uid));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SeriesInstanceUID, series_uid));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_StudyID, "1"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_SeriesNumber, "1"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_AcquisitionNumber, "1"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_InstanceNumber, std::to_string(z + 1)));
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_ImagePositionPatient, pos.data(), 3));
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_ImageOrientationPatient, orientation, 6));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_FrameOfReferenceUID, for_uid));
    SEGFLOW_PUT(ds.insertEmptyElement(DCM_PositionReferenceIndicator));
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_SliceLocation, &location, 1));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_SamplesPerPixel, 1));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_PhotometricInterpretation, "MONOCHROME2"));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_Rows, static_cast<Uint16>(Y)));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_Columns, static_cast<Uint16>(X)));
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_PixelSpacing, pixel_spacing, 2));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_BitsAllocated, 16));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_BitsStored, 16));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_HighBit, 15));
    SEGFLOW_PUT(ds.putAndInsertUint16(DCM_PixelRepresentation, 0));
    SEGFLOW_RETURN_IF_ERROR(put_ds(ds, DCM_RescaleIntercept, &intercept, 1));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_RescaleSlope, "1"));
    SEGFLOW_RETURN_IF_ERROR(put(ds, DCM_RescaleType, opt.modality == "CT" ? "HU" : "US"));
    const double* slice = v + z * Y * X;
    for (std::int64_t i = 0; i < Y * X; ++i) {
      double s = std::nearbyint(slice[i] - intercept);
      stored[static_cast<std::size_t>(i)] = static_cast<Uint16>(std::clamp(s, 0.0, 65535.0));
    }
    SEGFLOW_PUT(ds.putAndInsertUint16Array(DCM_PixelData, stored.data(), static_cast<unsigned long>(Y * X)));

    if (codec.xfer != EXS_LittleEndianExplicit) {
      OFCondition c = ds.chooseRepresentation(codec.xfer, codec.params.get());
      if (c.bad() || !ds.canWriteXfer(codec.xfer))
        return internal_error(where + ": cannot compress slice " + std::to_string(z) + " as " +
                              DcmXfer(codec.xfer).getXferName() + ": " +
                              (c.bad() ? condition_text(c) : std::string("the encoder failed")));
    }
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
