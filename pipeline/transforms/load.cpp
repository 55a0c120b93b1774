#include "pipeline/transforms/load.hpp"

#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void LoadOptions::bind(OptionParser& p) {
  p.string("image_key", image_key, "tensor name of the image, (C, Z, Y, X) float32");
  p.string("label_key", label_key, "tensor name of the label map, (1, Z, Y, X)");
  p.choice("label_dtype", label_dtype, {"uint8", "int64"},
           "label map type (uint8 is 8x smaller in the cache)");
  p.boolean("require_label", require_label, "error for a case without a label");
  if (image_key.empty()) p.fail("image_key", "expected a non-empty name");
  if (label_key.empty()) p.fail("label_key", "expected a non-empty name");
  if (image_key == label_key)
    p.fail("label_key", "expected a name different from image_key '" + image_key + "'");
}

Result<Sample> sample_from_case(LoadedCase c, const LoadOptions& o) {
  Sample s;
  s.id = c.id;
  s.geometry = c.image.geometry;
  s.tensors[o.image_key] = c.image.voxels.to(torch::kFloat32).contiguous();
  if (c.label) {
    at::Tensor l = c.label->voxels;
    if (o.label_dtype == "uint8" && l.scalar_type() != torch::kUInt8) {
      if (l.numel() > 0) {
        const double lo = l.min().item<double>(), hi = l.max().item<double>();
        if (lo < 0 || hi > 255)
          return corrupt_data("load: case '" + c.id + "': label values [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "] do not fit label_dtype uint8; use label_dtype: int64");
      }
      l = l.to(torch::kUInt8);
    } else if (o.label_dtype == "int64") {
      l = l.to(torch::kInt64);
    }
    s.tensors[o.label_key] = l.contiguous();
  } else if (o.require_label) {
    return invalid_argument("load: case '" + c.id + "' has no label (require_label is true)");
  }
  return s;
}

namespace {

class LoadStage final : public SourceStage {
 public:
  using Options = LoadOptions;
  static constexpr const char* kName = "load";
  static constexpr const char* kDoc = "read a dataset case (image float32, label map, geometry)";
  static constexpr bool kDeterministic = true;

  LoadStage(Options o, nlohmann::json resolved)
      : SourceStage(kName, std::move(resolved), {o.image_key, o.label_key}), o_(std::move(o)) {}

  bool deterministic() const override { return true; }
  bool supports_device(const c10::Device& d) const override { return d.is_cpu(); }

  Result<Sample> read(const CaseEntry& entry) const override {
    SEGFLOW_ASSIGN_OR_RETURN(LoadedCase c, load_case(entry));
    return sample_from_case(std::move(c), o_);
  }

  // A sample that already holds its image passes through (pipelines fed with tensors).
  Status apply_sample(Sample& s, Rng&) const override {
    if (!s.has(o_.image_key))
      return invalid_argument("load: sample '" + s.id + "' has no '" + o_.image_key +
                              "'; start the pipeline from a dataset case (run_deterministic(CaseEntry))");
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_load_stage(StageRegistry& r) { return add_stage<LoadStage>(r); }

}  // namespace segflow::pipeline
