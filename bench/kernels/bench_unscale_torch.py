#!/usr/bin/env python3
"""PyTorch's CPU unscale kernel beside ampactor's, on the lists of build/bench/ampactor-bench-kernels.

torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale), the kernel that
torch.amp.GradScaler("cpu").unscale_ runs, on gradient lists drawn the way bench_kernels.cpp's
make_grads draws them: 128 tensors whose sizes are log-uniform over a 1000x range (its
std::mt19937_64 draw is reproduced, with bench/common/mt19937.py), fp32 lists of --sizes-mb MiB (seed 1) and fp16/bf16
lists of min(64, that size) MiB (seed 2), as the C++ bench does. GB/s of gradient bytes,
median of at least --min-reps calls and --min-seconds after one warm-up; the scale alternates
0.5 and 2 so that the values stay normal.

With --ampactor BIN the C++ bench runs too, on the same sizes and threads, once per
ATEN_CPU_CAPABILITY in --variants ("native": unset, i.e. the best loops this CPU has; "avx2":
ampactor's AVX2 loops). Each thread count and fp32 size (with its fp16/bf16 lists) is a cell that
every contender runs back to back, in an order that turns round by round, for --rounds rounds.
The table shows the medians and, per contender, the median of its ratios to torch taken within
a cell. Run from the project root, e.g.
  python bench/kernels/bench_unscale_torch.py --ampactor build/bench/ampactor-bench-kernels \\
      --sizes-mb 256,1024 --threads 1,2 --rounds 3 --json /tmp/unscale-torch.json
Needs PyPI torch (pip install torch) and, for 1 GiB lists, about 3 GB of memory. CI never runs it.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

# bench/common/mt19937.py, shared with the other areas' scripts.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from mt19937 import mt19937_64  # noqa: E402

COUNT = 128  # bench_kernels.cpp's default --tensors


def sizes_of(total_bytes, elem_size, seed, count=COUNT):
    """bench_kernels.cpp's make_grads sizes: log-uniform weights, each size made odd."""
    rng = mt19937_64(seed)
    top = math.nextafter(1.0, 0.0)
    w = [math.exp(min(float(next(rng)) / 2.0**64, top) * math.log(1000.0)) for _ in range(count)]
    total = 0.0
    for x in w:
        total += x
    elems = total_bytes // elem_size
    return [max(1, int(float(elems) * x / total)) | 1 for x in w]


def median_seconds(fn, min_reps, min_seconds):
    fn()  # warm-up
    times = []
    spent = 0.0
    while len(times) < min_reps or (spent < min_seconds and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        s = time.perf_counter() - t0
        times.append(s)
        spent += s
    return statistics.median(times)


def torch_figures(args, threads, sizes_mb):
    """{key: GB/s} with the C++ bench's keys (e.g. 64MB/t2/bf16/fused_unscale_GBps)."""
    out = {}
    half_mb = min(64, sizes_mb[-1])
    cases = [(mb, torch.float32, "", 1) for mb in sizes_mb]
    cases += [(half_mb, torch.float16, "/fp16", 2), (half_mb, torch.bfloat16, "/bf16", 2)]
    for t in threads:
        torch.set_num_threads(t)
        for mb, dtype, name, seed in cases:
            elem = torch.empty((), dtype=dtype).element_size()
            grads = [(torch.randn(n) * 16).to(dtype) for n in sizes_of(mb << 20, elem, seed)]
            gb = sum(g.numel() * elem for g in grads) / 1e9
            found = torch.zeros((), dtype=torch.float32)
            scales = [torch.full((), 0.5), torch.full((), 2.0)]
            flip = [0]

            def call():
                flip[0] ^= 1
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found, scales[flip[0]])

            s = median_seconds(call, args.min_reps, args.min_seconds)
            out[f"{mb}MB/t{t}{name}/fused_unscale_GBps"] = gb / s
            del grads
    return out


