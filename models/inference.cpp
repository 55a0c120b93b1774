#include "models/inference.hpp"

#include <torch/torch.h>

#include <chrono>

#include "models/trainer.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

at::Tensor resample_to_grid(const at::Tensor& data, const Geometry& src, const Geometry& dst,
                            const Size3& dst_size) {
  torch::NoGradGuard ng;
  // Continuous source index of a destination index: i_s = A i_d + b.
  double A[3][3], b[3];
  double od[3];
  for (int r = 0; r < 3; ++r) od[r] = dst.origin[r] - src.origin[r];
  for (int r = 0; r < 3; ++r) {
    b[r] = 0;
    for (int k = 0; k < 3; ++k) b[r] += src.direction[k * 3 + r] * od[k];
    b[r] /= src.spacing[r];
    for (int c = 0; c < 3; ++c) {
      double m = 0;
      for (int k = 0; k < 3; ++k) m += src.direction[k * 3 + r] * dst.direction[k * 3 + c];
      A[r][c] = m * dst.spacing[c] / src.spacing[r];
    }
  }
  const bool integral = !at::isFloatingType(data.scalar_type());
  const std::int64_t sx = data.size(3), sy = data.size(2), sz = data.size(1);
  const std::int64_t nx = dst_size[0], ny = dst_size[1], nz = dst_size[2];
  at::Tensor src_f = data.to(at::kFloat).unsqueeze(0);  // (1, C, Z, Y, X)
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(data.device());
  at::Tensor out = torch::empty({data.size(0), nz, ny, nx}, opts);
  auto ix = torch::arange(nx, opts).view({1, 1, nx});
  auto iy = torch::arange(ny, opts).view({1, ny, 1});
  const std::int64_t slab = std::max<std::int64_t>(1, (8LL << 20) / std::max<std::int64_t>(1, nx * ny));
  const double size_s[3] = {static_cast<double>(sx), static_cast<double>(sy), static_cast<double>(sz)};
  for (std::int64_t z0 = 0; z0 < nz; z0 += slab) {
    const std::int64_t z1 = std::min(nz, z0 + slab);
    auto iz = torch::arange(z0, z1, opts).view({z1 - z0, 1, 1});
    std::vector<at::Tensor> coords;
    for (int r = 0; r < 3; ++r) {
      at::Tensor c = A[r][0] * ix + A[r][1] * iy + A[r][2] * iz + b[r];
      // align_corners=true normalisation; a single-voxel axis maps everything near it to 0.
      c = size_s[r] > 1 ? c * (2.0 / (size_s[r] - 1)) - 1.0 : c * 2.0;
      coords.push_back(c.expand({z1 - z0, ny, nx}));
    }
    at::Tensor grid = torch::stack(coords, -1).unsqueeze(0);  // (1, z, y, x, 3) in (x, y, z)
    F::GridSampleFuncOptions::mode_t mode = torch::kBilinear;
    if (integral) mode = torch::kNearest;
    at::Tensor r = F::grid_sample(
        src_f, grid, F::GridSampleFuncOptions().mode(mode).padding_mode(torch::kZeros).align_corners(true));
    out.slice(1, z0, z1).copy_(r[0]);
  }
  return integral ? out.round().to(data.scalar_type()) : out;
}

Result<InferResult> run_inference(const InferOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, load_for_inference(o.checkpoint, o.device));
  const JobConfig& cfg = trainer->config();
  if (trainer->model().info().needs_box)
    return unsupported(o.checkpoint.string() +
                       ": box-prompted models need a box per slice; segflow infer runs "
                       "UNet checkpoints (use the Trainer API with boxes for SAM-style models)");
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image input, pipeline::read_image(o.input));
  const auto fmt = pipeline::detect_format(o.input);
  const bool dicom = fmt == pipeline::ImageFormat::dicom_file || fmt == pipeline::ImageFormat::dicom_folder;

  // Deterministic stages of the training pipeline, minus the loader and anything random.
  pipeline::StageRegistry registry = pipeline::builtin_registry();
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Pipeline pipe, pipeline::build_pipeline(cfg.stages, registry, cfg.file));
  Sample s;
  s.id = o.input.filename().string();
  s.tensors["image"] = input.voxels.to(at::kFloat);
  s.geometry = input.geometry;
  // Stages written for (image, label) pairs get an empty label map, dropped afterwards.
  s.tensors["label"] =
      torch::zeros({1, input.voxels.size(1), input.voxels.size(2), input.voxels.size(3)}, at::kByte);
  SEGFLOW_ASSIGN_OR_RETURN(Sample pre, pipe.run_deterministic(std::move(s)));
  at::Tensor logits = trainer->predict(pre.at("image"));
  at::Tensor labels = logits.size(0) == 1 ? (logits > 0).to(at::kByte) : logits.argmax(0, true).to(at::kByte);
  labels = labels.to(at::kCPU);
  at::Tensor back = resample_to_grid(labels, pre.geometry, input.geometry, input.size());

  pipeline::Image seg;
  seg.voxels = back.contiguous();
  seg.geometry = input.geometry;
  seg.modality = "SEG";
  fs::path out = o.output;
  std::error_code ec;
  const bool to_folder = fs::is_directory(out, ec) || out.string().ends_with("/");
  if (to_folder) {
    fs::create_directories(out, ec);
    std::string stem = o.input.filename().string();
    for (const char* e : {".nii.gz", ".nii"})
      if (stem.ends_with(e)) stem = stem.substr(0, stem.size() - std::string(e).size());
    out = dicom ? out / "seg.dcm" : out / (stem + "_seg.nii.gz");
  }
  if (out.extension() == ".dcm") {
    if (!dicom)
      return invalid_argument(out.string() + ": DICOM SEG output needs a DICOM input, got " +
                              o.input.string());
    fs::path dir = fs::is_directory(o.input) ? o.input : o.input.parent_path();
    SEGFLOW_ASSIGN_OR_RETURN(auto series, pipeline::scan_dicom_folder(dir));
    const pipeline::DicomSeriesInfo* ref = nullptr;
    for (const auto& si : series)
      if (si.modality != "SEG") ref = &si;
    if (!ref) return not_found(dir.string() + ": no image series to reference from the DICOM SEG");
    SEGFLOW_RETURN_IF_ERROR(pipeline::write_dicom_seg(out, seg, *ref));
  } else if (pipeline::is_nifti_path(out)) {
    SEGFLOW_RETURN_IF_ERROR(pipeline::write_nifti(out, seg));
  } else {
    return invalid_argument(out.string() + ": --output: expected a .nii, .nii.gz or .dcm file or a folder");
  }
  InferResult r;
  r.output = out;
  r.size = seg.size();
  at::Tensor u = std::get<0>(at::_unique(back.flatten().to(at::kLong), true));
  for (std::int64_t i = 0; i < u.numel(); ++i) r.labels.push_back(u[i].item<std::int64_t>());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace segflow::models
