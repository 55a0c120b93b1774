// Fuzz harness: a NIfTI-1/NIfTI-2 file (header and data), plain or gzip-compressed (chosen
// by the gzip magic at the start of the input, as the file name would say).
#include "fuzz_target.hpp"
#include "pipeline/io/nifti.hpp"

SEGFLOW_FUZZ_TARGET(nifti) {
  const bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  const auto file = write_input(gz ? "input.nii.gz" : "input.nii", data, size);
  auto image = pipeline::read_nifti(file);
  if (image.is_ok()) check_image(*image);
  return 0;
}
