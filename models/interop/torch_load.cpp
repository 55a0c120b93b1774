#include "models/interop/torch_load.hpp"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <system_error>

namespace segflow::models {

namespace {

/// A value on the unpickler's stack: an IValue, a global (a class or function, by its
/// "module.name"), or the MARK that TUPLE, SETITEMS and APPENDS pop back to.
struct PickleItem {
  c10::IValue value;
  std::string global;  ///< non-empty: a global
  bool mark = false;
};

/// A global's value on the stack (so that one inside a tuple, the storage class of a
/// persistent id, keeps its name): this prefix and "module.name".
constexpr const char* kGlobalTag = "\x01global:";

std::optional<at::ScalarType> storage_dtype(const std::string& global) {
  static const std::map<std::string, at::ScalarType> kTable{
      {"torch.FloatStorage", at::kFloat}, {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},   {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool},
      {"torch.UntypedStorage", at::kByte}};
  auto it = kTable.find(global);
  if (it == kTable.end()) return std::nullopt;
  return it->second;
}

std::vector<std::int64_t> int_tuple(const c10::IValue& v) {
  std::vector<std::int64_t> out;
  for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toInt());
  return out;
}

class TorchUnpickler {
 public:
  TorchUnpickler(caffe2::serialize::PyTorchStreamReader& reader, const char* data, std::size_t size,
                 std::string where)
      : reader_(reader), data_(data), size_(size), where_(std::move(where)) {}

  Result<c10::IValue> run() {
    try {
      while (true) {
        const std::uint8_t op = byte();
        if (op == '.') break;
        if (!step(op)) return corrupt_data(where_ + ": unknown pickle opcode " + std::to_string(op));
      }
      if (stack_.size() != 1) return corrupt_data(where_ + ": pickle stream ends with a bad stack");
      return stack_.back().value;
    } catch (const std::exception& e) {
      return corrupt_data(
          where_ + ": not a torch.save archive segflow can read: " + std::string(e.what()).substr(0, 300));
    }
  }

