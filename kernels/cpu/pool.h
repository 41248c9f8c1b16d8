// The worker pool behind ampactor's own parallel CPU passes (the unscale/check kernels and the
// fused optimizer steps) off the main thread (run_shares below says where they run). Not an
// OpenMP team: OpenMP counts every team's threads, and once the trainer's team and another team
// together outnumber the cores, every team stops spinning and each of the trainer's many small
// parallel regions sleeps and wakes through the kernel. The pool's workers sleep on a condition
// variable between runs. No torch.
#pragma once

#include <functional>

namespace ampactor::kernels::cpu {

/// Runs fn(t, n) for t = 0 .. n-1: share 0 on the caller, the others on the pool's workers (made
/// on first need, alive until exit); returns once every share is done. One run at a time: when
/// another thread's run holds the pool, the caller runs fn(0, 1) alone instead of waiting for it.
/// Returns the number of shares the work was cut into. fn must not throw.
int parallel_run(int n, const std::function<void(int, int)>& fn);

/// The passes' entry: fn(t, n) on the calling thread's OpenMP team where the caller is the
/// process's main thread, else parallel_run. A trainer's LibTorch ops run on the main thread's
/// team, whose idle workers libgomp keeps spinning for tens of ms after each op: there the pool's
/// workers would share their cores with them (a 16 Mi step gains nothing from a second thread),
/// while the team's own workers are awake. On any other thread (an optimizer thread) an OpenMP
/// team would be a second team, which oversubscribes the cores and makes every team sleep
/// between regions, so those use the pool. ThreadSanitizer builds always use the pool: it cannot
/// see libgomp's barriers. Returns the number of shares. fn must not throw.
int run_shares(int n, const std::function<void(int, int)>& fn);

/// Whether run_shares on this thread runs on its OpenMP team.
bool shares_on_omp_team();

}  // namespace ampactor::kernels::cpu
