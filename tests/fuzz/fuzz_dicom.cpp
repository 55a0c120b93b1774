// Fuzz harness: one DICOM file through segflow's reader (header, pixel data, the DCMTK and
// OpenJPEG codecs), the header-only probe and the series identity read_dicom_seg refers to.
#include "fuzz_target.hpp"
#include "pipeline/io/dicom.hpp"

SEGFLOW_FUZZ_TARGET(dicom) {
  const auto file = write_input("input.dcm", data, size);
  auto probe = pipeline::probe_dicom(file);
  auto image = pipeline::read_dicom(file);
  if (image.is_ok()) {
    check_image(*image);
    // What read_dicom read, probe_dicom must have found from the headers alone.
    invariant(probe.is_ok(), "read_dicom read a file probe_dicom refused: " + probe.status().message());
  }
  (void)pipeline::dicom_source_series(file);
  (void)pipeline::is_dicom_seg_file(file);
  return 0;
}
