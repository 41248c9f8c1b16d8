"""The checkpoint seeds of make_corpus.py (see its docstring): LibTorch 1.13's zip layout and
pickles written by hand, in hostile shapes."""
import os

from corpus_zip import *  # noqa: F401,F403 (the writers and their constants)


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
