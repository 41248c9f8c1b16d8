// Each rule alone through a short hand-written sequence of overflow (O) and clean (C) steps, with
// the scale, the growth tracker, the hysteresis tracker (where the rule has one) and the errors
// checked after every step (rows, driver and the sources they cite: peer_sequences.h).
#include "peer_sequences.h"

TEST_SUITE("peer sequences") {
  TEST_CASE(
      "deepspeed: an overflow spends the hysteresis, a backoff leaves it spent, only a growth "
      "refills it, the first growth on the (w+1)-th clean step, the next w later") {
    ScaleState s =
        started(GradScalerOptions::deepspeed().init_scale(1024).growth_interval(3).hysteresis(2));
    REQUIRE(s.hysteresis_tracker() == 2);  // [DS] L234: cur_hysteresis = delayed_shift
    const Row rows[] = {
        {C, 1024, 1, 2},  // [DS] L283: stable_interval (0 - -1) - 1 = 0, L284 false; L288
        {O, 1024, 0, 1},  // [DS] L256 false (2, 2): L274 hysteresis -= 1, no backoff; L275
        {C, 1024, 1, 1},  // [DS] L277: a clean step does not refill; L283: (2 - 1) - 1 = 0
        {O, 512, 0, 1},   // [DS] L256 (cur_hysteresis == 1): L261 max(1024 / 2, 1), L267; L275
        {O, 256, 0, 1},   // [DS] L256-L267 again: the backoff did not refill the hysteresis
        {C, 256, 1, 1},   // [DS] L283: (5 - 4) - 1 = 0
        {C, 256, 2, 1},   // [DS] L283-L284: (6 - 4) - 1 = 1, 1 % 3 != 0
        {C, 256, 3, 1},   // [DS] L283-L284: 2 % 3 != 0
        {C, 512, 1, 2},   // [DS] L283-L284: (8 - 4) - 1 = 3, 3 % 3 == 0: L286 refill, L287 * 2
        {C, 512, 2, 2},   // [DS] L284: 4 % 3 != 0 (last_overflow_iter stays 4: the count goes on)
        {C, 512, 3, 2},   // [DS] L284: 5 % 3 != 0
        {C, 1024, 1, 2},  // [DS] L284: 6 % 3 == 0, three clean steps after the last growth
        {O, 1024, 0, 1},  // [DS] L274: the refilled hysteresis absorbs the next overflow
    };
    drive(s, rows);
  }

  TEST_CASE("deepspeed: with consecutive_hysteresis every clean step refills the hysteresis") {
    ScaleState s = started(GradScalerOptions::deepspeed()
                               .init_scale(1024)
                               .growth_interval(3)
                               .hysteresis(2)
                               .consecutive_hysteresis(true));
    const Row rows[] = {
        {O, 1024, 0, 1},  // [DS] L256 false: L274 hysteresis 2 -> 1; L275 last_overflow_iter = 0
        {C, 1024, 1, 2},  // [DS] L277-L281: refilled to delayed_shift; L283: (1 - 0) - 1 = 0
        {O, 1024, 0, 1},  // [DS] L256 false again (2): L274 absorbed; L275 last_overflow_iter = 2
        {O, 512, 0, 1},   // [DS] L256 (cur_hysteresis == 1): L261 max(1024 / 2, 1); L275
        {O, 256, 0, 1},   // [DS] L256-L267: consecutive overflows go on backing off
        {C, 256, 1, 2},   // [DS] L277-L281 refill; L283: (5 - 4) - 1 = 0
        {C, 256, 2, 2},   // [DS] L284: 1 % 3 != 0
        {C, 256, 3, 2},   // [DS] L284: 2 % 3 != 0
        {C, 512, 1, 2},   // [DS] L284: 3 % 3 == 0: L287 scale * 2 (L285: no refill there)
    };
    drive(s, rows);
  }

  TEST_CASE(
      "deepspeed: at its minimum with raise_at_min_scale an overflow due to back off is "
      "errc::scale_at_minimum and changes nothing") {
    // The preset: min_scale 1, raise_at_min_scale (the engine's raise_error_at_min_scale).
    ScaleState s =
        started(GradScalerOptions::deepspeed().init_scale(4).growth_interval(2).hysteresis(2));
    const errc at_min = errc::scale_at_minimum;
    const Row rows[] = {
        {O, 4, 0, 1},          // [DS] L256 false: L274 absorbed; L275
        {O, 2, 0, 1},          // [DS] L256, L257 (4 != 1), L261 max(4 / 2, 1) = 2
        {C, 2, 1, 1},          // [DS] L283: (2 - 1) - 1 = 0
        {O, 1, 0, 1},          // [DS] L261 max(2 / 2, 1) = 1; L275 last_overflow_iter = 3
        {C, 1, 1, 1},          // [DS] L283: (4 - 3) - 1 = 0
        {O, 1, 1, 1, at_min},  // [DS] L257-L259: cur_scale == min_scale raises before L275, L288
        {O, 1, 1, 1, at_min},  // [DS] L257-L259: nothing changed, so it raises again
        {C, 1, 2, 1},          // [DS] L288 never ran: (5 - 3) - 1 = 1, 1 % 2 != 0
        {C, 2, 1, 2},          // [DS] L284: (6 - 3) - 1 = 2, 2 % 2 == 0: L286 refill, L287 grow
        {O, 2, 0, 1},          // [DS] L256 false: the refilled hysteresis absorbs at 2
    };
    drive(s, rows);
  }

  TEST_CASE("deepspeed: without raise_at_min_scale a backoff at its minimum stays at min_scale") {
    ScaleState s = started(GradScalerOptions::deepspeed()
                               .init_scale(2)
                               .growth_interval(5)
                               .hysteresis(1)
                               .raise_at_min_scale(false));
    const Row rows[] = {
        {O, 1, 0, 1},  // [DS] L256 (delayed_shift == 1), L261 max(2 / 2, 1) = 1
        {O, 1, 0, 1},  // [DS] L257 false (raise_error_at_min_scale off): L261 max(0.5, 1) = 1
        {C, 1, 1, 1},  // [DS] L283: (2 - 1) - 1 = 0
    };
    drive(s, rows);
  }

  TEST_CASE(
      "megatron: the hysteresis tracker counts down below 0 and every overflow restarts the "
      "growth count, only a growth refills it, the backoff floors at min_scale") {
    ScaleState s = started(
        GradScalerOptions::megatron().init_scale(1024).growth_interval(3).hysteresis(2).min_scale(
            256));
    REQUIRE(s.hysteresis_tracker() == 2);  // [MEG] L129: _hysteresis_tracker = hysteresis
    const Row rows[] = {
        {C, 1024, 1, 2},  // [MEG] L146 growth tracker + 1; L148: 1 != 3
        {O, 1024, 0, 1},  // [MEG] L139 growth tracker 0, L140 -> 1, L142: 1 > 0, no backoff
        {C, 1024, 1, 1},  // [MEG] L146: a clean step leaves the hysteresis tracker
        {O, 512, 0, 0},   // [MEG] L139-L140 -> 0, L142-L143 max(1024 * 0.5, 256)
        {O, 256, 0, -1},  // [MEG] L140 -> -1 (no lower bound), L143 max(512 * 0.5, 256)
        {O, 256, 0, -2},  // [MEG] L143 max(128, 256): the floor
        {C, 256, 1, -2},  // [MEG] L146
        {C, 256, 2, -2},  // [MEG] L146; L148: 2 != 3
        {C, 512, 0, 2},   // [MEG] L148-L153: tracker 0, refilled to hysteresis, scale * 2
        {O, 512, 0, 1},   // [MEG] L139-L142: the refilled hysteresis absorbs
    };
    drive(s, rows);
  }

  TEST_CASE("apex: an overflow halves, growth_interval clean steps double, clamped at max_scale") {
    ScaleState s =
        started(GradScalerOptions::apex().init_scale(1024).growth_interval(2).max_scale(2048));
    const Row rows[] = {
        {C, 1024, 1},  // [APX] L210-L211 _unskipped += 1; L213: 1 != 2
        {C, 2048, 0},  // [APX] L213-L215: min(2048, 1024 * 2.), _unskipped = 0
        {C, 2048, 1},  // [APX] L211
        {C, 2048, 0},  // [APX] L214: min(2048, 4096.): held at max_loss_scale
        {O, 1024, 0},  // [APX] L202-L208: no min_loss_scale, L207 / 2.; L208 _unskipped = 0
        {C, 1024, 1},  // [APX] L211
        {O, 512, 0},   // [APX] L207-L208
    };
    drive(s, rows);
  }

  TEST_CASE(
      "colossalai: hysteresis counts its steps up, the backoff floors at min_scale, the growth "
      "clamps at max_scale") {
    ScaleState s = started(GradScalerOptions::colossalai()
                               .init_scale(1024)
                               .growth_interval(2)
                               .hysteresis(2)
                               .min_scale(512)
                               .max_scale(2048));
    REQUIRE(s.hysteresis_tracker() == 2);  // [CAI] L62: _hysteresis_step = 0 (2 - 0)
    const Row rows[] = {
        {O, 1024, 0, 1},  // [CAI] L85 _hysteresis_step 1, L86 _growth_step 0, L88: 1 < 2
        {O, 512, 0, 0},   // [CAI] L85 -> 2, L88-L89: L106 1024 * 0.5, L107-L108 max(.., 512)
        {O, 512, 0, -1},  // [CAI] L85 -> 3, L106 256, L108 max(256, 512): the floor
        {C, 512, 1, -1},  // [CAI] L92 _growth_step 1; L93: 1 != 2
        {C, 1024, 0, 2},  // [CAI] L93-L96: _growth_step 0, _hysteresis_step 0, L113 * 2
        {C, 1024, 1, 2},  // [CAI] L92
        {C, 2048, 0, 2},  // [CAI] L96, L113-L115 min(2048, 2048)
        {C, 2048, 1, 2},  // [CAI] L92
        {C, 2048, 0, 2},  // [CAI] L115 min(4096, 2048): held at max_scale
        {O, 2048, 0, 1},  // [CAI] L85-L88: 1 < 2, absorbed
    };
    drive(s, rows);
  }

  TEST_CASE("keras: an overflow halves with no floor, the growth_interval-th clean step doubles") {
    ScaleState s = started(GradScalerOptions::keras().init_scale(2).growth_interval(3));
    const Row rows[] = {
        {O, 1, 0},    // [KRS] L241 step_counter 0, L242 dynamic_scale * 0.5
        {O, 0.5, 0},  // [KRS] L242: no floor
        {C, 0.5, 1},  // [KRS] L233-L237: 0 != 3 - 1, L229-L230 step_counter + 1
        {C, 0.5, 2},  // [KRS] L234: 1 != 2, L230
        {C, 1, 0},    // [KRS] L234: 2 == 2, L225-L227 step_counter 0, dynamic_scale * 2.0
        {C, 1, 1},    // [KRS] L230
        {O, 0.5, 0},  // [KRS] L241-L242
    };
    drive(s, rows);
  }

  TEST_CASE(
      "tf: the floor is 1 (an overflow lifts a scale below 1 to 1), growth when good_steps + 1 "
      ">= period") {
    ScaleState s = started(GradScalerOptions::tf().init_scale(4).growth_interval(3));
    const Row rows[] = {
        {O, 2, 0},  // [TF] L407-L414: maximum(4 / 2, 1), good_steps 0
        {O, 1, 0},  // [TF] L410-L411: maximum(2 / 2, 1)
        {O, 1, 0},  // [TF] L410-L411: maximum(0.5, 1), the floor
        {C, 1, 1},  // [TF] L402-L405: 0 + 1 < 3, assign_add(1)
        {C, 1, 2},  // [TF] L403-L405: 1 + 1 < 3
        {C, 2, 0},  // [TF] L403: 2 + 1 >= 3: L396-L400 scale * 2 (finite, L289-L293), 0
        {C, 2, 1},  // [TF] L405
        {C, 2, 2},  // [TF] L405
    };
    drive(s, rows);
    s.set_scale(0.25);  // a scale below 1, as tf starts with an initial_loss_scale below 1
    const Row lifted[] = {
        {O, 1, 0},  // [TF] L410-L411: maximum(0.25 / 2, 1) = 1: an overflow raises the scale
        {C, 1, 1},  // [TF] L405
        {C, 1, 2},  // [TF] L405
    };
    drive(s, lifted);
    s.set_growth_interval(2);  // a period lowered to below good_steps + 1
    const Row at_once[] = {
        {C, 2, 0},  // [TF] L403: 2 + 1 >= 2 (>=, where torch's == would stall), L396-L400
    };
    drive(s, at_once);
  }

  TEST_CASE(
      "jmp: an overflow divides by the factor down to min_scale, the period-th clean step "
      "multiplies") {
    ScaleState s = started(GradScalerOptions::jmp()
                               .init_scale(64)
                               .growth_factor(4)
                               .backoff_factor(0.25)
                               .growth_interval(3)
                               .min_scale(2));
    const Row rows[] = {
        {O, 16, 0},  // [JMP] L165 maximum(2, 64 / 4); L167 counter (..) * False = 0
        {O, 4, 0},   // [JMP] L165 maximum(2, 16 / 4)
        {O, 2, 0},   // [JMP] L165 maximum(2, 4 / 4): the floor
        {C, 2, 1},   // [JMP] L159: 0 != 3 - 1, L162 scale kept; L167 (0 + 1) % 3
        {C, 2, 2},   // [JMP] L159: 1 != 2; L167 (1 + 1) % 3
        {C, 8, 0},   // [JMP] L159-L161: 2 == 2, 2 * 4 is finite; L167 (2 + 1) % 3 = 0
        {C, 8, 1},   // [JMP] L167
        {O, 2, 0},   // [JMP] L165 maximum(2, 8 / 4); L167
    };
    drive(s, rows);
  }

  TEST_CASE(
      "torch with min_scale and max_scale: torch's kernel, the growth clamped at max_scale and "
      "the backoff at min_scale") {
    ScaleState s =
        started(GradScalerOptions().init_scale(4).growth_interval(2).min_scale(1).max_scale(8));
    const Row rows[] = {
        {C, 4, 1},  // [PT] L193 successful = 1; L197-L199 scale kept, tracker 1
        {C, 8, 0},  // [PT] L194-L196: 2 == 2, 4 * 2.0, tracker 0
        {C, 8, 1},  // [PT] L197-L199
        {C, 8, 0},  // [PT] L195 8 * 2.0, clamped to max_scale 8 (ampactor's); L196
        {O, 4, 0},  // [PT] L187-L189: 8 * 0.5, tracker 0
        {O, 2, 0},  // [PT] L188
        {O, 1, 0},  // [PT] L188
        {O, 1, 0},  // [PT] L188 0.5, floored at min_scale 1 (ampactor's)
        {C, 1, 1},  // [PT] L197-L199
    };
    drive(s, rows);
  }
}
