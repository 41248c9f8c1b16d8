// Rules switched through load_state_dict: torch's dict into the hysteresis rules, and theirs into
// torch's, each checked step by step (rows, driver and the sources they cite: peer_sequences.h).
#include "peer_sequences.h"

#include <ampactor/core/state_dict.h>
#include <ampactor/scaler/local_grad_scaler.h>

using ampactor::LocalGradScaler;
using ampactor::StateDict;

TEST_SUITE("peer sequences") {
  TEST_CASE(
      "rules switched through load_state_dict: torch's dict into megatron and deepspeed leaves "
      "the hysteresis full") {
    // A torch run: init 1024, interval 4.
    ScaleState torch_rule = started(GradScalerOptions().init_scale(1024).growth_interval(4));
    const Row torch_rows[] = {
        {O, 512, 0},  // [PT] L187-L189
        {C, 512, 1},  // [PT] L197-L199
        {C, 512, 2},  // [PT] L197-L199
    };
    drive(torch_rule, torch_rows);
    const StateDict sd = ampactor::make_state_dict(torch_rule);
    REQUIRE_FALSE(sd.contains("_hysteresis_tracker"));  // torch's keys only

    // doc/guide/update-rules.md: "a dict without it, torch's, leaves the hysteresis full".
    for (const GradScalerOptions& peer :
         {GradScalerOptions::megatron().init_scale(4096), GradScalerOptions::deepspeed()}) {
      CAPTURE(ampactor::rule_name(peer.rule()));
      LocalGradScaler fresh(peer);  // before its first scale(): the dict's values become initial
      fresh.load_state_dict(sd);
      CHECK(fresh.get_scale() == 512);
      CHECK(fresh.get_growth_tracker() == 2);
      CHECK(fresh.get_growth_interval() == 4);
      CHECK(fresh.state_dict().get_int("_hysteresis_tracker") == 2);

      ScaleState spent = started(peer);  // a live scaler whose hysteresis an overflow spent
      spent.update(true);
      REQUIRE(spent.hysteresis_tracker() == 1);
      ampactor::load_state_dict(spent, sd);  // what LocalGradScaler::load_state_dict calls
      CHECK(spent.scale() == 512);
      CHECK(spent.growth_tracker() == 2);
      CHECK(spent.hysteresis_tracker() == 2);  // full again
      // The full hysteresis absorbs one overflow; the next backs off.
      if (peer.rule() == ampactor::RuleKind::megatron) {
        const Row rows[] = {
            {O, 512, 0, 1},  // [MEG] L139-L142: 2 -> 1 > 0, absorbed
            {O, 256, 0, 0},  // [MEG] L140 -> 0, L142-L143 max(512 * 0.5, 1)
        };
        drive(spent, rows);
      } else {
        const Row rows[] = {
            {O, 512, 0, 1},  // [DS] L173 false (2): L191 absorbed; L192
            {O, 256, 0, 1},  // [DS] L173-L184: max(512 / 2, 1); the backoff does not refill
        };
        drive(spent, rows);
      }
    }
  }

  TEST_CASE(
      "rules switched through load_state_dict: a hysteresis rule's dict into torch is accepted "
      "and its _hysteresis_tracker ignored") {
    ScaleState megatron =
        started(GradScalerOptions::megatron().init_scale(1024).growth_interval(4).hysteresis(2));
    const Row megatron_rows[] = {
        {O, 1024, 0, 1},  // [MEG] L139-L142: absorbed
        {O, 512, 0, 0},   // [MEG] L143
        {O, 256, 0, -1},  // [MEG] L140 -> -1, L143
        {C, 256, 1, -1},  // [MEG] L146
    };
    drive(megatron, megatron_rows);
    const StateDict sd = ampactor::make_state_dict(megatron);
    REQUIRE(sd.get_int("_hysteresis_tracker") == -1);

    LocalGradScaler torch_rule(GradScalerOptions().init_scale(65536).growth_interval(2000));
    CHECK(refusal_of([&] { torch_rule.load_state_dict(sd); }).code == errc{});  // accepted
    StateDict without = sd;
    without.erase("_hysteresis_tracker");
    CHECK(torch_rule.state_dict() == without);  // torch's keys, the dict's values
    LocalGradScaler loaded_without(GradScalerOptions().init_scale(65536).growth_interval(2000));
    loaded_without.load_state_dict(without);
    CHECK(torch_rule.scale_state() == loaded_without.scale_state());  // the key left no trace
    // Ignored, not read: a value no hysteresis rule would take is no error here.
    StateDict odd = without;
    odd.set("_hysteresis_tracker", 1e300);
    CHECK(refusal_of([&] { loaded_without.load_state_dict(odd); }).code == errc{});
    // torch's rule from there: no hysteresis, the first overflow backs off.
    ScaleState s = torch_rule.scale_state();
    s.lazy_init();
    const Row rows[] = {
        {C, 256, 2},  // [PT] L193, L197-L199: the loaded tracker 1 + 1
        {O, 128, 0},  // [PT] L187-L189: backs off at once
        {O, 64, 0},   // [PT] L188
    };
    drive(s, rows);
  }
}
