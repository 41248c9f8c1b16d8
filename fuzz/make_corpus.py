#!/usr/bin/env python3
"""Seeds of hostile shapes for the two libFuzzer targets (issue 35).

Run by hand from anywhere (Python 3, standard library only; the seeds are made by
corpus_traces.py and corpus_checkpoints.py, the zip and pickle writers are corpus_zip.py):

    python3 fuzz/make_corpus.py           # (re)writes the seeds below
    python3 fuzz/make_corpus.py --check   # exit 1 if a seed on disk differs from what it writes

It is deterministic: the same bytes on every run and machine. It writes

  fuzz/corpus/trace/*.jsonl          every file of that folder (ampactor-fuzz-trace: a trace's text)
  fuzz/corpus/checkpoint/shape-*     ampactor-fuzz-checkpoint: the first byte picks the mode
                                     (0: a whole checkpoint file, 1: a pickle inside a torch.save
                                     archive, 3: data.pkl inside an ampactor checkpoint)

and removes files of those names that it no longer writes. The other seeds of
fuzz/corpus/checkpoint (file-*, pickle-*, ckpt-*, finding-*) were written by LibTorch or found by
the fuzzer and are left alone; this script reads file-scaler_archive, whose archive its own zip
writer must reproduce byte for byte (a check that it lays archives out as LibTorch 1.13 does).

The shapes: JSON nested just under, at and over the reader's limit of 32 levels and 85,000 deep,
long lines, many and repeated fields, truncated lines and traces, numbers at the edges of what
JSON and double hold; checkpoints declaring many attributes, truncated at every kind of record,
with zip64 records and extra fields, deflate bombs, entries named twice, deep types and modules.
doc/dev/fuzzing.md has the table. Every file stays under 256 KB.
"""
import os
import sys

from corpus_checkpoints import checkpoint_seeds
from corpus_traces import trace_seeds

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE_DIR = os.path.join(HERE, "corpus", "trace")
CKPT_DIR = os.path.join(HERE, "corpus", "checkpoint")
MAX_FILE = 256 * 1024

# ------------------------------------------------------------------------------------------------


def main():
    check = "--check" in sys.argv[1:]
    plans = [(TRACE_DIR, trace_seeds(), lambda n: True),
             (CKPT_DIR, checkpoint_seeds(), lambda n: n.startswith("shape-"))]
    bad = 0
    total = count = 0
    for folder, seeds, ours in plans:
        os.makedirs(folder, exist_ok=True)
        for name, data in sorted(seeds.items()):
            if len(data) > MAX_FILE:
                sys.exit("make_corpus.py: %s is %d bytes, over %d" % (name, len(data), MAX_FILE))
            path = os.path.join(folder, name)
            total += len(data)
            count += 1
            old = open(path, "rb").read() if os.path.exists(path) else None
            if old == data:
                continue
            if check:
                print("differs: %s" % os.path.relpath(path))
                bad = 1
            else:
                with open(path, "wb") as f:
                    f.write(data)
        for name in sorted(os.listdir(folder)):
            if ours(name) and name not in seeds:
                if check:
                    print("not written by this script: %s" % os.path.relpath(os.path.join(folder, name)))
                    bad = 1
                else:
                    os.remove(os.path.join(folder, name))
    print("make_corpus.py: %d seeds, %d bytes%s" % (count, total, " (checked)" if check else ""))
    return bad


if __name__ == "__main__":
    sys.exit(main())
