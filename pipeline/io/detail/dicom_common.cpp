#include <torch/torch.h>

#include "pipeline/io/detail/dicom_common.hpp"

#include <dcmtk/dcmdata/dccodec.h>
#include <dcmtk/dcmdata/dcdict.h>
#include <dcmtk/dcmdata/dcrledrg.h>
#include <dcmtk/dcmdata/dcrleerg.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmjpeg/djdecode.h>
#include <dcmtk/dcmjpeg/djencode.h>
#include <dcmtk/dcmjpls/djdecode.h>
#include <dcmtk/dcmjpls/djencode.h>
#include <dcmtk/oflog/oflog.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>

#include "messages/file_util.hpp"
#include "pipeline/io/dicom.hpp"

namespace segflow::pipeline {

void register_dicom_codecs() {
  static std::once_flag once;
  std::call_once(once, [] {
    DcmRLEDecoderRegistration::registerCodecs();
    DcmRLEEncoderRegistration::registerCodecs();
    // Decoders for JPEG baseline (process 1), extended (2/4), lossless (14, 14 SV1).
    // YCbCr is converted to RGB as the photometric interpretation says.
    DJDecoderRegistration::registerCodecs(EDC_photometricInterpretation);
    DJEncoderRegistration::registerCodecs();
    DJLSDecoderRegistration::registerCodecs();
    DJLSEncoderRegistration::registerCodecs();
    detail::register_j2k_decoder();  // JPEG 2000 (.90, .91) through OpenJPEG
  });
}

}  // namespace segflow::pipeline

