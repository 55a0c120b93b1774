// Fuzz harness: NRRD and MetaImage headers and their attached data (ITK's NrrdIO and MetaIO
// behind segflow's readers). An input starting with "NRRD" is a .nrrd, anything else a .mha.
#include <cstring>

#include "fuzz_target.hpp"
#include "pipeline/io/metaimage.hpp"
#include "pipeline/io/nrrd.hpp"

SEGFLOW_FUZZ_TARGET(nrrd_mha) {
  const bool nrrd = size >= 4 && std::memcmp(data, "NRRD", 4) == 0;
  const auto file = write_input(nrrd ? "input.nrrd" : "input.mha", data, size);
  auto image = nrrd ? pipeline::read_nrrd(file) : pipeline::read_metaimage(file);
  if (image.is_ok()) check_image(*image);
  return 0;
}
