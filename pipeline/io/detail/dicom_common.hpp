#pragma once
// Private helpers shared by the DICOM reader, writer and SEG code: DCMTK set-up, tag access
// that returns std::optional instead of OFCondition, DS formatting, transfer-syntax names,
// small 3-vector maths and atomic saving. Included only by pipeline/io/*dicom*.cpp.

#include <dcmtk/config/osconfig.h>  // must come first among DCMTK headers
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcitem.h>
#include <dcmtk/dcmdata/dcmetinf.h>
#include <dcmtk/dcmdata/dcxfer.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline::detail {

using Vec3 = std::array<double, 3>;

inline Vec3 add(const Vec3& a, const Vec3& b) { return {a[0] + b[0], a[1] + b[1], a[2] + b[2]}; }
inline Vec3 sub(const Vec3& a, const Vec3& b) { return {a[0] - b[0], a[1] - b[1], a[2] - b[2]}; }
inline Vec3 scale(const Vec3& a, double s) { return {a[0] * s, a[1] * s, a[2] * s}; }
inline double dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
inline double norm(const Vec3& a) { return std::sqrt(dot(a, a)); }
inline Vec3 cross(const Vec3& a, const Vec3& b) {
  return {a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]};
}
/// `a / |a|`, or `a` unchanged when it is (nearly) zero.
inline Vec3 normalized(const Vec3& a) {
  double n = norm(a);
  return n > 1e-12 ? scale(a, 1.0 / n) : a;
}
/// Column `c` of a row-major 3x3 matrix.
inline Vec3 column(const std::array<double, 9>& m, int c) { return {m[c], m[3 + c], m[6 + c]}; }

/// Registers segflow's JPEG 2000 decoder (OpenJPEG, detail/dicom_j2k.cpp) with DCMTK for
/// transfer syntaxes 1.2.840.10008.1.2.4.90 (lossless) and .91 (lossy). Idempotent,
/// thread-safe; register_dicom_codecs() calls it.
void register_j2k_decoder();

/// Registers the codecs (once) and turns DCMTK's own logging down to fatal errors: every
/// problem DCMTK reports comes back to callers as a Status instead (unless the environment
/// sets SEGFLOW_DCMTK_LOG). Thread-safe.
void ensure_dcmtk_ready();

/// "Rows (0028,0010)": the dictionary name and the tag, for messages.
std::string tag_name(const DcmTagKey& tag);

/// DCMTK's text for a condition ("I/O suspension or premature end of stream").
std::string condition_text(const OFCondition& c);

/// Standard name and UID of a transfer syntax, e.g.
/// "JPEG 2000 Image Compression (Lossless Only) (1.2.840.10008.1.2.4.90)".
std::string describe_transfer_syntax(const std::string& uid);

/// The TransferSyntaxUID of a loaded file (from its meta header; else what DCMTK detected).
std::string transfer_syntax_uid(DcmFileFormat& ff);

/// Ok when segflow can decode pixel data in this transfer syntax (native, deflated, RLE,
/// JPEG baseline/extended/lossless, JPEG-LS, JPEG 2000 Part 1); else `unsupported` naming
/// the syntax.
Status check_transfer_syntax(const std::filesystem::path& file, DcmFileFormat& ff);

/// How a file starts: with the 128-byte preamble and "DICM", with what may be a dataset
/// without preamble (a low group number: (0002,xxxx) meta or (0008,xxxx)), or neither.
enum class DicomPrefix { preamble, maybe_dataset, none };
DicomPrefix sniff_dicom_prefix(const std::filesystem::path& file);

/// Loads a DICOM file (meta header optional). Values longer than `max_read_length` bytes
/// (pixel data) stay on disk until they are accessed. Errors name the file.
Result<std::unique_ptr<DcmFileFormat>> load_file(const std::filesystem::path& file,
                                                 std::uint32_t max_read_length = 4096);

/// Value of a string tag, trimmed; nullopt when absent or empty.
std::optional<std::string> get_string(DcmItem& item, const DcmTagKey& tag);
/// All values of a string tag joined by '\'.
std::optional<std::string> get_string_array(DcmItem& item, const DcmTagKey& tag);
/// A US/SS/IS/UL value; nullopt when absent, empty or not a number.
std::optional<long> get_integer(DcmItem& item, const DcmTagKey& tag, unsigned long pos = 0);
/// Value `pos` of a DS/FD/FL tag; nullopt when absent, empty or not a number.
std::optional<double> get_double(DcmItem& item, const DcmTagKey& tag, unsigned long pos = 0);
/// Number of values of a tag (0 when absent).
unsigned long value_count(DcmItem& item, const DcmTagKey& tag);
/// Exactly N numbers of a DS/FD tag; nullopt when absent or fewer than N finite values.
template <std::size_t N>
std::optional<std::array<double, N>> get_doubles(DcmItem& item, const DcmTagKey& tag) {
  if (value_count(item, tag) < N) return std::nullopt;
  std::array<double, N> out{};
  for (std::size_t i = 0; i < N; ++i) {
    auto v = get_double(item, tag, static_cast<unsigned long>(i));
    if (!v) return std::nullopt;
    out[i] = *v;
  }
  return out;
}
/// Item `index` of a sequence, or nullptr.
DcmItem* sequence_item(DcmItem& item, const DcmTagKey& seq, unsigned long index = 0);

/// A DS value: the shortest decimal (at most 16 characters) that keeps the most precision.
std::string format_ds(double v);
/// "[a, b, c]" for messages.
std::string format_numbers(const double* v, std::size_t n);

/// A fresh UID under DCMTK's site root (`root` e.g. SITE_SERIES_UID_ROOT).
std::string generate_uid(const char* root);

/// Saves `ff` in `xfer` to a temporary name next to `target`, then renames it over `target`,
/// so a reader never sees a half-written file.
Status save_atomically(DcmFileFormat& ff, const std::filesystem::path& target, E_TransferSyntax xfer);

}  // namespace segflow::pipeline::detail
