// segflow infer with box prompts (apps/infer_boxes.hpp, models/box_inference.hpp).
#include <nlohmann/json.hpp>

#include <iostream>

#include "apps/commands.hpp"
#include "apps/infer_boxes.hpp"
#include "models/box_inference.hpp"

namespace segflow::apps {

bool wants_box_inference(const Args& a) {
  return a.has("boxes") || a.has("boxes-from") || a.has("box-margin") || a.flag("propagate");
}

int infer_with_boxes(const Args& a) {
  if (a.all("checkpoint").size() > 1)
    return fail("infer", invalid_argument("--checkpoint: box-prompted inference takes one checkpoint, got " +
                                          std::to_string(a.all("checkpoint").size())));
  for (const char* k : {"tta", "overlap", "stitch-device", "postprocess", "amp", "channels-last"})
    if (a.has(k))
      return fail("infer", invalid_argument(std::string("--") + k + ": not used by box-prompted inference"));
  if (a.flag("save-probabilities"))
    return fail("infer", invalid_argument("--save-probabilities: not used by box-prompted inference"));
  models::BoxInferOptions o;
  o.checkpoint = a.get("checkpoint");
  o.input = a.get("input");
  o.output = a.get("output");
  o.device = a.get("device", "auto");
  o.boxes = a.get("boxes");
  o.boxes_from = a.get("boxes-from");
  o.propagate = a.flag("propagate");
  o.format = a.get("format");
  if (a.has("box-margin")) {
    auto m = parse_int("--box-margin", a.get("box-margin"));
    if (!m.is_ok()) return fail("infer", m.status());
    o.box_margin = *m;
  }
  if (a.has("class-names")) {
    const std::string text = a.get("class-names");
    for (std::size_t p = 0; p <= text.size();) {
      const std::size_t q = std::min(text.find(',', p), text.size());
      o.class_names.push_back(text.substr(p, q - p));
      p = q + 1;
    }
  }
  auto r = models::run_box_inference(o);
  if (!r.is_ok()) return fail("infer", r.status());
  nlohmann::json spans = nlohmann::json::array();
  for (const auto& s : r->spans)
    spans.push_back({{"label", s.label},
                     {"name", s.name},
                     {"first_slice", s.first_slice},
                     {"last_slice", s.last_slice},
                     {"voxels", s.voxels}});
  const auto& x = r->result;
  std::cout << nlohmann::json{{"case", x.case_id},   {"output", x.output.string()},
                              {"size", x.size},      {"labels", x.labels},
                              {"segments", spans},   {"slices_embedded", r->slices_embedded},
                              {"seconds", x.seconds}}
                   .dump()
            << '\n';
  return 0;
}

}  // namespace segflow::apps
