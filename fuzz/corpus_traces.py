"""The trace seeds of make_corpus.py (see its docstring): hostile shapes of a trace's text."""
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