 private:
  std::uint8_t byte() {
    if (pos_ >= size_) throw std::runtime_error("data.pkl is truncated");
    return static_cast<std::uint8_t>(data_[pos_++]);
  }
  std::uint64_t uint_le(int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(byte()) << (8 * i);
    return v;
  }
  std::string bytes(std::size_t n) {
    if (n > size_ - pos_) throw std::runtime_error("data.pkl is truncated");
    std::string s(data_ + pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    std::string s;
    for (char c = static_cast<char>(byte()); c != '\n'; c = static_cast<char>(byte())) s += c;
    return s;
  }
  PickleItem pop() {
    if (stack_.empty()) throw std::runtime_error("pickle stack underflow");
    PickleItem it = std::move(stack_.back());
    stack_.pop_back();
    return it;
  }
  /// The items above the last MARK, which is removed.
  std::vector<PickleItem> pop_to_mark() {
    std::size_t m = stack_.size();
    while (m > 0 && !stack_[m - 1].mark) --m;
    if (m == 0) throw std::runtime_error("pickle MARK missing");
    std::vector<PickleItem> out(std::make_move_iterator(stack_.begin() + m),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(m - 1);
    return out;
  }
  void push(c10::IValue v) { stack_.push_back(PickleItem{std::move(v), {}, false}); }
  void push_global(const std::string& name) {
    stack_.push_back(PickleItem{std::string(kGlobalTag) + name, name, false});
  }
  void memo_put(std::size_t i) {
    if (stack_.empty()) throw std::runtime_error("pickle memo of an empty stack");
    memo_[i] = stack_.back();
  }

  bool step(std::uint8_t op) { return scalar(op) || container(op) || object(op); }
  bool scalar(std::uint8_t op);
  bool container(std::uint8_t op);
  bool object(std::uint8_t op);
  c10::IValue reduce(const std::string& global, const c10::IValue& args);
  c10::IValue storage(const c10::IValue& pid);

  caffe2::serialize::PyTorchStreamReader& reader_;
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::string where_;
  std::vector<PickleItem> stack_;
  std::map<std::size_t, PickleItem> memo_;
  std::map<std::string, at::Storage> storages_;
};

bool TorchUnpickler::scalar(std::uint8_t op) {
  switch (op) {
    case 0x80:
      byte();
      return true;  // PROTO
    case 0x95:
      uint_le(8);
      return true;  // FRAME
    case 'N':
      push(c10::IValue());
      return true;
    case 0x88:
      push(true);
      return true;  // NEWTRUE
    case 0x89:
      push(false);
      return true;  // NEWFALSE
    case 'K':
      push(static_cast<std::int64_t>(uint_le(1)));
      return true;
    case 'M':
      push(static_cast<std::int64_t>(uint_le(2)));
      return true;
    case 'J':
      push(static_cast<std::int64_t>(static_cast<std::int32_t>(uint_le(4))));
      return true;
    case 0x8a: {  // LONG1: little-endian two's complement
      const int n = byte();
      if (n > 8) throw std::runtime_error("integer wider than 64 bits");
      std::uint64_t v = uint_le(n);
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t{0} << (8 * n);
      push(static_cast<std::int64_t>(v));
      return true;
    }
    case 'G': {  // BINFLOAT: big-endian double
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
      double d;
      std::memcpy(&d, &v, sizeof d);
      push(d);
      return true;
    }
    case 0x8c:
    case 'U':
    case 'C':
      push(bytes(uint_le(1)));
      return true;  // short str / bytes
    case 'X':
    case 'T':
    case 'B':
      push(bytes(uint_le(4)));
      return true;  // str / bytes
    case 0x8d:
    case 0x8e:
      push(bytes(uint_le(8)));
      return true;  // 8-byte lengths
    default:
      return false;
  }
}

bool TorchUnpickler::container(std::uint8_t op) {
  switch (op) {
    case '}':
      push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
      return true;
    case ']':
    case 0x8f:
      push(c10::impl::GenericList(c10::AnyType::get()));
      return true;  // list, set
    case ')':
      push(c10::ivalue::Tuple::create({}));
      return true;
    case '(':
      stack_.push_back(PickleItem{{}, {}, true});
      return true;
    case 't':
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE, TUPLE1..3
      std::vector<c10::IValue> elems;
      if (op == 't') {
        for (auto& it : pop_to_mark()) elems.push_back(std::move(it.value));
      } else {
        for (int i = 0; i < op - 0x84; ++i) elems.insert(elems.begin(), pop().value);
      }
      push(c10::ivalue::Tuple::create(std::move(elems)));
      return true;
    }
    case 's':
    case 'u': {  // SETITEM, SETITEMS
      std::vector<PickleItem> kv;
      if (op == 'u')
        kv = pop_to_mark();
      else {
        kv.push_back(pop());
        kv.insert(kv.begin(), pop());
      }
      if (stack_.empty() || !stack_.back().value.isGenericDict())
        throw std::runtime_error("SETITEMS on a non-dict");
      auto dict = stack_.back().value.toGenericDict();
      for (std::size_t i = 0; i + 1 < kv.size(); i += 2) dict.insert_or_assign(kv[i].value, kv[i + 1].value);
      return true;
    }
    case 'a':
    case 'e':
    case 0x90: {  // APPEND, APPENDS, ADDITEMS
      std::vector<PickleItem> items;
      if (op == 'a')
        items.push_back(pop());
      else
        items = pop_to_mark();
      if (stack_.empty() || !stack_.back().value.isList()) throw std::runtime_error("APPENDS on a non-list");
      auto list = stack_.back().value.toList();
      for (auto& it : items) list.push_back(it.value);
      return true;
    }
    case 'q':
      memo_put(uint_le(1));
      return true;  // BINPUT
    case 'r':
      memo_put(uint_le(4));
      return true;  // LONG_BINPUT
    case 0x94:
      memo_put(memo_.size());
      return true;  // MEMOIZE
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      auto it = memo_.find(uint_le(op == 'h' ? 1 : 4));
      if (it == memo_.end()) throw std::runtime_error("pickle memo entry missing");
      stack_.push_back(it->second);
      return true;
    }
    case '0':
      pop();
      return true;  // POP
    case '1':
      pop_to_mark();
      return true;  // POP_MARK
    case '2':
      stack_.push_back(stack_.back());
      return true;  // DUP
    default:
      return false;
  }
}

bool TorchUnpickler::object(std::uint8_t op) {
  switch (op) {
    case 'c': {  // GLOBAL module\nname\n
      std::string module = line();
      push_global(module + "." + line());
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      const std::string name = pop().value.toStringRef();
      push_global(pop().value.toStringRef() + "." + name);
      return true;
    }
    case 'R':
    case 0x81: {  // REDUCE callable(args), NEWOBJ cls.__new__(cls, *args)
      const c10::IValue args = pop().value;
      const PickleItem f = pop();
      push(reduce(f.global, args));
      return true;
    }
    case 0x92: {  // NEWOBJ_EX cls, args, kwargs
      pop();
      pop();
      const PickleItem f = pop();
      push(reduce(f.global, c10::IValue()));
      return true;
    }
    case 'b':
      pop();
      return true;  // BUILD: the object's state is not needed
    case 'Q':
      push(storage(pop().value));
      return true;  // BINPERSID
    default:
      return false;
  }
}

c10::IValue TorchUnpickler::reduce(const std::string& global, const c10::IValue& args) {
  const auto elems = args.isTuple() ? args.toTupleRef().elements().vec() : std::vector<c10::IValue>{};
  if (global == "collections.OrderedDict" || global == "builtins.dict")
    return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  if (global == "torch._utils._rebuild_tensor_v2" || global == "torch._utils._rebuild_tensor") {
    const at::Tensor st = elems.at(0).toTensor();
    return at::empty({0}, st.options())
        .set_(st.storage(), elems.at(1).toInt(), int_tuple(elems.at(2)), int_tuple(elems.at(3)));
  }
  if (global == "torch._utils._rebuild_parameter" || global == "torch._utils._rebuild_parameter_with_state")
    return elems.at(0);
  if (global == "torch.device") return elems.at(0).toStringRef();
  if (global == "builtins.set" || global == "builtins.frozenset") {
    c10::impl::GenericList out(c10::AnyType::get());
    if (!elems.empty() && elems[0].isList())
      for (const auto& e : elems[0].toList()) out.push_back(e);
    return out;
  }
  return c10::IValue();  // another class or function: not needed, not run
}

c10::IValue TorchUnpickler::storage(const c10::IValue& pid) {
  // ('storage', torch.FloatStorage, key, location, numel), the class a tagged global.
  const auto& e = pid.toTupleRef().elements();
  if (e.size() < 5 || e[0].toStringRef() != "storage") throw std::runtime_error("unknown persistent id");
  const std::string cls = e[1].isString() ? e[1].toStringRef() : "";
  const std::size_t tag = std::strlen(kGlobalTag);
  const auto found = cls.size() > tag ? storage_dtype(cls.substr(tag)) : std::nullopt;
  if (!found)
    throw std::runtime_error("unknown storage class '" + cls.substr(std::min(tag, cls.size())) + "'");
  const at::ScalarType dtype = *found;
  const std::string& key = e[2].toStringRef();
  auto it = storages_.find(key);
  if (it == storages_.end()) {
    const std::int64_t numel = e[4].toInt();
    const std::size_t nbytes = static_cast<std::size_t>(numel) * c10::elementSize(dtype);
    at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (nbytes > 0) {
      auto [ptr, size] = reader_.getRecord("data/" + key);
      if (size < nbytes) throw std::runtime_error("storage data/" + key + " is shorter than its tensor");
      std::memcpy(t.data_ptr(), ptr.get(), nbytes);
    }
    it = storages_.emplace(key, t.storage()).first;
  }
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(it->second);
}

}  // namespace

