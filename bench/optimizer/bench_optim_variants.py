#!/usr/bin/env python3
"""The fused step's loop variants side by side: build/bench/ampactor-bench-optim run once per
ATEN_CPU_CAPABILITY ("native": unset, the best loops this CPU has; "avx2": the AVX2 loops;
"default": the baseline), alternately for --rounds rounds in an order that turns round by round.
Prints the fused step's ms (check + step) per variant, medians over the rounds, and each one's
time over the first variant's (above 1: the first is faster). No torch needed; CI never runs it. From the project root:
  python3 bench/optimizer/bench_optim_variants.py --bench build/bench/ampactor-bench-optim --rounds 3 \\
      --mparams 1 16 64 --threads 1 2 --dtype half bfloat16 --reps 9 --json /tmp/variants.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(args, variant):
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if variant != "native":
        env["ATEN_CPU_CAPABILITY"] = variant
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [args.bench, "--mparams", *map(str, args.mparams), "--threads",
               *map(str, args.threads), "--dtype", *args.dtype, "--reps", str(args.reps),
               "--pipeline-mparams", "0", "--json", f.name]
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        loops = out.split("fused step loops: ", 1)[1].split(";", 1)[0]
        return json.load(open(f.name))["steps"], loops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bench", default="build/bench/ampactor-bench-optim")
    ap.add_argument("--variants", nargs="+", default=["native", "avx2"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mparams", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtype", nargs="+", default=["half", "bfloat16"])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", help="write every run's rows here")
    args = ap.parse_args()
    runs, loops = [], {}
    for r in range(args.rounds):
        shift = r % len(args.variants)
        for v in args.variants[shift:] + args.variants[:shift]:
            steps, loops[v] = run(args, v)
            runs.append({"round": r, "variant": v, "steps": steps})
        print(f"round {r + 1} of {args.rounds} done (load average {os.getloadavg()[0]:.2f})",
              flush=True)

    def med(v, key, m, d, t):
        xs = [s[key] for run_ in runs if run_["variant"] == v for s in run_["steps"]
              if (s["mparams"], s["dtype"], s["threads"]) == (m, d, t)]
        return statistics.median(xs)

    names = [f"{v} ({loops[v]})" for v in args.variants]
    print(f"\nfused step (check + step), ms, median of {args.rounds} runs of --reps "
          f"{args.reps}; ratio: this variant's time / the first's")
    print("| params, dtype, threads | " + " | ".join(names) +
          "".join(f" | {v} / {args.variants[0]}" for v in args.variants[1:]) + " |")
    print("|---" * (1 + 2 * len(args.variants) - 1) + "|")
    for d in args.dtype:
        for m in args.mparams:
            for t in args.threads:
                ms = [med(v, "fused_ms", m, d, t) for v in args.variants]
                print(f"| {m} Mi, {d}, {t} | " + " | ".join(f"{x:.2f}" for x in ms) +
                      "".join(f" | {x / ms[0]:.2f}x" for x in ms[1:]) + " |")
    same = all(s["same_masters"] for run_ in runs for s in run_["steps"])
    print(f"\nevery run's fused step equal to torch::optim's ('same masters'): {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loops": loops, "runs": runs}, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
