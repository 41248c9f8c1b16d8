// scale_keeper: the single owner of the scale state, as an actor. It never blocks: requests that
// must wait (the exact policy's ScaleRequest, up-to-date getters, setters, state_dict) queue
// behind the updates sent before them, and an update waits only for its iteration's UnscaleDone
// messages. The logic is KeeperCore's (<ampactor/keeper/keeper_core.h>); this is its mailbox.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <memory>

#include <ampactor/core/options.h>
#include <ampactor/keeper/keeper_core.h>
#include <ampactor/messages/messages.h>

namespace ampactor {

/// The whole protocol of the keeper. A refused request is answered with a caf::error in the
/// ampactor category (to_exception() makes it a ScalerError).
using scale_keeper_actor =
    caf::typed_actor<caf::replies_to<ScaleRequest>::with<ScaleReply>,        //
                     caf::replies_to<GetParams>::with<ScaleParams>,          //
                     caf::replies_to<SetGrowthFactor>::with<ScaleParams>,    //
                     caf::replies_to<SetBackoffFactor>::with<ScaleParams>,   //
                     caf::replies_to<SetGrowthInterval>::with<ScaleParams>,  //
                     caf::replies_to<GetStateDict>::with<StateDictMsg>,      //
                     caf::replies_to<LoadStateDict>::with<ScaleParams>,      //
                     caf::reacts_to<UnscaleDone>,                            //
                     caf::reacts_to<UpdateScale>,                            //
                     caf::reacts_to<UpdateWhenClosed>,                       //
                     caf::reacts_to<SetScale>,                               //
                     caf::reacts_to<IterationClosed>,                        //
                     caf::reacts_to<subscribe_atom, trainer_actor>,          //
                     caf::reacts_to<unsubscribe_atom, trainer_actor>>;

/// Spawns a keeper with `opts` (checked: ScalerError on bad options) run as `keeper` says.
/// Subscribers receive an UpdateApplied for every applied update.
scale_keeper_actor spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts,
                                      const KeeperOptions& keeper = {});

/// The positional form of 0.2 (whose keeper is not detached unless asked), kept one release.
[[deprecated("pass KeeperOptions().policy(...).detached(...).tap(...)")]] scale_keeper_actor
spawn_scale_keeper(caf::actor_system& sys, const GradScalerOptions& opts, ScalePolicy policy,
                   bool detached = false, std::shared_ptr<KeeperTap> tap = nullptr);

}  // namespace ampactor
