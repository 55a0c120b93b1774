// Placeholder until the nifti reader lands; every entry point reports "not implemented".
#include "pipeline/io/nifti.hpp"
namespace segflow::pipeline {
Result<Image> read_nifti(const std::filesystem::path& p) { return unsupported(p.string() + ": NIfTI reader not implemented yet"); }
Status write_nifti(const std::filesystem::path& p, const Image&) { return unsupported(p.string() + ": NIfTI writer not implemented yet"); }
bool is_nifti_path(const std::filesystem::path& p) { auto s = p.string(); return s.ends_with(".nii") || s.ends_with(".nii.gz"); }
}
