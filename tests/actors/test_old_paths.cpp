// The include paths of 0.2 still work for one release: each forwards to the new path (quietly
// here; users see a deprecation warning) and names the same entities.
#define AMPACTOR_NO_DEPRECATED_HEADER_WARNINGS
#include <ampactor/actors/keeper_core.h>
#include <ampactor/actors/sharded_checkpoint.h>
#include <ampactor/async_optimizer.h>
#include <ampactor/checkpoint.h>
#include <ampactor/grad_scaler.h>
#include <ampactor/messages/protocol.h>
#include <ampactor/scaler/arg.h>
#include <ampactor/scaler/checkpoint.h>
#include <ampactor/scaler/errors.h>
#include <ampactor/scaler/options.h>
#include <ampactor/scaler/peer_state_dict.h>
#include <ampactor/scaler/rules.h>
#include <ampactor/scaler/scale_state.h>
#include <ampactor/scaler/stage.h>
#include <ampactor/scaler/state_dict.h>
#include <ampactor/scaler/update_rule.h>

#include <ampactor/ampactor.h>

#include "doctest_torch.h"

TEST_CASE("the 0.2 include paths still compile and reach the same API as the new ones") {
  // A ScalerError thrown through the old header's name is the new header's type.
  bool caught = false;
  try {
    throw ampactor::ScalerError(ampactor::errc::bad_checkpoint, "x");
  } catch (const ampactor::ScalerError& e) {
    caught = e.code() == ampactor::errc::bad_checkpoint;
  }
  CHECK(caught);
  // The sharded run's functions, now ampactor::checkpoint's, through the old path: a world
  // below 1 refused as before.
  bool refused = false;
  try {
    ampactor::reshard_run("no-such-run", 0, "no-such-out");
  } catch (const ampactor::ScalerError& e) {
    refused = e.code() == ampactor::errc::bad_option;
  }
  CHECK(refused);
}
