// scale_keeper: the single owner of the scale state. It never blocks: requests that must wait
// (the exact policy's ScaleRequest, up-to-date getters, setters, state_dict) queue behind the
// updates sent before them, and an update waits only for its iteration's UnscaleDone messages.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <memory>

#include <ampactor/messages/messages.h>
#include <ampactor/scaler/options.h>

namespace ampactor {

class TraceSink;

/// The whole protocol of the keeper.
using scale_keeper_actor = caf::typed_actor<caf::replies_to<ScaleRequest>::with<ScaleReply>,  //
                                            caf::reacts_to<UnscaleDone>,                      //
                                            caf::reacts_to<UpdateScale>,                      //
                                            caf::reacts_to<IterationClosed>,                  //
                                            caf::replies_to<GetParams>::with<ScaleParams>,    //
                                            caf::replies_to<SetParam>::with<ScaleParams>,     //
                                            caf::replies_to<GetStateDict>::with<StateDictMsg>,
                                            caf::replies_to<LoadStateDict>::with<ScaleParams>,
                                            caf::reacts_to<subscribe_atom, caf::actor>>;

/// Spawns a keeper with `opts` (checked: ScalerError on bad options) and `policy`.
/// Subscribers (subscribe_atom) receive an UpdateApplied for every applied update.
/// detached: a thread of its own, which answers a request in ~12 us where CAF 0.17's default
/// work-stealing workers, polling with sleeps, take ~120 us (bench/RESULTS.md).
/// trace: records every message in and out, in mailbox order (<ampactor/actors/trace.h>); the
/// header is written before this returns.
scale_keeper_actor spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts,
                                      ScalePolicy policy = ScalePolicy::exact,
                                      bool detached = false,
                                      std::shared_ptr<TraceSink> trace = nullptr);

}  // namespace ampactor
