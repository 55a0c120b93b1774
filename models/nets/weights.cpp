#include "models/nets/weights.hpp"
#include "messages/file_util.hpp"

#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "pipeline/io/image.hpp"

namespace segflow::models {
namespace {

static_assert(std::endian::native == std::endian::little, "tensor archives assume a little-endian host");

constexpr char kMagic[8] = {'S', 'F', 'T', 'A', 'R', 'C', 'H', '1'};
constexpr uint64_t kAlign = 64;

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// "3 missing keys: a, b, c" with at most 20 names.
std::string list_keys(const std::vector<std::string>& keys, const std::string& what) {
  std::string s = std::to_string(keys.size()) + " " + what + (keys.size() == 1 ? "" : "s") + ": ";
  for (size_t i = 0; i < keys.size() && i < 20; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 20) s += ", ... (" + std::to_string(keys.size() - 20) + " more)";
  return s;
}

}  // namespace

Result<TensorMap> read_tensor_archive(const std::filesystem::path& path) {
  const std::string where = path.string();
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error(where + ": cannot open for reading");
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) return io_error(where + ": " + ec.message());
  char magic[8];
  uint64_t header_len = 0;
  if (file_size < 16 || !f.read(magic, 8) || !f.read(reinterpret_cast<char*>(&header_len), 8))
    return corrupt_data(where + ": not a segflow tensor archive (shorter than 16 bytes)");
  if (std::memcmp(magic, kMagic, 8) != 0)
    return corrupt_data(where + ": not a segflow tensor archive (expected magic SFTARCH1)");
  if (header_len > file_size - 16)
    return corrupt_data(where + ": header length " + std::to_string(header_len) + " exceeds the file size " +
                        std::to_string(file_size));
  std::string header(header_len, '\0');
  if (!f.read(header.data(), static_cast<std::streamsize>(header_len)))
    return io_error(where + ": cannot read header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    return corrupt_data(where + ": header is not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("tensors") || !j["tensors"].is_array())
    return corrupt_data(where + ": header: expected an object with a \"tensors\" array");
  if (j.contains("version") && j["version"] != 1)
    return unsupported(where + ": header.version: expected 1, got " + j["version"].dump());
  const uint64_t data_start = 16 + header_len;
  const uint64_t data_size = file_size - data_start;
  TensorMap out;
  size_t index = 0;
  for (const auto& t : j["tensors"]) {
    const std::string field = where + ": tensors[" + std::to_string(index++) + "]";
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("dtype") ||
        !t["dtype"].is_string() || !t.contains("shape") || !t["shape"].is_array() || !t.contains("offset") ||
        !t["offset"].is_number_unsigned() || !t.contains("nbytes") || !t["nbytes"].is_number_unsigned())
      return corrupt_data(field + ": expected {name, dtype, shape, offset, nbytes}, got " + t.dump());
    const auto name = t["name"].get<std::string>();
    const auto dt = t["dtype"].get<std::string>();
    const std::optional<at::ScalarType> dtype = pipeline::dtype_from_name(dt);
    if (!dtype) return corrupt_data(field + " (" + name + ").dtype: unknown dtype '" + dt + "'");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& s : t["shape"]) {
      if (!s.is_number_unsigned())
        return corrupt_data(field + " (" + name + ").shape: expected non-negative integers, got " +
                            t["shape"].dump());
      shape.push_back(s.get<int64_t>());
      numel *= s.get<uint64_t>();
    }
    const uint64_t offset = t["offset"].get<uint64_t>(), nbytes = t["nbytes"].get<uint64_t>();
    const uint64_t expected = numel * c10::elementSize(*dtype);
    if (nbytes != expected)
      return corrupt_data(field + " (" + name + ").nbytes: expected " + std::to_string(expected) + " for " +
                          dt + " " + t["shape"].dump() + ", got " + std::to_string(nbytes));
    if (offset > data_size || nbytes > data_size - offset)
      return corrupt_data(field + " (" + name + "): data [" + std::to_string(offset) + ", " +
                          std::to_string(offset + nbytes) + ") lies past the end of the file (truncated?)");
    if (out.count(name)) return corrupt_data(field + ": duplicate name '" + name + "'");
    auto tensor = at::empty(shape, at::TensorOptions().dtype(*dtype));
    f.seekg(static_cast<std::streamoff>(data_start + offset));
    if (nbytes && !f.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(nbytes)))
      return io_error(field + " (" + name + "): read failed");
    out.emplace(name, std::move(tensor));
  }
  return out;
}

