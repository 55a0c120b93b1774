#include "models/parallel/collective.hpp"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>

#include "messages/log.hpp"

namespace segflow::models::parallel {

namespace {

using BackendType = c10d::ProcessGroup::BackendType;

/// The first line of a LibTorch message (the rest is a C++ stack trace).
std::string seconds_text(std::chrono::milliseconds ms) {
  return std::to_string(static_cast<double>(ms.count()) / 1000.0) + " s";
}

/// Tensors grouped into flat buckets: consecutive tensors of one dtype and device, at most
/// `cap` bytes each (a bigger tensor gets a bucket of its own).
std::vector<std::vector<at::Tensor>> make_buckets(const std::vector<at::Tensor>& tensors, std::int64_t cap) {
  std::vector<std::vector<at::Tensor>> buckets;
  std::map<std::pair<int, std::string>, std::size_t> open;  // (dtype, device) -> bucket index
  std::map<std::size_t, std::int64_t> bytes;
  for (const auto& t : tensors) {
    const auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    const std::int64_t n = t.numel() * static_cast<std::int64_t>(t.element_size());
    auto it = open.find(key);
    if (it == open.end() || bytes[it->second] + n > cap) {
      buckets.emplace_back();
      it = open.insert_or_assign(key, buckets.size() - 1).first;
      bytes[it->second] = 0;
    }
    buckets[it->second].push_back(t.detach());
    bytes[it->second] += n;
  }
  return buckets;
}

/// One flat tensor for a bucket (the tensor itself when it is alone and contiguous, so the
/// collective works in place without copies).
at::Tensor flatten(const std::vector<at::Tensor>& bucket) {
  if (bucket.size() == 1 && bucket[0].is_contiguous()) return bucket[0].view({-1});
  std::vector<at::Tensor> flat;
  flat.reserve(bucket.size());
  for (const auto& t : bucket) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& bucket) {
  if (bucket.size() == 1 && bucket[0].is_contiguous() && flat.is_same(bucket[0].view({-1}))) return;
  if (bucket.size() == 1 && bucket[0].is_contiguous() && flat.data_ptr() == bucket[0].data_ptr()) return;
  std::int64_t off = 0;
  for (const auto& t : bucket) {
    const std::int64_t n = t.numel();
    t.copy_(flat.narrow(0, off, n).view(t.sizes()));
    off += n;
  }
}

/// A Collective over one c10d::ProcessGroup with one backend (Gloo or NCCL).
class GroupCollective final : public Collective {
 public:
  GroupCollective(c10::intrusive_ptr<c10d::ProcessGroup> pg, Backend backend, c10::Device device,
                  CollectiveOptions options)
      : pg_(std::move(pg)), backend_(backend), device_(device), options_(options) {}
  /// An NCCL group is shut down, not left to ProcessGroupNCCL's destructor, which aborts its
  /// communicators (and warns that the program did not call destroy_process_group).
  ~GroupCollective() override {
    if (backend_ != Backend::nccl || !pg_) return;
    try {
      pg_->shutdown();
    } catch (const std::exception& e) {
      log::warn("NCCL process group shutdown: " + first_line(e));
    }
  }

  int rank() const override { return pg_->getRank(); }
  int world_size() const override { return pg_->getSize(); }
  Backend backend() const override { return backend_; }
  c10::Device device() const override { return device_; }
  const CollectiveOptions& options() const override { return options_; }
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const override { return pg_; }

  Status allreduce_mean(const std::vector<at::Tensor>& tensors) override {
    return allreduce(tensors, true, "allreduce_mean");
  }
  Status allreduce_sum(const std::vector<at::Tensor>& tensors) override {
    return allreduce(tensors, false, "allreduce_sum");
  }

