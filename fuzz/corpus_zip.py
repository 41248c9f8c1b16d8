"""LibTorch 1.13's zip layout and pickles, written by hand, for the checkpoint seeds of
make_corpus.py."""
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE_DIR = os.path.join(HERE, "corpus", "trace")
CKPT_DIR = os.path.join(HERE, "corpus", "checkpoint")
MAX_FILE = 256 * 1024

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
