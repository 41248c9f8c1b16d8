"""TensorBoard's own reader (EventAccumulator) on ampactor's event files: every scalar it reads
equals what the keeper reported in the trace recorded beside them (UpdateApplied, float32).

usage: tensorboard_readback.py EVENT_DIR TRACE_JSONL ITERATIONS
"""
import json
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    logdir, trace, iterations = sys.argv[1], sys.argv[2], int(sys.argv[3])
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {"loss-scale", "grad-norm", "iteration-time", "Train/Samples/elapsed_time_ms_step",
            "ampactor/skipped", "ampactor/found-inf", "ampactor/growth-tracker",
            "ampactor/backoffs-in-row", "ampactor/overflow-tensors", "ampactor/trainer-wait-ms"}
    missing = want - tags
    if missing:
        sys.exit(f"tags missing from the event file: {sorted(missing)} (read: {sorted(tags)})")
    applied, made_at = {}, {}
    with open(trace) as f:
        for line in f:
            e = json.loads(line)
            if e.get("type") == "UpdateApplied":
                applied[e["msg"]["k"]] = e["msg"]
            if e.get("type") == "UnscaleDone":
                made_at[e["msg"]["k"]] = e["msg"]["scale_used"]
    if len(applied) != iterations:
        sys.exit(f"the trace has {len(applied)} updates, expected {iterations}")

    def series(tag):
        return {ev.step: ev.value for ev in acc.Scalars(tag)}

    checks = {
        "loss-scale": lambda u: f32(u["scale"]),
        "ampactor/growth-tracker": lambda u: float(u["growth_tracker"]),
        "ampactor/found-inf": lambda u: float(u["found_inf"]),
        "ampactor/skipped": lambda u: float(u["found_inf"] and not u["abandoned"]),
        "ampactor/backoffs-in-row": lambda u: float(u["backoffs_in_row"]),
    }
    compared = 0
    for tag, expected in checks.items():
        got = series(tag)
        if sorted(got) != sorted(applied):
            sys.exit(f"{tag}: steps {sorted(got)} != the trace's iterations {sorted(applied)}")
        for k, u in applied.items():
            if got[k] != expected(u):
                sys.exit(f"{tag} at step {k}: TensorBoard read {got[k]}, the keeper sent "
                         f"{expected(u)}")
            compared += 1
    used = series("ampactor/scale-used")
    for k in applied:
        if used.get(k) != f32(made_at[k]):
            sys.exit(f"ampactor/scale-used at step {k}: TensorBoard read {used.get(k)}, the "
                     f"optimizer's UnscaleDone said {made_at[k]}")
        compared += 1
    skipped = [k for k, u in applied.items() if u["found_inf"]]
    norms = series("grad-norm")
    if any(k in norms for k in skipped) or len(norms) != iterations - len(skipped):
        sys.exit(f"grad-norm has steps {sorted(norms)}; the skipped ones ({skipped}) have none")
    print(f"tensorboard read back {compared} values equal to the keeper's, over "
          f"{len(applied)} iterations ({len(skipped)} skipped) and {len(tags)} tags")


if __name__ == "__main__":
    main()
