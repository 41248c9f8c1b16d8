// The worker pool behind every parallel CPU pass of ampactor's own (the unscale/check kernels and
// the fused optimizer steps). Not an OpenMP team: OpenMP counts every team's threads, and once the
// trainer's team and another team together outnumber the cores, every team stops spinning and
// each of the trainer's many small parallel regions sleeps and wakes through the kernel; and a
// team's workers keep spinning after its region, holding the core that the next pass (of another
// team) needs. The pool's workers sleep on a condition variable between runs. No torch.
#pragma once

#include <functional>

namespace ampactor::kernels::cpu {

/// Runs fn(t, n) for t = 0 .. n-1: share 0 on the caller, the others on the pool's workers (made
/// on first need, alive until exit); returns once every share is done. One run at a time: when
/// another thread's run holds the pool, the caller runs fn(0, 1) alone instead of waiting for it.
/// Returns the number of shares the work was cut into. fn must not throw.
int parallel_run(int n, const std::function<void(int, int)>& fn);

}  // namespace ampactor::kernels::cpu