namespace segflow::pipeline::detail {

void ensure_dcmtk_ready() {
  static std::once_flag once;
  std::call_once(once, [] {
    // DCMTK logs its own warnings and errors to stderr; segflow reports them as Status.
    // SEGFLOW_DCMTK_LOG=1 in the environment keeps DCMTK's log (for debugging).
    if (!std::getenv("SEGFLOW_DCMTK_LOG")) OFLog::getLogger("dcmtk").setLogLevel(OFLogger::FATAL_LOG_LEVEL);
  });
  register_dicom_codecs();
}

std::string tag_name(const DcmTagKey& tag) {
  DcmTag t(tag);
  std::string name = t.getTagName();
  return name + " " + tag.toString().c_str();
}

std::string condition_text(const OFCondition& c) { return c.text(); }

namespace {

struct XferName {
  const char* uid;
  const char* name;
};

// PS3.6 table A-1 names of the transfer syntaxes a reader may meet.
constexpr XferName kXferNames[] = {
    {"1.2.840.10008.1.2", "Implicit VR Little Endian"},
    {"1.2.840.10008.1.2.1", "Explicit VR Little Endian"},
    {"1.2.840.10008.1.2.1.98", "Encapsulated Uncompressed Explicit VR Little Endian"},
    {"1.2.840.10008.1.2.1.99", "Deflated Explicit VR Little Endian"},
    {"1.2.840.10008.1.2.2", "Explicit VR Big Endian"},
    {"1.2.840.10008.1.2.4.50", "JPEG Baseline (Process 1)"},
    {"1.2.840.10008.1.2.4.51", "JPEG Extended (Process 2 & 4)"},
    {"1.2.840.10008.1.2.4.57", "JPEG Lossless, Non-Hierarchical (Process 14)"},
    {"1.2.840.10008.1.2.4.70",
     "JPEG Lossless, Non-Hierarchical, First-Order Prediction (Process 14 [Selection Value 1])"},
    {"1.2.840.10008.1.2.4.80", "JPEG-LS Lossless Image Compression"},
    {"1.2.840.10008.1.2.4.81", "JPEG-LS Lossy (Near-Lossless) Image Compression"},
    {"1.2.840.10008.1.2.4.90", "JPEG 2000 Image Compression (Lossless Only)"},
    {"1.2.840.10008.1.2.4.91", "JPEG 2000 Image Compression"},
    {"1.2.840.10008.1.2.4.92", "JPEG 2000 Part 2 Multi-component Image Compression (Lossless Only)"},
    {"1.2.840.10008.1.2.4.93", "JPEG 2000 Part 2 Multi-component Image Compression"},
    {"1.2.840.10008.1.2.4.94", "JPIP Referenced"},
    {"1.2.840.10008.1.2.4.95", "JPIP Referenced Deflate"},
    {"1.2.840.10008.1.2.4.100", "MPEG2 Main Profile / Main Level"},
    {"1.2.840.10008.1.2.4.101", "MPEG2 Main Profile / High Level"},
    {"1.2.840.10008.1.2.4.102", "MPEG-4 AVC/H.264 High Profile / Level 4.1"},
    {"1.2.840.10008.1.2.4.103", "MPEG-4 AVC/H.264 BD-compatible High Profile / Level 4.1"},
    {"1.2.840.10008.1.2.4.104", "MPEG-4 AVC/H.264 High Profile / Level 4.2 For 2D Video"},
    {"1.2.840.10008.1.2.4.105", "MPEG-4 AVC/H.264 High Profile / Level 4.2 For 3D Video"},
    {"1.2.840.10008.1.2.4.106", "MPEG-4 AVC/H.264 Stereo High Profile / Level 4.2"},
    {"1.2.840.10008.1.2.4.107", "HEVC/H.265 Main Profile / Level 5.1"},
    {"1.2.840.10008.1.2.4.108", "HEVC/H.265 Main 10 Profile / Level 5.1"},
    {"1.2.840.10008.1.2.4.110", "JPEG XL Lossless"},
    {"1.2.840.10008.1.2.4.111", "JPEG XL JPEG Recompression"},
    {"1.2.840.10008.1.2.4.112", "JPEG XL"},
    {"1.2.840.10008.1.2.4.201", "High-Throughput JPEG 2000 Image Compression (Lossless Only)"},
    {"1.2.840.10008.1.2.4.202",
     "High-Throughput JPEG 2000 with RPCL Options Image Compression (Lossless Only)"},
    {"1.2.840.10008.1.2.4.203", "High-Throughput JPEG 2000 Image Compression"},
    {"1.2.840.10008.1.2.5", "RLE Lossless"},
};

// Why DCMTK 3.6.7 (with the codecs segflow registers) cannot decode a syntax.
std::string unsupported_reason(const std::string& uid) {
  auto starts = [&](const char* p) { return uid.rfind(p, 0) == 0; };
  if (starts("1.2.840.10008.1.2.4.94") || starts("1.2.840.10008.1.2.4.95"))
    return "JPIP references pixel data on a server, which segflow does not fetch";
  if (starts("1.2.840.10008.1.2.4.9") || starts("1.2.840.10008.1.2.4.20"))
    return "segflow decodes JPEG 2000 Part 1 only (1.2.840.10008.1.2.4.90 and .91), not Part 2 "
           "multi-component or High-Throughput JPEG 2000";
  if (starts("1.2.840.10008.1.2.4.10"))
    return "video transfer syntaxes (MPEG, H.264, HEVC) are not supported";
  if (starts("1.2.840.10008.1.2.4.11")) return "DCMTK has no JPEG XL codec";
  return "DCMTK has no decoder for it";
}

}  // namespace

std::string describe_transfer_syntax(const std::string& uid) {
  for (const auto& x : kXferNames)
    if (uid == x.uid) return std::string(x.name) + " (" + uid + ")";
  DcmXfer x(uid.c_str());
  if (x.getXfer() != EXS_Unknown) return std::string(x.getXferName()) + " (" + uid + ")";
  return "transfer syntax " + (uid.empty() ? std::string("<none>") : uid);
}

std::string transfer_syntax_uid(DcmFileFormat& ff) {
  OFString uid;
  if (ff.getMetaInfo() && ff.getMetaInfo()->findAndGetOFString(DCM_TransferSyntaxUID, uid).good() &&
      !uid.empty())
    return std::string(uid.c_str());
  DcmXfer x(ff.getDataset()->getOriginalXfer());
  return x.getXfer() == EXS_Unknown ? std::string() : std::string(x.getXferID());
}

Status check_transfer_syntax(const std::filesystem::path& file, DcmFileFormat& ff) {
  std::string uid = transfer_syntax_uid(ff);
  E_TransferSyntax xfer = ff.getDataset()->getOriginalXfer();
  DcmXfer meta_x(uid.c_str());
  if (!uid.empty() && meta_x.getXfer() == EXS_Unknown)
    return unsupported(file.string() + ": TransferSyntaxUID: " + describe_transfer_syntax(uid) +
                       " is not supported: " + unsupported_reason(uid));
  DcmXfer x(xfer);
  if (x.isNotEncapsulated()) return Status::ok();
  if (DcmCodecList::canChangeCoding(xfer, EXS_LittleEndianExplicit)) return Status::ok();
  std::string id = uid.empty() ? std::string(x.getXferID()) : uid;
  return unsupported(file.string() + ": TransferSyntaxUID: " + describe_transfer_syntax(id) +
                     " is not supported: " + unsupported_reason(id));
}

DicomPrefix sniff_dicom_prefix(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return DicomPrefix::none;
  char buf[132] = {};
  in.read(buf, sizeof buf);
  const auto n = in.gcount();
  if (n >= 132 && std::memcmp(buf + 128, "DICM", 4) == 0) return DicomPrefix::preamble;
  if (n < 8) return DicomPrefix::none;
  const auto* u = reinterpret_cast<const unsigned char*>(buf);
  const unsigned group_le = u[0] | (u[1] << 8), group_be = (u[0] << 8) | u[1];
  const bool low = (group_le >= 0x0002 && group_le <= 0x0010) || (group_be >= 0x0002 && group_be <= 0x0010);
  return low ? DicomPrefix::maybe_dataset : DicomPrefix::none;
}

Result<std::unique_ptr<DcmFileFormat>> load_file(const std::filesystem::path& file,
                                                 std::uint32_t max_read_length) {
  ensure_dcmtk_ready();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return not_found(file.string() + ": no such file");
  if (!std::filesystem::is_regular_file(file, ec))
    return invalid_argument(file.string() + ": not a regular file");
  auto size = std::filesystem::file_size(file, ec);
  if (ec) return io_error(file.string() + ": cannot read: " + ec.message());
  if (size == 0) return corrupt_data(file.string() + ": empty file (0 bytes), expected a DICOM file");
  if (sniff_dicom_prefix(file) == DicomPrefix::none)
    return corrupt_data(file.string() +
                        ": not a DICOM file: no \"DICM\" at offset 128 and no DICOM dataset at the start");
  if (!dcmDataDict.isDictionaryLoaded())
    return internal_error(file.string() + ": DCMTK's data dictionary is not loaded (set DCMDICTPATH)");
  auto ff = std::make_unique<DcmFileFormat>();
  OFCondition c =
      ff->loadFile(OFFilename(file.c_str()), EXS_Unknown, EGL_noChange, max_read_length, ERM_autoDetect);
  if (c.bad()) {
    std::string msg = file.string() + ": cannot parse DICOM: " + condition_text(c);
    if (c == EC_StreamNotifyClient || c == EC_InvalidStream || c == EC_PrematureSequDelimitationItem ||
        c == EC_SequDelimitationItemMissing || c == EC_ItemDelimitationItemMissing)
      msg += " (file truncated?)";
    return corrupt_data(msg);
  }
  if (ff->getDataset()->card() == 0) return corrupt_data(file.string() + ": DICOM dataset is empty");
  return ff;
}

std::optional<std::string> get_string(DcmItem& item, const DcmTagKey& tag) {
  OFString v;
  if (item.findAndGetOFString(tag, v).bad()) return std::nullopt;
  std::string s(v.c_str());
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return std::nullopt;
  auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::optional<std::string> get_string_array(DcmItem& item, const DcmTagKey& tag) {
  OFString v;
  if (item.findAndGetOFStringArray(tag, v).bad() || v.empty()) return std::nullopt;
  return std::string(v.c_str());
}

std::optional<long> get_integer(DcmItem& item, const DcmTagKey& tag, unsigned long pos) {
  long v = 0;
  if (item.findAndGetLongInt(tag, v, pos).good()) return v;
  return std::nullopt;
}

std::optional<double> get_double(DcmItem& item, const DcmTagKey& tag, unsigned long pos) {
  Float64 v = 0;
  if (item.findAndGetFloat64(tag, v, pos).bad()) return std::nullopt;
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

unsigned long value_count(DcmItem& item, const DcmTagKey& tag) {
  DcmElement* e = nullptr;
  if (item.findAndGetElement(tag, e).bad() || !e) return 0;
  return e->getVM();
}

DcmItem* sequence_item(DcmItem& item, const DcmTagKey& seq, unsigned long index) {
  DcmItem* out = nullptr;
  if (item.findAndGetSequenceItem(seq, out, static_cast<signed long>(index)).bad()) return nullptr;
  return out;
}

std::string format_ds(double v) {
  if (v == 0.0 || std::abs(v) < 1e-300) return "0";
  char buf[64];
  for (int prec = 16; prec >= 1; --prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strlen(buf) <= 16) return buf;
  }
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string format_numbers(const double* v, std::size_t n) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

std::string generate_uid(const char* root) {
  char buf[100];
  dcmGenerateUniqueIdentifier(buf, root);
  return buf;
}

Status save_atomically(DcmFileFormat& ff, const std::filesystem::path& target, E_TransferSyntax xfer) {
  return replace_file_atomically(target, [&](const std::filesystem::path& tmp) -> Status {
    OFCondition c = ff.saveFile(OFFilename(tmp.c_str()), xfer);
    if (c.bad()) return io_error(target.string() + ": cannot write DICOM: " + condition_text(c));
    return Status::ok();
  });
}

}  // namespace segflow::pipeline::detail
