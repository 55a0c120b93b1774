// Placeholder until the npy reader lands; every entry point reports "not implemented".
#include "pipeline/io/npy.hpp"
namespace segflow::pipeline {
Result<at::Tensor> read_npy(const std::filesystem::path& p) { return unsupported(p.string() + ": npy reader not implemented yet"); }
Status write_npy(const std::filesystem::path& p, const at::Tensor&) { return unsupported(p.string() + ": npy writer not implemented yet"); }
Result<Image> read_npy_image(const std::filesystem::path& p) { return unsupported(p.string() + ": npy reader not implemented yet"); }
}