  Status broadcast(const std::vector<at::Tensor>& tensors, int root) override {
    if (root < 0 || root >= world_size())
      return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank of " +
                              std::to_string(world_size()));
    return guarded("broadcast", [&] {
      torch::NoGradGuard ng;
      auto buckets = make_buckets(tensors, options_.bucket_bytes);
      std::vector<at::Tensor> flats;
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      c10d::BroadcastOptions bo;
      bo.rootRank = root;
      for (auto& b : buckets) {
        check_device(b);
        std::vector<at::Tensor> one{flatten(b)};
        works.push_back(pg_->broadcast(one, bo));
        flats.push_back(one[0]);
      }
      for (auto& w : works) w->wait();
      for (std::size_t i = 0; i < buckets.size(); ++i) unflatten(flats[i], buckets[i]);
    });
  }

  Status barrier() override {
    return guarded("barrier", [&] { pg_->barrier()->wait(); });
  }

  Result<bool> all(bool flag) override { return reduce_flag(flag, c10d::ReduceOp::MIN, "all"); }
  Result<bool> any(bool flag) override { return reduce_flag(flag, c10d::ReduceOp::MAX, "any"); }

 private:
  template <class F>
  Status guarded(const char* op, F&& f) {
    try {
      f();
      return Status::ok();
    } catch (const std::exception& e) {
      return internal_error(std::string(to_string(backend_)) + " " + op + " on rank " +
                            std::to_string(rank()) + " of " + std::to_string(world_size()) +
                            " failed (a rank died, or exceeded the " + seconds_text(options_.timeout) +
                            " timeout): " + first_line(e));
    }
  }

  void check_device(const std::vector<at::Tensor>& b) const {
    TORCH_CHECK(b.front().device() == device_, "tensor on ", b.front().device().str(),
                ", this rank communicates on ", device_.str());
  }

  Status allreduce(const std::vector<at::Tensor>& tensors, bool mean, const char* op) {
    return guarded(op, [&] {
      torch::NoGradGuard ng;
      auto buckets = make_buckets(tensors, options_.bucket_bytes);
      std::vector<at::Tensor> flats;
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      // Gloo has no AVG: sum, then divide (as DDP does).
      c10d::AllreduceOptions ao;
      ao.reduceOp = c10d::ReduceOp::SUM;
      for (auto& b : buckets) {
        check_device(b);
        std::vector<at::Tensor> one{flatten(b)};
        works.push_back(pg_->allreduce(one, ao));
        flats.push_back(one[0]);
      }
      const double inv = 1.0 / static_cast<double>(world_size());
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        works[i]->wait();
        if (mean) {
          if (at::isFloatingType(flats[i].scalar_type()))
            flats[i].mul_(inv);
          else
            flats[i].div_(world_size(), "floor");
        }
        unflatten(flats[i], buckets[i]);
      }
    });
  }

