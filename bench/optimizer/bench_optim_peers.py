#!/usr/bin/env python3
"""Peer optimizer steps on the sizes of build/bench/ampactor-bench-optim (for comparison only).

Adam (lr 1e-3, default betas/eps), 64 fp32 tensors whose sizes are log-uniform over a 1000x
range, N Mi (2^20) parameters in all: the same sizes as the C++ bench (its std::mt19937_64(3)
draw is reproduced below). Milliseconds per optimizer step, median of --reps after 1 warm-up.
Each (size, threads, variant) gets fresh fp32 masters from the same initial values.

  torch fused        torch.optim.Adam(fused=True) alone, fp32 grads already in .grad.
  torch pipeline     what ampactor's fused step covers, done the torch way: fp16/bf16 grads
                     copied to the fp32 .grad, torch.amp.GradScaler("cpu").step() (inf/NaN check
                     of the fp32 grads, then grad_scale + found_inf handed to the fused step,
                     which unscales inside), GradScaler.update(), masters cast to model weights.
  RoundPipe          RoundPipe's roundpipe.optim.Adam (OpenMP kernel, csrc/adam.cpp) alone.
  RoundPipe pipeline the same work done RoundPipe's way: grads copied to the fp32 .grad, the
                     torch GradScaler that RoundPipe's GradScaler wraps unscales them in place
                     (separate pass) and checks found_inf, then the step, then the cast.
  max|d|             largest difference of each variant's final masters from "torch fused".

RoundPipe (https://github.com/ITcarrot/RoundPipe) is used unmodified: its roundpipe/optim/adam.py
is imported as is, and its csrc/adam.cpp is built with torch.utils.cpp_extension.load and the
flags of its optim_builder.py (-Ofast -fopenmp -mtune=native -march=native); only that builder
(which also needs py-cpuinfo) is replaced. Get its sources beside the project, e.g.
  git clone https://github.com/ITcarrot/RoundPipe roundpipe-git     (or, from a bare mirror:
  mkdir -p roundpipe-src && git --git-dir=<mirror> archive HEAD | tar -x -C roundpipe-src)
Run (needs PyTorch >= 2.4, ninja and g++; 64 Mi needs about 3 GB of memory):
  python bench/optimizer/bench_optim_peers.py --mparams 1 16 64 --threads 1 2 --reps 5 \
      --roundpipe-src roundpipe-src --json /tmp/peers.json
Without --roundpipe-src the RoundPipe columns are skipped. CI never runs this script.
"""
import argparse
import importlib.util
import json
import math
import os
import pathlib
import statistics
import sys
import time
import types

import torch

# bench/common/mt19937.py, shared with the other areas' scripts.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from mt19937 import mt19937_64  # noqa: E402

LR = 1e-3
SCALE = 65536.0  # the loss scale of the C++ bench (it unscales by 1/65536)


def sizes_of(n):
    """64 sizes log-uniform over a 1000x range, n in all (bench_optim.cpp's sizes_of)."""
    rng = mt19937_64(3)
    top = math.nextafter(1.0, 0.0)
    w = [math.exp(min(float(next(rng)) / 2.0**64, top) * math.log(1000.0)) for _ in range(64)]
    total = 0.0
    for x in w:
        total += x
    return [max(1, int(float(n) * x / total)) for x in w]


