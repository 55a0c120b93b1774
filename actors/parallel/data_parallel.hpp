#pragma once
// Data-parallel training: one trainer per rank, each on its own shard of the training cases
// (pipeline/sampler.hpp, by rank and world size), gradients averaged after every optimizer
// step by models/parallel/ddp_sync.hpp (DDP's c10d::Reducer; Gloo on CPUs, NCCL on GPUs).
//
// Two ways to start the ranks:
//  - run_data_parallel: every rank in this process, one thread each (several CPU ranks for
//    testing, or one rank per GPU of the node: devices cuda:0 .. cuda:W-1);
//  - run_distributed_from_env: this process is one rank of a job started by torchrun,
//    srun or a Kubeflow PyTorchJob (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK;
//    see models/parallel/collective.hpp); a CUDA config trains on cuda:LOCAL_RANK.
//
// Only rank 0 writes the run folder (config.json, metrics.jsonl, tb/, progress.svg,
// last.pt, best.pt) and validates; the other ranks run the same Trainer::fit against a
// private temporary folder that is removed at the end (their checkpoints would be copies of
// rank 0's: the weights are identical on every rank after each step). Only rank 0's
// `observer` sees events; its should_stop() is agreed by all ranks at every step (a tiny
// all-reduce), so a stop request ends every rank at the same step.
//
// Batch size and learning rate: train.batch_size is per device, so the global batch is
// batch_size x world_size (x accumulate). The learning rate is NOT scaled automatically:
// the configured optimizer.lr applies to the global batch as it is. For the same
// trajectory as one device with batch B, run W devices with batch_size B/W (the
// equivalence the tests check); to keep batch_size and grow the global batch, scale lr
// yourself (linear scaling with warm-up is the usual rule for SGD; Adam tolerates a
// smaller change). The schedule counts optimizer steps, which are the same on every rank:
// each rank's steps_per_epoch is computed from its own shard (about 1/W of the cases).
//
// Resume: every rank loads the same checkpoint (weights, optimizer state, counters), so
// multi-process resume needs the run folder on a filesystem every rank sees; a checkpoint
// that only some ranks find is an error on all of them.
//
// Failure: a rank that fails (or dies) makes the others fail within the collective
// timeout (at once with Gloo when a peer's sockets close) instead of hanging; the error
// returned names the rank that failed first.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "actors/jobs/job_runner.hpp"
#include "messages/status.hpp"
#include "models/parallel/ddp_sync.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"

namespace segflow::actors {

struct DataParallelOptions {
  /// Ranks in this process (run_data_parallel only), >= 1.
  std::int64_t world_size = 2;
  /// One device per rank ("cpu", "cuda:1"); empty: from train.device, cpu for every rank
  /// on a CPU config, cuda:0 .. cuda:W-1 (cuda:LOCAL_RANK with run_distributed_from_env)
  /// on a CUDA one.
  std::vector<std::string> devices;
  models::parallel::DdpOptions ddp;
  /// Longest wait in any rendezvous or collective; must exceed rank 0's validation plus
  /// checkpoint time, during which the other ranks wait.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

/// Trains `cfg` on options.world_size ranks in this process. Returns rank 0's run folder.
Result<std::filesystem::path> run_data_parallel(const models::JobConfig& cfg, const RunOptions& run,
                                                models::TrainObserver& observer,
                                                const DataParallelOptions& options);
/// The same with the default options for `world_size` ranks.
Result<std::filesystem::path> run_data_parallel(const models::JobConfig& cfg, const RunOptions& run,
                                                models::TrainObserver& observer, std::int64_t world_size);

/// Trains `cfg` as the rank the launcher's environment names (options.world_size and
/// options.devices beyond this rank's device are ignored; the environment decides).
/// Returns the run folder on rank 0, an empty path on the other ranks.
Result<std::filesystem::path> run_distributed_from_env(const models::JobConfig& cfg, const RunOptions& run,
                                                       models::TrainObserver& observer,
                                                       const DataParallelOptions& options = {});

}  // namespace segflow::actors
