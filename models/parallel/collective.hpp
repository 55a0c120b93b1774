#pragma once
// Collective communication between data-parallel ranks, on c10d's own process groups:
// Gloo (ProcessGroupGloo) for CPU tensors, NCCL (ProcessGroupNCCL) for CUDA tensors. No
// home-made network collective: everything here is a thin layer over c10d so that the
// reducer (models/parallel/ddp_sync.hpp) can use DDP's own c10d::Reducer on the same group.
//
// Ranks meet through a store:
//  - in one process (tests, `devices: [cuda:0, cuda:1]`): a LocalRendezvous shares one
//    c10d::HashStore; each rank's thread calls join() and they all block until all joined;
//  - one process per rank (torchrun, SLURM srun, Kubeflow PyTorchJob): launch_env() reads
//    MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK (SLURM_PROCID, SLURM_NTASKS,
//    SLURM_LOCALID as fallbacks) and connect() meets the others through a c10d::TCPStore
//    served by rank 0.
//
// Failure: every operation waits at most `timeout`; a rank that dies makes the others fail
// with an error naming the operation (Gloo: at once when the peer's socket closes, or at the
// timeout; NCCL: at the timeout, through ProcessGroupNCCL's watchdog) instead of hanging.
//
// Threads: one Collective per rank; its methods are called from that rank's thread only.
// Every rank must issue the same collectives in the same order (c10d's rule).

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace at {
class Tensor;
}
namespace c10d {
class ProcessGroup;
}

namespace segflow::models::parallel {

enum class Backend { gloo, nccl };
const char* to_string(Backend b) noexcept;

struct CollectiveOptions {
  /// Longest wait of any rendezvous or collective before it fails. Must exceed the longest
  /// stretch one rank can spend outside collectives while the others wait (rank 0's
  /// validation and checkpoint writing between epochs), hence the generous default.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// Bytes per flattened bucket in allreduce_mean/broadcast (DDP's bucket_cap_mb = 25).
  std::int64_t bucket_bytes = 25LL << 20;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Backend backend() const = 0;
  /// Where this rank's tensors must live (cpu for Gloo, cuda:N for NCCL).
  virtual c10::Device device() const = 0;
  virtual const CollectiveOptions& options() const = 0;

  /// Averages each tensor across ranks, in place. Tensors may differ in shape and dtype;
  /// they are flattened into buckets of options().bucket_bytes per dtype, all buckets are
  /// started before the first is waited for.
  virtual Status allreduce_mean(const std::vector<at::Tensor>& tensors) = 0;
  /// Sums each tensor across ranks, in place (same bucketing).
  virtual Status allreduce_sum(const std::vector<at::Tensor>& tensors) = 0;
  /// Copies rank `root`'s values into every rank's tensors, in place.
  virtual Status broadcast(const std::vector<at::Tensor>& tensors, int root = 0) = 0;
  virtual Status barrier() = 0;
  /// True on every rank when `flag` is true on every rank (a one-element MIN all-reduce of a
  /// CPU tensor, over Gloo for NCCL groups too: it never waits for a GPU).
  virtual Result<bool> all(bool flag) = 0;
  /// True on every rank when `flag` is true on any rank (a one-element MAX all-reduce, idem).
  virtual Result<bool> any(bool flag) = 0;

  /// The c10d group, for c10d::Reducer and anything else that speaks c10d.
  virtual c10::intrusive_ptr<c10d::ProcessGroup> process_group() const = 0;
};

/// Gloo for CPU devices, NCCL for CUDA devices (an error when CUDA is missing).
Result<Backend> backend_for(const c10::Device& device);

/// Several ranks in one process, meeting through a shared c10d::HashStore.
class LocalRendezvous {
 public:
  explicit LocalRendezvous(int world_size, CollectiveOptions options = {});
  ~LocalRendezvous();
  LocalRendezvous(const LocalRendezvous&) = delete;
  LocalRendezvous& operator=(const LocalRendezvous&) = delete;

  int world_size() const { return world_size_; }
  /// Joins as `rank` with tensors on `device` (cpu: Gloo, cuda:N: NCCL). Blocks until every
  /// rank has joined, or fails after options.timeout. Call it once per rank, each from the
  /// thread that will use the Collective, all ranks concurrently.
  Result<std::unique_ptr<Collective>> join(int rank, const c10::Device& device);

 private:
  struct Impl;
  int world_size_;
  std::unique_ptr<Impl> impl_;
};

/// Where this process stands in a multi-process job, as its launcher said.
struct LaunchEnv {
  std::string master_addr;  ///< host of rank 0's TCP store (MASTER_ADDR)
  int master_port = 0;      ///< its port (MASTER_PORT)
  int world_size = 1;       ///< WORLD_SIZE, else SLURM_NTASKS
  int rank = 0;             ///< RANK, else SLURM_PROCID
  int local_rank = 0;       ///< LOCAL_RANK, else SLURM_LOCALID, else 0 (picks cuda:N)
  std::string launcher;     ///< "torchrun" (RANK etc. set) or "slurm" (the fallbacks)
};

/// Reads a LaunchEnv through `getenv` (testable); errors name the variable and its value.
Result<LaunchEnv> launch_env(const std::function<const char*(const char*)>& getenv);
/// The same from the process environment.
Result<LaunchEnv> launch_env();

/// Connects this process as env.rank through a TCPStore at master_addr:master_port (rank 0
/// serves it), then builds the Gloo or NCCL group for `device`. Fails after options.timeout
/// when the other ranks do not all arrive. Gloo binds to GLOO_SOCKET_IFNAME when set, to
/// 127.0.0.1 when MASTER_ADDR is a loopback address, else to this host's name.
Result<std::unique_ptr<Collective>> connect(const LaunchEnv& env, const c10::Device& device,
                                            CollectiveOptions options = {});

}  // namespace segflow::models::parallel
