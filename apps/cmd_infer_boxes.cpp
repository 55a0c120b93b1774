// segflow infer with box prompts (apps/infer_boxes.hpp, models/inference/box_inference.hpp).
#include <nlohmann/json.hpp>

#include <iostream>

#include "apps/commands.hpp"
#include "apps/infer_args.hpp"
#include "apps/infer_boxes.hpp"
#include "models/inference/box_inference.hpp"
#include "models/inference/inference.hpp"

namespace segflow::apps {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

/// The result line of one case.
json result_line(const models::BoxInferResult& r) {
  json spans = json::array();
  for (const auto& s : r.spans)
    spans.push_back({{"label", s.label},
                     {"name", s.name},
                     {"first_slice", s.first_slice},
                     {"last_slice", s.last_slice},
                     {"voxels", s.voxels}});
  json j = infer_result_json(r.result);
  j.erase("tta_axes");  // box prompts have no TTA
  j["segments"] = spans;
  j["slices_embedded"] = r.slices_embedded;
  return j;
}

/// A folder of scans (or a dataset): each case with its own prompts from the folders given as
/// --boxes / --boxes-from, written to the output folder as "<case id>.nii.gz" (".dcm" for
/// DICOM series). A case that fails is reported with its error and the others go on; exit 1
/// when any failed.
int infer_folder_with_boxes(const models::BoxInferOptions& base) {
  const fs::path& prompts = base.boxes.empty() ? base.boxes_from : base.boxes;
  const bool box_files = !base.boxes.empty();
  if (!fs::is_directory(prompts))
    return fail("infer", invalid_argument(std::string(box_files ? "--boxes " : "--boxes-from ") +
                                          prompts.string() + ": a folder input takes a folder of " +
                                          (box_files ? "box files (<case id>.json / .csv)" : "label maps") +
                                          ", one per case"));
  std::vector<std::pair<std::string, std::string>> skipped;
  auto cases = models::list_inference_cases(base.input, &skipped);
  if (!cases.is_ok()) return fail("infer", cases.status());
  for (const auto& [file, why] : skipped)
    std::cerr << "segflow infer: skipped " << file << ": " << why << '\n';
  if (!base.also_output.empty())
    return fail("infer", invalid_argument("--also-output " + base.also_output.front().string() +
                                          ": names a file of one scan; " + base.input.string() +
                                          " is a folder of scans"));
  if (base.output.has_extension() && !fs::is_directory(base.output))
    return fail("infer", invalid_argument("--output " + base.output.string() +
                                          ": a folder input writes into a folder (one file per case)"));
  // The checkpoint is loaded once for every case (and a bad one fails before any case).
  auto model = models::load_box_model(base.checkpoint, base.device);
  if (!model.is_ok()) return fail("infer", model.status());
  fs::create_directories(base.output);
  int failed = 0;
  for (const models::InferCase& c : *cases) {
    models::BoxInferOptions o = base;
    Status st = Status::ok();
    if (c.channels.size() != 1)
      st = invalid_argument("box-prompted inference takes one image per case, got " +
                            std::to_string(c.channels.size()) + " channels");
    const fs::path prompt = models::prompt_file_for(prompts, c.id, box_files);
    if (st.is_ok() && prompt.empty())
      st = not_found(prompts.string() + ": no " +
                     (box_files ? "box file " + c.id + ".json or .csv" : "label map") + " for case " + c.id);
    if (st.is_ok()) {
      (box_files ? o.boxes : o.boxes_from) = prompt;
      o.input = c.channels.front();
      const bool seg = base.format == "seg" || (base.format.empty() && c.dicom);
      o.output = base.output / (c.id + (seg ? ".dcm" : ".nii.gz"));
      auto r = models::run_box_inference(o, **model);
      if (r.is_ok()) {
        std::cout << result_line(*r).dump() << '\n' << std::flush;
        continue;
      }
      st = r.status();
    }
    ++failed;
    std::cout << json{{"case", c.id}, {"error", st.message()}}.dump() << '\n' << std::flush;
    std::cerr << "segflow infer: " << c.id << ": " << st.message() << '\n';
  }
  std::cerr << "segflow infer: " << cases->size() - static_cast<std::size_t>(failed) << " of "
            << cases->size() << " cases written to " << base.output.string() << '\n';
  return failed == 0 ? 0 : 1;
}

}  // namespace

std::span<const Option> box_prompt_options() { return infer_flags("box prompts (a sam checkpoint)"); }

bool wants_box_inference(const Args& a) {
  for (const Option& o : box_prompt_options())
    if (a.given(o.name)) return true;
  return false;
}

int infer_with_boxes(const Args& a) {
  if (a.all("checkpoint").size() > 1)
    return fail("infer", invalid_argument("--checkpoint: box-prompted inference takes one checkpoint, got " +
                                          std::to_string(a.all("checkpoint").size())));
  for (const Option& o : sliding_window_options())
    if (a.given(o.name))
      return fail("infer",
                  invalid_argument("--" + std::string(o.name) + ": not used by box-prompted inference"));
  auto request = infer_request_from_args(a);
  if (!request.is_ok()) return fail("infer", request.status());
  const models::BoxInferOptions o = request->box_options();
  if (!models::is_single_scan(o.input)) return infer_folder_with_boxes(o);
  auto r = models::run_box_inference(o);
  if (!r.is_ok()) return fail("infer", r.status());
  std::cout << result_line(*r).dump() << '\n';
  return 0;
}

}  // namespace segflow::apps