def load_roundpipe(src, build):
    """RoundPipe's Adam class, its kernel built as its optim_builder.py builds it."""
    from torch.utils.cpp_extension import load
    optim_dir = pathlib.Path(src) / "roundpipe" / "optim"
    build.mkdir(parents=True, exist_ok=True)
    ext = load(name="roundpipe_optim_adam", sources=[str(optim_dir / "csrc" / "adam.cpp")],
               extra_cflags=["-Ofast", "-fopenmp", "-mtune=native", "-march=native"],
               build_directory=str(build))
    pkg = types.ModuleType("rp_optim")
    pkg.__path__ = [str(optim_dir)]
    builder = types.ModuleType("rp_optim.optim_builder")
    builder.load_optim_function = lambda name: None
    builder.get_optim_function = lambda name: getattr(ext, name)
    sys.modules.update({"rp_optim": pkg, "rp_optim.optim_builder": builder})
    spec = importlib.util.spec_from_file_location("rp_optim.adam", optim_dir / "adam.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Adam


def run(make_opt, init, grads32, grads16, dt, reps, pipeline):
    """ms per step (median of reps after 1 warm-up) and the final masters."""
    masters = [w.clone() for w in init]
    for p, g in zip(masters, grads32):
        p.grad = torch.empty_like(p) if pipeline else g
    opt = make_opt(masters)
    weights = [w.to(dt) for w in init]
    scaler = None
    if pipeline:
        scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
        scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    times = []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        if pipeline:
            torch._foreach_copy_([p.grad for p in masters], grads16)
            scaler.step(opt)
            scaler.update()
            torch._foreach_copy_(weights, masters)
        else:
            opt.step()
        if r > 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, masters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mparams", type=int, nargs="+", default=[1, 16, 64],
                    help="parameter counts, in Mi (2^20)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5, help="timed steps (median), >= 5 advised")
    ap.add_argument("--dtype", choices=["half", "bfloat16"], default="half",
                    help="the model dtype of grads and weights")
    ap.add_argument("--roundpipe-src", help="a checkout of RoundPipe's sources")
    ap.add_argument("--roundpipe-build", help="where its extension is built "
                    "(default: roundpipe-build beside --roundpipe-src)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    dt = torch.bfloat16 if args.dtype == "bfloat16" else torch.float16
    load0 = os.getloadavg()[0]

    rp_adam = None
    if args.roundpipe_src:
        src = pathlib.Path(args.roundpipe_src).resolve()
        build = pathlib.Path(args.roundpipe_build or src.parent / "roundpipe-build")
        rp_adam = load_roundpipe(src, build)
    else:
        print("note: no --roundpipe-src given, RoundPipe is skipped")

    variants = [("torch fused", lambda ps: torch.optim.Adam(ps, lr=LR, fused=True), False),
                ("torch pipeline", lambda ps: torch.optim.Adam(ps, lr=LR, fused=True), True)]
    if rp_adam is not None:
        variants += [("RoundPipe", lambda ps: rp_adam(ps, lr=LR), False),
                     ("RoundPipe pipeline", lambda ps: rp_adam(ps, lr=LR), True)]

    print(f"torch {torch.__version__}; Adam (lr {LR}, defaults), fp32 masters, model grads and "
          f"weights in {args.dtype}; ms per step, median of {args.reps} after 1 warm-up; "
          f"{os.cpu_count()} CPUs, load average {load0:.2f} (other work skews "
          "multi-thread figures: each OpenMP region waits for its slowest thread)\n")
    head = "params  dtype     thr | " + " | ".join(f"{v[0]:>18}" for v in variants)
    print(head + " | max|d| from torch fused")
    rows = []
    for m in args.mparams:
        torch.manual_seed(0)
        sizes = sizes_of(m << 20)
        init = [torch.randn(n) * 0.1 for n in sizes]
        grads16 = [(torch.randn(n) * 64).to(dt) for n in sizes]  # scaled by SCALE, as in C++
        grads32 = [g.float() / SCALE for g in grads16]            # the same grads, unscaled
        for t in args.threads:
            torch.set_num_threads(t)  # also omp_set_num_threads: RoundPipe's omp region uses it
            row = {"mparams": m, "dtype": args.dtype, "threads": t}
            ref, diffs = None, []
            for name, make, pipeline in variants:
                ms, masters = run(make, init, grads32, grads16, dt, args.reps, pipeline)
                row[name.replace(" ", "_").lower() + "_ms"] = ms
                if ref is None:
                    ref = masters
                else:
                    d = max((a - b).abs().max().item() for a, b in zip(masters, ref))
                    row[name.replace(" ", "_").lower() + "_max_diff"] = d
                    diffs.append(f"{d:.1e}")
                del masters
            del ref
            rows.append(row)
            cells = " | ".join(f"{row[v[0].replace(' ', '_').lower() + '_ms']:18.2f}"
                               for v in variants)
            print(f"{m:4d} Mi  {args.dtype:8s}  {t}  | {cells} | {' '.join(diffs)}", flush=True)
    load1 = os.getloadavg()[0]
    print(f"\nload average at the end: {load1:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "reps": args.reps, "cpus": os.cpu_count(),
                       "loadavg": [load0, load1], "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
