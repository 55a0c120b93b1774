#include "actors/detail/intraop_threads.hpp"

#include <ATen/Parallel.h>

#include <dlfcn.h>

namespace segflow::actors::detail {

void use_one_intraop_thread() {
  using SetThreads = void (*)(int);
  // The OpenMP runtime is the one LibTorch links (the wheel ships its own libgomp); linking
  // another here would load two runtimes.
  static const auto set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  // LibTorch sets a thread's team to its process default the first time that thread runs a
  // parallel op (at::internal::lazy_init_num_threads), which would undo the setting below:
  // get_num_threads() runs that first-time set-up now, so it is behind us.
  (void)at::get_num_threads();
  if (set_threads) set_threads(1);
}

}  // namespace segflow::actors::detail