def ampactor_figures(args, threads, sizes_mb, variant):
    """The C++ bench's JSON figures, and the name of the loops it ran."""
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if variant != "native":
        env["ATEN_CPU_CAPABILITY"] = variant
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [args.ampactor, "--sizes-mb", ",".join(map(str, sizes_mb)),
               "--threads", ",".join(map(str, threads)), "--min-reps", str(args.min_reps),
               "--min-seconds", str(args.min_seconds), "--json", f.name]
        run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        loops = run.stdout.split("CPU loops '", 1)[1].split("'", 1)[0]
        return json.load(open(f.name)), loops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes-mb", default="256,1024",
                    help="fp32 list sizes in MiB (fp16/bf16: min(64, the size))")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.5)
    ap.add_argument("--ampactor", help="build/bench/ampactor-bench-kernels, run side by side")
    ap.add_argument("--variants", default="native,avx2",
                    help="ATEN_CPU_CAPABILITY values for the ampactor runs ('native': unset)")
    ap.add_argument("--rounds", type=int, default=1, help="alternating runs; medians are shown")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes_mb.split(",")]
    threads = [int(x) for x in args.threads.split(",")]
    variants = args.variants.split(",") if args.ampactor else []
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}; "
          f"{os.cpu_count()} CPUs", flush=True)

    # One cell = one thread count and one fp32 size (with its fp16/bf16 lists): every
    # contender runs it back to back, in an order that turns round by round, so that each
    # ratio compares figures taken a few seconds apart on this noisy machine.
    runs = []  # (round, cell, who, figures)
    loops_of = {}
    who_all = variants + ["torch"]
    for r in range(args.rounds):
        for t in threads:
            for mb in sizes:
                shift = r % len(who_all)
                for who in who_all[shift:] + who_all[:shift]:
                    if who == "torch":
                        figs = torch_figures(args, [t], [mb])
                    else:
                        figs, loops_of[who] = ampactor_figures(args, [t], [mb], who)
                    runs.append((r, (t, mb), who, figs))
        print(f"round {r + 1} of {args.rounds} done (load average {os.getloadavg()[0]:.2f})",
              flush=True)

    def figure(who, key):
        return [(r, c, f[key]) for r, c, w, f in runs if w == who and key in f]

    def paired(v, key):
        theirs = {(r, c): x for r, c, x in figure("torch", key)}
        return [x / theirs[(r, c)] for r, c, x in figure(v, key) if (r, c) in theirs]

    def med(xs):
        return statistics.median(xs) if xs else float("nan")

    cols = [f"ampactor {v} ({loops_of[v]})" for v in variants]
    print("\nGB/s: medians over %d round(s); ratio: median of the paired ampactor / torch" %
          args.rounds)
    print("| list, threads | torch | " + " | ".join(cols) +
          "".join(f" | ratio {v}" for v in variants) + " |")
    print("|---" * (2 + 2 * len(variants)) + "|")
    rows = [(f"{mb}MB", "fp32", "") for mb in sizes]
    half = sorted({min(64, mb) for mb in sizes})
    rows += [(f"{mb}MB", n, "/" + n) for mb in half for n in ("fp16", "bf16")]
    for t in threads:
        for mb, name, suffix in rows:
            key = f"{mb}/t{t}{suffix}/fused_unscale_GBps"
            tv = med([x for _, _, x in figure("torch", key)])
            ours = [med([x for _, _, x in figure(v, key)]) for v in variants]
            ratios = [med(paired(v, key)) for v in variants]
            print(f"| {name} {mb}, {t} | {tv:.2f} | " + " | ".join(f"{x:.2f}" for x in ours) +
                  "".join(f" | {x:.2f}" for x in ratios) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_version": torch.__version__, "loops": loops_of,
                       "runs": [{"round": r, "threads": c[0], "mb": c[1], "who": w, "figures": f}
                                for r, c, w, f in runs]}, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
