#!/usr/bin/env python3
"""The PyTorch side of ampactor-bench-gpt (bench/gpt/bench_gpt.cpp), and the comparison of the two.

Trains the same small GPT (bench/gpt/gpt_model.cpp, operation for operation) on the same weights and
batches with torch.amp.GradScaler and torch.optim.AdamW(fused=True): fp32 parameters, each cast
to fp16 where the model uses it (what autocast does, made explicit so that both sides run the same
kernels). Needs PyTorch with CUDA; not run by CI.

  python3 bench/gpt/gpt_torch.py --text FILE --out DIR            # writes DIR/torch.csv, a summary
  python3 bench/gpt/gpt_torch.py --compare DIR                    # the table of every run in DIR
"""
import argparse
import csv
import math
import os
import sys
import time

MASK64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


class Corpus:
    def __init__(self, path):
        with open(path, "rb") as f:
            text = f.read()
        if len(text) < 100000:
            sys.exit(f"too little text in {path} ({len(text)} bytes, 100000 needed)")
        alphabet = sorted(set(text))
        index = {c: i for i, c in enumerate(alphabet)}
        self.ids = [index[c] for c in text]
        self.vocab = len(alphabet)

    def batch(self, state, batch, context, held_out):
        import torch
        split = len(self.ids) * 9 // 10
        lo = split if held_out else 0
        span = (len(self.ids) if held_out else split) - lo - context - 1
        xs, ys = [], []
        for _ in range(batch):
            state, r = splitmix64(state)
            at = lo + r % span
            xs.append(self.ids[at:at + context])
            ys.append(self.ids[at + 1:at + context + 1])
        return state, torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


