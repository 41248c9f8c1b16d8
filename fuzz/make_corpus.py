#!/usr/bin/env python3
"""Seeds of hostile shapes for the two libFuzzer targets (issue 35).

Run by hand from anywhere (Python 3, standard library only):

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
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE_DIR = os.path.join(HERE, "corpus", "trace")
CKPT_DIR = os.path.join(HERE, "corpus", "checkpoint")
MAX_FILE = 256 * 1024

# ------------------------------------------------------------------------------------------------
# Traces
# ------------------------------------------------------------------------------------------------

# The start of tests/traces/overflow_exact.jsonl (version 6), copied so that the seeds do not
# change when that golden trace is regenerated.
HEADER = ('{"trace":"ampactor","version":6,"policy":"exact","options":{"init_scale":1024.0,'
          '"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":3,"enabled":true,'
          '"allow_fp16_grads":false}}')
EVENTS = [
    '{"seq":0,"k":-1,"from":"anonymous","to":"keeper","type":"Subscribe","msg":{"subscriber":"trainer1"}}',
    '{"seq":1,"k":0,"from":"trainer1","to":"keeper","type":"ScaleRequest","msg":{"k":0}}',
    '{"seq":2,"k":0,"from":"keeper","to":"trainer1","type":"ScaleReply","msg":{"k":0,"scale":1024.0}}',
    '{"seq":3,"k":0,"from":"anonymous","to":"keeper","type":"UpdateScale","msg":{"k":0,"unscales":1}}',
    '{"seq":4,"k":1,"from":"trainer1","to":"keeper","type":"ScaleRequest","msg":{"k":1}}',
    '{"seq":5,"k":0,"from":"optimizer1","to":"keeper","type":"UnscaleDone","msg":{"k":0,"optimizer":1,'
    '"found_inf":false,"scale_used":1024.0,"grad_max":20000.0,"dtype_max":65504.0,"local_found_inf":false}}',
    '{"seq":6,"k":0,"from":"keeper","to":"subscribers","type":"UpdateApplied","msg":{"k":0,"scale":1024.0,'
    '"growth_tracker":1,"found_inf":false,"backed_off":false,"grew":false,"abandoned":false,"halted":false,'
    '"below_one":false}}',
    '{"seq":7,"k":1,"from":"keeper","to":"trainer1","type":"ScaleReply","msg":{"k":1,"scale":1024.0}}',
]


def trailer(n):
    return '{"end":"ampactor","events":%d}' % n


def trace(lines, end="\n"):
    return ("\n".join(lines) + end).encode()


def whole(events=EVENTS):
    return [HEADER] + list(events) + [trailer(len(events))]


def header_with(field, value):
    """The header with `field` (a top-level key) holding the raw JSON text `value`."""
    at = HEADER.index('"%s":' % field)
    end = HEADER.index(",", at) if field != "options" else len(HEADER) - 1
    return HEADER[:at] + '"%s":%s' % (field, value) + HEADER[end:]


def reply_with(scale_text, seq=2):
    return ('{"seq":%d,"k":0,"from":"keeper","to":"trainer1","type":"ScaleReply",'
            '"msg":{"k":0,"scale":%s}}' % (seq, scale_text))


def nested(depth, kind="array", inner="1"):
    if kind == "array":
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + inner + "}" * depth


def trace_seeds():
    s = {}
    # Nesting. The line's own object is one level: a value nested d levels inside a header or
    # message field makes the line d + 1 (header) or d + 2 (message) levels deep; the reader
    # refuses more than 32, before any deep value exists.
    for d in (30, 31, 32, 33):
        s["nest-header-array-%d.jsonl" % d] = trace([header_with("policy", nested(d))] + EVENTS[:2])
        s["nest-msg-array-%d.jsonl" % d] = trace(
            [HEADER] + EVENTS[:2] + [reply_with(nested(d))] + EVENTS[3:4])
    for d in (30, 31, 32):
        s["nest-msg-object-%d.jsonl" % d] = trace(
            [HEADER] + EVENTS[:2] + [reply_with(nested(d, "object"))] + EVENTS[3:4])
        s["nest-header-empty-%d.jsonl" % d] = trace([header_with("policy", nested(d, inner=""))])
    s["nest-options-object-31.jsonl"] = trace([header_with("options", nested(31, "object", "{}"))])
    # As the issue found it: 170 KB of brackets, 85,000 deep.
    s["nest-header-85000.jsonl"] = trace([header_with("policy", nested(85000))] + EVENTS[:2])
    s["nest-msg-85000-unclosed.jsonl"] = trace(
        [HEADER] + EVENTS[:2] + [reply_with("[" * 85000)])
    s["nest-msg-objects-12000.jsonl"] = trace(
        [HEADER] + EVENTS[:2] + [reply_with(nested(12000, "object"))] + EVENTS[3:4])
    s["nest-mixed-1000-in-event-2.jsonl"] = trace(
        [HEADER, EVENTS[0], '{"seq":1,"k":%s}' % ('[{"a":' * 500 + "0" + "}]" * 500)])

    # Long lines.
    long_from = EVENTS[1].replace('"trainer1"', '"' + "t" * 200000 + '"')
    s["long-from-200k.jsonl"] = trace(
        [HEADER, EVENTS[0], long_from, EVENTS[2].replace('"to":"trainer1"', '"to":"%s"' % ("t" * 1000))]
        + [trailer(3)])
    s["long-policy-64k.jsonl"] = trace([header_with("policy", '"' + "x" * 65536 + '"')])
    s["long-unterminated-string-64k.jsonl"] = trace(
        [HEADER, EVENTS[0], '{"seq":1,"k":0,"from":"' + "u" * 65536], end="")
    s["long-whitespace-64k.jsonl"] = trace(
        [HEADER, EVENTS[0].replace(",", " " * 8192 + ",\t")] + [trailer(1)])
    s["long-escapes.jsonl"] = trace(
        [HEADER, EVENTS[0].replace('"trainer1"', '"' + "\\u00e9\\ud83d\\ude00\\n\\\\" * 2000 + '"'),
         trailer(1)])
    s["long-lone-surrogate.jsonl"] = trace(
        [HEADER, EVENTS[0].replace('"trainer1"', '"' + "\\u00e9" * 1000 + '\\ud800"'), trailer(1)])
    s["long-raw-utf8-and-nul.jsonl"] = trace(
        [HEADER, EVENTS[0].replace('"trainer1"', '"tr\u00e9\u4e2d\U0001f600"'),
         EVENTS[1].replace('"trainer1"', '"tr\u00e9\u4e2d\U0001f600"'), '{"seq":2,"k":\x000}'])

    # Many fields.
    many = ",".join('"f%d":%d' % (i, i) for i in range(3000))
    s["fields-msg-3000.jsonl"] = trace(
        [HEADER, EVENTS[0], EVENTS[1].replace('"msg":{"k":0}', '"msg":{"k":0,%s}' % many)])
    s["fields-header-3000.jsonl"] = trace([HEADER[:-1] + "," + many + "}"] + EVENTS[:2])
    s["fields-options-3000.jsonl"] = trace([HEADER[:-2] + "," + many + "}}"] + EVENTS[:2])
    dup = ",".join('"k":%d' % (i % 3) for i in range(5000))
    s["fields-duplicate-keys-5000.jsonl"] = trace(
        [HEADER, EVENTS[0], EVENTS[1].replace('"msg":{"k":0}', '"msg":{%s}' % dup)])
    s["fields-duplicate-header.jsonl"] = trace(
        [HEADER[:-1] + ',"version":1,"policy":"lagged","trace":"ampactor"}'] + EVENTS[:2])
    # Many records: the base iteration repeated (k and seq renumbered), with its trailer.
    events = [EVENTS[0]]
    k = 0
    while len(events) < 700:
        events += [
            '{"seq":%d,"k":%d,"from":"trainer1","to":"keeper","type":"ScaleRequest","msg":{"k":%d}}'
            % (len(events), k, k),
            '{"seq":%d,"k":%d,"from":"keeper","to":"trainer1","type":"ScaleReply","msg":{"k":%d,"scale":1024.0}}'
            % (len(events) + 1, k, k),
            '{"seq":%d,"k":%d,"from":"anonymous","to":"keeper","type":"UpdateScale","msg":{"k":%d,"unscales":1}}'
            % (len(events) + 2, k, k),
            '{"seq":%d,"k":%d,"from":"optimizer1","to":"keeper","type":"UnscaleDone","msg":{"k":%d,"optimizer":1,'
            '"found_inf":%s,"scale_used":1024.0,"grad_max":20000.0,"dtype_max":65504.0,"local_found_inf":false}}'
            % (len(events) + 3, k, k, "true" if k % 7 == 3 else "false"),
        ]
        k += 1
    s["records-700.jsonl"] = trace([HEADER] + events + [trailer(len(events))])

    # Truncated lines and traces.
    full = trace(whole())
    s["cut-mid-header.jsonl"] = full[:HEADER.index("backoff")]
    for name, at in (("string", EVENTS[5].index("optimizer1") + 4),
                     ("number", EVENTS[5].index("20000.0") + 3),
                     ("literal", EVENTS[5].index("false") + 2),
                     ("key", EVENTS[5].index('"scale_used"') + 5)):
        s["cut-mid-%s.jsonl" % name] = trace([HEADER] + EVENTS[:5]) + EVENTS[5][:at].encode()
    s["cut-mid-escape.jsonl"] = trace([HEADER, EVENTS[0]]) + b'{"seq":1,"k":0,"from":"tr\\u00'
    s["cut-mid-utf8.jsonl"] = trace([HEADER, EVENTS[0]]) + '{"seq":1,"k":0,"from":"\u4e2d'.encode()[:-1]
    s["cut-no-trailer.jsonl"] = trace([HEADER] + EVENTS)
    s["cut-mid-trailer.jsonl"] = trace([HEADER] + EVENTS) + trailer(8)[:12].encode()
    s["cut-no-final-newline.jsonl"] = trace(whole(), end="")
    s["cut-crlf.jsonl"] = trace(whole()).replace(b"\n", b"\r\n")
    s["cut-blank-line-then-event.jsonl"] = trace([HEADER] + EVENTS[:3] + [""] + EVENTS[3:5])
    s["cut-after-trailer.jsonl"] = trace(whole()) + EVENTS[0][:20].encode()
    s["cut-nul-mid-line.jsonl"] = trace([HEADER] + EVENTS[:3]) + EVENTS[3][:30].encode() + b"\0" + \
        EVENTS[3][30:].encode() + b"\n"
    s["cut-header-only.jsonl"] = trace([HEADER])

    # Numbers at the edges. Each value in a float field of a message, of the header's options and
    # in an integer field (seq).
    numbers = {
        "1e400": "1e400", "minus-1e400": "-1e400", "1e-400": "1e-400", "dbl-max": "1.7976931348623157e308",
        "dbl-max-up": "1.7976931348623159e308", "denorm-min": "4.9406564584124654e-324",
        "half-denorm": "2.4703282292062327e-324", "minus-0": "-0", "minus-0.0": "-0.0", "0e0": "0e0",
        "exp-plus": "1E+2", "exp-huge": "1e2147483648", "exp-huge-neg": "1e-2147483649",
        "NaN": "NaN", "Infinity": "Infinity", "minus-Infinity": "-Infinity", "str-nan": '"nan"',
        "str-inf": '"inf"', "str-minus-inf": '"-inf"', "int64-max": "9223372036854775807",
        "int64-max-up": "9223372036854775808", "int64-min": "-9223372036854775808",
        "int64-min-down": "-9223372036854775809", "uint64-max": "18446744073709551615",
        "uint64-max-up": "18446744073709551616", "digits-400": "1" + "0" * 400,
        "frac-digits-400": "0." + "0" * 399 + "1", "leading-zero": "01", "trailing-dot": "1.",
        "leading-dot": ".5", "plus": "+1", "hex": "0x10", "bare-e": "1e", "bare-minus": "-",
    }
    for slug, text in numbers.items():
        s["number-msg-%s.jsonl" % slug] = trace(
            [HEADER] + EVENTS[:2] + [reply_with(text)] + EVENTS[3:5])
        opts = HEADER.replace('"init_scale":1024.0', '"init_scale":' + text)
        s["number-header-%s.jsonl" % slug] = trace([opts] + EVENTS[:3])
        s["number-seq-%s.jsonl" % slug] = trace(
            [HEADER] + EVENTS[:2] + [EVENTS[2].replace('"seq":2', '"seq":' + text)])
    return s


# ------------------------------------------------------------------------------------------------
# Checkpoints: LibTorch 1.13's zip layout and pickles, written by hand
# ------------------------------------------------------------------------------------------------

LOCAL, CENTRAL, DESCRIPTOR = 0x04034B50, 0x02014B50, 0x08074B50
END, ZIP64_END, LOCATOR = 0x06054B50, 0x06064B50, 0x07064B50
ONES16, ONES32 = 0xFFFF, 0xFFFFFFFF


def le(v, n):
    return v.to_bytes(n, "little")


class Rec:
    """One record: its name in the archive (without the folder), its bytes, how it is stored."""

    def __init__(self, name, data, method=None, packed=None, usize=None, crc=None):
        self.name = name.encode() if isinstance(name, str) else name
        self.data = data
        if method is None:  # as LibTorch: code deflated where that makes it smaller
            method = 0
            if self.name.startswith(b"code/") and self.name.endswith(b".py"):
                z = deflate(data)
                if len(z) < len(data) and len(data) > 200:
                    method, packed = 8, z
        self.method = method
        self.packed = packed if packed is not None else (deflate(data) if method == 8 else data)
        self.usize = len(data) if usize is None else usize
        self.crc = zlib.crc32(data) if crc is None else crc


def deflate(data, level=9):
    c = zlib.compressobj(level, zlib.DEFLATED, -15, 9)
    return c.compress(data) + c.flush()


class Zip:
    """LibTorch 1.13's layout: each entry's data aligned to 64 bytes by an "FB" extra field, CRC
    and sizes in a data descriptor, the directory, then the zip64 end record, its locator and the
    end record. zip64=True puts every size and offset in zip64 fields, as the spec does beyond
    4 GiB (and 8-byte data descriptors). `where` records each structure's offset."""

    def __init__(self, recs, folder="archive", zip64=False, local_zip64=False, descriptors=True,
                 central_extra=None, local_extra=None):
        self.where = {"local": [], "data": [], "descriptor": [], "central": []}
        out = bytearray()
        central = bytearray()
        n = len(recs)
        for i, r in enumerate(recs):
            name = folder.encode() + b"/" + r.name if folder else r.name
            need = 45 if zip64 else 20 if r.method == 8 else 0
            flags = 0x0808 if descriptors else 0x0800
            at = len(out)
            self.where["local"].append(at)
            lx = b""
            if local_zip64:
                lx += le(1, 2) + le(16, 2) + le(0 if descriptors else r.usize, 8) + \
                    le(0 if descriptors else len(r.packed), 8)
            if local_extra and i in local_extra:
                lx += local_extra[i]
            start = at + 30 + len(name) + len(lx)
            pad = (-(start + 4)) % 64
            lx += b"FB" + le(pad, 2) + b"Z" * pad
            small = lambda v: ONES32 if (local_zip64 and not descriptors) else v
            out += le(LOCAL, 4) + le(need, 2) + le(flags, 2) + le(r.method, 2) + le(0, 4)
            if descriptors:
                out += le(0, 4) + le(0, 4) + le(0, 4)
            else:
                out += le(r.crc, 4) + le(small(len(r.packed)), 4) + le(small(r.usize), 4)
            out += le(len(name), 2) + le(len(lx), 2) + name + lx
            self.where["data"].append(len(out))
            out += r.packed
            self.where["descriptor"].append(len(out))
            if descriptors:
                w = 8 if zip64 else 4
                out += le(DESCRIPTOR, 4) + le(r.crc, 4) + le(len(r.packed), w) + le(r.usize, w)
            cx = b""
            cs, us, off = len(r.packed), r.usize, at
            if zip64:
                cx = le(1, 2) + le(24, 2) + le(us, 8) + le(cs, 8) + le(off, 8)
                cs = us = off = ONES32
            if central_extra and i in central_extra:
                cx += central_extra[i]
            self.where["central"].append(len(central))
            central += (le(CENTRAL, 4) + le(0, 2) + le(need, 2) + le(flags, 2) + le(r.method, 2) +
                        le(0, 4) + le(r.crc, 4) + le(cs, 4) + le(us, 4) + le(len(name), 2) +
                        le(len(cx), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(off, 4) +
                        name + cx)
        dir_at = len(out)
        self.where["central"] = [dir_at + c for c in self.where["central"]]
        out += central
        self.where["zip64_end"] = z64 = len(out)
        out += (le(ZIP64_END, 4) + le(44, 8) + le(0x031E, 2) + le(0x2D, 2) + le(0, 4) + le(0, 4) +
                le(n, 8) + le(n, 8) + le(len(central), 8) + le(dir_at, 8))
        self.where["locator"] = len(out)
        out += le(LOCATOR, 4) + le(0, 4) + le(z64, 8) + le(1, 4)
        self.where["end"] = len(out)
        if zip64:
            out += le(END, 4) + le(0, 2) + le(0, 2) + le(ONES16, 2) + le(ONES16, 2) + \
                le(ONES32, 4) + le(ONES32, 4) + le(0, 2)
        else:
            out += le(END, 4) + le(0, 2) + le(0, 2) + le(n, 2) + le(n, 2) + le(len(central), 4) + \
                le(dir_at, 4) + le(0, 2)
        self.bytes = bytes(out)


def read_zip(b):
    """The records of an archive LibTorch wrote, with their stored bytes as they are."""
    eocd = len(b) - 22
    n = int.from_bytes(b[eocd + 10:eocd + 12], "little")
    at = int.from_bytes(b[eocd + 16:eocd + 20], "little")
    recs, folder = [], None
    for _ in range(n):
        (_, _, _, _, method, _, _, crc, cs, us, nl, el, cl, _, _, _, off) = struct.unpack(
            "<IHHHHHHIIIHHHHHII", b[at:at + 46])
        name = b[at + 46:at + 46 + nl]
        lnl, lel = struct.unpack("<HH", b[off + 26:off + 30])
        start = off + 30 + lnl + lel
        packed = b[start:start + cs]
        data = zlib.decompress(packed, -15) if method == 8 else packed
        folder, rel = name.split(b"/", 1)
        recs.append(Rec(rel, data, method, packed, us, crc))
        at += 46 + nl + el + cl
    return folder.decode(), recs


class Pickler:
    """data.pkl as LibTorch 1.13's pickler writes a module of values: protocol 2, every string
    and GLOBAL memoized once (BINPUT, LONG_BINPUT past 255) and fetched again (BINGET)."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")
        self.memo = 0
        self.strings = {}
        self.globals = {}

    def put(self):
        i = self.memo
        self.memo += 1
        self.out += (b"q" + bytes([i])) if i < 256 else (b"r" + le(i, 4))
        return i

    def get(self, i):
        self.out += (b"h" + bytes([i])) if i < 256 else (b"j" + le(i, 4))

    def string(self, s):
        if s in self.strings:
            return self.get(self.strings[s])
        b = s.encode()
        self.out += b"X" + le(len(b), 4) + b
        self.strings[s] = self.put()

    def glob(self, qual):
        if qual in self.globals:
            return self.get(self.globals[qual])
        mod, name = qual.rsplit(".", 1)
        self.out += b"c" + mod.encode() + b"\n" + name.encode() + b"\n"
        self.globals[qual] = self.put()

    def value(self, v):
        if v is None:
            self.out += b"N"
        elif v is True or v is False:
            self.out += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            if 0 <= v < 256:
                self.out += b"K" + bytes([v])
            elif 0 <= v < 65536:
                self.out += b"M" + le(v, 2)
            elif -2 ** 31 <= v < 2 ** 31:
                self.out += b"J" + v.to_bytes(4, "little", signed=True)
            else:
                self.out += b"\x8a\x08" + v.to_bytes(8, "little", signed=True)
        elif isinstance(v, float):
            self.out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, tuple):
            if len(v) > 3:
                self.out += b"("
            for item in v:
                self.value(item)
            self.out += (b")", b"\x85", b"\x86", b"\x87")[len(v)] if len(v) <= 3 else b"t"
        elif isinstance(v, Obj):
            self.glob(v.cls)
            self.out += b")\x81}("
            for k, x in v.attrs:
                self.string(k)
                self.value(x)
            self.out += b"ub"
            self.put()
        else:
            raise TypeError(v)

    def done(self):
        return bytes(self.out) + b"."


class Obj:
    def __init__(self, cls, attrs):
        self.cls, self.attrs = cls, attrs


def pickle_of(obj):
    p = Pickler()
    p.value(obj)
    return p.done()


def is_identifier(n):
    return bool(n) and (n[0].isalpha() or n[0] == "_") and all(
        c.isalnum() or c == "_" for c in n) and n.isascii()


def class_code(attrs):
    """The code LibTorch prints for a module of attributes [(name, type text)] (no tensors)."""
    s = "class Module(Module):\n  __parameters__ = []\n  __buffers__ = []\n"
    if attrs and not is_identifier(attrs[0][0]):
        s += "  __annotations__ = []\n"
    for n, t in attrs:
        if is_identifier(n):
            s += "  %s : %s\n" % (n, t)
        else:
            s += '  __annotations__["%s"] = %s\n' % (n, t)
    return s.encode()


def code_name(i):
    """The record of the i-th class (0: __torch__.Module), and its qualified name."""
    if i == 0:
        return "code/__torch__.py", "__torch__.Module"
    n = i - 1
    return "code/__torch__/___torch_mangle_%d.py" % n, "__torch__.___torch_mangle_%d.Module" % n


def module_archive(classes, pkl, debug):
    """The records of an archive of module classes [(attrs)] (class 0 the root) and data.pkl."""
    recs = [Rec("data.pkl", pkl)]
    for i, attrs in enumerate(classes):
        rel, _ = code_name(i)
        recs.append(Rec(rel, class_code(attrs)))
        recs.append(Rec(rel + ".debug_pkl", debug))
    recs.append(Rec("constants.pkl", b"\x80\x02)."))
    recs.append(Rec("version", b"3\n"))
    return recs


def checkpoint_seeds():
    base_file = open(os.path.join(CKPT_DIR, "file-scaler_archive"), "rb").read()
    folder, scaler = read_zip(base_file[1:])
    if Zip(scaler, folder).bytes != base_file[1:]:
        sys.exit("make_corpus.py: its zip writer no longer lays out file-scaler_archive as LibTorch")
    recs = {r.name.decode(): r for r in scaler}
    debug = recs["code/__torch__.py.debug_pkl"].data
    scaler_attrs = [("_growth_tracker", 0), ("backoff_factor", 0.5), ("growth_factor", 2.0),
                    ("growth_interval", 2000), ("scale", 65536.0)]
    if pickle_of(Obj("__torch__.Module", scaler_attrs)) != recs["data.pkl"].data:
        sys.exit("make_corpus.py: its pickler no longer writes the scaler's data.pkl as LibTorch")
    scaler_types = [("_growth_tracker", "int"), ("backoff_factor", "float"),
                    ("growth_factor", "float"), ("growth_interval", "int"), ("scale", "float")]
    if class_code(scaler_types) != recs["code/__torch__.py"].data:
        sys.exit("make_corpus.py: its printer no longer writes the scaler's code as LibTorch")

    s = {}

    def whole_file(name, data):
        s["shape-" + name] = b"\x00" + data

    def zipped(records, **kw):
        return Zip(records, folder, **kw).bytes

    def with_code(code, method=None, **kw):
        """The scaler archive with code/__torch__.py replaced."""
        out = []
        for r in scaler:
            if r.name == b"code/__torch__.py":
                r = Rec(r.name, code, method, **kw)
            out.append(r)
        return out

    def code_file(types, method=None, **kw):
        """The scaler archive whose class declares `types` (its pickle unchanged)."""
        return zipped(with_code(class_code(types), method, **kw))

    def module_file(classes, obj):
        """An archive of module classes (class 0 the root) holding `obj`."""
        return zipped(module_archive(classes, pickle_of(obj), debug))

    # Many attributes: as the quadratic screen's case (100,000 in the test), here 20,000, the
    # code deflated as LibTorch deflates it. The pickle holds the scaler's 5: refused after the
    # names are checked. Then the same with one name twice, and 2,000 that load.
    many = scaler_types + [("a%d" % i, "float") for i in range(20000)]
    root = "__torch__.Module"
    whole_file("attributes-20000", code_file(many))
    whole_file("attributes-20000-twice", code_file(many + [("a7", "float")]))
    quoted = [("a b%d" % i if i % 2 else "a%d" % i, "int") for i in range(2000)]
    whole_file("attributes-2000-loads",
               module_file([quoted], Obj(root, [(n, i) for i, (n, _) in enumerate(quoted)])))
    long_name = "n" * 50000
    whole_file("attribute-name-50000-loads",
               module_file([[(long_name, "str")]], Obj(root, [(long_name, "v" * 1000)])))
    whole_file("attribute-reserved-names",
               code_file(scaler_types + [("if", "int"), ("__init__", "int"), ('a"b', "int")]))

    # Deep types and modules. Types nest 8 deep at most; modules 64.
    def tuple_type(d):
        return "Tuple[" * d + "int" + "]" * d

    def tuple_value(d):
        v = 7
        for _ in range(d):
            v = (v,)
        return v

    for d in (8, 9):
        whole_file("tuple-nesting-%d" % d,
                   module_file([[("t", tuple_type(d))]], Obj(root, [("t", tuple_value(d))])))
    whole_file("tuple-nesting-5000", code_file(scaler_types + [("t", tuple_type(5000))]))
    wide = "Tuple[" + ", ".join(["int"] * 3000) + "]"
    whole_file("tuple-wide-3000", code_file(scaler_types + [("t", wide)]))
    for depth in (64, 65):
        classes = []
        for i in range(depth):
            inner = [("inner", code_name(i + 1)[1])]
            classes.append([("leaf", "int")] if i == depth - 1 else inner)
        v = Obj(code_name(depth - 1)[1], [("leaf", 1)])
        for i in range(depth - 2, -1, -1):
            v = Obj(code_name(i)[1], [("inner", v)])
        whole_file("modules-%d-deep" % depth, module_file(classes, v))
    # A class that contains itself through another.
    cycle = [[("inner", code_name(1)[1])], [("back", code_name(0)[1])]]
    whole_file("modules-cycle", zipped(module_archive(cycle, recs["data.pkl"].data, debug)))

    # Truncated at each kind of record of a valid archive (the nested one: several entries, a
    # deflated code record), and the data cut out of the middle with the directory kept.
    inner = Obj(code_name(1)[1], scaler_attrs)
    nested = module_archive([scaler_types + [("inner", code_name(1)[1])], scaler_types],
                            pickle_of(Obj(root, scaler_attrs + [("inner", inner)])), debug)
    for r in nested:
        if r.name == b"code/__torch__.py":
            r.method, r.packed = 8, deflate(r.data)
    z = Zip(nested, folder)
    w, b = z.where, z.bytes
    whole_file("nested-whole", b)
    cuts = {
        "first-bytes": 22, "mid-local-header": w["local"][2] + 17,
        "mid-local-name": w["local"][1] + 36, "mid-padding": w["data"][1] - 9,
        "mid-data": w["data"][0] + 60, "mid-deflated-data": w["data"][1] + 40,
        "mid-descriptor": w["descriptor"][3] + 7, "before-directory": w["central"][0],
        "mid-directory-entry": w["central"][2] + 30, "mid-directory-name": w["central"][4] + 50,
        "mid-zip64-end": w["zip64_end"] + 30, "mid-locator": w["locator"] + 9,
        "mid-end": w["end"] + 11, "last-byte": len(b) - 1,
    }
    for what, at in cuts.items():
        whole_file("cut-%s" % what, b[:at])
    hole = w["data"][0] + 40
    whole_file("cut-hole-in-data", b[:hole] + b[hole + 64:])
    whole_file("cut-end-record-only", b[w["end"]:])
    whole_file("cut-tail-records-only", b[w["zip64_end"]:])
    # Pickles cut mid opcode: alone (mode 1) and inside an ampactor checkpoint (mode 3).
    pkl = recs["data.pkl"].data
    for at in (2, 17, 40, len(pkl) - 3, len(pkl) - 1):
        s["shape-pickle-cut-%d" % at] = b"\x01" + pkl[:at]
    template = open(os.path.join(CKPT_DIR, "ckpt-pickle-template"), "rb").read()
    for at in (60, 200, len(template) - 2):
        s["shape-ckpt-pickle-cut-%d" % at] = template[:at]
    s["shape-pickle-deep-tuples"] = b"\x01\x80\x02" + b"K\x01" + b"\x85" * 20000 + b"."
    s["shape-pickle-deep-marks"] = b"\x01\x80\x02" + b"(" * 50000 + b"."
    memo = b"".join(b"X\x01\x00\x00\x00a" + (b"q" + bytes([i]) if i < 256 else b"r" + le(i, 4)) + b"0"
                    for i in range(3000))
    s["shape-ckpt-pickle-many-memo"] = b"\x03\x80\x02" + memo + b"."

    # zip64: every size and offset in zip64 fields (8-byte descriptors, end record all ones), as
    # miniz reads them; sizes in the local headers, no descriptors; and broken variants.
    whole_file("zip64-all-fields", zipped(scaler, zip64=True))
    whole_file("zip64-local-fields", zipped(scaler, zip64=True, local_zip64=True))
    whole_file("zip64-no-descriptors",
               zipped(scaler, zip64=True, local_zip64=True, descriptors=False))
    whole_file("zip64-nested-cut-mid-end", zipped(nested, zip64=True)[:-5])
    zz = Zip(scaler, folder, zip64=True)
    b = bytearray(zz.bytes)
    b[zz.where["zip64_end"] + 24:zz.where["zip64_end"] + 40] = le(4, 8) * 2  # 4 of 5 entries
    whole_file("zip64-count-4-of-5", bytes(b))
    b = bytearray(zz.bytes)
    b[zz.where["zip64_end"] + 32:zz.where["zip64_end"] + 40] = le(4, 8)  # disagrees with "here"
    whole_file("zip64-count-disagrees", bytes(b))
    b = bytearray(zz.bytes)
    b[zz.where["end"] + 8:zz.where["end"] + 12] = le(5, 2) * 2  # end record names the count
    whole_file("zip64-end-record-partly-ones", bytes(b))
    b = bytearray(zz.bytes)
    b[zz.where["locator"] + 8:zz.where["locator"] + 16] = le(zz.where["zip64_end"] + 1, 8)
    whole_file("zip64-locator-off-by-one", bytes(b))
    b = bytearray(zz.bytes)
    b[zz.where["zip64_end"] + 4:zz.where["zip64_end"] + 12] = le(ONES32 * 4, 8)  # record size
    whole_file("zip64-record-size-huge", bytes(b))
    b = bytearray(zz.bytes)
    b[zz.where["zip64_end"] + 40:zz.where["zip64_end"] + 48] = le(2 ** 63 + 5, 8)  # dir size
    whole_file("zip64-directory-size-2-63", bytes(b))
    # Extra fields in the directory and in local headers.
    x64 = le(1, 2) + le(8, 2) + le(2 ** 40, 8)
    def field(tag, data, length=None):
        return le(tag, 2) + le(len(data) if length is None else length, 2) + data

    whole_file("extra-zip64-twice", zipped(scaler, zip64=True, central_extra={1: field(1, b"\0" * 24)}))
    whole_file("extra-zip64-not-needed", zipped(scaler, central_extra={0: x64}))
    whole_file("extra-unknown-id", zipped(scaler, central_extra={2: field(0x5455, b"\x01" * 5)}))
    whole_file("extra-runs-past-end", zipped(scaler, central_extra={0: field(0x4246, b"", 400)}))
    whole_file("extra-local-zip64", zipped(scaler, local_extra={0: field(1, b"\0" * 16)}))
    whole_file("extra-local-unknown",
               zipped(scaler, local_extra={1: field(0x7875, b"\x01\x04" + b"\0" * 9)}))

    # Deflate bombs. LibTorch's reader (miniz) takes stored and deflated entries; the screen takes
    # deflate for code records alone, at most 16 MiB inflated. A 32 MiB code record (refused by its
    # declared size, before inflating); the same stream declared as the scaler's 176 bytes (its
    # first 176 bytes are the code: miniz must stop where the declared size ends); 16 MiB exactly
    # (inflated, then refused: its last line does not end), and 1 MiB of empty lines (each a line
    # to split); a deflated tensor; methods miniz does not know. (16 MiB of attributes, the worst
    # the limit lets through, takes 2.8 s under ASan to refuse: too slow a seed for the gate's 60 s.)
    code = recs["code/__torch__.py"].data
    bomb = code + b" " * (32 * 2 ** 20 - len(code))
    bomb_z = deflate(bomb)
    whole_file("bomb-code-32mib", zipped(with_code(bomb, 8, packed=bomb_z)))
    whole_file("bomb-code-declared-small", zipped(with_code(code, 8, packed=bomb_z)))
    at_limit = code + b" " * (16 * 2 ** 20 - len(code))
    whole_file("bomb-code-16mib-exactly", Zip(with_code(at_limit, 8), folder).bytes)
    whole_file("bomb-code-16mib-plus-1", Zip(with_code(at_limit + b"\n", 8), folder).bytes)
    lines = code + b"\n" * 2 ** 20
    whole_file("bomb-code-1mib-newlines", Zip(with_code(lines, 8), folder).bytes)
    tensor = [Rec("data/0", b"\0" * (8 * 2 ** 20), 8)] + [r for r in scaler]
    whole_file("bomb-tensor-8mib", Zip(tensor, folder).bytes)
    stored_as = [Rec(r.name, r.data, 8) if r.name == b"data.pkl" else r for r in scaler]
    whole_file("deflated-data-pkl", Zip(stored_as, folder).bytes)
    for method in (1, 9, 12, 14, 93, 99):
        whole_file("method-%d" % method, zipped(with_code(code, method, packed=deflate(code))))
    broken = bytearray(bomb_z[:4000])
    broken[1000] ^= 0xFF
    whole_file("bomb-code-broken-stream", zipped(with_code(code, 8, packed=bytes(broken))))
    level0 = zlib.compressobj(0, zlib.DEFLATED, -15)
    stored_blocks = level0.compress(code) + level0.flush()
    whole_file("deflate-stored-blocks", zipped(with_code(code, 8, packed=stored_blocks)))

    # Entries named twice, and near twice.
    whole_file("duplicate-version", Zip(scaler + [Rec("version", b"3\n")], folder).bytes)
    whole_file("duplicate-case", zipped(scaler + [Rec("DATA.PKL", recs["data.pkl"].data)]))
    whole_file("duplicate-code",
               zipped(scaler + [Rec("code/__torch__.py", class_code(scaler_types[:4]))]))
    whole_file("duplicate-debug-pkl", zipped(scaler + [Rec("code/__torch__.py.debug_pkl", debug)]))
    whole_file("entry-dotdot", Zip(scaler + [Rec(b"../archive/version", b"3\n")], folder).bytes)
    # Many entries, long names, odd folders.
    storages = [Rec("data/%d" % i, le(i, 4)) for i in range(400)]
    whole_file("entries-400", Zip(storages + scaler, folder).bytes)
    whole_file("entry-name-30000", Zip(scaler + [Rec("data/" + "1" * 30000, b"x")], folder).bytes)
    whole_file("entry-name-slash-end", Zip(scaler + [Rec("data/", b"")], folder).bytes)
    whole_file("entry-folder-empty", Zip(scaler, "").bytes)
    differ = [Rec(b"archive/" + r.name, r.data) for r in scaler[:-1]] + [Rec(b"other/version", b"3\n")]
    whole_file("entry-folders-differ", Zip(differ, "").bytes)
    return s


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