Result<c10::IValue> read_torch_save(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return not_found(path.string() + ": missing");
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path.string());
  } catch (const std::exception&) {
    return corrupt_data(path.string() +
                        ": not a torch.save zip archive (torch >= 1.6); re-save it with a current torch");
  }
  try {
    auto [ptr, size] = reader->getRecord("data.pkl");
    TorchUnpickler u(*reader, static_cast<const char*>(ptr.get()), size, path.string());
    return u.run();
  } catch (const std::exception& e) {
    return corrupt_data(path.string() + ": " + std::string(e.what()).substr(0, 300));
  }
}

Result<std::vector<std::pair<std::string, at::Tensor>>> state_dict_tensors(const c10::IValue& value,
                                                                           const std::string& where) {
  if (!value.isGenericDict()) return invalid_argument(where + ": expected a dict of tensors (a state_dict)");
  const auto dict = value.toGenericDict();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& kv : dict)
    if (kv.key().isString() && kv.value().isTensor())
      out.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  if (!out.empty()) return out;
  for (const char* k : {"state_dict", "model", "network_weights"})
    if (dict.contains(k) && dict.at(k).isGenericDict())
      return state_dict_tensors(dict.at(k), where + ": " + k);
  return invalid_argument(where +
                          ": expected a dict of tensors (a state_dict) or one under state_dict, model "
                          "or network_weights; found none");
}

}  // namespace segflow::models
