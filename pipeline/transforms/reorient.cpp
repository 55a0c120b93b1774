#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::pipeline {

namespace {
// World (LPS) axis and sign of an orientation letter: an axis "points to" that letter.
bool letter_axis(char c, int& axis, double& sign) {
  switch (c) {
    case 'L':
      axis = 0;
      sign = 1;
      return true;
    case 'R':
      axis = 0;
      sign = -1;
      return true;
    case 'P':
      axis = 1;
      sign = 1;
      return true;
    case 'A':
      axis = 1;
      sign = -1;
      return true;
    case 'S':
      axis = 2;
      sign = 1;
      return true;
    case 'I':
      axis = 2;
      sign = -1;
      return true;
    default:
      return false;
  }
}
}  // namespace

Status check_axcodes(const std::string& axcodes) {
  bool seen[3] = {false, false, false};
  bool ok = axcodes.size() == 3;
  for (char c : axcodes) {
    int a = 0;
    double s = 0;
    if (!letter_axis(c, a, s) || seen[a])
      ok = false;
    else
      seen[a] = true;
  }
  if (!ok)
    return invalid_argument(
        "expected 3 letters, one of L/R, one of P/A and one of I/S (e.g. \"RAS\", \"LPS\"), got \"" +
        axcodes + "\"");
  return Status::ok();
}

void ReorientOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to reorient (same grid)");
  p.string("axcodes", axcodes, "where axes x, y, z point, one of L/R, P/A, I/S each (\"RAS\", \"LPS\")");
  if (Status st = check_axcodes(axcodes); !st.is_ok()) p.fail("axcodes", st.message());
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

ReorientPlan plan_reorient(const Geometry& g, const std::string& axcodes) {
  std::array<int, 3> world{0, 1, 2};
  std::array<double, 3> sign{1, 1, 1};
  for (int i = 0; i < 3; ++i) letter_axis(axcodes[i], world[i], sign[i]);
  auto D = [&](int r, int c) { return g.direction[r * 3 + c]; };
  std::array<int, 3> perm{0, 1, 2}, best = perm;
  double best_score = -1;
  do {
    double score = 0;
    for (int i = 0; i < 3; ++i) score += std::abs(D(world[i], perm[i]));
    if (score > best_score + 1e-12) {
      best_score = score;
      best = perm;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  ReorientPlan plan;
  plan.source = best;
  for (int i = 0; i < 3; ++i) plan.flip[i] = D(world[i], best[i]) * sign[i] < 0;
  return plan;
}

at::Tensor reorient_tensor(const at::Tensor& t, const ReorientPlan& plan) {
  if (plan.identity()) return t;
  std::vector<std::int64_t> order{0, 0, 0, 0};
  for (int d = 1; d <= 3; ++d) order[d] = 3 - plan.source[3 - d];
  at::Tensor r = t.permute(order);
  std::vector<std::int64_t> flips;
  for (int i = 0; i < 3; ++i)
    if (plan.flip[i]) flips.push_back(3 - i);
  if (!flips.empty()) r = r.flip(flips);
  return r.contiguous();
}

Geometry reorient_geometry(const Geometry& g, const Size3& size, const ReorientPlan& plan) {
  Geometry out;
  std::array<double, 3> corner{0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    const int a = plan.source[i];
    const double s = plan.flip[i] ? -1.0 : 1.0;
    out.spacing[i] = g.spacing[a];
    for (int r = 0; r < 3; ++r) out.direction[r * 3 + i] = s * g.direction[r * 3 + a];
    if (plan.flip[i]) corner[a] = static_cast<double>(size[a] - 1);
  }
  out.origin = index_to_physical(g, corner);
  return out;
}

namespace {

class ReorientStage final : public MapStage {
 public:
  using Options = ReorientOptions;
  static constexpr const char* kName = "reorient";
  static constexpr const char* kDoc = "permute/flip axes to the closest orientation code (RAS, LPS, ...)";
  static constexpr bool kDeterministic = true;

  ReorientStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    if (keys.empty()) return Status::ok();
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, keys, kName, true).status());
    const ReorientPlan plan = plan_reorient(s.geometry, o_.axcodes);
    if (plan.identity()) return Status::ok();
    const Size3 size = detail::spatial_size_xyz(s.at(keys.front()));
    for (const auto& k : keys) s.at(k) = reorient_tensor(s.at(k), plan);
    s.geometry = reorient_geometry(s.geometry, size, plan);
    detail::drop_indices(s);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_reorient_stage(StageRegistry& r) { return add_stage<ReorientStage>(r); }

}  // namespace segflow::pipeline