def init(shape, seed, device):
    """gpt_init's weights, drawn in its order, as fp32 holding fp16 values (the masters ampactor
    starts from are the fp16 model's weights widened)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    d, L, V, T = shape["embed"], shape["layers"], shape["vocab"], shape["context"]
    resid = 0.02 / math.sqrt(2.0 * L)
    w = []
    randn = lambda sizes, sd: w.append(torch.randn(sizes, generator=gen) * sd)
    fill = lambda n, v: w.append(torch.ones(n) if v else torch.zeros(n))
    randn((V, d), 0.02)
    randn((T, d), 0.02)
    for _ in range(L):
        fill(d, 1), fill(d, 0)
        randn((d, 3 * d), 0.02), fill(3 * d, 0)
        randn((d, d), resid), fill(d, 0)
        fill(d, 1), fill(d, 0)
        randn((d, 4 * d), 0.02), fill(4 * d, 0)
        randn((4 * d, d), resid), fill(d, 0)
    fill(d, 1), fill(d, 0)
    randn((d, V), 0.02)
    return [t.half().float().to(device).requires_grad_(True) for t in w]


def loss_fn(params, shape, x, y):
    """gpt_loss, operation for operation, on fp16 casts of the parameters."""
    import torch
    import torch.nn.functional as F
    w = [p.half() for p in params]
    B, T = x.shape
    d, H = shape["embed"], shape["embed"] // 64
    dh = d // H

    def norm(t, i):
        return F.layer_norm(t.float(), (d,), w[i].float(), w[i + 1].float(), 1e-5).half()

    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    h = F.embedding(x, w[0]) + w[1][:T]
    i = 2
    for _ in range(shape["layers"]):
        qkv = torch.matmul(norm(h, i), w[i + 2]) + w[i + 3]
        q, k, v = (qkv[:, :, p * d:(p + 1) * d].view(B, T, H, dh).transpose(1, 2) for p in range(3))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        att = torch.softmax(att.float().masked_fill(future, float("-inf")), -1).half()
        out = torch.matmul(att, v).transpose(1, 2).reshape(B, T, d)
        h = h + (torch.matmul(out, w[i + 4]) + w[i + 5])
        m = F.gelu(torch.matmul(norm(h, i + 6), w[i + 8]) + w[i + 9])
        h = h + (torch.matmul(m, w[i + 10]) + w[i + 11])
        i += 12
    logits = torch.matmul(norm(h, i), w[i + 2])
    return F.cross_entropy(logits.float().view(B * T, shape["vocab"]), y.reshape(B * T))


def train(a):
    import torch
    corpus = Corpus(a.text)
    shape = dict(vocab=corpus.vocab, context=a.context, embed=a.embed, layers=a.layers)
    params = init(shape, a.seed, a.device)
    kind = dict(fused=dict(fused=True), foreach=dict(foreach=True), single=dict(foreach=False))
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=a.weight_decay, **kind[a.optimizer])
    mode = "torch" if a.optimizer == "fused" else "torch-" + a.optimizer
    scaler = torch.amp.GradScaler(a.device, growth_interval=a.growth_interval)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    state = a.seed
    losses, scales, found = [], [], []
    for k in range(a.steps):
        if k == a.warmup:
            sync()
            t0 = time.perf_counter()
        state, x, y = corpus.batch(state, a.batch, a.context, False)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(params, shape, x.to(a.device), y.to(a.device))
        scaled = scaler.scale(loss)  # the scale is made here, on the first call
        scales.append(scaler._get_scale_async().clone())  # no host sync, as ampactor's run
        scaled.backward()
        losses.append(loss.detach())
        scaler.step(opt)
        found.append(sum(scaler._found_inf_per_device(opt).values()).clone())
        scaler.update()
    sync()
    secs = time.perf_counter() - t0
    tokens_per_s = (a.steps - a.warmup) * a.batch * a.context / secs
    skipped = [bool(f.item()) for f in found]
    with open(os.path.join(a.out, mode + ".csv"), "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["iteration", "loss", "scale", "skipped"])
        for k in range(a.steps):
            out.writerow([k, "%.9g" % losses[k].item(), "%.9g" % scales[k].item(), int(skipped[k])])
    with torch.no_grad():
        es, total = a.seed + 999, 0.0
        for _ in range(8):
            es, x, y = corpus.batch(es, a.batch, a.context, True)
            total += loss_fn(params, shape, x.to(a.device), y.to(a.device)).item()
    row = dict(mode=mode, tokens_per_s=tokens_per_s, eval_loss=total / 8,
               skipped=sum(skipped), final_scale=scaler.get_scale())
    with open(os.path.join(a.out, mode + ".summary.csv"), "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(row))
        out.writeheader()
        out.writerow(row)
    print("%s (torch %s, %s): %.0f tokens/s  eval loss %.4f  skipped %d  final scale %g" % (
        mode, torch.__version__, torch.cuda.get_device_name() if a.device == "cuda" else "cpu", tokens_per_s, row["eval_loss"],
        row["skipped"], row["final_scale"]))


def read_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def compare(folder):
    """Every run in DIR against torch's fused AdamW run: where the scales and skips first differ,
    the losses' distance before that and over the run; PyTorch's other AdamW runs, if there, show
    the spread that the optimizer's arithmetic alone makes."""
    ref = read_rows(os.path.join(folder, "torch.csv"))
    names = sorted(f for f in os.listdir(folder) if f.endswith(".summary.csv"))
    names.sort(key=lambda f: f != "torch.summary.csv")
    summaries = [row for f in names for row in read_rows(os.path.join(folder, f))]
    if os.path.exists(os.path.join(folder, "summary.csv")):
        summaries += read_rows(os.path.join(folder, "summary.csv"))
    print("| run | tokens/s | eval loss | mean loss, last 20 | skipped | scales and skips as torch's"
          " until | max abs loss difference until then | over the run |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summaries:
        rows = read_rows(os.path.join(folder, s["mode"] + ".csv"))
        if len(rows) != len(ref):
            sys.exit("%s has %d iterations, torch.csv %d" % (s["mode"], len(rows), len(ref)))
        first = next((k for k, (r, t) in enumerate(zip(rows, ref))
                      if float(r["scale"]) != float(t["scale"]) or r["skipped"] != t["skipped"]),
                     len(ref))
        diffs = [abs(float(r["loss"]) - float(t["loss"])) for r, t in zip(rows, ref)]
        tail = sum(float(r["loss"]) for r in rows[-20:]) / min(20, len(rows))
        print("| %s | %.0f | %.4f | %.4f | %s | %s | %.3g | %.3g |" % (
            s["mode"], float(s["tokens_per_s"]), float(s["eval_loss"]), tail, s["skipped"],
            "the end" if first == len(ref) else "iteration %d" % first, max(diffs[:first] or [0]),
            max(diffs)))
    exact_pairs(folder)
    return 0


def exact_pairs(folder):
    """The runs that must equal another bit for bit: overlap_backward is offload's training."""
    for run, ref in [("offload-overlap", "offload")]:
        paths = [os.path.join(folder, n + ".csv") for n in (run, ref)]
        if not all(os.path.exists(p) for p in paths):
            continue
        a, b = (read_rows(p) for p in paths)
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) == len(b):
            print("\n%s against %s: every loss, scale and skip identical (%d iterations)"
                  % (run, ref, len(a)))
        else:
            print("\n%s against %s: first differs at iteration %s" % (run, ref, first))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--text")
    p.add_argument("--out", default="out/gpt")
    p.add_argument("--compare", metavar="DIR", help="compare the runs in DIR and exit")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--growth-interval", type=int, default=10)
    p.add_argument("--optimizer", default="fused", choices=["fused", "foreach", "single"],
                   help="torch.optim.AdamW's implementation (fused: the run to compare with; the\n"
                        "others: PyTorch against itself, the spread that arithmetic alone makes)")
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke run of this script alone)")
    a = p.parse_args()
    if a.compare:
        return compare(a.compare)
    if not a.text:
        p.error("--text is required")
    if a.embed % 64:
        p.error("--embed must be a multiple of 64")
    if not 0 <= a.warmup < a.steps:
        p.error("--warmup must be below --steps")
    train(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