  Result<bool> reduce_flag(bool flag, c10d::ReduceOp::RedOpType op, const char* name) {
    bool out = flag;
    SEGFLOW_RETURN_IF_ERROR(guarded(name, [&] {
      // A CPU tensor: Gloo reduces it (NCCL groups carry a Gloo backend for CPU tensors), so
      // the per-step flags (all_have, should_stop) never wait for the GPU's queue.
      std::vector<at::Tensor> t{torch::full({1}, flag ? 1 : 0, torch::TensorOptions().dtype(torch::kInt))};
      c10d::AllreduceOptions ao;
      ao.reduceOp = op;
      pg_->allreduce(t, ao)->wait();
      out = t[0].item<int>() != 0;
    }));
    return out;
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  Backend backend_;
  c10::Device device_;
  CollectiveOptions options_;
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

/// Builds the group for `device` on `store` (which every rank shares).
std::unique_ptr<Collective> make_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       const c10::Device& device, Backend backend,
                                       const CollectiveOptions& options, const std::string& gloo_host) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  auto make_gloo = [&](const c10::intrusive_ptr<c10d::Store>& gloo_store) {
    auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (!gloo_host.empty())
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(gloo_host));
    else
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    o->threads = 2;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, rank, size, o);
  };
  if (backend == Backend::gloo) {
    pg->setDefaultBackend(BackendType::GLOO);
    pg->setBackend(c10::DeviceType::CPU, BackendType::GLOO, make_gloo(store));
  } else {
#ifdef USE_C10D_NCCL
    // CPU tensors (the one-element flags of all()/any()) go to a Gloo backend of the same
    // group, under its own key prefix, as torch.distributed's "cpu:gloo,cuda:nccl" does.
    pg->setBackend(c10::DeviceType::CPU, BackendType::GLOO,
                   make_gloo(c10::make_intrusive<c10d::PrefixStore>("cpu-gloo/", store)));
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = options.timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
    // Bind the communicator to this rank's device instead of letting NCCL guess it from
    // rank % device_count (wrong for several processes per node with CUDA_VISIBLE_DEVICES).
    nccl->setBoundDeviceId(device);
    pg->setDefaultBackend(BackendType::NCCL);
    pg->setBackend(c10::DeviceType::CUDA, BackendType::NCCL, nccl);
#else
    TORCH_CHECK(false, "this LibTorch was built without NCCL");
#endif
  }
  return std::make_unique<GroupCollective>(pg, backend, device, options);
}

Result<int> parse_int(const std::function<const char*(const char*)>& getenv, const char* name, int lo,
                      int hi) {
  const char* v = getenv(name);
  if (!v) return not_found(std::string(name) + " is not set");
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    return invalid_argument(std::string(name) + ": expected an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "], got \"" + v + "\"");
  return static_cast<int>(x);
}

/// The first of `names` that is set, parsed; not_found (naming them all) when none is.
Result<int> parse_first(const std::function<const char*(const char*)>& getenv,
                        std::initializer_list<const char*> names, int lo, int hi) {
  std::string tried;
  for (const char* n : names) {
    if (getenv(n)) return parse_int(getenv, n, lo, hi);
    tried += tried.empty() ? n : std::string(" nor ") + n;
  }
  return not_found(tried + " is set");
}

}  // namespace

const char* to_string(Backend b) noexcept { return b == Backend::gloo ? "gloo" : "nccl"; }

Result<Backend> backend_for(const c10::Device& device) {
  if (device.is_cpu()) return Backend::gloo;
  if (device.is_cuda()) {
#ifdef USE_C10D_NCCL
    if (!torch::cuda::is_available())
      return invalid_argument("device " + device.str() + ": CUDA is not available (NCCL needs it)");
    if (!device.has_index())
      return invalid_argument("device " + device.str() + ": NCCL ranks need an explicit cuda:N");
    return Backend::nccl;
#else
    return unsupported("device " + device.str() + ": this LibTorch was built without NCCL");
#endif
  }
  return unsupported("device " + device.str() +
                     ": data-parallel training runs on cpu (Gloo) or cuda:N (NCCL)");
}

struct LocalRendezvous::Impl {
  CollectiveOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  std::mutex mu;
  std::vector<bool> joined;
};

LocalRendezvous::LocalRendezvous(int world_size, CollectiveOptions options)
    : world_size_(world_size), impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->store = c10::make_intrusive<c10d::HashStore>();
  impl_->store->setTimeout(options.timeout);
  impl_->joined.assign(static_cast<std::size_t>(std::max(0, world_size)), false);
}
LocalRendezvous::~LocalRendezvous() = default;

