// Placeholder until the dicom reader lands; every entry point reports "not implemented".
#include "pipeline/io/dicom.hpp"
namespace segflow::pipeline {
void register_dicom_codecs() {}
Result<std::vector<DicomSeriesInfo>> scan_dicom_folder(const std::filesystem::path& d, std::vector<SkippedFile>*) { return unsupported(d.string() + ": DICOM not implemented yet"); }
Result<Image> read_dicom_series(const std::vector<std::filesystem::path>&) { return unsupported("DICOM not implemented yet"); }
Result<Image> read_dicom(const std::filesystem::path& p) { return unsupported(p.string() + ": DICOM not implemented yet"); }
Result<Image> read_dicom_seg(const std::filesystem::path& p, const Image&) { return unsupported(p.string() + ": DICOM SEG not implemented yet"); }
Result<DicomCompression> parse_dicom_compression(const std::string& s) { return unsupported(s); }
Result<DicomSeriesInfo> write_dicom_series(const std::filesystem::path& d, const Image&, const DicomWriteOptions&) { return unsupported(d.string()); }
Status write_dicom_seg(const std::filesystem::path& f, const Image&, const DicomSeriesInfo&) { return unsupported(f.string()); }
bool looks_like_dicom(const std::filesystem::path&) { return false; }
}
