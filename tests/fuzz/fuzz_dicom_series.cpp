// Fuzz harness: series assembly from a set of headers. The input is several DICOM files
// joined by the line "\n--segflow-file--\n"; they are written into one folder, grouped by
// scan_dicom_folder, probed and read as a volume (stacks, slice order, spacing checks).
#include <string_view>
#include <system_error>

#include "fuzz_target.hpp"
#include "pipeline/io/dicom.hpp"

SEGFLOW_FUZZ_TARGET(dicom_series) {
  constexpr std::string_view kSeparator = "\n--segflow-file--\n";
  constexpr int kMaxFiles = 32;
  const auto dir = scratch_dir() / "series";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::size_t begin = 0;
  int count = 0;
  while (begin <= in.size() && count < kMaxFiles) {
    std::size_t end = in.find(kSeparator, begin);
    if (end == std::string_view::npos) end = in.size();
    const auto part = in.substr(begin, end - begin);
    write_input("series/slice" + std::to_string(count++) + ".dcm",
                reinterpret_cast<const std::uint8_t*>(part.data()), part.size());
    begin = end + kSeparator.size();
  }
  std::vector<pipeline::SkippedFile> skipped;
  auto groups = pipeline::scan_dicom_folder(dir, &skipped);
  if (groups.is_ok()) {
    std::size_t files = skipped.size();
    for (const auto& g : *groups) files += g.files.size();
    invariant(files <= static_cast<std::size_t>(count), "scan_dicom_folder listed more files than written");
  }
  auto probe = pipeline::probe_dicom(dir);
  auto image = pipeline::read_dicom(dir);
  if (image.is_ok()) {
    check_image(*image);
    invariant(probe.is_ok(), "read_dicom read a folder probe_dicom refused: " + probe.status().message());
  }
  return 0;
}