Result<std::unique_ptr<Collective>> LocalRendezvous::join(int rank, const c10::Device& device) {
  if (world_size_ < 1)
    return invalid_argument("local rendezvous: world size must be >= 1, got " + std::to_string(world_size_));
  if (rank < 0 || rank >= world_size_)
    return invalid_argument("local rendezvous: rank " + std::to_string(rank) + " is not in [0, " +
                            std::to_string(world_size_) + ")");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->joined[static_cast<std::size_t>(rank)])
      return invalid_argument("local rendezvous: rank " + std::to_string(rank) + " joined twice");
    impl_->joined[static_cast<std::size_t>(rank)] = true;
  }
  SEGFLOW_ASSIGN_OR_RETURN(Backend backend, backend_for(device));
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("segflow/local", impl_->store);
    return make_group(store, rank, world_size_, device, backend, impl_->options, "127.0.0.1");
  } catch (const std::exception& e) {
    return internal_error(std::string("local rendezvous (") + to_string(backend) + ") as rank " +
                          std::to_string(rank) + " of " + std::to_string(world_size_) + " failed within " +
                          seconds_text(impl_->options.timeout) + ": " + first_line(e));
  }
}

Result<LaunchEnv> launch_env(const std::function<const char*(const char*)>& getenv) {
  LaunchEnv env;
  const bool torchrun = getenv("RANK") != nullptr;
  env.launcher = torchrun ? "torchrun" : "slurm";
  const std::string how =
      " (start the workers with torchrun, srun or a PyTorchJob, or set MASTER_ADDR, MASTER_PORT, WORLD_SIZE "
      "and RANK)";
  auto rank = parse_first(getenv, {"RANK", "SLURM_PROCID"}, 0, INT_MAX);
  if (!rank.is_ok()) return Status(rank.status().code(), rank.status().message() + how);
  env.rank = *rank;
  auto world = parse_first(getenv, {"WORLD_SIZE", "SLURM_NTASKS"}, 1, INT_MAX);
  if (!world.is_ok()) return Status(world.status().code(), world.status().message() + how);
  env.world_size = *world;
  if (env.rank >= env.world_size)
    return invalid_argument(std::string(torchrun ? "RANK" : "SLURM_PROCID") + " " + std::to_string(env.rank) +
                            " is not below " + (getenv("WORLD_SIZE") ? "WORLD_SIZE " : "SLURM_NTASKS ") +
                            std::to_string(env.world_size));
  if (getenv("LOCAL_RANK") || getenv("SLURM_LOCALID")) {
    SEGFLOW_ASSIGN_OR_RETURN(env.local_rank,
                             parse_first(getenv, {"LOCAL_RANK", "SLURM_LOCALID"}, 0, INT_MAX));
  }
  const char* addr = getenv("MASTER_ADDR");
  if (!addr || !*addr) return not_found("MASTER_ADDR is not set (the host of rank 0)" + how);
  env.master_addr = addr;
  auto port = parse_int(getenv, "MASTER_PORT", 1, 65535);
  if (!port.is_ok()) return Status(port.status().code(), port.status().message() + how);
  env.master_port = *port;
  return env;
}

Result<LaunchEnv> launch_env() {
  return launch_env([](const char* n) -> const char* { return std::getenv(n); });
}

Result<std::unique_ptr<Collective>> connect(const LaunchEnv& env, const c10::Device& device,
                                            CollectiveOptions options) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    return invalid_argument("connect: rank " + std::to_string(env.rank) + " of world size " +
                            std::to_string(env.world_size));
  SEGFLOW_ASSIGN_OR_RETURN(Backend backend, backend_for(device));
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.numWorkers = static_cast<std::size_t>(env.world_size);
    so.waitWorkers = true;
    so.timeout = options.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    return internal_error("rendezvous at " + where + " (MASTER_ADDR:MASTER_PORT) as rank " +
                          std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                          " failed within " + seconds_text(options.timeout) + ": " + first_line(e));
  }
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("segflow/default", store);
    return make_group(prefixed, env.rank, env.world_size, device, backend, options,
                      is_loopback(env.master_addr) ? "127.0.0.1" : "");
  } catch (const std::exception& e) {
    return internal_error(std::string("creating the ") + to_string(backend) + " group through " + where +
                          " as rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                          " failed within " + seconds_text(options.timeout) + ": " + first_line(e));
  }
}

}  // namespace segflow::models::parallel