Status write_tensor_archive(const std::filesystem::path& path, const TensorMap& tensors) {
  nlohmann::json list = nlohmann::json::array();
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) return invalid_argument("write_tensor_archive: " + name + ": undefined tensor");
    const char* dt = pipeline::dtype_name(t.scalar_type());
    if (!dt)
      return invalid_argument("write_tensor_archive: " + name + ": unsupported dtype " +
                              std::string(c10::toString(t.scalar_type())));
    auto c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = c.numel() * c.element_size();
    list.push_back(
        {{"name", name}, {"dtype", dt}, {"shape", c.sizes().vec()}, {"offset", offset}, {"nbytes", nbytes}});
    offset += (nbytes + kAlign - 1) / kAlign * kAlign;
    cpu.push_back(std::move(c));
  }
  nlohmann::json header = {{"format", "segflow-tensor-archive"}, {"version", 1}, {"tensors", list}};
  std::string h = header.dump();
  // Pad the header with spaces so the data section starts 64-byte aligned.
  h.append((kAlign - (16 + h.size()) % kAlign) % kAlign, ' ');
  const uint64_t header_len = h.size();
  return replace_file_atomically(path, [&](const std::filesystem::path& tmp) -> Status {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return io_error(tmp.string() + ": cannot open for writing");
    f.write(kMagic, 8);
    f.write(reinterpret_cast<const char*>(&header_len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    static const char zeros[kAlign] = {};
    for (const auto& c : cpu) {
      const uint64_t nbytes = c.numel() * c.element_size();
      f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(nbytes));
      f.write(zeros, static_cast<std::streamsize>((kAlign - nbytes % kAlign) % kAlign));
    }
    f.flush();
    if (!f) return io_error(tmp.string() + ": write failed");
    return Status::ok();
  });
}

TensorMap named_tensors(const torch::nn::Module& module) {
  TensorMap m;
  for (const auto& p : module.named_parameters(true)) m.emplace(p.key(), p.value().detach());
  for (const auto& b : module.named_buffers(true)) m.emplace(b.key(), b.value().detach());
  return m;
}

namespace {
void read_module(torch::serialize::InputArchive& ar, const torch::nn::Module& m, const std::string& prefix,
                 TensorMap& out) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    at::Tensor t;
    if (ar.try_read(p.key(), t)) out.emplace(prefix + p.key(), t);
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    at::Tensor t;
    if (ar.try_read(b.key(), t, /*is_buffer=*/true)) out.emplace(prefix + b.key(), t);
  }
  for (const auto& c : m.named_children()) {
    if (!c.value()->is_serializable()) continue;  // Module::save skips these too
    torch::serialize::InputArchive sub;
    if (ar.try_read(c.key(), sub)) read_module(sub, *c.value(), prefix + c.key() + ".", out);
  }
}
}  // namespace

TensorMap read_module_archive(torch::serialize::InputArchive& archive, const torch::nn::Module& module) {
  TensorMap out;
  read_module(archive, module, "", out);
  return out;
}

Status load_into(torch::nn::Module& module, const TensorMap& tensors, bool strict) {
  std::map<std::string, at::Tensor> targets;
  for (auto& p : module.named_parameters(true)) targets.emplace(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) targets.emplace(b.key(), b.value());
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      missing.push_back(name);
    } else if (!it->second.defined() || it->second.sizes() != t.sizes()) {
      mismatched.push_back(name + " (model " + shape_str(t.sizes()) + ", weights " +
                           (it->second.defined() ? shape_str(it->second.sizes()) : std::string("undefined")) +
                           ")");
    }
  }
  for (const auto& [name, t] : tensors)
    if (!targets.count(name)) unexpected.push_back(name);
  std::vector<std::string> problems;
  if (!mismatched.empty()) problems.push_back(list_keys(mismatched, "shape mismatch"));
  if (strict && !missing.empty()) problems.push_back(list_keys(missing, "missing key"));
  if (strict && !unexpected.empty()) problems.push_back(list_keys(unexpected, "unexpected key"));
  if (!problems.empty()) {
    std::string msg = "load_into: ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    return invalid_argument(msg);
  }
  at::NoGradGuard no_grad;
  for (auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it != tensors.end()) t.copy_(it->second);
  }
  return Status::ok();
}

}  // namespace segflow::models
