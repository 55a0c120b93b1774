#pragma once
// Intra-op threads of the data path's own threads.

namespace segflow::actors::detail {

/// Makes LibTorch's CPU ops on the calling thread run on that thread alone, as PyTorch's
/// DataLoader does in its workers (torch.set_num_threads(1)). Decoders and augmenters run on
/// their own threads beside the trainer; if each also opened an OpenMP team, libgomp would
/// manage more threads than there are cores and switch every team, the trainer's included,
/// from spinning to sleeping between parallel regions, which on a 2-core machine cost the
/// trainer about 40% of its step rate (segflow bench, compute line). Only this thread's
/// OpenMP setting changes (omp_set_num_threads, looked up in the runtime LibTorch loaded);
/// at::set_num_threads would change the process-wide default as well.
void use_one_intraop_thread();

}  // namespace segflow::actors::detail
