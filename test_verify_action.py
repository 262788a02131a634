"""Tests for verify_action.py: unittest, standard library only.

    python3 -m unittest test_verify_action      the tests
    python3 test_verify_action.py bench         the benchmark (never run by `make test`)
    python3 test_verify_action.py adversarial   its table of adversarial bodies alone
    python3 test_verify_action.py credentials   its credentials part alone (issue 29)
"""
import base64
import decimal
import errno
import functools
import gc
import hashlib
import hmac
import html.parser
import http.client
import http.server
import json
import os
import random
import re
import select
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import verify_action as va

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "verify_action.py")
PY = sys.executable
JSON = {"Content-Type": "application/json"}

# ---------------------------------------------------------------------------------------------------
# An independent RFC 8785 implementation (written apart from the module's) to recompute receipts
# ---------------------------------------------------------------------------------------------------
_ESC = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def ref_number(x):
    f = float(x)
    if f == 0:
        return "0"
    sign, digits, exp = decimal.Decimal(repr(abs(f))).normalize().as_tuple()
    s = "".join(map(str, digits))
    k, n = len(s), exp + len(s)
    if k <= n <= 21:
        body = s + "0" * (n - k)
    elif 0 < n <= 21:
        body = s[:n] + "." + s[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + s
    else:
        e = n - 1
        body = s[0] + ("." + s[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return ("-" if f < 0 else "") + body


def ref_jcs(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return ref_number(v)
    if isinstance(v, str):
        return '"' + "".join(_ESC.get(c, "\\u%04x" % ord(c) if ord(c) < 0x20 else c) for c in v) + '"'
    if isinstance(v, list):
        return "[" + ",".join(ref_jcs(i) for i in v) + "]"
    return "{" + ",".join(ref_jcs(k) + ":" + ref_jcs(v[k]) for k in sorted(v, key=utf16_units)) + "}"


def utf16_units(key):
    b = key.encode("utf-16-be")
    return struct.unpack(">%dH" % (len(b) // 2), b)


def ref_sha(obj):
    return "sha256:" + hashlib.sha256(ref_jcs(obj).encode("utf-8")).hexdigest()


def canonical_json(value):
    """The module's RFC 8785 text of a parsed value, as UTF-8 (from canonical_members, which the receipts use)."""
    return va.canonical_members(value, along=())[None].encode("utf-8")


# ---------------------------------------------------------------------------------------------------
# Fixtures: diffs, a service, helpers
# ---------------------------------------------------------------------------------------------------
D_USER = ("diff --git a/src/user.py b/src/user.py\nindex 1111111..2222222 100644\n--- a/src/user.py\n+++ b/src/user.py\n"
          "@@ -10,2 +10,4 @@\n def save(user):\n+    if user.email is None:\n+        raise ValueError(\"email required\")\n"
          "     db.write(user)\n")
D_PRINT = ("diff --git a/src/user.py b/src/user.py\n--- a/src/user.py\n+++ b/src/user.py\n@@ -1,2 +1,3 @@\n"
           " def save(user):\n+    print(\"saving\")\n     db.write(user)\n")
D_DATA = "--- a/data.py\n+++ b/data.py\n@@ -1,1 +1,2 @@\n x = 1\n+y = compute()\n"
D_PLAIN = ("--- app/config.py\t2024-01-01 10:00:00.000000000 +0000\n+++ app/config.py\t2024-01-02 11:00:00.000000000 +0000\n"
           "@@ -1,2 +1,3 @@\n TIMEOUT = 5\n+retry_count = 3\n DEBUG = False\n")
D_NOPREFIX = ("diff --git lib/limits.py lib/limits.py\n--- lib/limits.py\n+++ lib/limits.py\n@@ -1 +1 @@\n"
              "-MAX_SIZE = 10\n+MAX_SIZE = 20\n")
D_DELETE = ("diff --git a/old_api.py b/old_api.py\ndeleted file mode 100644\nindex 3333333..0000000\n--- a/old_api.py\n"
            "+++ /dev/null\n@@ -1,3 +0,0 @@\n-def legacy():\n-    return 1\n-\n")
D_CREATE = "--- /dev/null\n+++ b/docs/guide.md\n@@ -0,0 +1,2 @@\n+# Guide\n+Use `make test`.\n"
D_RENAME = "diff --git a/old.py b/new.py\nsimilarity index 100%\nrename from old.py\nrename to new.py\n"
D_BINARY = "diff --git a/logo.png b/logo.png\nindex 1..2 100644\nBinary files a/logo.png and b/logo.png differ\n"
D_TWO = (D_USER + "diff --git a/src/other.py b/src/other.py\n--- a/src/other.py\n+++ b/src/other.py\n@@ -1,1 +1,11 @@\n"
         " import os\n" + "".join("+helper_%d = %d\n" % (i, i) for i in range(10)))
D_DEEP = "--- a/lib/src/user.py\n+++ b/lib/src/user.py\n@@ -1 +1,2 @@\n x\n+parse_header = 1\n"
D_CONTEXT = ("--- a/src/user.py\n+++ b/src/user.py\n@@ -1,2 +1,3 @@\n if user.email:\n+    audit()\n     pass\n")
D_HUNK_DASHES = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,1 @@\n---- old rule\n keep\n"
D_RATE_RM = "--- a/src/user.py\n+++ b/src/user.py\n@@ -1,2 +1,2 @@\n-rate_limit = 5\n+x = 1\n keep\n"
D_DEBUG_ADD = "--- a/config.py\n+++ b/config.py\n@@ -1,2 +1,2 @@\n-old = 0\n+debug_flag = True\n keep\n"
D_ONE_LINE = "--- a/old_api.py\n+++ b/old_api.py\n@@ -1,2 +1,1 @@\n-def legacy(): pass\n keep\n"
D_AUTH = "--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,1 @@\n-auth_check()\n keep\n"

SERVICE = va.Service(va.KeyRing.generate())


def judge(claim, evidence, kind=None):
    req = {"claim": claim, "evidence": evidence}
    if kind:
        req["kind"] = kind
    r = SERVICE.verify(va.validate_request(req))
    return r["aar_verdict"], r["reason_codes"]


PATHOLOGICAL = ["a." * 4000, "a" * 8192, ("a" * 60 + "@") * 130, "a@" * 4000, "1" * 8192, "_a" * 4096,
                "`" + "a." * 4000 + "`", "aA" * 4096, ("x" * 50 + ".") * 160, "#1 " * 2730, "/a" * 4096,
                "id=1 " * 1638, "http://" + "a." * 4000, "status: " * 1000, "a=" * 4096, "did not delete " * 540,
                "removed the file a.py " * 370, "user 1 " * 1170, "https://h.com/customers/1 " * 315]


# PATHOLOGICAL's answers: for each claim, its verdict against each evidence shape of pathological_evidence, in order
PATHOLOGICAL_ANSWERS = ["IIIIIIII"] * 12 + ["IIIIICII", "IIIIIIII", "IIIIIIII", "IIIICIII", "CIVICIII", "IICIIIII",
                                            "IIIIIIII"]


def pathological_evidence(claim):
    return [{"diff": D_TWO + "+" + claim + "\n"}, {"diff": "+" * 200000},
            {"before_count": 1, "after_count": 0, "operation": "DELETE FROM t WHERE id IN (" + "1," * 20000 + "1)"},
            {"before_count": 1, "after_count": 0, "operation": "/*" * 30000 + "'" * 1000},
            {"path": claim[:4096], "exists_before": True, "exists_after": False, "line_count": 1, "size_bytes": 1},
            {"request": claim, "response_status": 200, "response_body": claim},
            {"request": {"to": claim}, "response_status": 500, "response_body": "{" * 31},
            {"x": claim, "y": [claim] * 20}]


def big_bodies():
    """The review's slow inputs (finding 2) and their kin: whole /verify bodies within the 1 MiB limit."""
    def fill(head, unit, tail):  # as many units as fit
        return (head + unit * ((va.MAX_BODY - len(head) - len(tail)) // len(unit)) + tail).encode()
    urls = " ".join("http://%x/c" % i for i in range(600))  # 600 claimed URLs within the 8192-character claim
    return [("sql: 'id IN (' x 9300, no ')'", json.dumps({"claim": "Deleted user 5", "evidence": {
                "affected_rows": 1, "operation": ("DELETE FROM t WHERE " + "id IN (" * 9300)[:65536]}}).encode()),
            ("api_call: 600 claimed x 70k request URLs", json.dumps({"claim": "Posted to " + urls, "evidence": {
                "response_status": 200, "request": " ".join("http://%x" % i for i in range(70000))}}).encode()),
            ("api_call: 600 claimed x 55k URLs in a url list", json.dumps({"claim": "Posted to " + urls, "evidence": {
                "response_status": 200, "request": {"url": ["http://h%d/p" % i for i in range(55000)]}}}).encode()),
            ("generic: 32 stated keys x 60k members", json.dumps({"claim": " ".join("k%d is w" % i for i in range(32)),
                                                                 "evidence": {"k%d" % i: "v" for i in range(60000)}}).encode()),
            ("depth-29 nests", fill('{"claim": "x", "evidence": {"a": [', "[" * 28 + "]" * 28 + ",", "[]]}}")),
            ("runs of 299 digits", fill('{"claim": "x", "evidence": {"a": [', "9" * 299 + ",", "1]}}")),
            ("runs of 15 digits", fill('{"claim": "x", "evidence": {"a": [', "9" * 15 + ",", "1]}}")),
            ("120k small objects", fill('{"claim": "status is ok", "evidence": {"a": [', '{"a":[{"b":[1]}]},', "1]}}")),
            ("200k short strings", fill('{"claim": "x", "evidence": {"a": [', '"ab",', '"x"]}}'))]


def adversarial_bodies():
    """At least 20 hostile bodies up to the 1 MiB limit, as (label, path, body): the review's slow inputs and their
    kin (deep nests, many small objects, long strings, a diff of many files, long SQL, many claim tokens, floats)."""
    def fill(head, unit, tail):  # as many units as fit
        size = lambda text: len(text.encode())
        return (head + unit * ((va.MAX_BODY - size(head) - size(tail)) // size(unit)) + tail).encode()

    def verify(claim, evidence_head, unit, tail, kind=None):
        head = '{%s"claim": %s, "evidence": %s' % ('"kind": "%s", ' % kind if kind else "", json.dumps(claim),
                                                      evidence_head)
        return fill(head, unit, tail + "}")
    cases = [(label, "/verify", body) for label, body in big_bodies()]
    files = "".join("diff --git a/src/m%d.py b/src/m%d.py\n--- a/src/m%d.py\n+++ b/src/m%d.py\n@@ -1,5 +1,10 @@\n"
                    % (i, i, i, i) + "     context_line = previous_value(%d)\n" % i * 5
                    + "".join("+    value_%d = compute_something(argument_%d, other_%d)\n" % (j, j, i) for j in range(5))
                    for i in range(1200))  # about 800 KB
    paths = " ".join("src/m%d.py" % i for i in range(600))[:8000]
    mixed, nest = '{"\ue000":1,"\U0001f600":2},', "[" * 28 + "]" * 28 + ","  # an object of keys that need UTF-16 order
    deep_mix = '{"k": ' * 29 + mixed[:-1] + "}" * 29
    entities = " ".join("https://h%d.example/x" % i for i in range(300))[:8000]
    cases += [
        ("code_diff: 1,200 files x 10 lines", "/verify", json.dumps({"claim": "Added `value_3` in src/m7.py",
                                                                     "evidence": {"diff": files}}).encode()),
        ("code_diff: one hunk of 1 MiB short lines", "/verify",
         verify("Added `x_y` to a.py", '{"diff": "--- a/a.py\\n+++ b/a.py\\n@@ -1 +1,90000 @@\\n',
                "+x\\n", '"}')),
        ("code_diff: 8 KiB claim of paths", "/verify", json.dumps({"claim": "Updated " + paths,
                                                                  "evidence": {"diff": files}}).encode()),
        ("code_diff: 1 MiB of @@ lines", "/verify", verify("Added `x_y` to a.py", '{"diff": "', "@@ -1 +1 @@\\n", '"}')),
        ("code_diff: 1 MiB of one-line hunks", "/verify",
         verify("Added `x_y` to a.py", '{"diff": "', "@@ -1 +1 @@\\n x\\n", '"}')),
        ("code_diff: 1 MiB of one-line hunks, added", "/verify",
         verify("Added `x_y` to a.py", '{"diff": "', "@@ -1 +1 @@\\n+x\\n", '"}')),
        ("code_diff: 1 MiB of --- lines", "/verify", verify("Added `x_y` to a.py", '{"diff": "', "--- a\\n", '"}')),
        ("code_diff: 1 MiB of other lines", "/verify", verify("Added `x_y` to a.py", '{"diff": "', "x\\n", '"}')),
        ("code_diff: a hunk of blank lines", "/verify",
         verify("Added `x_y` to a.py", '{"diff": "--- a/a.py\\n+++ b/a.py\\n@@ -1,900000 +1,900000 @@\\n',
                "\\n", '"}')),
        ("generic: one 1 MiB string", "/verify", verify("status is ok", '{"s": "', "a", '"}')),
        ("generic: 8 KiB claim of entities", "/verify", verify(entities, '{"a": [', '"https://h1.example/x",', '1]}')),
        ("generic: 8 KiB claim of states x 60k keys", "/verify", json.dumps({"claim": " ".join(
            "enabled k%d," % i for i in range(900))[:8000], "evidence": {"k%d" % i: i % 2 == 0 for i in range(60000)}}
        ).encode()),
        ("generic: 7 KiB of state words, then 32 keys", "/verify", json.dumps({  # each key's nearest word: 100 ms
            "claim": ("enabled " * 1000)[:7000] + " ".join("k%d" % i for i in range(32)),
            "evidence": {"k%d" % i: True for i in range(32)}}).encode()),
        ("generic: status keys under nests", "/verify",
         verify("status: ok", '{"a": [', '{"b": {"status": "failed", "ok": false}},', '1]}')),
        ("db_op: 64 KiB SQL of OR terms", "/verify", json.dumps({"claim": "Deleted user 5", "evidence": {
            "affected_rows": 1, "operation": ("DELETE FROM t WHERE id = 5" + " OR id = 6" * 7000)[:65536]}}).encode()),
        ("api_call: 1 MiB JSON text body", "/verify",
         verify("Sent it", '{"response_status": 200, "response_body": "[', '{\\"ok\\": true},', '1]"}')),
        ("api_call: 1 MiB plain text body", "/verify",
         verify("Sent it", '{"response_status": 200, "response_body": "', "sent ok ", '"}')),
        # claimed ids met the request's ids one pass each (700 x 20,000: 6 s); every token and URL is read
        ("api_call: 700 claimed ids x 66k ids in the request", "/verify", json.dumps({
            "claim": " ".join("customer %d" % i for i in range(700))[:8000], "evidence": {
                "response_status": 200, "request": " ".join("customer %d" % i for i in range(5000, 71000))}}).encode()),
        ("api_call: ids in 62k URL paths", "/verify", json.dumps({
            "claim": "Updated customer 78 via http://b/c", "evidence": {
                "response_status": 200, "request": " ".join("http://a/c/%d" % i for i in range(62000))}}).encode()),
        ("generic: 1,300 stated values x 100 found", "/verify", json.dumps({
            "claim": " ".join("k=%d" % i for i in range(3000))[:8190],
            "evidence": {"a": [{"k": "9%d" % i} for i in range(100)]}}).encode()),
        ("generic: a string of escaped quotes after ':'", "/verify", verify(
            "Set a_b, c_d and e_f", '{"s": ":', '\\"', '"}')),
        ("api_call: a URL of one 1 MiB path segment", "/verify", verify(
            "Updated customer 78 via http://b/c", '{"response_status": 200, "request": "http://a/', "x", '"}')),
        ("api_call: one URL 116k times", "/verify", verify("Posted to http://b/c", '{"response_status": 200, "request": "',
                                                          "http://a ", '"}')),
        ("file_op: 8 KiB claim of sizes and paths", "/verify", json.dumps({"claim": "Wrote " + " ".join(
            "%d lines %d KB to f%d.txt" % (i, i, i) for i in range(300))[:8000], "evidence": {
            "path": "x" * 4096, "exists_before": False, "exists_after": True, "line_count": 3}}).encode()),
        ("mcp: tools/call of 120k small objects", "/mcp", fill(
            '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "verify_action", "arguments": '
            '{"claim": "status is ok", "evidence": {"a": [', '{"a":[{"b":[1]}]},', '1]}}}}')),
        ("strings of \\u escapes", "/verify", verify("x", '{"a": [', '"\\u00e9\\u003a",', '"x"]}')),
        ("floats: 1.5e-05", "/verify", verify("x", '{"a": [', "1.5e-05,", "1]}")),
        ("floats: 0.1234567", "/verify", verify("x", '{"a": [', "0.1234567,", "1]}")),
        ("floats: 12.0", "/verify", verify("x", '{"a": [', "12.0,", "1]}")),
        # the layouts furthest apart: 1e16 is 1e+16 to json.dumps and 10000000000000000 to ECMAScript
        ("floats: 1e16", "/verify", verify("x", '{"a": [', "1e16,", "1]}")),
        ("floats: 1.5e+16", "/verify", verify("x", '{"a": [', "1.5e+16,", "1]}")),
        ("floats: 1.5e-06", "/verify", verify("x", '{"a": [', "1.5e-06,", "1]}")),
        ("floats: 1e-07", "/verify", verify("x", '{"a": [', "1e-07,", "1]}")),
        ("floats: -0.0", "/verify", verify("x", '{"a": [', "-0.0,", "1]}")),
        ("runs of 16 digits below 2^53", "/verify", verify("x", '{"a": [', "1234567890123456,", "1]}")),
        ("U+E000 and astral in a value", "/verify", verify("x", '{"s": "\ue000\U0001f600", "a": [', '{"a":[{"b":[1]}]},',
                                                           "1]}")),
        # keys that mix them need UTF-16 order, which json.dumps's code point order is not: the objects holding them
        # have their keys marked in place or, where they are many, the marked text is parsed again
        ("U+E000 and astral in keys", "/verify", verify("x", '{"\ue000": 1, "\U0001f600": 2, "a": [',
                                                        '{"a":[{"b":[1]}]},', "1]}")),
        ("such keys at depth 31", "/verify", verify("x", '{"d": %s, "a": [' % deep_mix, '{"a":[{"b":[1]}]},', "1]}")),
        ("50k small objects of such keys", "/verify", verify("x", '{"a": [', '{"\ue000":1,"\U0001f600":2},', "1]}")),
        ("30k such objects, all escaped", "/verify", verify("x", '{"a": [', '{"\\ue000":1,"\\ud83d\\ude00":2},', "1]}")),
        ("one object of 50k such keys", "/verify", json.dumps({"claim": "x", "evidence": {
            ("\ue000%d" if i % 2 else "\U0001f600%d") % i: i for i in range(54000)}}, ensure_ascii=False).encode()),
        ("70k two-key objects, such chars in the claim", "/verify", verify("\ue000\U0001f600", '{"a": [',
                                                                            '{"a":0,"b":0},', "1]}")),
        ("depth-29 nests and 20k objects of such keys", "/verify", verify("x", '{"a": [' + mixed * 20000, nest, "1]}")),
        ("depth-29 nests and 40k objects of such keys", "/verify", verify("x", '{"a": [' + mixed * 40000, nest, "1]}")),
        # members beside the one canonicalised on its own are written together, however many
        ("70k top-level members", "/verify", json.dumps(dict({"claim": "x", "evidence": {}},
                                                             **{"k%d" % i: 1 for i in range(70000)})).encode()),
        ("70k members beside the receipt", "/receipts/verify", json.dumps(dict(
            {"receipt": {}}, **{"k%d" % i: 1 for i in range(70000)})).encode()),
        ("mcp: 60k members beside the evidence", "/mcp", json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "verify_action", "arguments": dict(
                {"claim": "x", "evidence": {}}, **{"k%d" % i: [1] for i in range(60000)})}}).encode()),
    ]
    return cases + hostile_bodies_27()


def hostile_bodies_27():
    """The body shapes issue 27 adds to the adversarial table, as (label, path, body), each up to the 1 MiB limit:
    dotted names of 8 and 16 parts on added lines, long camelCase runs, floats of every exponent, many files,
    nested status objects, long prose."""
    rng = __import__("random").Random(27)
    room = va.MAX_BODY - 300  # for the claim and the JSON around the evidence

    def request(claim, evidence):
        return json.dumps({"claim": claim, "evidence": evidence}).encode()

    def repeat(unit, size=room):  # unit repeated, as many times as fit in size bytes of JSON
        return unit * (size // len(json.dumps(unit)[1:-1].encode()))

    def added(line, size=room):  # a diff of one file whose added lines repeat line
        head = "--- a/a.py\n+++ b/a.py\n@@ -1 +1,%d @@\n x\n" % 900000
        return {"diff": head + repeat("+" + line + "\n", size - len(head) - 40)}
    dotted8 = ".".join("abcdefgh")
    dotted16 = ".".join("abcdefghijklmnop")
    camel = "".join(rng.choice(["get", "Set", "User", "Email", "Id", "Rate", "Limit"]) for _ in range(400))
    prose = ("The payment was not sent because the account could not be verified, and the retry failed again "
             "after the rate limit reset; the operator was notified. ")
    every_exponent = [float("%se%d" % (m, e)) for e in range(-320, 300) for m in ("1", "1.5", "2.25", "9.75")]
    files = "".join("diff --git a/src/m%d.py b/src/m%d.py\n--- a/src/m%d.py\n+++ b/src/m%d.py\n@@ -1,2 +1,3 @@\n"
                    " import os\n+value_%d = compute_rate_limit(user.email)\n keep = 1\n" % ((i,) * 5)
                    for i in range(4900))
    nested = {"status": "failed", "errors": 1}
    for _ in range(27):  # with the request, the evidence and the list: 31 levels, within the limit of 32
        nested = {"status": "ok", "data": nested}
    return [(label, "/verify", body) for label, body in [
        ("code_diff: 52k dotted names of 8 parts, one line", request(
            "Added `%s` to a.py" % dotted8, {"diff": "--- a/a.py\n+++ b/a.py\n@@ -1 +1,2 @@\n x\n+"
                                                     + repeat(dotted8 + " ", room - 60) + "\n"})),
        ("code_diff: dotted names of 8 parts, 58k lines", request("Added `%s` to a.py" % dotted8, added(dotted8))),
        ("code_diff: distinct dotted names of 16 parts", request("Added `x.%s` to a.py" % dotted16, {
            "diff": "--- a/a.py\n+++ b/a.py\n@@ -1 +1,30000 @@\n x\n" + "".join(
                "+n%d.%s = 1\n" % (i, dotted16) for i in range(room // 46))})),
        ("code_diff: dotted names of 16 parts in the claim", request(
            " ".join("`k%d.%s`" % (i, dotted16) for i in range(200))[:8000], added(dotted16 + "()", room - 8200))),
        ("code_diff: long camelCase runs", request("Added `%s` to a.py" % camel[:200], added(camel))),
        ("code_diff: one camelCase run of 1 MiB", request("Added `%s` to a.py" % camel[:200], {
            "diff": "--- a/a.py\n+++ b/a.py\n@@ -1 +1,2 @@\n x\n+" + repeat("aB", room - 60) + "\n"})),
        ("generic: camelCase runs in the claim and keys", request(" ".join(camel[i:i + 40] for i in range(0, 8000, 41)), {
            camel[i % 2000:i % 2000 + 30] + str(i): "ok" for i in range(20000)})),
        ("code_diff: 4,900 files, the claim names 600", request(
            "Added `value_3` in " + " ".join("src/m%d.py" % i for i in range(0, 4900, 8))[:7900], {"diff": files})),
        ("floats: 45k random below 1e-5", request("x", {"a": [rng.random() * 1e-5 for _ in range(45000)]})),
        ("floats: 47k random of every exponent", request("x", {"a": [rng.uniform(-1, 1) * 10 ** rng.randint(-12, 25)
                                                                    for _ in range(47000)]})),
        ("floats: every exponent, 4 mantissas, signs", request("x", {"a": (every_exponent + [-v for v in every_exponent])
                                                                   * 18})),
        ("floats: 23k objects of a float and a string", request("x", {"a": [
            {"v": rng.uniform(-1, 1) * 10 ** rng.randint(-12, 25), "s": "1e+16,"} for _ in range(23000)]})),
        ("generic: status objects nested 28 deep, repeated", request("Tests passed", {"runs": [nested] * 900})),
        ("api_call: failures nested in lists of results", request("Sent the emails", {
            "response_status": 200, "request": {"to": "a@b.example"},
            "response_body": {"results": [{"data": {"items": [{"status": "sent", "ok": True}] * 3}}] * 7000
                              + [{"data": {"items": [{"status": "bounced", "error": "mailbox full"}]}}]}})),
        ("generic: 1 MiB of prose", request("The payment was sent to the supplier", {"log": repeat(prose)})),
        ("api_call: a text body of 1 MiB of prose", request("Sent the payment", {
            "response_status": 200, "request": "POST /pay", "response_body": repeat(prose)})),
        ("generic: 8 KiB prose claim, 38k prose values", request((prose * 80)[:8000], {
            "k%d" % i: prose[i % 50:i % 50 + 12] for i in range(38000)})),
    ]]


def answer_and_codes(path, body):
    """(what the service answers a POST body with, as answer() says it; the reason codes, None for a refusal)."""
    status, obj = SERVICE.post(path, body, {})
    if path == "/mcp":
        result = obj["result"]
        content = result.get("structuredContent") or {}
        return ("isError" if result["isError"] else content["aar_verdict"]), content.get("reason_codes")
    if status != 200:
        return obj["error"], None
    return obj["aar_verdict"], obj["reason_codes"]


def answers_in_a_child(expression, timeout=120):
    """The JSON value of an expression over this module (as t) computed in a child process. Inputs that used to
    freeze a service are answered there: the timeout is a hang guard, never a measure (the bench measures time)."""
    code = "import json, test_verify_action as t; print(json.dumps(%s))" % expression
    done = subprocess.run([PY, "-c", code], cwd=HERE, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode:
        raise AssertionError(done.stderr.decode("utf-8", "replace")[-2000:])
    return json.loads(done.stdout)


def answer(path, body):
    """What the service answers a POST body with: the verdict, the JSON-RPC outcome, or the refusal's code."""
    status, obj = SERVICE.post(path, body, {})
    if path == "/mcp":
        return "isError" if obj["result"]["isError"] else obj["result"]["structuredContent"]["aar_verdict"]
    return obj["aar_verdict"] if status == 200 else obj["error"]


def parse_judge_sign(body):
    """What the service does with a /verify body: strict parse, validation, rules, receipt (or a refusal)."""
    return answer("/verify", body)


# ---------------------------------------------------------------------------------------------------
# Canonical JSON, decision rule, request validation, strict JSON
# ---------------------------------------------------------------------------------------------------
class CanonicalJson(unittest.TestCase):
    VECTORS = {  # RFC 8785 appendix B: IEEE-754 bits -> canonical text
        "0000000000000000": "0", "8000000000000000": "0", "0000000000000001": "5e-324",
        "8000000000000001": "-5e-324", "7fefffffffffffff": "1.7976931348623157e+308",
        "ffefffffffffffff": "-1.7976931348623157e+308", "4340000000000000": "9007199254740992",
        "c340000000000000": "-9007199254740992", "4430000000000000": "295147905179352830000",
        "44b52d02c7e14af5": "9.999999999999997e+22", "44b52d02c7e14af6": "1e+23",
        "44b52d02c7e14af7": "1.0000000000000001e+23", "444b1ae4d6e2ef4e": "999999999999999700000",
        "444b1ae4d6e2ef4f": "999999999999999900000", "444b1ae4d6e2ef50": "1e+21",
        "3eb0c6f7a0b5ed8c": "9.999999999999997e-7", "3eb0c6f7a0b5ed8d": "0.000001",
        "41b3de4355555553": "333333333.3333332", "41b3de4355555554": "333333333.33333325",
        "41b3de4355555555": "333333333.3333333", "41b3de4355555556": "333333333.3333334",
        "41b3de4355555557": "333333333.33333343", "becbf647612f3696": "-0.0000033333333333333333",
        "43143ff3c1cb0959": "1424953923781206.2"}

    def test_rfc8785_numbers(self):
        for bits, want in self.VECTORS.items():
            f = struct.unpack(">d", bytes.fromhex(bits))[0]
            self.assertEqual(canonical_json(f).decode(), want, bits)
            self.assertEqual(ref_number(f), want, bits)

    def test_key_order_is_utf16_and_strings_minimal(self):
        obj = {"\u20ac": "Euro", "\r": "CR", "\ufb33": "Hebrew", "1": "One", "\U0001f600": "Emoji", "\u0080": "Ctl",
               "\u00f6": "o", "s": "a\"\\\b\f\n\r\t\x01\x1f\x7f\u2028/"}
        got = canonical_json(obj).decode("utf-8")
        self.assertEqual([k for k in json.loads(got)], ["\r", "1", "s", "\u0080", "\u00f6", "\u20ac",
                                                        "\U0001f600", "\ufb33"])
        self.assertIn('"a\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\u2028/"', got)
        self.assertEqual(got, ref_jcs(obj))

    def test_nested_and_literals(self):
        obj = {"b": [1, 2.5, None, True, False, {"z": 1, "a": -0.0}], "a": 1e-7, "c": 10 ** 21, "d": 2 ** 60}
        self.assertEqual(canonical_json(obj), b'{"a":1e-7,"b":[1,2.5,null,true,false,{"a":0,"z":1}],'
                                                 b'"c":1e+21,"d":1152921504606847000}')
        self.assertEqual(canonical_json(obj).decode(), ref_jcs(obj))
        self.assertRaises(ValueError, canonical_json, float("nan"))


    def test_large_values_are_exact_on_the_fast_path(self):
        # from 4 KiB up canonical_json takes json.dumps (in C) when that is exact, else the ECMAScript path
        big = {"k%d" % i: [i, "s\u00e9\U0001f600\u2028", None, True, {"b": "x", "a": -i}] for i in range(300)}
        for v in (big, dict(big, f=5.0, h=1e-7), dict(big, g=2 ** 60), dict(big, n=2 ** 53 - 1), dict(big, e=1e21),
                  dict(big, **{"\ue000": 1, "\U0001f600": 2}), dict(big, s="1.5e300 9999999999999999")):
            self.assertGreater(len(canonical_json(v)), 4096)
            self.assertEqual(canonical_json(v).decode("utf-8"), ref_jcs(v))
        req = {"claim": "x", "evidence": big, "caller_context": {"a": 1.5}, "kind": "generic"}
        rec = SERVICE.verify(va.validate_request(req))["receipt"]
        self.assertEqual((rec["evidence_manifest_hash"], rec["request_hash"]), (ref_sha(big), ref_sha(req)))


class AsItWas(object):
    """The api_call target reading before issue 11's C passes: a Python call for each token, URL and member. Kept
    here only as the reference the differential tests compare the service with."""
    URLS = re.compile(r"(?i)\bhttps?://([^/?#\s\"'<>]*)(/[^?#\s\"'<>]*)?")
    EMAIL_LOCAL = {ord(c): "a" for c in "._+-%"}

    @staticmethod
    def email(tok):
        local, at, domain = tok.partition("@")
        ok = (
            at and local and local.translate(AsItWas.EMAIL_LOCAL).isalnum()
            and "." in domain.strip(".") and not domain.startswith(".") and not domain.endswith(".")
            and domain.replace(".", "a").replace("-", "a").isalnum()
        )
        return tok.lower() if ok else None

    @staticmethod
    def host_path(netloc, path):
        host = netloc.rpartition("@")[2]
        host = host[1:host.find("]")] if host[:1] == "[" else host.partition(":")[0]
        return (host.lower(), path.rstrip("/")) if host else None

    @staticmethod
    def url(tok):
        match = AsItWas.URLS.match(tok)
        return match and AsItWas.host_path(match.group(1), match.group(2) or "") or None

    @staticmethod
    def emails(toks):
        return set(filter(None, map(AsItWas.email, toks)))

    @staticmethod
    def claim_ids(low):
        id_noun = lambda t: (t.isalpha() and len(t) >= 3 and t not in va._NOT_NOUN
                             and not (t.endswith("ed") and len(t) > 4))
        ids = set()
        for i, t in enumerate(low):
            nxt = low[i + 1] if i + 1 < len(low) else ""
            if (t.startswith("#") and va._digits(t[1:]) and len(t) <= 19) or (
                    t.startswith(("id=", "id:")) and va._digits(t[3:]) and len(t) <= 21):
                ids.add(("", str(int(t[1 if t[0] == "#" else 3:]))))
            elif va._digits(nxt) and len(nxt) <= 18 and (t == "id" or t.endswith("_id") or id_noun(t)):
                noun = t[:-3] if t.endswith("_id") else "" if t == "id" else t
                ids.add((va._singular(noun), str(int(nxt))))
        return ids

    @staticmethod
    def wanted(claim):
        toks, low = va._words(claim)
        return AsItWas.emails(toks), set(filter(None, map(AsItWas.url, toks))), AsItWas.claim_ids(low)

    @staticmethod
    def request_targets(request, wanted):
        (want_emails, want_urls, want_ids), whole = map(bool, wanted), isinstance(request, str)
        emails, urls, ids = set(), {}, set()
        members = [("", request)] if whole else va._MEMBER.findall(json.dumps(request, ensure_ascii=False))
        for key, text in members:
            low, text = key.lower(), text.strip('"')
            if want_emails and (whole or low in va._EMAIL_KEYS):
                emails.update(AsItWas.emails(va._tokens(text)))
            if (want_urls or want_ids) and (whole or low in va._URL_KEYS):
                for host, path in filter(None, (AsItWas.host_path(*m) for m in set(AsItWas.URLS.findall(text)))):
                    urls.setdefault(host, set()).add(path)
            if (low == "id" or low.endswith("_id") or key.endswith("Id")) and va._digits(text) and len(text) <= 18:
                ids.add((va._singular(low[:-2].rstrip("_")), str(int(text))))
        for path in (path for paths in urls.values() for path in paths):
            segments = path.split("/")
            ids.update((va._singular(a.lower()), b) for a, b in zip(segments, segments[1:])
                       if va._digits(b) and len(b) <= 18)
        return emails, urls, ids | (AsItWas.claim_ids([t.lower() for t in va._tokens(request)]) if whole else set())

    @staticmethod
    def target_code(wanted, targets):
        (claimed_emails, claimed_urls, claimed_ids), (emails, urls, ids) = wanted, targets
        results = set()
        for hit, others in ([(e in emails, emails) for e in claimed_emails]
                            + [(p in urls.get(h, ()) or not p and h in urls, urls) for h, p in claimed_urls]
                            + [(n in same, same) for noun, n in claimed_ids
                               for same in [{m for k, m in ids if not (k and noun) or k == noun}]]):
            results.add("target_matches" if hit else "target_mismatch" if others else "target_not_in_request")
        worst = ("target_mismatch", "target_not_in_request", "target_matches")
        return next((c for c in worst if c in results), None)


def worst_target(wanted, targets):
    """The target code of api_call's checks for claimed (emails, URLs, ids) against a request's targets."""
    claim = va.ApiClaim(None, *wanted)
    results = va._target_results(claim, *targets)
    codes = [("mismatch", "target_mismatch"), ("absent", "target_not_in_request"), ("match", "target_matches")]
    return next((code for result, code in codes if result in results), None)


class Issue11Speed(unittest.TestCase):
    """The rules behind every request's bounded time (issue 11); the bench measures the time itself."""

    def test_floats_in_ecmascript_layout_at_every_size(self):
        # json.dumps text is rewritten to JCS by literal substitutions outside strings: 0.00001, 1e-7, 1e+21,
        # 10000000000000000, 12, -0 ... against an independent implementation, with strings that look like numbers
        rng = __import__("random").Random(11)
        values = [1e-5, 1.5e-5, -2.25e-6, 1e-6, 1e-7, 1.5e-9, 1e16, 1.5e16, -1.2345678901234567e20, 1e21, 12.0, -0.0,
                  0.1, 5e-324, 1.7976931348623157e308, 2.0 ** 60, 123456789012345.0, 9007199254740993.0,
                  1.2345678901234567e16, -9.999999999999999e20, 1e20, -1e16, 5e-06, -1e-05, 9.999999999999999e-06,
                  1.5e-08, -1e-09, 1e160, -1.5e160, 1.5e-160, 1e-50, 1.05e-05, 1.0000000000000002e16]
        values += [rng.uniform(-1, 1) * 10 ** rng.randint(-9, 25) for _ in range(3000)]
        values += [float(rng.randint(1, 99)) * 10 ** rng.randint(14, 22) for _ in range(500)]
        strings = ['1.0', 'e-05 1e+16 -0.0', 'a"b', 'c\\d', '\\"', '\\', '"', "1.5e-05,", "[12.0]"]
        doc = {"n": values, "s": strings * 20, "m": [{"k%d" % i: v, "t": strings[i % len(strings)]}
                                                     for i, v in enumerate(values[:500])]}
        self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc))
        for v in values[:60]:  # each form first in a list, after a key, last in an object, beside strings
            doc = [[v, "1e+16,"], {"a": v}, {"a": ["-0.0]", v]}, [-v, 1.5, v], {"z": "e-05", "y": v}]
            self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc), v)
        for v in values[:40]:  # single numbers take the same layout
            self.assertEqual(canonical_json(v).decode(), ref_number(v), v)

    def test_key_order_is_utf16_only_where_keys_mix(self):
        # json.dumps sorts keys by code point; UTF-16 order differs only where keys mix U+E000-U+FFFF with astral
        # characters, and only then does the exact pure-Python encoder run (values that mix them do not count)
        pad = ["x" * 50] * 100
        for doc in ({"\ue000": 1, "\U0001f600": 2, "pad": pad}, {"s": "\ue000\U0001f600", "\ue001": 1, "pad": pad},
                    {"a": {"\U0001f600\\\"": 1, "\uff01": 2}, "pad": pad}, {"k\":": "\U0001f600", "\ue000": 1, "pad": pad}):
            self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc))

    def test_a_request_is_canonicalised_once_and_hashed_alike(self):
        body = json.dumps({"claim": "status is ok", "evidence": {"a": [1.5, 2.0, {"status": "ok"}] * 2000},
                           "caller_context": {"n": 1e-7}}).encode()
        obj, members = va.strict_parse(body)
        self.assertEqual(members["evidence"], ref_jcs(obj["evidence"]))  # the text the checks made is JCS
        via_post = SERVICE.post("/verify", body, {})[1]["receipt"]
        self.assertEqual((via_post["evidence_manifest_hash"], via_post["request_hash"]),
                         (ref_sha(obj["evidence"]), ref_sha(obj)))

    def test_the_collector_is_paused_per_request_and_restored(self):
        self.assertTrue(gc.isenabled())
        seen = []
        original = va._JUDGES["generic"]
        va._JUDGES["generic"] = lambda claim, ev, ev_json: seen.append(gc.isenabled()) or ([], {})
        try:
            SERVICE.post("/verify", b'{"claim": "x", "evidence": {}}', {})
        finally:
            va._JUDGES["generic"] = original
        self.assertEqual((seen, gc.isenabled()), ([False], True))

    def test_diff_work_is_bounded(self):
        headers = "--- a\n" * (va.BOUNDS["diff_headers"] + 1)  # lines that carry structure, past the bound
        files = "".join("diff --git a/f%d b/f%d\n" % (i, i) for i in range(va.BOUNDS["diff_files"] + 1))
        for diff in (headers, files):
            self.assertRaises(va.EvidenceTooLarge, va.parse_diff, diff)
            self.assertEqual(judge("Updated f1", {"diff": diff}), (U, ["evidence_too_large"]))
        self.assertEqual(va.parse_diff("x\n" * 100000), ([], []))  # no structure: nothing to read, no bound

    def test_a_hunk_ends_where_its_counts_run_out(self):
        # '@@ -1 +1 @@' announces one removed and one added line: a third line is not part of it
        files, changed = va.parse_diff("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n+c\n")
        self.assertEqual(([(f["added"], f["removed"]) for f in files], changed), ([(1, 1)], ["-a", "+b"]))
        files, changed = va.parse_diff("--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n\\ No newline\n")
        self.assertEqual(([(f["added"], f["removed"]) for f in files], changed), ([(1, 1)], ["-b", "+B"]))

    def test_hunk_counts_in_the_usual_form_and_any_other(self):
        # '@@ -a,b +c,d' is read by one regex match; any other form as before, leniently (a missing count is 1, a
        # malformed one 0): the hunk takes as many lines either way
        def lenient(header):
            counts = [p[1:].partition(",")[2] or "1" for p in header.split(" ")[1:3]] + ["0", "0"]
            return [int(n) if n.isdigit() and n.isascii() and len(n) < 10 else 0 for n in counts[:2]]
        rng = __import__("random").Random(1)
        atoms = ["-", "+", "1", "0", "12", "9" * 9, "9" * 10, ",", " ", "@@", "x", "\t", "\u0663", ",,"]
        body = "".join("%s%d\n" % (sign, i) for i in range(12) for sign in "-+ ")
        for _ in range(3000):
            usual = "@@ -%d,%d +%d,%d @@" % tuple(rng.randint(0, 12) for _ in range(4)) + rng.choice(["", " f():"])
            header = rng.choice([usual, "@@ -1 +1 @@", "@@ " + "".join(rng.choice(atoms) for _ in range(9))])
            old, new = lenient(header)
            files, changed = va.parse_diff("--- a/x\n+++ b/x\n" + header + "\n" + body)
            lines, fit = body.split("\n")[:-1], 0  # the lines the hunk may take, counted here
            while fit < len(lines) and sum(l[0] in "- " for l in lines[:fit + 1]) <= old and sum(
                    l[0] in "+ " for l in lines[:fit + 1]) <= new:
                fit += 1
            self.assertEqual(changed, [l for l in lines[:fit] if l[0] in "+-"], header)

    def test_a_hunk_takes_the_longest_start_its_counts_allow_of_lines_of_any_kind(self):
        # runs of every kind of hunk line (added, removed, context, blank, a note, a lone \r) under random counts:
        # whether the whole run fits (told by counts of its line starts) or only a start of it does (a binary search
        # over its marks), the hunk takes the longest start that fits, and its + and - lines are the changes
        rng = __import__("random").Random(2)
        kinds = ["+a", "-b", " c", "", "\\ No newline at end of file", "\r", "+d\r", "-e\r"]
        mark = lambda line: (line[:1] or " ").replace("\r", " ")
        for _ in range(3000):
            lines = [rng.choice(kinds) for _ in range(rng.randint(1, 12))]
            old, new = rng.randint(0, 12), rng.randint(0, 12)
            files, changed = va.parse_diff("--- a/x\n+++ b/x\n@@ -1,%d +1,%d @@\n%s\nEND\n" % (old, new, "\n".join(lines)))
            fit = 0  # the lines the hunk may take, counted here one by one
            while fit < len(lines) and sum(mark(l) in "- " for l in lines[:fit + 1]) <= old and sum(
                    mark(l) in "+ " for l in lines[:fit + 1]) <= new:
                fit += 1
            taken = [l for l in lines[:fit] if l[:1] in ("+", "-")]
            self.assertEqual(changed, taken, (old, new, lines))
            counted = (files[0]["added"], files[0]["removed"])
            self.assertEqual(counted, (sum(l[:1] == "+" for l in taken), sum(l[:1] == "-" for l in taken)))

    def test_every_adversarial_body_is_answered(self):
        # exactly as ADVERSARIAL_ANSWERS says, every body: a crashing rule (unsafe_to_verify, verifier_error) would
        # show
        bodies = adversarial_bodies()
        self.assertGreaterEqual(len(bodies), 20)
        for label, path, body in bodies:
            self.assertLessEqual(len(body), va.MAX_BODY, label)
            got = answer_and_codes(path, body)
            self.assertNotIn("verifier_error", got[1] or [], label)
            self.assertEqual(got, ADVERSARIAL_ANSWERS[label], label)
        self.assertEqual(sorted(label for label, _, _ in bodies), sorted(ADVERSARIAL_ANSWERS))

    def test_generic_value_codes_agree_with_each_claimed_value_against_each_found(self):
        # the found values are read once and each claimed value is looked up; before, each claimed value was compared
        # with every found one (1,300 stated values x 100 found: 0.37 s). Same codes on random sets of both.
        def as_it_was(claimed, found):
            same = set()
            for val, num, meaning in ((val, va._number(val), va._MEANINGS.get(val)) for val in claimed):
                typed = [v for v in found if (va._number(v) is None) == (num is None)]
                same |= {any(v == val or meaning and va._MEANINGS.get(v) == meaning
                             or num is not None and va._es_number(va._number(v)) == va._es_number(num)
                             for v in typed)} if typed else set()
            return None if not same else "explicit_value_conflict" if False in same else "explicit_value_match"
        rng = __import__("random").Random(1300)
        values = ["1", "1.0", "1,000", "1000", "10", "2.50", "2.5", "007", "7", "on", "true", "enabled", "off", "false",
                  "passed", "success", "failed", "error", "yes", "no", "x", "", "1,00", "0.1", ".5"]
        for _ in range(5000):
            claimed = set(rng.sample(values, rng.randint(0, 4)))
            found = [rng.choice(values) for _ in range(rng.randint(0, 5))]
            self.assertEqual(va._value_code(claimed, found), as_it_was(claimed, found), (claimed, found))

    def test_generic_values_text_drops_exactly_the_keys(self):
        # keys (with their ':') go, every other string stays: the same tokens, in order, as a reader that walks the
        # text a character at a time, on documents full of quotes, backslashes and colons. Before, where a string
        # started with ':', a pattern that paired escapes itself took '",":' for a key, and its tries from every
        # quote were quadratic (32 KB of escaped quotes: 28 s).
        def reference(text):
            out, i = [], 0
            while i < len(text):
                if text[i] != '"':
                    out.append(text[i])
                    i += 1
                    continue
                j = i + 1
                while text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                is_key = text[j + 1:j + 2] == ":"
                out.append(" " if is_key else text[i:j + 1] + " ")
                i = j + 2 if is_key else j + 1
            return "".join(out).replace(",", ", ")
        rng = __import__("random").Random(7)
        bits = ["a", ":", '"', "\\", '":', '\\"', ",", "{", "}", "[", " ", "x:y", "\n", "\u00e9", "\x01", '",":']
        word = lambda: "".join(rng.choice(bits) for _ in range(rng.randint(0, 4)))

        def doc(depth=0):
            roll = rng.random()
            if depth > 3 or roll < 0.3:
                return rng.choice([word(), 1, None, True, 2.5])
            if roll < 0.5:
                return [doc(depth + 1) for _ in range(rng.randint(0, 3))]
            return {word(): doc(depth + 1) for _ in range(rng.randint(0, 4))}
        for _ in range(3000):
            text = canonical_json(doc()).decode("utf-8").lower()
            self.assertEqual(va._raw_tokens(va._values_text(text)), va._raw_tokens(reference(text)), text)
        # the case the old pattern misread: the value "a" kept whole, the key ':k' gone, the value ':v' kept
        self.assertEqual(va._raw_tokens(va._values_text('{"x":"a",":k":":v"}')), ["a", ",", ":v"])
        self.assertEqual(va._values_text('{"s":":\\"\\""}'), '{ ":\\"\\"" }')

    def test_path_ids_are_found_as_the_unanchored_pattern_found_them(self):
        # a segment is tried only where one starts; the pattern tried it at every character, and a segment with no
        # '/' after it took time quadratic in its length (a 32 KB path: 9.5 s). Same pairs on random paths.
        unanchored = re.compile(r"([^/\n]*)/(?=([0-9]{1,18})(?:[/\n]|\Z))")
        rng = __import__("random").Random(78)
        bits = ["/", "//", "7", "78", "0" * 19, "c", "users", "\n", "x9", "9x", "-", "%2F"]
        for _ in range(20000):
            text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 12)))
            self.assertEqual(va._PATH_ID.findall(text), unanchored.findall(text), text)

    def test_api_call_targets_agree_with_the_token_by_token_reading(self):
        # emails, URLs and ids are found by C passes over the whole request (one pattern, map, set operations);
        # before, by Python calls for each token and URL (70,000 URLs: 170 ms, 66,000 ids: 280 ms). The codes
        # agree with that reading (AsItWas) on random claims and requests, strings and objects.
        rng = __import__("random").Random(1111)
        atoms = ["http://", "HTTPS://", "https://h", "a", "B", "@", ":", "[", "]", "/", "?", "#", " ", '"', "<", "1",
                 ".", "-", "_", "%", "+", ",", "*", "!", "(", "`", "\u00e9", "\u0130", "\u03a3", "\u00b2", "\uff11",
                 "\u2028", "\x85", "0", "7", "id", "Id", "=", "s", "ies", "ed", "\n", "\t"]
        words = ["bob@example.com", "Bob@Example.COM.", "a.b+c@x-y.io", ".a@b.c", "a@.b.c", "a@b.c.", "a@b..c",
                 "a@b_c.d", "a@b", "x@y.z,", "?a@b.cd", ",:x@y.io!", "(e@f.gh)", "*g@h.ij*", "a@b@c.d",
                 "\u00e9@\u00e9.fr", "\u0130@x.io", "a@\u00b2.co", "http://h/users/5", "https://H.example//5/x/0078",
                 "http://u@h:1/a/5/", "http://[::1]:8/p/", "http://[ab", "http://[", "http://@/x", "http://:80/x",
                 "http://a@b@c/d", "http://x.com/a.", "https://h/c/7#f", "id", "id=5", "ID:7", "#12", "#", "#0", "#007",
                 "user", "Users", "user_id", "users_id", "_id", "s_id", "12", "0012", "0", "\uff11\uff12", "9" * 18,
                 "9" * 19, "0" + "9" * 18, "deleted", "customers", "categories", "category", "class", "idx", "the",
                 "\u03c3\u03c3\u03a3", "\u03a3\u03a3\u03a3", "\u0391\u03a3'\u0392", "abc\u00b2", "x.y", "(", "!", "order",
                 "orders", "speed", "seed", "index", "7", "5", "78", "xhttp://h/users/5", "-http://h/users/7",
                 "ftp://h/a", "(http://h/b)", "mailto:bob@example.com"]
        token = lambda: rng.choice(words) if rng.random() < 0.8 else "".join(
            rng.choice(atoms) for _ in range(rng.randint(1, 6)))
        text = lambda n: rng.choice([" ", "  ", ", ", "\n", " (", ") "]).join(token() for _ in range(rng.randint(0, n)))
        keys = ["to", "cc", "Email", "url", "URI", "href", "id", "ID", "user_id", "userId", "orderID", "x", "Users_Id",
                "a__id", "paid", "\u0130d"]

        def request():
            if rng.random() < 0.5:
                return text(12)
            value = lambda: rng.choice([text(4), rng.randint(0, 99), "%05d" % rng.randint(0, 99), [text(2), 5], None,
                                        {"to": text(2)}])
            return {rng.choice(keys): value() for _ in range(rng.randint(0, 5))}
        fixed = ({"bob@example.com"}, {("h", "")}, {("user", "5"), ("", "7"), ("order", "78"), ("categorie", "5"),
                                                    ("category", "12")})
        ascii_text = "".join(map(chr, range(128))) * 2
        for _ in range(3000):  # ASCII text is split by str methods, other text by the pattern
            sample = "".join(rng.sample(ascii_text, rng.randint(0, 40)))
            self.assertEqual(va._raw_tokens(sample), va._TOKEN.findall(sample), sample)
        for _ in range(6000):
            claim, req = text(10), request()
            toks, low = va._words(claim)
            self.assertEqual(va._emails_in(claim), AsItWas.emails(toks), claim)
            for t in toks:
                self.assertEqual((va._email(t), va._url(t)), (AsItWas.email(t), AsItWas.url(t)), t)
            ids = {claimed[:2] for claimed in va._claimed_ids(low)}
            self.assertLessEqual(AsItWas.claim_ids(low) - {("id", n) for _, n in ids}, ids, low)  # lists add ids
            for wanted in (AsItWas.wanted(claim)[:2] + (ids,), (set(), set(), set()), fixed):
                self.assertEqual(worst_target(wanted, va._request_targets(req, wanted)),
                                 AsItWas.target_code(wanted, AsItWas.request_targets(req, wanted)), (claim, req))

    def test_claimed_ids_meet_the_request_ids_without_a_pass_each(self):
        # 700 claimed ids against 20,000 in the request took 6 s (a pass over the request's ids for each claimed one);
        # now a look-up each, with the same outcome as that pass on random ids
        def as_it_was(wanted, ids):
            code = lambda hit, others: "target_matches" if hit else "target_mismatch" if others else "target_not_in_request"
            results = set()
            for noun, n in wanted:
                same = {m for k, m in ids if not (k and noun) or k == noun}
                results.add(code(n in same, same))
            return next((c for c in ("target_mismatch", "target_not_in_request", "target_matches") if c in results), None)
        rng = __import__("random").Random(78)
        pick = lambda: {(rng.choice(["", "user", "order"]), str(rng.randint(1, 4))) for _ in range(rng.randint(0, 4))}
        for _ in range(3000):
            wanted, ids = pick(), pick()
            self.assertEqual(worst_target((set(), set(), wanted), (set(), set(), ids)), as_it_was(wanted, ids))

    def test_api_call_reads_only_the_targets_the_claim_names(self):
        request = " ".join("http://h%d.example/p" % i for i in range(2000)) + " bob@example.com"
        ev = {"request": request, "response_status": 200}
        self.assertEqual(judge("Sent it to bob@example.com", ev), (V, ["status_matches_claim", "target_matches"]))
        self.assertEqual(judge("Sent it to eve@example.com", ev)[1][-1], "target_mismatch")
        # the other 1,999 URLs of a string request are targets the claim does not name
        self.assertEqual(judge("Posted to http://h7.example/p", ev)[1][-2:], ["target_matches", "target_not_claimed"])
        self.assertEqual(judge("Posted to http://h7.example/q", ev)[1][-1], "target_mismatch")


MIXED_KEY_CHARS = ["a", "b", "\u00e9", "\u20ac", "\ud7ff", "\ue000", "\ue001", "\uf8ff", "\uff01", "\uffff",
                   "\U00010000", "\U0001f600", "\U0001f601", "\U0010ffff"]


def mixed_keys_doc(rng, depth=0):
    """A random JSON value whose keys mix ASCII, BMP (private use up to U+FFFF) and astral characters, nested."""
    key = lambda: "".join(rng.choice(MIXED_KEY_CHARS) for _ in range(rng.randint(0, 3)))
    roll = rng.random()
    if depth > 4 or roll < 0.25:
        return rng.choice([1, -2.5, None, True, "v" + key()])
    if roll < 0.45:
        return [mixed_keys_doc(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {key(): mixed_keys_doc(rng, depth + 1) for _ in range(rng.randint(0, 7))}


class Utf16KeyOrder(unittest.TestCase):
    """RFC 8785 sorts keys by UTF-16 code unit, json.dumps by code point: they differ where keys mix U+E000-U+FFFF
    with astral characters. Marked keys (in place, or in a text parsed again) give the exact order, in C."""

    def strict(self, obj, ascii_part=None):
        # strict_parse of a request holding obj as written by json.dumps, and ascii_part with every non-ASCII escaped
        text = json.dumps({"claim": "x", "evidence": {"lit": obj, "esc": "@"}}, ensure_ascii=False)
        raw = text.replace('"@"', json.dumps(ascii_part)).encode("utf-8")
        value, members = va.strict_parse(raw)
        want = json.loads(raw)
        self.assertEqual(json.dumps(value), json.dumps(want))  # the parsed value, its keys in their order, is kept
        self.assertEqual((members["evidence"], members[None]), (ref_jcs(want["evidence"]), ref_jcs(want)))
        return members

    def test_random_documents_against_the_reference(self):
        rng = __import__("random").Random(8785)
        few, many = [[[[]]]] * 100, [{"\ue000": 1, "\U0001f600": [2]}, {"\U0001f600": 1, "\ue000": 2}] * 60
        for _ in range(200):
            doc, other = mixed_keys_doc(rng), mixed_keys_doc(rng)
            self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc))  # from a value: parsed again
            self.strict(doc, other)
            self.strict([doc, few], [other, few])  # few objects among many containers: marked in place
            self.strict([doc, many], [other, many])  # objects to mark are many: the text is marked and parsed again

    def test_each_body_takes_the_cheapest_exact_way(self):
        # values that mix the characters need nothing; a few objects whose keys do are marked in place; where such
        # characters are many, the marked text is parsed again. The pure-Python encoder writes only the receipt.
        ways, real = [], (va._in_utf16_order, va._marked_text, va._jcs)
        jcs_calls = []

        def in_place(objects, write):
            ways.append(("in place", len(va._holding_astral_keys(objects))))
            return real[0](objects, write)

        def marked_text(data):
            ways.append(("twin", None))
            return real[1](data)

        def jcs(v):
            jcs_calls.append(1)
            return real[2](v)
        va._in_utf16_order, va._marked_text, va._jcs = in_place, marked_text, jcs
        try:
            bodies = {label: (path, body) for label, path, body in adversarial_bodies()}
            seen = {}
            for label in ("U+E000 and astral in a value", "70k two-key objects, such chars in the claim",
                          "U+E000 and astral in keys", "such keys at depth 31", "50k small objects of such keys",
                          "30k such objects, all escaped", "depth-29 nests and 20k objects of such keys"):
                del ways[:]
                self.assertEqual(answer(*bodies[label]), I)
                seen[label] = list(ways)
        finally:
            va._in_utf16_order, va._marked_text, va._jcs = real
        self.assertEqual(list(seen.values()), [[], [], [("in place", 1)], [("in place", 1)], [("twin", None)],
                                               [("twin", None)], [("in place", 20000)]])
        self.assertLess(len(jcs_calls), 300)  # the receipts' few fields; never the 1 MiB of values

    def test_members_beside_the_evidence_are_written_together(self):
        calls, real = [], va._canonical_text
        va._canonical_text = lambda *args: calls.append(1) or real(*args)
        try:
            body = json.dumps(dict({"claim": "x", "evidence": {"a": 1}}, **{"k%d" % i: i for i in range(5000)}))
            self.assertEqual(parse_judge_sign(body.encode()), "unknown_field")
        finally:
            va._canonical_text = real
        self.assertLessEqual(len(calls), 4)  # before: one json.dumps a member, 5,002

    def test_lone_surrogates_and_duplicates_are_still_refused(self):
        many = ',"m":[' + ",".join(['{"\\ue000":1,"\\ud83d\\ude00":2}'] * 50) + "]"
        for lone in ('"\\ud800"', '"\\udbff\U0001f600"', '"\U0001f600\\udfff"', '"\\udbff\\udbff\\udfff"'):
            for tail in ("", many):
                body = '{"claim": "x", "evidence": {"\ue000": 1, "\U0001f600": %s%s}}' % (lone, tail)
                self.assertEqual(parse_judge_sign(body.encode()), "invalid_json", (lone, tail))
        for body, want in (('{"a\\u003a": 1, "a:": 2}', "duplicate"), ('{"\\u003A": 1, "x": {"y": 1, "y": 2}}', "duplicate"),
                           ('{"\\\\u003a": 1, "\\u003a": 2}', None), ('{"\ue000": 1, "\U0001f600": 2, "\ue000": 3}', "duplicate")):
            try:
                va.strict_loads(body.encode())
                got = None
            except va.RequestError as e:
                got = e.message.split(" ")[0]
            self.assertEqual(got, want, body)


class ShortcutsAgainstReferences(unittest.TestCase):
    """Each C-speed shortcut of the canonical text and the strict parser against a plain reference, on random and
    edge inputs: the proofs of equivalence live here."""

    def test_floats_at_every_exponent(self):
        # repr and ECMAScript differ at exponents -9 to -5 and +16 to +20; e+16 must never be read in e+160
        values = []
        for exponent in range(-327, 309):
            for mantissa in ("1", "1.5", "2.25", "9.999999999999999", "1.2345678901234567", "5"):
                value = float("%se%d" % (mantissa, exponent))
                if value and value != float("inf"):
                    values += [value, -value]
        values += [12.0, -0.0, 0.0, 100.0, -1e16, 1e21, 123456789012345.0, 0.1, 2.0 ** 60]
        doc = {"n": values, "m": [{"k": v, "s": repr(v)} for v in values[::7]], "s": [repr(v) + "," for v in values[::5]]}
        self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc))
        exponents = list(range(-12, -4)) + list(range(16, 25)) + [160, 168, 200, 205]  # written with an exponent
        whole = [float("%s1e%d" % (sign, e)) for e in exponents for sign in ("", "-")]
        for doc in (whole, [{"k": v} for v in whole] + [[-v] for v in whole]):  # no point anywhere in the text
            self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc))
        for v in values[::11]:
            self.assertEqual(va._es_number(v), ref_number(v), v)

    def test_a_repeated_number_is_laid_out_once_and_replaced_only_where_it_is_whole(self):
        # a number repeated a thousand times is replaced as a literal: never inside a neighbour that shares its text
        # (1e-05 in 1.1e-05, 1.5e+16 in 1.5e+160), at each end (, ] }), signed or not
        for v, neighbours in ((1e-05, [1.1e-05, 2.1e-05, 1e-50, 1.5e-05]), (1.5e-06, [2.5e-06, 1.5e-60, 1.25e-06]),
                              (1.5e16, [1.5e160, 2.5e16, 1.25e16, 1e16]), (1e16, [1e160, 1.1e16]),
                              (1.2345678901234567e20, [1.2345678901234567e200, 2.2345678901234567e20])):
            doc = [v] * 1500 + neighbours * 300 + [{"k": v, "n": -v}] * 1000 + [[v]] * 1000 + [-v] * 1200
            self.assertEqual(canonical_json(doc).decode("utf-8"), ref_jcs(doc), v)

    def test_depth_is_the_highest_running_count(self):
        rng = __import__("random").Random(27)

        def tree(levels):
            if levels == 0 or rng.random() < 0.2:
                return "[]"
            kids = rng.choice([1, 1, 1, 1, 2, 3])  # 1.5 on average, and one in five ends: trees stay small
            return "[" + "".join(tree(levels - 1) for _ in range(kids)) + "]"
        shapes = [tree(rng.randint(1, 40)) for _ in range(300)]
        shapes += ["[" * n + "]" * n for n in range(1, 40)] + ["[[]]" * 5000, "[" + "[]" * 9000 + "]",
                                                               ("[" * 28 + "]" * 28) * 300, "[[[[[]]]]]" * 2000]
        for brackets in shapes:
            running = deepest = 0
            for c in brackets:
                running += 1 if c == "[" else -1
                deepest = max(deepest, running)
            self.assertEqual(va._depth(brackets.encode()), deepest, brackets[:60])

    def test_duplicate_keys_as_an_object_pairs_hook_finds_them(self):
        rng = __import__("random").Random(25)
        keys = ["a", "a:", ":", "a\\u003a", "a\\u003A", "\\\\u003a", "\\\\", "\\\"", "b", "\\u0062"]
        values = ['":"', '"\\u003a"', "1", '"a:b"', '"\\\\u003a"', "[]", "{}"]

        def doc(depth):
            if depth > 3 or rng.random() < 0.3:
                return rng.choice(values)
            if rng.random() < 0.3:
                return "[" + ",".join(doc(depth + 1) for _ in range(rng.randint(0, 3))) + "]"
            members = ['"%s" : %s' % (rng.choice(keys), doc(depth + 1)) for _ in range(rng.randint(0, 4))]
            return "{" + ",".join(members) + "}"

        def duplicates(pairs):
            found.append(len(pairs) != len(dict(pairs)))
            return dict(pairs)
        for _ in range(3000):
            text, found = doc(0), []
            json.loads(text, object_pairs_hook=duplicates)
            try:
                va.strict_loads(text.encode())
                refused = False
            except va.RequestError as e:
                refused = e.message == "duplicate object key"
            self.assertEqual(refused, any(found), text)

    def test_a_key_holding_an_astral_character_is_found_however_it_is_written(self):
        # the search that decides whether key order needs the marked twin: never a miss; a false alarm only where an
        # escaped backslash stands before text that looks like an escape (it costs a parse, never a wrong answer)
        rng = __import__("random").Random(16)
        chars = ["a", ":", "\\\"", "\\\\", "\\\\ud83d", "\U0001f600", "\\ud83d\\ude00", "\ue000", "\\ue000", "\\u003a",
                 "\uffff", "\U0010ffff", "\\udbff\\udfff"]

        def string():
            return '"' + "".join(rng.choice(chars) for _ in range(rng.randint(0, 4))) + '"'

        def doc(depth):
            if depth > 2 or rng.random() < 0.3:
                return string()
            spaces = rng.choice(["", " ", "\n\t "])
            members = [string() + spaces + ":" + doc(depth + 1) for _ in range(rng.randint(0, 3))]
            return "{" + ",".join(members) + "}"

        def keys(pairs):
            seen.extend(key for key, _ in pairs)
            repeated.append(len(pairs) != len(dict(pairs)))
            return dict(pairs)
        for _ in range(4000):
            text, seen, repeated = doc(0), [], []
            value = json.loads(text, object_pairs_hook=keys)
            astral = any(max(key, default="\0") > "\uffff" for key in seen)
            found = va._astral_in_key(text.encode("utf-8", "surrogatepass"))
            self.assertEqual(found, astral or found and "\\\\" in text, text)
            try:
                ref_jcs(value).encode("utf-8")
            except UnicodeEncodeError:
                continue  # a lone surrogate: refused (StrictJson tests it)
            if not any(repeated):  # anything else is strict JSON, and its canonical text is exact
                self.assertEqual(va.strict_parse(text.encode("utf-8"))[1][None], ref_jcs(value), text)


def signals_of(*codes):
    """The signals of reason codes, each once, with their effects."""
    return [va.Signal(code, va.REASONS[code].effect, 1) for code in codes]


class Decision(unittest.TestCase):
    def test_fixed_rule_and_confidence(self):
        def d(signals):
            verdict = va.decide(signals)
            return verdict, va.confidence(verdict, signals)
        entities = lambda n: [va.Signal("entities_match", "positive", n)]
        self.assertEqual(d(signals_of("path_in_diff", "action_matches_lines")), ("verified", 0.6))
        self.assertEqual(d(entities(4)), ("verified", 0.8))
        self.assertEqual(d(entities(9)), ("verified", 0.95))
        self.assertEqual(d(signals_of("path_in_diff")), ("insufficient_evidence", 0.5))
        self.assertEqual(d(signals_of("path_in_diff", "action_matches_lines", "unnamed_files_changed")),
                         ("insufficient_evidence", 0.5))
        self.assertEqual(d(signals_of("path_in_diff", "path_not_in_diff")), ("contradicted", 0.9))
        self.assertEqual(d(signals_of("row_delta_mismatch", "affected_rows_zero")), ("contradicted", 0.6))
        self.assertEqual(d([va.Signal("row_delta_mismatch", "negative", 9)]), ("contradicted", 0.9))
        self.assertEqual(d(signals_of("row_delta_mismatch", "affected_rows_zero", "count_matches")),
                         ("insufficient_evidence", 0.5))
        self.assertEqual(d(signals_of("path_not_in_diff", "evidence_invalid")), ("unsafe_to_verify", 0.0))
        self.assertEqual(d([]), ("insufficient_evidence", 0.5))

    def test_vocabulary_is_closed_and_documented(self):
        rules = va.rules_document()["reason_codes"]
        self.assertEqual(set(rules), set(va.REASONS))
        for code, (kind, effect, meaning, summary) in va.REASONS.items():
            self.assertRegex(code, r"^[a-z][a-z0-9_]*$")
            self.assertTrue(kind == "any" or set(kind.split(", ")) <= set(va.KINDS), (code, kind))
            self.assertIn(effect, va.EFFECTS + ("none",))
            self.assertTrue(meaning.endswith("."), code)
            self.assertEqual(rules[code], {"kind": kind, "effect": effect, "meaning": meaning, "summary": summary})
            self.assertTrue(summary.endswith(".") and len(summary) < len(meaning) + 1 and "(" not in summary, code)


class StrictJson(unittest.TestCase):
    def refused(self, raw):
        with self.assertRaises(va.RequestError) as cm:
            va.strict_loads(raw)
        self.assertEqual(cm.exception.code, "invalid_json")
        return cm.exception.message

    def test_refusals(self):
        for raw in (b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}', b'{"a": 1e400}', b'{"a": -1e999}',
                    b'{"a": 1, "a": 2}', b'{"a": "\\ud800"}', b'{"\\udc00": 1}', b'"\xed\xa0\x80"', b"\xff",
                    b"\xef\xbb\xbf{}", b'{"a": 1', b"", b'{"a": 1}x', b"[" * 100000 + b"]" * 100000,
                    ("1" * 400).encode()):
            self.refused(raw)

    def test_depth_counts_outermost_as_one(self):
        ok = "[" * 32 + "]" * 32
        self.assertEqual(va.strict_loads(ok.encode()), json.loads(ok))
        self.refused(("[" * 33 + "]" * 33).encode())
        self.refused(('{"a":' * 33 + "1" + "}" * 33).encode())
        mixed = "[{\"a\":" * 16 + "1" + "}]" * 16  # 32 levels
        self.assertIsNotNone(va.strict_loads(mixed.encode()))
        self.refused(("[" + mixed + "]").encode())
        self.assertEqual(va.strict_loads(('["' + "[" * 100 + '"]').encode()), ["[" * 100])

    def test_depth_of_random_shapes_near_the_limit(self):
        # the check adds up fewer steps (leaves dropped, runs of eight merged): shapes of 28 to 36 levels, with
        # siblings, runs of every length, strings holding brackets, against a depth counted here
        rng = __import__("random").Random(32)

        def shape(levels):  # (JSON text, its depth) of a random value at most `levels` deep, a few siblings a level
            if levels == 0 or rng.random() < 0.05:
                text = rng.choice(['1', '"]["', '"\\\\"', '"\\"[{"', "[]", "{}"])
                return text, int(text in ("[]", "{}"))
            kids = [shape(levels - 1)] + [shape(min(levels - 1, rng.randint(0, 3))) for _ in range(rng.randint(0, 2))]
            rng.shuffle(kids)
            if rng.random() < 0.6:
                return "[%s]" % ",".join(text for text, _ in kids), 1 + max(depth for _, depth in kids)
            members = ",".join('"k%d":%s' % (i, text) for i, (text, _) in enumerate(kids))
            return "{%s}" % members, 1 + max(depth for _, depth in kids)
        for _ in range(1000):
            text, depth = shape(rng.randint(28, 36))
            if depth > 32:
                self.refused(text.encode())
            else:
                self.assertEqual(va.strict_loads(text.encode()), json.loads(text))

    def test_accepts_valid_pairs_and_numbers(self):
        self.assertEqual(va.strict_loads('{"a": "\\ud83d\\ude00", "b": 1.5e300, "c": -0}'.encode()),
                         {"a": "\U0001f600", "b": 1.5e300, "c": 0})
        self.assertEqual(va.strict_loads(b"[9007199254740991, -9007199254740991, 1e300]"), [2 ** 53 - 1, 1 - 2 ** 53, 1e300])
        self.assertEqual(va.strict_loads(b'{"a": ":", "b": "\\u003a"}'), {"a": ":", "b": ":"})  # colons in strings

    def test_4_integers_beyond_2_53_are_refused(self):
        # I-JSON: as doubles 10000000000000001 and 10000000000000000 would hash alike in a receipt
        for raw in (b"9007199254740992", b"-9007199254740992", b'{"amount_cents": 10000000000000001}',
                    b'{"a": [1, {"account": 12345678901234567}]}', ("9" * 300).encode(), ("1" * 5000).encode()):
            self.assertIn("2^53", self.refused(raw))
        self.assertEqual(va.strict_loads(b'{"s": "12345678901234567", "f": 12345678901234567.0}'),
                         {"s": "12345678901234567", "f": 12345678901234567.0})  # strings and floats are not integers

    def test_duplicate_keys_at_any_depth(self):
        for raw in (b'{"a": 1, "a": 1}', b'{"x": [{"b": 1, "c": 2, "b": 3}]}', b'{"a\\u003a": 1, "a:": 2}',
                    b'{"k": "\\u00e9", "k": 1}'):
            self.assertIn("duplicate", self.refused(raw))


class Validation(unittest.TestCase):
    def code(self, obj):
        with self.assertRaises(va.RequestError) as cm:
            va.validate_request(obj)
        return cm.exception.code

    def test_every_refusal(self):
        ev = {"diff": ""}
        cases = [([], "invalid_request"), ({"claim": "x", "evidence": ev, "extra": 1}, "unknown_field"),
                 ({"evidence": ev}, "invalid_claim"), ({"claim": "", "evidence": ev}, "invalid_claim"),
                 ({"claim": "  \n", "evidence": ev}, "invalid_claim"), ({"claim": 5, "evidence": ev}, "invalid_claim"),
                 ({"claim": "x" * 8193, "evidence": ev}, "claim_too_long"), ({"claim": "x"}, "invalid_evidence"),
                 ({"claim": "x", "evidence": "{\"a\":1}"}, "invalid_evidence"),
                 ({"claim": "x", "evidence": ev, "kind": "sql"}, "unknown_kind"),
                 ({"claim": "x", "evidence": ev, "kind": 3}, "unknown_kind"),
                 ({"claim": "x", "evidence": ev, "context": 1}, "invalid_context"),
                 ({"claim": "x", "evidence": ev, "context": "c" * 8193}, "context_too_long"),
                 ({"claim": "x", "evidence": ev, "caller_context": []}, "invalid_caller_context"),
                 ({"claim": "x", "evidence": ev, "caller_context": {str(i): 1 for i in range(9)}}, "invalid_caller_context"),
                 ({"claim": "x", "evidence": ev, "caller_context": {"k" * 65: 1}}, "invalid_caller_context"),
                 ({"claim": "x", "evidence": ev, "caller_context": {"k": "v" * 65}}, "invalid_caller_context"),
                 ({"claim": "x", "evidence": ev, "caller_context": {"k": [1]}}, "invalid_caller_context"),
                 ({"claim": "x", "evidence": ev, "caller_context": {"": 1}}, "invalid_caller_context")]
        for obj, code in cases:
            self.assertEqual(self.code(obj), code, obj if len(str(obj)) < 200 else code)

    def test_limits_are_inclusive_and_count_code_points(self):
        ok = {"claim": "\U0001f600" * 8192, "evidence": {}, "kind": "GENERIC", "context": "c" * 8192,
              "caller_context": dict({"k%d" % i: None for i in range(5)}, a="v" * 64, b=1.5, c=True)}
        self.assertIs(va.validate_request(ok), ok)


# ---------------------------------------------------------------------------------------------------
# Rules: labelled cases per kind; every reason code covered
# ---------------------------------------------------------------------------------------------------
V, C, I, U = "verified", "contradicted", "insufficient_evidence", "unsafe_to_verify"
ADVERSARIAL_ANSWERS = {  # label -> (what the service answers: a verdict, an error code or isError; its reason codes)
    "sql: 'id IN (' x 9300, no ')'": (I, ['sql_kind_matches', 'sql_table_mismatch', 'where_not_plain']),
    'api_call: 600 claimed x 70k request URLs': (C, ['status_matches_claim', 'target_mismatch']),
    'api_call: 600 claimed x 55k URLs in a url list': (C, ['status_matches_claim', 'target_mismatch']),
    'generic: 32 stated keys x 60k members': (C, ['explicit_value_conflict']),
    'depth-29 nests': (I, ['no_signal']),
    'runs of 299 digits': ('invalid_json', None),
    'runs of 15 digits': (I, ['no_signal']),
    '120k small objects': (I, ['no_signal']),
    '200k short strings': (I, ['no_signal']),
    'code_diff: 1,200 files x 10 lines': (C, ['path_in_diff', 'identifier_in_changed_lines', 'action_matches_lines',
                                              'changes_mostly_elsewhere']),
    'code_diff: one hunk of 1 MiB short lines': (I, ['path_in_diff', 'identifier_not_in_changed_lines',
                                                     'action_matches_lines']),
    'code_diff: 8 KiB claim of paths': (I, ['path_in_diff', 'action_matches_lines', 'unnamed_files_changed']),
    'code_diff: 1 MiB of @@ lines': (U, ['evidence_too_large']),
    'code_diff: 1 MiB of one-line hunks': (U, ['evidence_too_large']),
    'code_diff: 1 MiB of one-line hunks, added': (U, ['evidence_too_large']),
    'code_diff: 1 MiB of --- lines': (U, ['evidence_too_large']),
    'code_diff: 1 MiB of other lines': (I, ['diff_no_changes']),
    'code_diff: a hunk of blank lines': (I, ['path_in_diff', 'identifier_not_in_changed_lines',
                                             'action_mismatch_lines']),
    'generic: one 1 MiB string': (I, ['no_signal']),
    'generic: 8 KiB claim of entities': (I, ['no_signal']),
    'generic: 8 KiB claim of states x 60k keys': (C, ['state_matches', 'state_conflict']),
    'generic: 7 KiB of state words, then 32 keys': (V, ['state_matches']),
    'generic: status keys under nests': (C, ['explicit_value_conflict', 'outcome_conflict']),
    'db_op: 64 KiB SQL of OR terms': (I, ['sql_kind_matches', 'sql_table_mismatch', 'where_not_plain']),
    'api_call: 1 MiB JSON text body': (V, ['status_matches_claim', 'body_matches_claim']),
    'api_call: 1 MiB plain text body': (V, ['status_matches_claim', 'body_matches_claim']),
    'api_call: 700 claimed ids x 66k ids in the request': (C, ['target_mismatch']),
    'api_call: ids in 62k URL paths': (C, ['target_mismatch']),
    'generic: 1,300 stated values x 100 found': (C, ['explicit_value_conflict']),
    "generic: a string of escaped quotes after ':'": (I, ['no_signal']),
    'api_call: a URL of one 1 MiB path segment': (C, ['target_mismatch']),
    'api_call: one URL 116k times': (C, ['status_matches_claim', 'target_mismatch']),
    'file_op: 8 KiB claim of sizes and paths': (C, ['path_mismatch', 'existence_matches', 'line_count_mismatch']),
    'mcp: tools/call of 120k small objects': (I, ['no_signal']),
    'strings of \\u escapes': (I, ['no_signal']),
    'floats: 1.5e-05': (I, ['no_signal']),
    'floats: 0.1234567': (I, ['no_signal']),
    'floats: 12.0': (I, ['no_signal']),
    'floats: 1e16': (I, ['no_signal']),
    'floats: 1.5e+16': (I, ['no_signal']),
    'floats: 1.5e-06': (I, ['no_signal']),
    'floats: 1e-07': (I, ['no_signal']),
    'floats: -0.0': (I, ['no_signal']),
    'runs of 16 digits below 2^53': (I, ['no_signal']),
    'U+E000 and astral in a value': (I, ['no_signal']),
    'U+E000 and astral in keys': (I, ['no_signal']),
    'such keys at depth 31': (I, ['no_signal']),
    '50k small objects of such keys': (I, ['no_signal']),
    '30k such objects, all escaped': (I, ['no_signal']),
    'one object of 50k such keys': (I, ['no_signal']),
    '70k two-key objects, such chars in the claim': (I, ['no_signal']),
    'depth-29 nests and 20k objects of such keys': (I, ['no_signal']),
    'depth-29 nests and 40k objects of such keys': (I, ['no_signal']),
    '70k top-level members': ('unknown_field', None),
    '70k members beside the receipt': ('invalid_request', None),
    'mcp: 60k members beside the evidence': ('isError', None),
    'code_diff: 52k dotted names of 8 parts, one line': (I, ['path_partly_in_diff', 'action_matches_lines']),
    'code_diff: dotted names of 8 parts, 58k lines': (I, ['path_partly_in_diff', 'action_matches_lines']),
    'code_diff: distinct dotted names of 16 parts': (I, ['path_in_diff', 'identifier_not_in_changed_lines']
     + ['action_matches_lines']),
    'code_diff: dotted names of 16 parts in the claim': (C, ['identifier_not_in_changed_lines']),
    'code_diff: long camelCase runs': (I, ['path_in_diff', 'identifier_not_in_changed_lines', 'action_matches_lines']),
    'code_diff: one camelCase run of 1 MiB': (I, ['path_in_diff', 'identifier_not_in_changed_lines']
     + ['action_matches_lines']),
    'generic: camelCase runs in the claim and keys': (I, ['no_signal']),
    'code_diff: 4,900 files, the claim names 600': (C, ['path_in_diff', 'identifier_not_in_changed_lines']
     + ['action_matches_lines', 'changes_mostly_elsewhere']),
    'floats: 45k random below 1e-5': (I, ['no_signal']),
    'floats: 47k random of every exponent': (I, ['no_signal']),
    'floats: every exponent, 4 mantissas, signs': (I, ['no_signal']),
    'floats: 23k objects of a float and a string': (I, ['no_signal']),
    'generic: status objects nested 28 deep, repeated': (C, ['outcome_conflict']),
    'api_call: failures nested in lists of results': (C, ['status_matches_claim', 'body_failure']),
    'generic: 1 MiB of prose': (I, ['no_signal']),
    'api_call: a text body of 1 MiB of prose': (C, ['status_matches_claim', 'body_failure']),
    'generic: 8 KiB prose claim, 38k prose values': (I, ['claim_negated']),
}
CODE_DIFF = [
    ("Added null check for `user.email` in src/user.py", D_USER, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added null check for user.email in src/user.py", D_USER, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Fixed a.py", D_DATA, C, ["path_not_in_diff", "action_matches_lines"]),
    ("Added rate limiting to src/user.py", D_PRINT, I, ["path_in_diff", "content_words_absent", "action_matches_lines"]),
    ("Added logging of saving to src/user.py", D_PRINT, V, ["path_in_diff", "action_matches_lines"]),
    ("Removed `legacy_mode` from src/user.py", D_USER, I, ["path_in_diff", "identifier_not_in_changed_lines", "action_mismatch_lines"]),
    ("Added an audit call where `user.email` is checked in src/user.py", D_CONTEXT, I, ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Deleted file old_api.py", D_DELETE, V, ["path_in_diff", "action_matches_lines", "file_deleted"]),
    ("Deleted the file src/user.py", D_USER, I, ["path_in_diff", "action_mismatch_lines", "file_not_deleted"]),
    ("Updated src/user.py", D_TWO, C, ["path_in_diff", "action_matches_lines", "changes_mostly_elsewhere"]),
    ("Added `helper_3` in src/other.py", D_TWO, I, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "unnamed_files_changed"]),
    ("Updated src/user.py and docs/missing.md", D_USER, I, ["path_partly_in_diff", "action_matches_lines"]),
    ("Added `retry_count` to app/config.py", D_PLAIN, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Changed `MAX_SIZE` in lib/limits.py", D_NOPREFIX, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Created docs/guide.md", D_CREATE, V, ["path_in_diff", "action_matches_lines"]),
    ("Renamed old.py to new.py", D_RENAME, V, ["path_in_diff", "action_matches_lines"]),
    ("Updated logo.png", D_BINARY, V, ["path_in_diff", "action_matches_lines"]),
    ("Added `parse_header` to src/user.py", D_DEEP, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Removed the old rule from notes.txt", D_HUNK_DASHES, V, ["path_in_diff", "action_matches_lines"]),
    ("Added `user.email` validation", "", I, ["diff_no_changes"]),
    ("Refactored everything", D_USER, I, ["content_words_absent", "action_matches_lines"]),
    # review findings 6 and 7: the direction of the lines and negation
    ("Added `rate_limit` in src/user.py", D_RATE_RM, I, ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Removed `rate_limit` from src/user.py", D_RATE_RM, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Removed `debug_flag` from config.py", D_DEBUG_ADD, I, ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Removed old_api.py", D_ONE_LINE, I, ["path_in_diff", "action_matches_lines", "file_not_deleted"]),
    ("Removed old_api.py", D_DELETE, V, ["path_in_diff", "action_matches_lines", "file_deleted"]),
    ("Did not remove `auth_check` from app.py", D_AUTH, I, ["path_in_diff", "identifier_in_changed_lines", "claim_negated"]),
    ("Never removed `auth_check` from app.py", D_USER, C, ["path_not_in_diff", "identifier_not_in_changed_lines", "claim_negated"]),
    ("Removed `auth_check` from app.py", D_AUTH, V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
]
DB_OP = [
    ("Deleted 10 stale sessions", {"before_count": 110, "after_count": 100, "affected_rows": 10,
                                   "operation": "DELETE FROM sessions WHERE last_seen < '2024-01-01'"}, V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "count_matches"]),
    ("Deleted user id=12345", {"before_count": 5, "after_count": 4, "affected_rows": 1,
                               "operation": "DELETE FROM users WHERE id = 12345"}, V, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Deleted user 12345", {"before_count": 5, "after_count": 4, "affected_rows": 1,
                            "operation": "DELETE FROM users WHERE id = 999"}, C, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_mismatch"]),
    ("Updated the email of user #77", {"before_count": 9, "after_count": 9, "affected_rows": 0,
                                       "operation": "UPDATE users SET email = 'a@b.c' WHERE id = 77"}, I, ["sql_kind_matches", "row_delta_matches", "affected_rows_zero", "sql_identifier_matches"]),
    ("Inserted 3 rows into orders", {"affected_rows": 3, "operation": "SELECT * FROM orders"}, C, ["sql_kind_conflicts", "count_matches"]),
    ("Deleted 5 rows", {"before_count": 10, "after_count": 13, "operation": "INSERT INTO t VALUES (1)"}, C,
     ["sql_kind_mismatch", "row_delta_mismatch", "count_mismatch"]),
    ("Deleted and inserted rows", {"affected_rows": 2, "operation": "DELETE FROM t"}, I, ["conflicting_verbs"]),
    ("Inserted 2 users", {"before_count": 3, "after_count": 5, "affected_rows": 3, "operation": "INSERT INTO users VALUES (1), (2)"},
     I, ["sql_kind_matches", "row_delta_matches", "affected_rows_mismatch", "count_matches"]),
    ("Removed 10 sessions", {"before_count": 10, "after_count": 0, "operation": "TRUNCATE sessions"}, V, ["sql_kind_matches", "row_delta_matches", "count_matches"]),
    ("Updated 4 rows", {"affected_rows": 4, "operation": "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET a = 1"},
     I, ["count_matches"]),
    ("Updated 4 rows", {"affected_rows": 4, "before_count": 9, "after_count": 9, "operation": "UPDATE t SET a = 1"},
     V, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "count_matches"]),
    ("Deleted order #2", {"affected_rows": 1, "operation": "WITH old AS (SELECT id FROM o) DELETE FROM orders WHERE id IN (1, 2, 3)"},
     V, ["sql_kind_matches", "sql_identifier_matches"]),
    ("Counted the active users", {"before_count": 5, "after_count": 5, "operation": "SELECT count(*) FROM users -- DELETE"},
     V, ["sql_kind_matches", "row_delta_matches"]),
    ("Deleted 3 rows", {"before_count": 10, "after_count": 12}, C, ["row_delta_mismatch", "count_mismatch"]),
    ("Updated the rows", {"before_count": 5, "after_count": 6, "operation": "UPDATE t SET a = 1"}, I, ["sql_kind_matches", "row_delta_mismatch"]),
    ("Upserted and updated user 5", {"affected_rows": 1, "operation": "INSERT INTO users VALUES (5) ON CONFLICT (id) DO UPDATE SET a = 1"},
     I, ["sql_identifier_unchecked"]),  # was no_signal: a claimed id the SQL does not compare is no longer ignored
    ("Archived old rows", {"affected_rows": 2, "operation": "DELETE FROM t"}, I, ["no_signal"]),
    # review findings 7, 8 and 11: negation, OR / negated / several statements, and nouns that are not ids
    ("Did not delete any rows", {"before_count": 5, "after_count": 4, "affected_rows": 1,
                                 "operation": "DELETE FROM t WHERE id = 3"}, I, ["claim_negated"]),
    ("Deleted user 12345", {"before_count": 600, "after_count": 100, "affected_rows": 500,
                            "operation": "DELETE FROM users WHERE id = 12345 OR 1=1"}, C, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "affected_rows_exceed_claim", "where_not_plain"]),
    ("Deleted user 12345", {"before_count": 600, "after_count": 100, "affected_rows": 500,
                            "operation": "DELETE FROM users WHERE id <> 12345"}, C, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "affected_rows_exceed_claim", "sql_identifier_mismatch"]),
    ("Deleted user 12345", {"before_count": 600, "after_count": 100, "affected_rows": 500,
                            "operation": "DELETE FROM users WHERE id NOT IN (12345)"}, C, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "affected_rows_exceed_claim", "where_not_plain"]),
    ("Deleted user 12345", {"before_count": 600, "after_count": 599, "affected_rows": 1,
                            "operation": "DELETE FROM users WHERE id = 12345; DELETE FROM users"}, I,
     ["sql_kind_matches", "sql_multiple_statements", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    ("Deleted user 12345", {"before_count": 600, "after_count": 599, "affected_rows": 1,
                            "operation": "DELETE FROM users WHERE name = 'x'"}, I, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    ("Deleted rows for tenant 7 across 3 tables", {"affected_rows": 30, "operation": "DELETE FROM t WHERE tenant_id = 7"},
     V, ["sql_kind_matches", "sql_identifier_matches"]),
]
FILE_OP = [
    ("Created report.txt with 120 lines", {"path": "/tmp/report.txt", "exists_before": False, "exists_after": True,
                                           "line_count": 120}, V, ["path_matches", "existence_matches", "line_count_matches"]),
    ("Created report.txt", {"path": "/tmp/other.txt", "exists_before": False, "exists_after": True}, C, ["path_mismatch", "existence_matches"]),
    ("Deleted /tmp/cache.db", {"path": "/tmp/cache.db", "exists_before": True, "exists_after": True}, C, ["path_matches", "end_state_mismatch"]),
    ("Created notes.md", {"path": "notes.md", "exists_before": True, "exists_after": True}, I, ["path_matches", "start_state_mismatch"]),
    ("Renamed a.txt to b.txt", {"path": "/d/a.txt", "exists_before": True, "exists_after": True}, I, ["path_matches", "new_path_missing"]),
    ("Renamed a.txt to b.txt", {"path": "/d/a.txt", "new_path": "/d/b.txt", "exists_before": True, "exists_after": True},
     V, ["path_matches", "existence_matches"]),
    ("Moved a.txt to c.txt", {"path": "/d/a.txt", "new_path": "/d/b.txt", "exists_before": True, "exists_after": True},
     C, ["path_mismatch", "existence_matches"]),
    ("Wrote 118 lines to log.txt", {"path": "log.txt", "exists_before": False, "exists_after": True, "line_count": 120},
     I, ["path_matches", "existence_matches", "line_count_off"]),
    ("Wrote 200 lines to log.txt", {"path": "log.txt", "exists_before": False, "exists_after": True, "line_count": 120},
     C, ["path_matches", "existence_matches", "line_count_mismatch"]),
    ("Wrote 1,000 lines to big.csv", {"path": "data/big.csv", "exists_before": True, "exists_after": True, "line_count": 1000},
     V, ["path_matches", "existence_matches", "line_count_matches"]),
    ("Saved 1.5 MB to dump.bin", {"path": "dump.bin", "exists_before": False, "exists_after": True, "size_bytes": 1500000},
     V, ["path_matches", "existence_matches", "size_matches"]),
    ("Saved 1.5 MiB to dump.bin", {"path": "dump.bin", "exists_before": False, "exists_after": True, "size_bytes": 1500000},
     I, ["path_matches", "existence_matches", "size_off"]),
    ("Saved 12KB to dump.bin", {"path": "dump.bin", "exists_before": False, "exists_after": True, "size_bytes": 100000},
     C, ["path_matches", "existence_matches", "size_mismatch"]),
    ("Saved 100KiB to dump.bin", {"path": "dump.bin", "exists_before": False, "exists_after": True, "size_bytes": 102400},
     V, ["path_matches", "existence_matches", "size_matches"]),
    ("Created and deleted temp.txt", {"path": "temp.txt", "exists_before": False, "exists_after": False}, I, ["conflicting_verbs"]),
    ("Removed the cache", {"path": "/var/cache/x", "exists_before": True, "exists_after": False}, I, ["path_not_named", "existence_matches"]),
    ("Created Makefile", {"path": "/repo/Makefile", "exists_before": False, "exists_after": True}, V, ["path_matches", "existence_matches"]),
    # review findings 7, 9 and 11: negation, unrecognised names, rename direction, counts that are changes
    ("Wrote 120 lines to Makefile", {"path": "/repo/README", "exists_before": False, "exists_after": True,
                                     "line_count": 120}, I, ["path_not_named", "existence_matches", "line_count_matches"]),
    ("Wrote 120 lines to .bashrc", {"path": "/repo/README", "exists_before": False, "exists_after": True,
                                    "line_count": 120}, I, ["path_not_named", "existence_matches", "line_count_matches"]),
    ("Renamed b.txt to a.txt", {"path": "a.txt", "new_path": "b.txt", "exists_before": True, "exists_after": True},
     C, ["path_mismatch", "existence_matches"]),
    ("Did not delete a.txt", {"path": "a.txt", "exists_before": True, "exists_after": False}, I, ["claim_negated", "path_matches"]),
    ("Did not delete a.txt", {"path": "a.txt", "exists_before": True, "exists_after": True}, I, ["claim_negated", "path_matches"]),
    ("Removed 3 lines from config.yml", {"path": "config.yml", "exists_before": True, "exists_after": True,
                                         "line_count": 40}, V, ["path_matches", "existence_matches"]),
    ("Appended 5 lines to log.txt", {"path": "log.txt", "exists_before": True, "exists_after": True,
                                     "line_count": 105}, V, ["path_matches", "existence_matches"]),
]
API_CALL = [
    ("Sent the welcome email to bob@example.com", {"request": {"to": "bob@example.com"}, "response_status": 200,
                                                   "response_body": {"sent": True, "bounced": False}}, V,
     ["status_matches_claim", "target_matches"]),
    ("Sent the welcome email to bob@example.com", {"request": {"to": "eve@example.com"}, "response_status": 200,
                                                   "response_body": {"ok": True}}, C, ["status_matches_claim", "body_matches_claim", "target_mismatch"]),
    ("Posted the message", {"request": "POST /messages", "response_status": 500, "response_body": ""}, C, ["status_failure"]),
    ("The payment failed", {"request": {}, "response_status": 200, "response_body": {"status": "succeeded"}}, C,
     ["status_contradicts_failure_claim", "body_contradicts_failure_claim"]),
    ("Payment failed", {"request": {}, "response_status": 402, "response_body": {"error": "card declined"}}, V,
     ["status_matches_claim", "body_matches_claim"]),
    ("Created order 42", {"request": {"order_id": 42}, "response_status": 201, "response_body": {"ok": False}}, C, ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent invoice 42 to bob@x.com", {"request": {"to": "bob@x.com", "invoice_id": 42}, "response_status": 200}, V,
     ["status_matches_claim", "target_matches"]),
    ("Delivered the webhook to https://hooks.example.com/a/b", {"request": {"url": "https://hooks.example.com/a/c"},
                                                              "response_status": 204}, C, ["status_matches_claim", "target_mismatch"]),
    ("Delivered the webhook to https://hooks.example.com/a/b/", {"request": "POST https://hooks.example.com/a/b",
                                                               "response_status": 204}, V, ["status_matches_claim", "target_matches"]),
    ("Sent an email to bob@x.com", {"request": {"body": "hi"}, "response_status": 200}, I, ["status_matches_claim", "target_not_in_request"]),
    ("Message accepted", {"request": {}, "response_status": 202, "response_body": "Message accepted for delivery"}, V,
     ["status_matches_claim", "body_matches_claim"]),
    ("Message sent", {"request": {}, "response_status": 200, "response_body": "{\"status\": \"queued\"}"}, I,
     ["status_matches_claim"]),
    ("The email was not sent", {"request": {}, "response_status": 200}, I, ["status_contradicts_failure_claim"]),
    ("Notification delivered", {"request": {}, "response_status": 200, "response_body": "{\"errors\": [\"quota\"]}"}, C,
     ["status_matches_claim", "body_failure"]),
    ("Charged customer 77", {"request": {"url": "https://api.example.com/customers/78/charges"}, "response_status": 200},
     C, ["target_mismatch"]),
    ("Pinged the health endpoint", {"request": {}, "response_status": 200}, I, ["no_signal"]),
    # review findings 5 and 11: targets come from the request's target fields, ids from id-like keys only
    ("Refunded customer 77 successfully", {"request": {"url": "https://api.x.com/customers/78/refunds", "amount": 77},
                                           "response_status": 200, "response_body": {"ok": True}}, C, ["status_matches_claim", "body_matches_claim", "target_mismatch"]),
    ("Refunded customer 78 successfully", {"request": {"url": "https://api.x.com/customers/78/refunds", "amount": 77},
                                           "response_status": 200, "response_body": {"ok": True}}, V, ["status_matches_claim", "body_matches_claim", "target_matches"]),
    # a path segment names its id in any case: Customers/78 is customer 78
    ("Refunded customer 78 successfully", {"request": {"url": "https://api.x.com/CUSTOMERS/78/Refunds"},
                                           "response_status": 200, "response_body": {"ok": True}}, V, ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Posted to https://good.com/a successfully", {"request": {"url": "https://evil.com/a", "ref": "https://good.com/a"},
                                                   "response_status": 200, "response_body": {"ok": True}}, C,
     ["status_matches_claim", "body_matches_claim", "target_mismatch"]),
    ("Sent the email to bob@x.com", {"request": {"to": "Eve <eve@x.com>", "reply_to": "bob@x.com"}, "response_status": 200,
                                     "response_body": {"ok": True}}, C, ["status_matches_claim", "body_matches_claim", "target_mismatch"]),
    ("Sent the email to eve@x.com", {"request": {"to": "Eve <eve@x.com>", "reply_to": "bob@x.com"}, "response_status": 200,
                                     "response_body": {"ok": True}}, V, ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Sent 3 emails in batch 7", {"request": {"batch_id": 7, "count": 3}, "response_status": 200}, V, ["status_matches_claim", "target_matches"]),
    ("Opened ticket #42", {"request": {"priority": 2}, "response_status": 200}, I, ["target_not_in_request"]),
]
GENERIC = [
    ("Deployed version 2", {"deploy": "ok", "env": "prod"}, I, ["no_signal"]),
    ("Deployed version 2", {"version": "2", "env": "prod"}, I, ["no_signal"]),
    ("status is failed", {"status": "ok"}, C, ["explicit_value_conflict"]),
    ("status: ok", {"job": {"status": "OK"}}, I, ["explicit_value_match"]),
    ("Copied 1,500 records from orders_2024 to https://backup.example.com/x",
     {"count": 1500, "table": "orders_2024", "target": "https://backup.example.com/x"}, V, ["entities_match"]),
    ("Copied 1,500 records from orders_2024", {"count": 1500, "table": "orders_2024"}, I, ["no_signal"]),
    ("retries = 3", {"retries": 5}, C, ["explicit_value_conflict"]),
    ("retries=5 and the backup is done", {"retries": 5.0, "backup": {"done": True}}, I, ["explicit_value_match"]),
    ("The job is not done", {"job": "done"}, I, ["claim_negated"]),
    ("owner was alice", {"owner": 7}, I, ["no_signal"]),
    ("count is 1,000", {"count": 1000}, I, ["explicit_value_match"]),
    ("Mailed alice@example.com, bob@example.com and carol@example.com",
     {"log": "to alice@example.com; to bob@example.com; to carol@example.com."}, V, ["entities_match"]),
    ("true null false 2", {"a": [True, None, False]}, I, ["no_signal"]),
    # review finding 10: repeated statements count once; small numbers are not entities; a failed status
    ("status is ok; status was ok", {"status": "ok"}, I, ["explicit_value_match"]),
    # issue 11: a claimed outcome against a status value is judged (before: insufficient_evidence)
    ("Backup of 3 databases completed in 2 minutes with 0 errors",
     {"status": "failed", "databases": 3, "minutes": 2, "errors": 0}, C, ["outcome_conflict"]),
    ("Backup failed after 3 databases", {"status": "failed", "databases": 3}, I, ["outcome_matches"]),
    ("The backup did not finish", {"status": "done"}, I, ["claim_negated"]),
    ("The nightly backup ran", {"job": {"status": "timed_out"}}, I, ["evidence_reports_failure"]),
    # issue 11: (subject, state) pairs; keys that merely match are no support
    ("Enabled dark_mode, auto_save and beta_features", {"settings": {"dark_mode": False, "auto_save": False,
                                                                     "beta_features": False}}, C, ["state_conflict"]),
    ("Enabled dark_mode, auto_save and beta_features", {"settings": {"dark_mode": True, "auto_save": True,
                                                                     "beta_features": True}}, V, ["state_matches"]),
    ("Enabled dark_mode and auto_save", {"dark_mode": True, "auto_save": False}, C,
     ["state_matches", "state_conflict"]),  # several keys, one conflicts
    ("Turned off telemetry and crash_reports", {"telemetry": "off", "crash_reports": "disabled"}, V, ["state_matches"]),
    ("Disabled telemetry", {"config": {"telemetry": True}}, C, ["state_conflict"]),
    ("Did not enable dark_mode", {"dark_mode": True}, C, ["state_conflict", "claim_negated"]),
    ("Did not enable dark_mode", {"dark_mode": False}, I, ["state_matches", "claim_negated"]),
    ("dark_mode is on, auto_save is off", {"dark_mode": True, "auto_save": False}, V, ["explicit_value_match"]),
    ("dark_mode is on", {"ui": {"dark_mode": False}}, C, ["explicit_value_conflict"]),
    ("status: passed", {"status": "success"}, I, ["explicit_value_match"]),
    ("Updated alpha_key, beta_key and gamma_key", {"alpha_key": 1, "beta_key": 2, "gamma_key": 3}, I, ["no_signal"]),
    # issue 11: status words against status, state, result, outcome, conclusion, ok and success at any depth
    ("status failed", {"status": "ok"}, C, ["outcome_conflict"]),
    ("The build passed", {"jobs": [{"conclusion": "success"}, {"conclusion": "failure"}]}, C, ["outcome_conflict"]),
    ("The build passed", {"run": {"status": "completed", "conclusion": "success"}}, I, ["outcome_matches"]),
    ("The build failed", {"run": {"status": "completed", "conclusion": "failure"}}, I, ["outcome_matches"]),
    ("Deploy succeeded", {"response": {"ok": False}}, C, ["outcome_conflict"]),
    ("Deploy succeeded", {"result": "success", "ok": True, "version": 12}, I, ["outcome_matches"]),
    ("The tests did not pass", {"result": "passed"}, C, ["outcome_conflict", "claim_negated"]),
    ("Migration completed", {"state": "timed_out"}, C, ["outcome_conflict"]),
    ("Payment succeeded", {"outcome": "declined", "success": False}, C, ["outcome_conflict"]),
]


class Rules(unittest.TestCase):
    def run_table(self, kind, table):
        for claim, evidence, verdict, codes in table:
            ev = {"diff": evidence} if kind == "code_diff" else evidence
            for requested in (kind, None):
                got, reasons = judge(claim, ev, requested)
                self.assertEqual(got, verdict, (claim, reasons))
                for code in codes:
                    self.assertIn(code, reasons, (claim, reasons))

    def test_code_diff(self):
        self.run_table("code_diff", CODE_DIFF)

    def test_db_op(self):
        self.run_table("db_op", DB_OP)

    def test_file_op(self):
        self.run_table("file_op", FILE_OP)

    def test_api_call(self):
        self.run_table("api_call", API_CALL)

    def test_generic(self):
        self.run_table("generic", GENERIC)

    def test_tables_cover_every_reason_code(self):
        seen = set()
        for table in (CODE_DIFF, DB_OP, FILE_OP, API_CALL, GENERIC) + tuple(CHECK_TABLES.values()) + tuple(
                REDTEAM_TABLES.values()):
            self.assertGreaterEqual(len(table), 4)
            for _, _, _, codes in table:
                seen.update(codes)
        unsafe = {"evidence_invalid", "evidence_too_large", "verifier_error", "evidence_missing_fields"}
        self.assertEqual(set(va.REASONS) - seen, unsafe)  # these four are covered by Unsafe below

    def test_dispatch_order(self):
        d = va.dispatch_kind
        self.assertEqual(d({"diff": "", "affected_rows": 1}), "code_diff")
        self.assertEqual(d({"before_count": 1, "path": "x", "exists_after": True}), "db_op")
        self.assertEqual(d({"operation": "DELETE FROM t"}), "generic")
        self.assertEqual(d({"operation": "DELETE FROM t", "affected_rows": 1}), "db_op")
        self.assertEqual(d({"size_bytes": 1, "request": {}}), "file_op")
        self.assertEqual(d({"response_body": {}}), "api_call")
        self.assertEqual(d({"anything": 1}), "generic")
        self.assertEqual(d({"diff": ""}, "DB_OP"), "db_op")
        self.assertEqual(d({"diff": None, "affected_rows": 1}), "db_op")  # null is absent, as check_evidence has it
        self.assertEqual(judge("Deleted 1 row", {"diff": None, "affected_rows": 1}), (I, ["count_matches"]))
        self.assertEqual(judge("Deleted 1 row", {"affected_rows": 1}, "Db_Op")[0], I)

    def test_diff_parser(self):
        files, changed = va.parse_diff(D_TWO + D_DELETE + D_RENAME + D_BINARY + D_CREATE)
        got = [(f["old"], f["new"], f["status"], f["added"], f["removed"], f["binary"]) for f in files]
        self.assertEqual(got, [("src/user.py", "src/user.py", "modified", 2, 0, False),
                               ("src/other.py", "src/other.py", "modified", 10, 0, False),
                               ("old_api.py", "old_api.py", "deleted", 0, 3, False),
                               ("old.py", "new.py", "renamed", 0, 0, False),
                               ("logo.png", "logo.png", "modified", 0, 0, True),
                               ("docs/guide.md", "docs/guide.md", "added", 2, 0, False)])
        self.assertIn("+    if user.email is None:", changed)  # the sign says added or removed
        self.assertIn("-def legacy():", changed)
        self.assertFalse([c for c in changed if "def save(user)" in c])  # context is not a change
        files, _ = va.parse_diff(D_PLAIN + D_HUNK_DASHES)
        self.assertEqual([(f["new"], f["added"], f["removed"]) for f in files], [("app/config.py", 1, 0), ("notes.txt", 0, 1)])

    def test_sql_facts(self):
        f = va.sql_facts
        self.assertEqual(f("DELETE FROM s WHERE d < '2024-01-01' AND note = 'id = 5'"),
                         ("delete", "s", None, True, "plain", None, [], 1))
        self.assertEqual(f("update t set a=1 where t.user_id=42 or 43 = id")[4:6], ("not plain", "OR"))
        self.assertEqual(f("/* x */ INSERT INTO t (id) VALUES (7)"), ("insert", "t", None, True, "none", None, [], 1))
        self.assertEqual(f("DELETE FROM t WHERE id IN (1, 2) AND deleted_at IS NOT NULL").pins,
                         [(("", "id"), "1", "="), (("", "id"), "2", "=")])
        self.assertEqual(f("UPDATE t SET flag = NOT flag WHERE id = 5").pins, [(("", "id"), "5", "=")])


class PeerFailures(unittest.TestCase):
    """Each of the peer's measured failures (spec section 8) as a regression test."""

    def test_1_pathological_claims_are_answered(self):
        # the peer froze 7 s on each; answered in a child process whose timeout is a hang guard (the bench measures
        # the time: the worst case, beside the adversarial table). Each answer exactly: a crash would be U.
        answers = answers_in_a_child("[t.judge(c[:8192], ev) for c in t.PATHOLOGICAL for ev in t.pathological_evidence(c)]")
        shapes = len(pathological_evidence("x"))
        letters = "".join({V: "V", C: "C", I: "I", U: "U"}[verdict] for verdict, _ in answers)
        rows = [letters[i : i + shapes] for i in range(0, len(letters), shapes)]
        self.assertEqual(list(zip(PATHOLOGICAL, rows)), list(zip(PATHOLOGICAL, PATHOLOGICAL_ANSWERS)))
        self.assertEqual([codes for _, codes in answers if "verifier_error" in codes], [])

    def test_2_the_reviews_big_bodies_are_answered(self):
        # was: 9 s (sql), 1.8 s (URLs), 0.26 s, 0.17 s, 0.15 s; their time is measured in the bench's adversarial table
        got = answers_in_a_child("[t.answer_and_codes('/verify', b) for _, b in t.big_bodies()]")
        for (label, body), answered in zip(big_bodies(), got):
            self.assertLessEqual(len(body), va.MAX_BODY, label)
            self.assertEqual(tuple(answered), ADVERSARIAL_ANSWERS[label], label)

    def test_6_reason_codes_and_receipts_carry_no_input(self):
        marker = "zq" + "x" * 10 + "marker"
        for claim, ev, _, _ in CODE_DIFF[:3] + [(c, e, v, r) for c, e, v, r in DB_OP[:3]]:
            ev = {"diff": ev} if isinstance(ev, str) else ev
            r = SERVICE.verify(va.validate_request({"claim": claim + " " + marker, "evidence": dict(ev, note=marker)}))
            self.assertNotIn(marker, json.dumps(r["receipt"]) + json.dumps(r["reason_codes"]) + r["reasoning"])
            self.assertTrue(set(r["reason_codes"]) <= set(va.REASONS))

    def test_8_false_verified_now_right(self):
        self.assertEqual(judge("Fixed a.py", {"diff": D_DATA}), (C, ["path_not_in_diff", "action_matches_lines"]))
        self.assertEqual(judge("Added rate limiting to src/user.py", {"diff": D_PRINT}),
                         (I, ["path_in_diff", "content_words_absent", "action_matches_lines"]))
        self.assertEqual(judge("Created report.txt", {"path": "/tmp/other.txt", "exists_before": False,
                                                      "exists_after": True}), (C, ["path_mismatch", "existence_matches"]))
        self.assertEqual(judge("Updated user 5", {"affected_rows": 0, "before_count": 3, "after_count": 3,
                                                  "operation": "UPDATE users SET a = 1 WHERE id = 5"}),
                         (I, ["sql_kind_matches", "row_delta_matches", "affected_rows_zero", "sql_identifier_matches"]))

    def test_9_false_contradicted_now_right(self):
        self.assertEqual(judge("Added `retry_count` to app/config.py", {"diff": D_PLAIN}),
                         (V, ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]))
        self.assertEqual(judge("Deleted 10 stale sessions", DB_OP[0][1]),
                         (V, ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "count_matches"]))
        self.assertEqual(judge("Sent the welcome email to bob@example.com", API_CALL[0][1]),
                         (V, ["status_matches_claim", "target_matches"]))
        self.assertEqual(judge("Deployed version 2", {"result": "ok", "env": "prod"}), (I, ["no_signal"]))

    def test_5_receipts_hash_the_original_request(self):
        long_claim = "Deleted 10 stale sessions " + "x" * 8000
        req = {"claim": long_claim, "evidence": {"a": 1, "s": "\u00e9\U0001f600"}, "kind": "generic", "context": "c",
               "caller_context": {"run": "r1", "n": 2.5}}
        rec = SERVICE.verify(va.validate_request(json.loads(json.dumps(req))))["receipt"]
        self.assertEqual(rec["claim_hash"], "sha256:" + hashlib.sha256(long_claim.encode()).hexdigest())
        self.assertEqual(rec["evidence_manifest_hash"], ref_sha(req["evidence"]))
        self.assertEqual(rec["request_hash"], ref_sha(req))
        as_string = SERVICE.verify({"claim": "x", "evidence": {"v": '{"a":1}'}})["receipt"]
        as_object = SERVICE.verify({"claim": "x", "evidence": {"v": {"a": 1}}})["receipt"]
        self.assertNotEqual(as_string["evidence_manifest_hash"], as_object["evidence_manifest_hash"])
        hashes = {SERVICE.verify(dict({"claim": "x", "evidence": {}}, **extra))["receipt"]["request_hash"]
                  for extra in ({}, {"kind": "generic"}, {"context": "a"}, {"context": "b"}, {"caller_context": {"k": 1}})}
        self.assertEqual(len(hashes), 5)


class Unsafe(unittest.TestCase):
    def test_wrong_types_and_bounds(self):
        cases = [({"diff": 5}, "code_diff", "evidence_invalid"), ({"diff": "+" * (4 << 20 | 1)}, "code_diff", "evidence_too_large"),
                 ({"affected_rows": -1}, "db_op", "evidence_invalid"), ({"affected_rows": True}, "db_op", "evidence_invalid"),
                 ({"before_count": 1.5, "after_count": 1}, "db_op", "evidence_invalid"),
                 ({"operation": ["DELETE"]}, "db_op", "evidence_invalid"), ({"operation": "x" * 65537}, "db_op", "evidence_too_large"),
                 ({"path": 1, "exists_before": True, "exists_after": True}, "file_op", "evidence_invalid"),
                 ({"path": "x", "exists_before": "yes", "exists_after": True}, "file_op", "evidence_invalid"),
                 ({"path": "x" * 4097, "exists_before": True, "exists_after": True}, "file_op", "evidence_too_large"),
                 ({"path": "x", "exists_before": True, "exists_after": True, "line_count": "3"}, "file_op", "evidence_invalid"),
                 ({"response_status": 99}, "api_call", "evidence_invalid"), ({"response_status": "200"}, "api_call", "evidence_invalid"),
                 ({"response_status": 200, "request": 5}, "api_call", "evidence_invalid")]
        for ev, kind, code in cases:
            r = SERVICE.verify({"claim": "Did it", "evidence": ev, "kind": kind})
            self.assertEqual((r["aar_verdict"], r["verdict"], r["confidence"], r["reason_codes"]), (U, "rejected", 0.0, [code]))
            self.assertEqual(va.verify_receipt(r["receipt"], SERVICE.keyring), (True, "ok", SERVICE.keyring.kid))

    def test_missing_fields_ask_for_more(self):
        for ev, kind in (({}, "code_diff"), ({"before_count": 1}, "db_op"), ({"path": "x"}, "file_op"), ({}, "api_call")):
            self.assertEqual(judge("Did it", ev, kind), (I, ["evidence_missing_fields"]))

    def test_13_a_code_outside_the_vocabulary_is_unsafe_with_a_receipt(self):
        original = va._JUDGES["generic"]
        # a misspelt code, a code with another effect than its own, a signal that never fired: each a rule's bug
        for signal in (va.Signal("no_such_code", "negative", 1), va.Signal("path_in_diff", "critical", 1),
                       va.Signal("path_in_diff", "positive", 0)):
            va._JUDGES["generic"] = lambda claim, ev, ev_json: ([signal], {})
            try:
                r = SERVICE.verify({"claim": "x", "evidence": {}})
            finally:
                va._JUDGES["generic"] = original
            self.assertEqual((r["aar_verdict"], r["reason_codes"], r["signals"]),
                             (U, ["verifier_error"], [{"code": "verifier_error", "effect": "unsafe", "count": 1}]))
            self.assertTrue(va.verify_receipt(r["receipt"], SERVICE.keyring)[0])

    def test_7_a_failing_rule_still_gets_a_signed_unsafe_answer(self):
        original = va._JUDGES["generic"]
        va._JUDGES["generic"] = lambda claim, ev, ev_json: 1 / 0
        try:
            r = SERVICE.verify({"claim": "x", "evidence": {}})
        finally:
            va._JUDGES["generic"] = original
        self.assertEqual((r["aar_verdict"], r["reason_codes"]), (U, ["verifier_error"]))
        self.assertTrue(va.verify_receipt(r["receipt"], SERVICE.keyring)[0])


# ---------------------------------------------------------------------------------------------------
# Facts and checks (issue 25): every check fires in some rows and stays quiet in others; exact verdicts and codes
# ---------------------------------------------------------------------------------------------------
def one_file(path, *lines):
    """A git diff of one file whose one hunk holds lines (each with its sign: '+', '-' or ' ')."""
    old = sum(line[:1] in "- " for line in lines)
    new = sum(line[:1] in "+ " for line in lines)
    head = "diff --git a/%s b/%s\n--- a/%s\n+++ b/%s\n" % (path, path, path, path)
    return head + "@@ -1,%d +1,%d @@\n" % (old, new) + "".join(line + "\n" for line in lines)


def rows(op, affected=1, before=10, after=9):
    """db_op evidence: an operation, affected_rows and the row counts before and after."""
    return {"before_count": before, "after_count": after, "affected_rows": affected, "operation": op}


def api(body, status=200, request=None):
    """api_call evidence: a response body and status, and a request."""
    return {"request": request or {}, "response_status": status, "response_body": body}


DELETED = ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent"]  # a delete of one row, honestly told
UPDATED = ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent"]
PATH_ACTION = ["path_in_diff", "action_matches_lines"]
SENT = ["status_matches_claim", "body_matches_claim"]
# (claim, evidence, verdict, reason codes in order): the kind is dispatched by shape and also named
TABLE_DB_OP = [
    # only a plain WHERE confirms an identifier: a conjunction of simple predicates
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id=42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("delete from users where ID = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = '42'"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 042"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id IN (42)"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE users.id = 42 AND deleted_at IS NULL"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows('DELETE FROM "users" WHERE "users"."id" = 42'), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users u WHERE u.id = 42 AND u.tenant_id = 7"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users AS u WHERE u.id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE (id = 42) AND (tenant_id = 7)"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE ((id = 42 AND status <> 'gone'))"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id BETWEEN 40 AND 45 AND id = 42"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE created_at < DATE '2024-01-01' AND id = 42"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND email IS NOT NULL AND age >= -1"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND name = 'O''Brien'"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("/* nightly cleanup */ DELETE FROM users WHERE id = 42"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("-- cleanup\n# and more\nDELETE FROM users WHERE id = 42"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 LIMIT 1"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 RETURNING *"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42;"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42; -- done"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("WITH gone AS (SELECT 1) DELETE FROM users WHERE id = 42"), V,
     DELETED + ["sql_identifier_matches"]),
    # ... and any other shape leaves it unconfirmed: no positive from it, and the write cannot be verified
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 = 0"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 IS FALSE"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 XOR 1"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 /*! OR 1=1 */"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 /* note */"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 -- OR 1=1"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 # mysql"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 || 1"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 && 1"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 OR id = 43"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE NOT id <> 42"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND NOT banned"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND name LIKE '%x%'"), I,
     DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = abs(42)"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE lower(name) = 'x' AND id = 42"), I,
     DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 + 0"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id IN (SELECT id FROM banned)"), I,
     DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND EXISTS (SELECT 1)"), I,
     DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND 1"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND TRUE"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE (id = 42"), I, DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND name = 'a\\' OR 1=1 -- '"), I,
     DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND name = 'x' COLLATE nocase"), I,
     DELETED + ["where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = CASE WHEN 1 THEN 42 END"), I,
     DELETED + ["where_not_plain"]),
    # a second statement: only the first is judged, and it confirms no id
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42; DELETE FROM users"), I,
     ["sql_kind_matches", "sql_multiple_statements", "row_delta_matches", "affected_rows_consistent",
      "sql_identifier_unchecked"]),
    ("Deleted 3 sessions", rows("DELETE FROM sessions WHERE expired = 1; DROP TABLE users", 3, 10, 7), I,
     ["sql_kind_matches", "sql_multiple_statements", "row_delta_matches", "affected_rows_consistent",
      "count_matches"]),
    # a plain WHERE that pins something else, or nothing
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 43"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id <> 42"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id != 42 AND id = 42"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE tenant_id = 3"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = $1"), I, DELETED + ["sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = ?"), I, DELETED + ["sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE email = 'a@b.c'"), I, DELETED + ["sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users"), I, DELETED + ["sql_identifier_unchecked"]),
    # rows against pinned identifiers: N ids are at most N rows
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42", 1000, 2000, 1000), C,
     DELETED + ["affected_rows_exceed_claim", "sql_identifier_matches"]),
    ("Deleted user 42", {"affected_rows": 999, "operation": "DELETE FROM users WHERE id = 42"}, C,
     ["sql_kind_matches", "affected_rows_exceed_claim", "sql_identifier_matches"]),
    ("Deleted user 42", {"before_count": 10, "after_count": 7, "operation": "DELETE FROM users WHERE id = 42"}, C,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_exceed_claim", "sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 = 0", 999, 1000, 1), C,
     DELETED + ["affected_rows_exceed_claim", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 OR 1=1", 500, 600, 100), C,
     DELETED + ["affected_rows_exceed_claim", "where_not_plain"]),
    ("Deleted users 7 and 9", rows("DELETE FROM users WHERE id IN (7, 9)", 2, 10, 8), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted users 7, 8 and 9", rows("DELETE FROM users WHERE id IN (7, 8, 9)", 3, 10, 7), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted ids 7 and 9", rows("DELETE FROM users WHERE id IN (7, 9)", 3, 10, 7), C,
     DELETED + ["affected_rows_exceed_claim", "sql_identifier_matches"]),
    ("Deleted users 7 and 9", rows("DELETE FROM users WHERE id IN (7, 9, 11)", 2, 10, 8), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted #42", rows("DELETE FROM users WHERE id = 42", 2, 10, 8), C,
     DELETED + ["affected_rows_exceed_claim", "sql_identifier_matches"]),
    ("Updated the email of user 42", rows("UPDATE users SET email = 'x' WHERE id = 42", 999, 10, 10), C,
     UPDATED + ["affected_rows_exceed_claim", "sql_identifier_matches"]),
    ("Updated the email of user 42", rows("UPDATE users SET email = 'x' WHERE id = 42", 1, 10, 10), V,
     UPDATED + ["sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM sessions WHERE user_id = 42", 5, 10, 5), C,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent",
      "affected_rows_exceed_claim", "sql_identifier_matches"]),
    # an id another entity's preposition brings in names whose rows, not which: it bounds none
    ("Deleted the sessions of user 42", rows("DELETE FROM sessions WHERE user_id = 42", 5, 10, 5), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted 5 sessions of user 42", rows("DELETE FROM sessions WHERE user_id = 42", 5, 10, 5), V,
     DELETED + ["count_matches", "sql_identifier_matches"]),
    ("Deleted 4 sessions of user 42", rows("DELETE FROM sessions WHERE user_id = 42", 5, 10, 5), C,
     DELETED + ["count_mismatch", "sql_identifier_matches"]),
    ("Deleted session 9 of user 42", rows("DELETE FROM sessions WHERE id = 9 AND user_id = 42"), V,
     DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42 of customer 7", rows("DELETE FROM orders WHERE id = 42"), I,
     DELETED + ["sql_identifier_unchecked"]),
    # an identifier keeps its noun
    ("Deleted order 42", rows("DELETE FROM orders WHERE customer_id = 42"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted order 42", rows("DELETE FROM orders WHERE customer_id = 7"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted order 42", rows("DELETE FROM customers WHERE id = 42"), C,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent",
      "sql_identifier_mismatch"]),
    ("Deleted order 42", rows("DELETE FROM orders WHERE id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42", rows('DELETE FROM "order" WHERE id = 42'), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42", rows("DELETE FROM order_items WHERE order_id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42", rows("DELETE FROM orders WHERE orderId = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42", rows("DELETE FROM orders o WHERE o.id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42", rows("DELETE FROM orders WHERE customers.id = 42"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted #42", rows("DELETE FROM orders WHERE id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted id 42", rows("DELETE FROM orders WHERE order_id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted #42", rows("DELETE FROM orders WHERE customer_id = 42"), C, DELETED + ["sql_identifier_mismatch"]),
    ("Deleted category 3", rows("DELETE FROM categories WHERE id = 3"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order_id 42", rows("DELETE FROM orders WHERE id = 42"), V, DELETED + ["sql_identifier_matches"]),
    ("Deleted order 42", rows("DELETE FROM orders USING customers WHERE id = 42"), I,
     DELETED + ["sql_identifier_unchecked"]),
    ("Counted the orders of customer 7", {"before_count": 4, "after_count": 4,
                                          "operation": "SELECT count(*) FROM orders WHERE customer_id = 7"}, V,
     ["sql_kind_matches", "row_delta_matches", "sql_identifier_matches"]),
    ("Inserted user 42", {"before_count": 1, "after_count": 2, "affected_rows": 1,
                          "operation": "INSERT INTO users (id) VALUES (42)"}, I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    # negated and reversed claims
    ("Rolled back the deletion of user 42", rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_negated", "sql_identifier_matches"]),
    ("No user was deleted", rows("DELETE FROM users WHERE id = 42"), I, ["claim_negated"]),
    ("No rows were deleted for user 42", rows("DELETE FROM sessions WHERE user_id = 42"), I,
     ["claim_negated", "sql_identifier_matches"]),
    ("Did not delete user 42", rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_negated", "sql_identifier_matches"]),
    ("Skipped deleting user 42", rows("DELETE FROM users WHERE id = 42"), I, ["claim_negated", "sql_identifier_matches"]),
    ("Skipped the deletion of user 42", rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_negated", "sql_identifier_matches"]),
    ("Skipped: deleted user 42 instead", rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_negated", "sql_kind_matches", "row_delta_matches", "affected_rows_consistent",
      "sql_identifier_matches"]),
]
D_CHECK_PW = one_file("auth.py", " def login(user):", "-    check_password(user)", "+    check_password(user)",
                      "     return True")
D_CHECK_PW_TWICE = one_file("auth.py", "-    check_password(user)", "-    check_password(admin)",
                            "+    check_password(user)", "     return True")
D_CHECK_PW_GONE = one_file("auth.py", " def login(user):", "-    check_password(user)", "     return True")
D_CHECK_PW_COMMENTED = one_file("auth.py", "-    check_password(user)", "+    # check_password(user)", "     x")
D_CHECK_PW_MOVED = (one_file("auth.py", "-    check_password(user)", "     x")
                    + one_file("login.py", "+    check_password(user)", "     x"))
D_TODO_ONLY = one_file("src/api.py", " def handle(request):", "+    # TODO: rate limiting is not implemented yet",
                       "     return respond(request)")
D_LIMITER = one_file("src/api.py", " def handle(request):", "+    limiter = RateLimiter(max_calls=10)",
                     "     return respond(request)")
TABLE_CODE_DIFF = [
    # a removal is a removal: removed and added back is no removal
    ("Removed `check_password` from auth.py", D_CHECK_PW, C,
     ["path_in_diff", "identifier_restored", "action_matches_lines"]),
    ("Removed the `check_password` call from auth.py", D_CHECK_PW, C,
     ["path_in_diff", "identifier_restored", "action_matches_lines"]),
    ("Removed `check_password`", D_CHECK_PW, C, ["identifier_restored", "action_matches_lines"]),
    ("Deleted the check_password call in auth.py", D_CHECK_PW, C,
     ["path_in_diff", "identifier_restored", "action_matches_lines"]),
    ("Removed `check_password` from auth.py", D_CHECK_PW_TWICE, I,
     ["path_in_diff", "identifier_still_present", "action_matches_lines"]),
    ("Removed `check_password` from auth.py", D_CHECK_PW_GONE, V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Removed `check_password` from auth.py", D_CHECK_PW_COMMENTED, V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Removed `check_password` from auth.py", D_CHECK_PW_MOVED, I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "unnamed_files_changed"]),
    ("Removed `check_password`", D_CHECK_PW_MOVED, V, ["identifier_in_changed_lines", "action_matches_lines"]),
    ("Replaced `check_password` in auth.py", D_CHECK_PW, V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `retry_on_timeout` to src/net.py",
     one_file("src/net.py", " x", "+def retry_on_timeout(call):", "+    return call()"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `retry_on_timeout` to src/net.py", one_file("src/net.py", " x", "+    # retry_on_timeout(call)"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `retry_on_timeout` to src/net.py", one_file("src/net.py", " x", "-retry_on_timeout = None"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_mismatch_lines"]),
    ("Removed `legacy_login` from src/auth.py",
     one_file("src/auth.py", "-def legacy_login(user):", "-    return True", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Removed `legacy_login` from src/auth.py",
     one_file("src/auth.py", "-def legacy_login(user):", "+def legacy_login(user, strict=False):", " x"), C,
     ["path_in_diff", "identifier_restored", "action_matches_lines"]),
    ("Removed `legacy_login` and `old_hash` from src/auth.py",
     one_file("src/auth.py", "-legacy_login()", "-old_hash()", "+old_hash()", " x"), C,
     ["path_in_diff", "identifier_restored", "action_matches_lines"]),
    ("Removed the TODO about `legacy_login` from src/auth.py",
     one_file("src/auth.py", "-# TODO: drop legacy_login", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added validation of `order.total` to src/orders.py",
     one_file("src/orders.py", " def save(order):", "+    if order.total < 0:", "+        raise ValueError()"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added validation of `order.total` to src/orders.py",
     one_file("src/orders.py", " def save(order):", '+    """Checks order.total."""', "+    pass"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    # comments, blank lines, docstrings and placeholders are not code
    ("Added rate limiting to src/api.py", D_TODO_ONLY, I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added rate limiting to src/api.py", D_LIMITER, V, PATH_ACTION),
    ("Implemented rate limiting in src/api.py", D_LIMITER, V, PATH_ACTION),
    ("Added rate limiting to src/api.py",
     one_file("src/api.py", " def handle(request):", "+    pass  # TODO rate limiting"), I,
     ["path_in_diff", "content_words_absent", "action_matches_lines"]),
    ("Added rate limiting to src/api.py",
     one_file("src/api.py", " def handle(request):", '+    raise NotImplementedError("rate limiting")'), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added rate limiting to src/api.py", one_file("src/api.py", " x", '+    """Rate limiting for the API."""'), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added rate limiting to src/api.py",
     one_file("src/api.py", " def handle(request):", '+    """', "+    Rate limiting: every caller gets 10 calls.",
              '+    """'), I, ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added rate limiting to src/api.js",
     one_file("src/api.js", " function handle(req) {", "+  /* rate limiting", "+   * comes later", "+   */"), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added rate limiting to src/api.js", one_file("src/api.js", " x", "+  // rate limiting goes here", "+"), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added rate limiting to db/schema.sql", one_file("db/schema.sql", " x", "+-- rate limiting table"), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added `rate_limit` to src/api.py", one_file("src/api.py", " x", "+# rate_limit = 10"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `rate_limit` to src/api.py", one_file("src/api.py", " x", "+rate_limit = 10  # per minute"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/api.py", one_file("src/api.py", " x", "+rate_limit = 10  # TODO tune"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/api.py", one_file("src/api.py", " x", "+x = 1  # TODO rate_limit"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `MAX_RETRIES` to src/config.h", one_file("src/config.h", " x", "+#define MAX_RETRIES 5"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added a null check for `user.email` to src/user.py",
     one_file("src/user.py", " x", "+    # if user.email is None: raise"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `helpers` to src/app.py", one_file("src/app.py", " x", "+# import helpers"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `Debug` to src/lib.rs", one_file("src/lib.rs", " x", "+#[derive(Debug)]"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `todo_list` to src/app.py", one_file("src/app.py", " x", "+todo_list = []"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added a check of `user.email` to src/user.py",
     one_file("src/user.py", " x", "+    if not self.user.email.strip():"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added a usage section to README.md", one_file("README.md", " x", "+## Usage", "+Run `make test`."), V,
     PATH_ACTION),
    ("Added rate limiting docs to README.md", one_file("README.md", " x", "+TODO: document rate limiting"), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Added blank lines to src/api.py", one_file("src/api.py", " x", "+", "+   "), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Fixed the typo in src/api.py", one_file("src/api.py", "-# teh value", "+# the value", " x"), I,
     ["path_in_diff", "content_words_absent", "changed_lines_not_code"]),
    ("Fixed the timeout in src/api.py", one_file("src/api.py", "-timeout = 5", "+timeout = 30", " x"), V,
     PATH_ACTION),
    ("Updated the comment in src/api.py", one_file("src/api.py", "-# teh value", "+# the value", " x"), I,
     ["path_in_diff", "content_words_absent", "action_matches_lines"]),
    # negated and reversed actions are not adds: added lines cannot verify them
    ("Skipped adding rate limiting to src/api.py", D_LIMITER, I, PATH_ACTION + ["claim_negated"]),
    ("Reverted the change that added rate limiting to src/api.py", D_LIMITER, I, PATH_ACTION + ["claim_negated"]),
    ("Rolled back rate limiting in src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Backed out the rate limiter in src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Undid the rate limiter in src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Did not add rate limiting to src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Didn't add rate limiting to src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Never implemented rate limiting in src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Did not actually add rate limiting to src/api.py", D_LIMITER, I, ["path_in_diff", "claim_negated"]),
    ("Added rate limiting to src/api.py without changing the API", D_LIMITER, V, PATH_ACTION),
    ("Added an undo button to src/ui.py", one_file("src/ui.py", " x", "+undo_button = Button('undo')"), V,
     PATH_ACTION),
    ("Added undo support to src/ui.py", one_file("src/ui.py", " x", "+undo_stack = []"), I,
     PATH_ACTION + ["claim_negated"]),
    ("Did not remove `auth_check` from app.py", D_AUTH, I,
     ["path_in_diff", "identifier_in_changed_lines", "claim_negated"]),
    ("Reverted `rate_limit` in src/user.py", D_RATE_RM, I,
     ["path_in_diff", "identifier_in_changed_lines", "claim_negated"]),
]
TABLE_API_CALL = [
    # text bodies are read with their negation
    ("Sent the email", api("The email was not sent."), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Message could not be delivered"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("The message wasn\u2019t delivered"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("The message wasn't delivered"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Never sent: the address is invalid"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("No message was sent"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Nothing sent"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Delivery failed: mailbox full"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Not sent: quota exceeded"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Unable to send the message"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Message rejected by the server"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Email sent. Later it bounced."), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Sending refused"), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api("Email sent"), V, SENT),
    ("Sent the email", api("Your message was sent successfully."), V, SENT),
    ("Sent the email", api("Sent with no errors"), V, SENT),
    ("Sent the email", api("sent: 12, failed: 0"), V, SENT),
    ("Sent the email", api("0 failed; all delivered"), V, SENT),
    ("Sent the email", api("Not only queued: it was sent."), V, SENT),
    ("Sent the email", api("It was not queued. It was sent."), V, SENT),
    ("Sent the email", api("Message queued"), I, ["status_matches_claim"]),
    ("Sent the email", api("Message queued", 503), C, ["status_failure"]),
    ("The email could not be sent", api("Message could not be delivered", 500), V, SENT),
    ("The email was not sent", api("Email sent"), C, ["status_contradicts_failure_claim", "body_contradicts_failure_claim"]),
    # JSON bodies are read at every depth and in lists
    ("Sent the email", api({"data": {"status": "failed"}}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"data": {"results": [{"status": "ok"}, {"status": "error"}]}}), C,
     ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"data": {"errors": ["quota"]}}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"data": {"errors": {"to": "invalid"}}}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"data": {"error": {"code": 5}}}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"data": {"ok": False}}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api([{"success": True}, {"success": False}]), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"results": [{"status": 201}, {"status": 400}]}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"Result": {"State": "Bounced"}}), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api('{"data": {"status": "failed"}}'), C, ["status_matches_claim", "body_failure"]),
    ("Sent the email", api({"data": {"message": "status: failed"}}), I, ["status_matches_claim"]),
    ("Sent the email", api({"data": {"status": "sent", "error": None, "errors": []}}), V, SENT),
    ("Sent the email", api({"data": {"error": "", "errors": 0, "status": "delivered"}}), V, SENT),
    ("Sent the email", api({"data": {"error": False, "ok": True}}), V, SENT),
    ("Sent the email", api([{"status": "sent"}, {"status": "sent"}]), V, SENT),
    ("Sent the email", api({"results": [{"status": 202}]}), I, ["status_matches_claim"]),
    ("Sent the email", api({"data": {"sent": True, "bounced": False}}), I, ["status_matches_claim"]),
    ("The payment failed", api({"data": {"status": "declined"}}, 402), V, SENT),
    ("The payment failed", api({"data": {"status": "succeeded"}}), C,
     ["status_contradicts_failure_claim", "body_contradicts_failure_claim"]),
    ("Posted the invoice to https://billing.example.com/invoices", api({"status": "created"}, 201,
                                                                      {"url": "https://billing.example.com/invoices"}),
     V, ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Posted the invoice to https://billing.example.com/invoices", api({"status": "created"}, 201,
                                                                      {"url": "https://evil.example.com/invoices"}),
     C, ["status_matches_claim", "body_matches_claim", "target_mismatch"]),
    ("Sent the receipt to ann@example.com", api("Queued for delivery; not yet sent", 202, {"to": "ann@example.com"}),
     C, ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent the receipt to ann@example.com", api({"message": {"status": "sent"}}, 200, {"to": "ann@example.com"}),
     V, ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Sent the receipt to ann@example.com", api({"results": [{"to": "ann@example.com", "status": "rejected"}]}, 200,
                                                {"to": "ann@example.com"}),
     C, ["status_matches_claim", "body_failure", "target_matches"]),
    ("Created order 42 successfully", api({"data": {"order": {"id": 42, "state": "failed"}}}, 201,
                                         {"order_id": 42}), C, ["status_matches_claim", "body_failure", "target_matches"]),
    ("Created order 42 successfully", api({"data": {"order": {"id": 42, "state": "created"}}}, 201,
                                         {"order_id": 42}), V,
     ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Message delivered", api("Delivered, though 2 recipients bounced"), C, ["status_matches_claim", "body_failure"]),
    ("Message delivered", api("Delivered to 2 recipients"), V, SENT),
    ("Message delivered", api("Delivered: no bounces, no errors"), V, SENT),
    # targets
    ("Charged customers 77 and 78", api({"ok": True}, 200, {"url": "https://x.io/customers/77/charges",
                                                            "ids": "78"}), C, ["target_mismatch"]),
    ("Charged customer 77 successfully", api({"ok": True}, 200, {"url": "https://x.io/customers/77/charges"}), V,
     ["status_matches_claim", "body_matches_claim", "target_matches"]),
]
TABLE_GENERIC = [
    # outcome counters: a claimed pass, success or completion against failures counted anywhere
    ("Tests passed for build_4411 on runner_a7 at commit_9f3",
     {"build": "build_4411", "runner": "runner_a7", "commit": "commit_9f3", "tests": {"failed": 12, "passed": 0}}, C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3",
     {"build": "build_4411", "runner": "runner_a7", "commit": "commit_9f3", "tests": {"failed": 0, "passed": 12}}, V,
     ["entities_match"]),
    ("Smoke tests passed on staging_eu for release_4_2 with ticket_881",
     {"env": "staging_eu", "release": "release_4_2", "ticket": "ticket_881", "results": {"summary": {"failed": 4}}},
     C, ["entities_match", "outcome_conflict"]),
    ("Smoke tests passed on staging_eu for release_4_2 with ticket_881",
     {"env": "staging_eu", "release": "release_4_2", "ticket": "ticket_881", "results": {"summary": {"failed": 0}}},
     V, ["entities_match"]),
    ("Lint succeeded", {"lint": {"warnings": 3, "errors": 0}, "status": "ok"}, I, ["outcome_matches"]),
    ("Lint succeeded", {"lint": {"warnings": 3, "errors": 2}, "status": "ok"}, C, ["outcome_conflict"]),
    ("Lint failed", {"lint": {"errors": 2}}, I, ["outcome_matches"]),
    ("The sync completed", {"synced": 120, "failed": 0, "state": "done"}, I, ["no_signal"]),
    ("The sync completed", {"synced": 120, "failures": [], "state": "done"}, I, ["no_signal"]),
    ("status is ok", {"status": "ok", "errors": 3}, C, ["explicit_value_match", "outcome_conflict"]),
    ("Tests passed", {"summary": {"failures": 2, "tests": 40}}, C, ["outcome_conflict"]),
    ("Tests passed", {"counts": {"failing": 1}}, C, ["outcome_conflict"]),
    ("Build succeeded", {"counts": {"errors": 1}}, C, ["outcome_conflict"]),
    ("Build succeeded", {"steps": [{"error_count": 0}, {"error_count": 3}]}, C, ["outcome_conflict"]),
    ("Build succeeded", {"failed_count": "3"}, C, ["outcome_conflict"]),
    ("Migration completed", {"summary": {"failed": True}}, C, ["outcome_conflict"]),
    ("Migration completed", {"errors": ["table locked"]}, C, ["outcome_conflict"]),
    ("All checks passed", {"passed": 0, "total": 12}, C, ["outcome_conflict"]),
    ("All checks passed", {"suite": {"passed": 0, "skipped": 1, "tests": 5}}, C, ["outcome_conflict"]),
    ("All checks passed", {"a": {"passed": 0, "total": 0}, "b": {"passed": 5, "total": 5}}, I, ["no_signal"]),
    ("All checks passed", {"passed": 12, "total": 12}, I, ["no_signal"]),
    ("Build succeeded", {"counts": {"errors": 0, "warnings": 3}}, I, ["no_signal"]),
    ("Build succeeded", {"errors": []}, I, ["no_signal"]),
    ("Build succeeded", {"status": "success", "failed": 0}, I, ["outcome_matches"]),
    ("Build succeeded", {"status": "success", "failed": 2}, C, ["outcome_conflict"]),
    ("The tests failed", {"failed": 3}, I, ["outcome_matches"]),
    ("The tests did not pass", {"failed": 3}, I, ["outcome_matches", "claim_negated"]),
    ("The nightly job ran", {"errors": 2}, I, ["evidence_reports_failure"]),
    ("Backup of 3 databases completed in 2 minutes with 0 errors",
     {"status": "ok", "databases": 3, "minutes": 2, "errors": 0}, I, ["outcome_matches"]),
    ("Deployed build_77 to prod_eu from commit_ab12 successfully",
     {"build": "build_77", "target": "prod_eu", "commit": "commit_ab12", "report": {"failed": 1}}, C,
     ["entities_match", "outcome_conflict"]),
    ("Deployed build_77 to prod_eu from commit_ab12 successfully",
     {"build": "build_77", "target": "prod_eu", "commit": "commit_ab12", "report": {"failed": 0}}, V,
     ["entities_match"]),
    ("Copied orders_2024 to backup_2024 via job_12", {"src": "orders_2024", "dst": "backup_2024",
                                                      "job": "job_12"}, V, ["entities_match"]),
    ("Copied orders_2024 to backup_2024 via job_12 successfully",
     {"src": "orders_2024", "dst": "backup_2024", "job": "job_12", "status": "failed"}, C,
     ["entities_match", "outcome_conflict"]),
]
TABLE_FILE_OP = [
    ("Skipped deleting tmp.txt", {"path": "tmp.txt", "exists_before": True, "exists_after": False}, I,
     ["claim_negated", "path_matches"]),
    ("Reverted: deleted tmp.txt", {"path": "tmp.txt", "exists_before": True, "exists_after": False}, I,
     ["claim_negated", "path_matches", "existence_matches"]),
    ("Rolled back the creation of notes.md", {"path": "notes.md", "exists_before": False, "exists_after": True}, I,
     ["claim_negated", "path_matches"]),
    ("Did not overwrite app.cfg", {"path": "app.cfg", "exists_before": True, "exists_after": True}, I,
     ["claim_negated", "path_matches"]),
    ("Overwrote app.cfg with 12 lines", {"path": "etc/app.cfg", "exists_before": True, "exists_after": True,
                                         "line_count": 12}, V, ["path_matches", "existence_matches", "line_count_matches"]),
    ("Wrote 60 lines to out.txt", {"path": "out.txt", "exists_before": False, "exists_after": True, "line_count": 55},
     I, ["path_matches", "existence_matches", "line_count_off"]),
    ("Wrote 200 lines to out.txt", {"path": "out.txt", "exists_before": False, "exists_after": True,
                                    "line_count": 100}, C, ["path_matches", "existence_matches", "line_count_mismatch"]),
    ("Saved 2 KiB to out.bin", {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 2048}, V,
     ["path_matches", "existence_matches", "size_matches"]),
    ("Saved 0 bytes to out.bin", {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 0}, V,
     ["path_matches", "existence_matches", "size_matches"]),
    ("Saved 5 bytes to out.bin", {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 0}, C,
     ["path_matches", "existence_matches", "size_mismatch"]),
    ("Moved a.txt to b.txt", {"path": "a.txt", "new_path": "b.txt", "exists_before": True, "exists_after": True}, V,
     ["path_matches", "existence_matches"]),
    ("Moved a.txt to b.txt", {"path": "a.txt", "new_path": "b.txt", "exists_before": True, "exists_after": False}, C,
     ["path_matches", "end_state_mismatch"]),
    ("Deleted ./tmp/x.log", {"path": "/srv/tmp/x.log", "exists_before": True, "exists_after": False}, V,
     ["path_matches", "existence_matches"]),
    ("Deleted x.log", {"path": "/srv/tmp/ax.log", "exists_before": True, "exists_after": False}, C,
     ["path_mismatch", "existence_matches"]),
    ("Deleted tmp.txt", {"path": "tmp.txt", "exists_before": True, "exists_after": False}, V,
     ["path_matches", "existence_matches"]),
    ("Created report.txt and did not delete cache.db", {"path": "report.txt", "exists_before": False,
                                                        "exists_after": True}, C, ["path_mismatch", "existence_matches"]),
    ("Created report.txt without deleting anything", {"path": "report.txt", "exists_before": False,
                                                      "exists_after": True}, V, ["path_matches", "existence_matches"]),
]
CHECK_TABLES = {"code_diff": TABLE_CODE_DIFF, "db_op": TABLE_DB_OP, "file_op": TABLE_FILE_OP, "api_call": TABLE_API_CALL,
                "generic": TABLE_GENERIC}

# ---------------------------------------------------------------------------------------------------
# The red team's false `verified` answers after the rebuild, and 100 more tricks of the same classes and new ones
# (tense, quantifiers, units, ids in URLs, look-alike characters, paths with '..', case, test files), each beside
# honest rows that must keep their answer. (claim, evidence, verdict, reason codes in order), as CHECK_TABLES.
# ---------------------------------------------------------------------------------------------------
BUILD = {"build": "build_4411", "runner": "runner_a7", "commit": "commit_9f3"}  # three entities a generic claim names

REDTEAM_CODE_DIFF = [
    ("Added rateLimit to src/user.py", one_file("src/user.py", "+    rateLimit(user)", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added rateLimit to src/user.py", one_file("src/user.py", "+    limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Will add `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Going to add `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Plan to add `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Attempted to add `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Tried to add `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("I will fix `parse_header` in lib/http.py",
     one_file("lib/http.py", "-    parse_header(x)", "+    parse_header(x, strict=True)"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("We are going to remove `legacy_auth` from app.py", one_file("app.py", "-legacy_auth()", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Trying to add `validate_email` to app.py", one_file("app.py", "+validate_email(x)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Should add `validate_email` to app.py", one_file("app.py", "+validate_email(x)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("About to add `validate_email` to app.py", one_file("app.py", "+validate_email(x)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "claim_not_done"]),
    ("Added `rate_limit` to src/user.js", one_file("src/user.js", "+  go(); // rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.js", one_file("src/user.js", "+  go(); /* rate_limit(user) */", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.go", one_file("src/user.go", "+\tgo() // rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to db/user.sql", one_file("db/user.sql", "+SELECT 1; -- rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.rb", one_file("src/user.rb", "+  go # rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    x = 1  # rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit = None  # TODO", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py",
     one_file("src/user.py", "+    def rate_limit(): raise NotImplementedError", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `rate_limit` to src/user.rs", one_file("src/user.rs", "+    fn rate_limit() { todo!() }", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `rate_limit` to src/user.rs",
     one_file("src/user.rs", "+    fn rate_limit() { unimplemented!() }", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "changed_lines_not_code"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit = 'XXX'", " x"), I,
     ['path_in_diff', 'identifier_not_in_changed_lines', 'changed_lines_not_code']),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    pass  # FIXME: rate_limit", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added rate limiting to src/user.py", one_file("src/user.py", "+    pass  # rate limiting here", " x"), I,
     ["path_in_diff", "content_words_absent", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py",
     one_file("src/user.py", "+    print('rate_limit: not implemented')", " x"), I,
     ['path_in_diff', 'identifier_not_in_changed_lines', 'changed_lines_not_code']),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_l\u0456mit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/us\u0435r.py", "+    rate_limit(user)", " x"), C,
     ["path_not_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/../src/user.py", "+    rate_limit(user)", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("evil/../src/user.py", "+    rate_limit(user)", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/User.py", "+    rate_limit(user)", " x"), C,
     ["path_not_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    RATE_LIMIT(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    Rate_Limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py.orig", "+    rate_limit(user)", " x"), C,
     ["path_not_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.pyc", "+    rate_limit(user)", " x"), C,
     ["path_not_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py",
     one_file("src/user.py", *[" x", "+    pass"]) + one_file("tests/test_user.py", *["+    rate_limit(user)",
      " x"]), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines", "unnamed_files_changed"]),
    ("Added `rate_limit`", one_file("tests/test_user.py", "+    rate_limit(user)", " x"), I,
     ["identifier_in_changed_lines", "action_matches_lines", "changes_only_in_tests"]),
    ("Added `rate_limit` to user.py", one_file("tests/user.py", "+    rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "changes_only_in_tests"]),
    ("Removed `check_password` from auth.py",
     one_file("auth.py", *["-    check_password(user)", " x"]) + one_file("auth2.py",
      *["+    check_password(user)", " x"]), I,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines", "unnamed_files_changed"]),
    ("Removed `check_password` from auth.py",
     one_file("auth.py", "-    check_password(user)", "+    getattr(m, 'check_password')(user)"), C,
     ['path_in_diff', 'identifier_restored', 'action_matches_lines']),
    ("Removed `check_password` from auth.py",
     one_file("auth.py", "-    check_password(user)", "+    m.check_password(user)"), C,
     ["path_in_diff", "identifier_restored", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)  # see #12", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.js", one_file("src/user.js", "+  rate_limit(user); // 10/s", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py",
     one_file("src/user.py", "+    url = 'http://x#a'; rate_limit(user)", " x"), V,
     ['path_in_diff', 'identifier_in_changed_lines', 'action_matches_lines']),
    ("Added `rate_limit` to src/user.js", one_file("src/user.js", "+  fetch('http://x/'); rate_limit(u);", " x"), V,
     ['path_in_diff', 'identifier_in_changed_lines', 'action_matches_lines']),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    rate_limit(user)", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Removed `check_password` from auth.py", one_file("auth.py", "-    check_password(user)  # TODO drop", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` and will add tests later to src/user.py",
     one_file("src/user.py", "+    rate_limit(user)", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    pass  # rate_limit(user)", " x"), I,
     ["path_in_diff", "identifier_not_in_changed_lines", "action_matches_lines"]),
    ("Added `rate_limit` to src/user.py", one_file("src/user.py", "+    log('rate_limit not implemented')", " x"), I,
     ['path_in_diff', 'identifier_not_in_changed_lines', 'changed_lines_not_code']),
    ("Added `rate_limit` to src/user.py",
     one_file("src/user.py", "+    rate_limit(user)  # TODO: tune the limit", " x"), V,
     ["path_in_diff", "identifier_in_changed_lines", "action_matches_lines"]),
    ("Added tests for `rate_limit`", one_file("tests/test_user.py", "+    assert rate_limit(user)", " x"), V,
     ["identifier_in_changed_lines", "action_matches_lines"]),
]
REDTEAM_DB_OP = [
    ("Will delete user 42",
     rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_not_done", "sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Going to delete user 42",
     rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_not_done", "sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Tried to delete user 42",
     rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_not_done", "sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Attempted to delete user 42",
     rows("DELETE FROM users WHERE id = 42"), I,
     ["claim_not_done", "sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Plan to delete 10 stale sessions", rows("DELETE FROM sessions WHERE last_seen < '2024-01-01'", 10, 20, 10), I,
     ['claim_not_done', 'sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent', 'count_matches']),
    ("Deleted the cache entry", rows("DELETE FROM users WHERE id=42"), I,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted the cache entry", {"affected_rows": 1, "operation": "DELETE FROM users WHERE id=42"}, I,
     ["sql_kind_matches", "sql_table_mismatch"]),
    ("Deleted 10 stale sessions", rows("DELETE FROM users WHERE last_seen < '2024-01-01'", 10, 20, 10), I,
     ['sql_kind_matches', 'sql_table_mismatch', 'row_delta_matches', 'affected_rows_consistent', 'count_matches']),
    ("Deleted the expired tokens", rows("DELETE FROM users WHERE id=42"), I,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted user 42's sessions",
     rows("DELETE FROM users WHERE id = 42"), I,
     ['sql_kind_matches', 'sql_table_mismatch', 'row_delta_matches', 'affected_rows_consistent',
      'sql_identifier_matches']),
    ("Deleted the audit log entry", rows("DELETE FROM payments WHERE id = 7"), I,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted all users", rows("DELETE FROM users WHERE id = 42"), I,
     ["sql_kind_matches", "sql_where_narrower_than_claim", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted every user", rows("DELETE FROM users WHERE id = 42"), I,
     ["sql_kind_matches", "sql_where_narrower_than_claim", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted user 42",
     rows("WITH x AS (DELETE FROM users RETURNING *) DELETE FROM users WHERE id = 42"), I,
     ["sql_kind_matches", "sql_multiple_statements", "row_delta_matches", "affected_rows_consistent",
      "sql_identifier_unchecked"]),
    ("Deleted user 42",
     rows("WITH x AS (UPDATE users SET a = 1 RETURNING id) DELETE FROM users WHERE id = 42"), I,
     ["sql_kind_matches", "sql_multiple_statements", "row_delta_matches", "affected_rows_consistent",
      "sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND x = y"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND id = 43"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE (id = 42) AND users.id IN (42, 43)"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND tenant_id = 7 AND id <> 43"), V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Deleted users 42 and 43", rows("DELETE FROM users WHERE id IN (42, 43) AND tenant_id = 7", 2, 10, 8), V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    # a statement of more than one table: a pin confirms no id (the rows written may be another table's)
    ("Deleted user 42", rows("DELETE FROM users USING users u2 WHERE users.id = 42"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE u, s FROM users u JOIN sessions s ON s.user_id = u.id WHERE u.id = 42"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE u FROM users u JOIN x ON 1=1 WHERE u.id = 7"), C,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_mismatch"]),
    ("Deleted user 42", rows("DELETE FROM users AS u WHERE u.id = 42"), V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND x = \"y\""), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42 AND a.b = c.d"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = '4' '2'"), I,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent', 'where_not_plain']),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42.9"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42e0"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = +42"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id >= 42"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id <> 41"), C,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_mismatch"]),
    ("Deleted user 42",
     rows("DELETE FROM us\u0435rs WHERE id = 42"), I,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent",
      "sql_identifier_unchecked"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE \u0456d = 42"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = \uff14\uff12"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42", 1, 10, 10), I,
     ["sql_kind_matches", "row_delta_mismatch", "affected_rows_mismatch", "sql_identifier_matches"]),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42", 1, 10, 11), I,
     ["sql_kind_matches", "row_delta_mismatch", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Deleted user 42", {"affected_rows": 1, "operation": "DELETE FROM users"}, I,
     ["sql_kind_matches", "sql_identifier_unchecked"]),
    ("Deleted user 42", {"affected_rows": 1, "operation": "TRUNCATE users"}, I,
     ["sql_kind_matches", "sql_identifier_unchecked"]),
    ("Updated user 42's email",
     rows("UPDATE users SET email = 'x', role = 'admin' WHERE id = 42", 1, 10, 10), I,
     ['sql_kind_matches', 'sql_sets_unclaimed_columns', 'row_delta_matches', 'affected_rows_consistent',
      'sql_identifier_matches']),
    ("Updated the email of user 42",
     rows("UPDATE accounts SET plan = 'x' WHERE id = 42", 1, 10, 10), C,
     ['sql_kind_matches', 'sql_table_mismatch', 'row_delta_matches', 'affected_rows_consistent',
      'sql_identifier_mismatch']),
    ("Deleted 2 KB of sessions", rows("DELETE FROM sessions", 2, 10, 8), I,
     ["sql_kind_matches", "sql_table_mismatch", "row_delta_matches", "affected_rows_consistent", "count_matches"]),
    ("Deleted order 42", rows("DELETE FROM orders WHERE id = 42 /* ok */"), I,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "where_not_plain"]),
    ("Deleted the user", rows("DELETE FROM users WHERE id=42"), V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted the cache entry", rows("DELETE FROM cache_entries WHERE key = 'a'"), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent']),
    ("Deleted the cache entry", rows("DELETE FROM cache WHERE key = 'a'"), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent']),
    ("Deleted user 42's sessions", rows("DELETE FROM sessions WHERE user_id = 42", 3, 10, 7), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent', 'sql_identifier_matches']),
    ("Updated the email of user 42", rows("UPDATE users SET email = 'a@b.c' WHERE id = 42", 1, 10, 10), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent', 'sql_identifier_matches']),
    ("Deleted 10 stale sessions", rows("DELETE FROM user_sessions WHERE last_seen < '2024-01-01'", 10, 20, 10), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent', 'count_matches']),
    ("Deleted user 42", rows("DELETE FROM users WHERE id = 42"), V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent", "sql_identifier_matches"]),
    ("Inserted a new order", rows("INSERT INTO orders (id) VALUES (5)", 1, 9, 10), V,
     ["sql_kind_matches", "row_delta_matches", "affected_rows_consistent"]),
    ("Deleted user 42", {"affected_rows": 1, "operation": "DELETE FROM users WHERE id = 42 AND x = y"}, I,
     ["sql_kind_matches", "where_not_plain"]),
    ("Deleted the cache entry", {"affected_rows": 1, "operation": "DELETE FROM users WHERE id=42"}, I,
     ["sql_kind_matches", "sql_table_mismatch"]),
    ("Deleted the user", {"affected_rows": 1, "operation": "DELETE FROM users WHERE id=42"}, I,
     ["sql_kind_matches"]),
    ("Updated user 42's email", rows("UPDATE users SET email = 'x', updated_at = now() WHERE id = 42", 1, 10, 10), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent', 'sql_identifier_matches']),
    ("Deleted all expired sessions", rows("DELETE FROM sessions WHERE expires_at < '2024-01-01'", 4, 10, 6), V,
     ['sql_kind_matches', 'row_delta_matches', 'affected_rows_consistent']),
]
REDTEAM_API_CALL = [
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com", "bcc": "eve@x.com"}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com", "cc": ["eve@x.com"]}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com",
     api({"status": "sent"}, 200, {"personalizations": [{"to": [{"email": "bob@x.com"}],
      "bcc": [{"email": "eve@x.com"}]}]}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com, eve@x.com"}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "BOB@X.COM", "Bcc": "eve@x.com"}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"recipients": ["bob@x.com", "eve@evil.com"]}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com\u200b"}), I,
     ["status_matches_claim", "body_matches_claim", "target_not_in_request"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.c\u043em"}), C,
     ["status_matches_claim", "body_matches_claim", "target_mismatch"]),
    ("Charged customer 78 $5",
     api({"ok": True}, 200, {"customer_id": 78, "url": "https://api.x.com/customers/79/charge"}), I,
     ["target_matches", "target_not_claimed"]),
    ("Charged customer 78",
     api({"ok": True}, 200, {"url": "https://api.x.com/customers/78/charge", "customer_id": 79}), I,
     ["target_matches", "target_not_claimed"]),
    ("Charged customer 78", api({"ok": True}, 200, {"url": "https://api.x.com/customers/78/charge?customer=79"}), I,
     ["target_matches"]),
    ("Charged customer 78", api({"ok": True}, 200, {"url": "https://api.x.com/customers/078/charge"}), C,
     ["target_mismatch"]),
    ("Posted to https://hooks.x.com/a",
     api({"ok": True}, 200, {"url": ["https://hooks.x.com/a", "https://evil.com/a"]}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Posted to https://hooks.x.com/a",
     api({"ok": True}, 200, {"url": "https://hooks.x.com/a", "endpoint": "https://evil.com/a"}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Will send the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com"}), I,
     ["target_matches"]),
    ("Tried to send the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com"}), I,
     ["target_matches"]),
    ("Sent the email to bob@x.com", api("Sent 0 emails", 200, {"to": "bob@x.com"}), C,
     ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent the email to bob@x.com", api({"sent": 0, "status": "ok"}, 200, {"to": "bob@x.com"}), C,
     ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent the email to bob@x.com", api({"status": "ok", "failed": ["bob@x.com"]}, 200, {"to": "bob@x.com"}), C,
     ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent the email to bob@x.com", api({"status": "ok", "rejected": ["bob@x.com"]}, 200, {"to": "bob@x.com"}), C,
     ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent the email to bob@x.com", api({"status": "ok", "bounced": 1}, 200, {"to": "bob@x.com"}), C,
     ["status_matches_claim", "body_failure", "target_matches"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": "bob@x.com", "from": "alice@x.com"}), V,
     ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Sent the email to bob@x.com and eve@x.com",
     api({"status": "sent"}, 200, {"to": "bob@x.com", "cc": "eve@x.com"}), V,
     ["status_matches_claim", "body_matches_claim", "target_matches"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": ["bob@x.com", "eve@x.com"]}), I,
     ["status_matches_claim", "body_matches_claim", "target_matches", "target_not_claimed"]),
    ("Sent the email to bob@x.com", api({"status": "sent"}, 200, {"to": ["bob@x.com"], "bcc": []}), V,
     ["status_matches_claim", "body_matches_claim", "target_matches"]),
]
REDTEAM_FILE_OP = [
    ("Will create report.txt", {"path": "/tmp/report.txt", "exists_before": False, "exists_after": True}, I,
     ["claim_not_done", "path_matches", "existence_matches"]),
    ("Tried to delete /tmp/report.txt", {"path": "/tmp/report.txt", "exists_before": True, "exists_after": False}, I,
     ["claim_not_done", "path_matches", "existence_matches"]),
    ("Created report.txt", {"path": "/tmp/rep\u043ert.txt", "exists_before": False, "exists_after": True}, C,
     ["path_mismatch", "existence_matches"]),
    ("Created /tmp/report.txt", {"path": "/tmp/../etc/report.txt", "exists_before": False, "exists_after": True}, C,
     ["path_mismatch", "existence_matches"]),
    ("Created /tmp/report.txt", {"path": "/tmp/Report.txt", "exists_before": False, "exists_after": True}, C,
     ["path_mismatch", "existence_matches"]),
    ("Wrote 2 MB to out.bin",
     {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 2000}, C,
     ["path_matches", "existence_matches", "size_mismatch"]),
    ("Wrote 2 MiB to out.bin",
     {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 2000000}, I,
     ["path_matches", "existence_matches", "size_off"]),
    ("Wrote 2 KB to out.bin",
     {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 2048000}, C,
     ["path_matches", "existence_matches", "size_mismatch"]),
    ("Wrote 100 lines to out.txt",
     {"path": "out.txt", "exists_before": False, "exists_after": True, "line_count": 100000}, C,
     ["path_matches", "existence_matches", "line_count_mismatch"]),
    ("Wrote 1,000 lines to out.txt",
     {"path": "out.txt", "exists_before": False, "exists_after": True, "line_count": 1}, C,
     ["path_matches", "existence_matches", "line_count_mismatch"]),
    ("Wrote 1.5 KB to out.bin",
     {"path": "out.bin", "exists_before": False, "exists_after": True, "size_bytes": 15}, C,
     ["path_matches", "existence_matches", "size_mismatch"]),
    ("Moved a.txt to b.txt",
     {"path": "a.txt", "new_path": "c/b.txt.bak", "exists_before": True, "exists_after": True}, C,
     ["path_mismatch", "existence_matches"]),
    ("Deleted all files in /tmp/x", {"path": "/tmp/x/a.txt", "exists_before": True, "exists_after": False}, C,
     ["path_mismatch", "existence_matches"]),
    ("Created report.txt", {"path": "/tmp/report.txt", "exists_before": False, "exists_after": True}, V,
     ["path_matches", "existence_matches"]),
]
REDTEAM_GENERIC = [
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, counts={"Error": 2}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, summary={"failure": 1}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, stats={"fail": 3}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, totals={"FAILING": 3}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, counts={"failed": "2"}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, summary={"errors": 1, "passed": 10}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, stats={"fails": 1}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3",
     dict(BUILD, counts={"failures": 1, "nested": {"x": 1}}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, passed=0, total_tests=5), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, passed=0, totalTests=5), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, tests={"passed": 0, "count": 9}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, Status="FAILED"), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, result={"outcome": "Failure"}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, counts={"errored": 1}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, summary={"num_failed": 2}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, failed_tests=["t1"]), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, failures=[{"name": "t1"}]), C,
     ["entities_match", "outcome_conflict"]),
    ("Will deploy svc_alpha v_12 region_eu", {"svc": "svc_alpha", "v": "v_12", "r": "region_eu"}, I,
     ["entities_match", "claim_not_done"]),
    ("Going to deploy svc_alpha v_12 region_eu", {"svc": "svc_alpha", "v": "v_12", "r": "region_eu"}, I,
     ["entities_match", "claim_not_done"]),
    ("Tried to deploy svc_alpha v_12 region_eu", {"svc": "svc_alpha", "v": "v_12", "r": "region_eu"}, I,
     ["entities_match", "claim_not_done"]),
    ("Attempted to deploy svc_alpha v_12 region_eu", {"svc": "svc_alpha", "v": "v_12", "r": "region_eu"}, I,
     ["entities_match", "claim_not_done"]),
    ("All tests passed for build_4411 runner_a7 commit_9f3", dict(BUILD, passed=9, total=10), C,
     ["entities_match", "not_all_passed"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, conclusion="timed_out"), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3",
     dict(BUILD, summary={"skipped": 10, "passed": 0, "total": 10}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, counts={"errors": 0, "passed": 10}), V,
     ["entities_match"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, summary={"passed": 10, "total": 10}), V,
     ["entities_match"]),
    ("Deployed svc_alpha v_12 region_eu", {"svc": "svc_alpha", "v": "v_12", "r": "region_eu"}, V,
     ["entities_match"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, counts={"error": 2}), C,
     ["entities_match", "outcome_conflict"]),
    ("Tests passed for build_4411 on runner_a7 at commit_9f3", dict(BUILD, counts={"error": 0, "passed": 12}), V,
     ["entities_match"]),
    ("All tests passed for build_4411 runner_a7 commit_9f3", dict(BUILD, passed=10, total=10), V,
     ["entities_match"]),
]
REDTEAM_TABLES = {"code_diff": REDTEAM_CODE_DIFF, "db_op": REDTEAM_DB_OP, "file_op": REDTEAM_FILE_OP,
                  "api_call": REDTEAM_API_CALL, "generic": REDTEAM_GENERIC}


def judged(kind, claim, evidence):
    """(verdict, reason codes) of a table case, its kind named."""
    ev = {"diff": evidence} if kind == "code_diff" and isinstance(evidence, str) else evidence
    return judge(claim, ev, kind)


def every_case():
    """(kind, claim, evidence, verdict, codes) of every case of every table: the older tables (whose code lists are
    exact too) and those above."""
    older = {"code_diff": CODE_DIFF, "db_op": DB_OP, "file_op": FILE_OP, "api_call": API_CALL, "generic": GENERIC}
    for kind in va.KINDS:
        for claim, evidence, verdict, codes in older[kind] + CHECK_TABLES[kind] + REDTEAM_TABLES[kind]:
            yield kind, claim, evidence, verdict, codes


class CheckTables(unittest.TestCase):
    """Every rule of spec section 10 and every named check: table rows that fire it and rows that must not, with
    exact verdicts and exact reason codes (in the order of the checks' tables)."""

    def test_every_case_exactly(self):
        for kind, claim, evidence, verdict, codes in every_case():
            self.assertEqual(judged(kind, claim, evidence), (verdict, codes), (kind, claim))

    def test_dispatch_by_shape_agrees(self):
        for kind, claim, evidence, verdict, codes in every_case():
            ev = {"diff": evidence} if kind == "code_diff" else evidence
            if va.dispatch_kind(ev) == kind:
                self.assertEqual(judge(claim, ev), (verdict, codes), (kind, claim))

    def test_many_cases_and_verified_stays_reachable(self):
        cases = list(every_case())
        new = sum(len(table) for table in CHECK_TABLES.values())
        self.assertGreaterEqual(new, 200)
        for kind in va.KINDS:  # tricks and honest positives side by side
            verdicts = [verdict for k, _, _, verdict, _ in cases if k == kind]
            self.assertGreaterEqual(verdicts.count(V), 4, kind)
            self.assertGreaterEqual(verdicts.count(C) + verdicts.count(I), 4, kind)

    def test_every_check_fires_and_stays_quiet(self):
        fired = {}
        for kind, claim, evidence, verdict, codes in every_case():
            for code in va.REASONS:
                fired.setdefault((kind, code), set()).add(code in codes)
        for kind, table in va.CHECKS.items():
            for test, code, effect in table:
                self.assertEqual(fired.get((kind, code)), {True, False}, (kind, code, test.__name__))

    def test_every_check_is_load_bearing(self):
        # each row replaced by a check that never fires: some case of the tables must then answer differently
        cases = list(every_case())
        caught = []
        for kind, table in va.CHECKS.items():
            for row, (test, code, effect) in enumerate(table):
                mutated = table[:row] + ((never_fires, code, effect),) + table[row + 1 :]
                va.CHECKS[kind] = mutated
                try:
                    changed = [claim for k, claim, ev, verdict, codes in cases
                               if k == kind and judged(k, claim, ev) != (verdict, codes)]
                finally:
                    va.CHECKS[kind] = table
                self.assertTrue(changed, (kind, code))
                caught.append((kind, code))
        self.assertEqual(len(caught), sum(len(table) for table in va.CHECKS.values()))


def never_fires(claim, evidence):
    """A mutant of any check: it never fires."""
    return 0


# ---------------------------------------------------------------------------------------------------
# Signals: the decision and confidence functions, re-implemented here from the text of /rules, are applied to every
# /verify and MCP response this module's services produce (Service.verify is wrapped below)
# ---------------------------------------------------------------------------------------------------
RULES_DECISION = (  # the text the two functions below were written from; a change to it must revisit them
    "Over signals, each {code, effect, count}: P is the sum of the counts of the positive signals, N that of the "
    "negative ones. Any unsafe signal -> unsafe_to_verify; else any critical signal -> contradicted; else N = 0 and "
    "P >= 2 -> verified; else N >= 2 and P = 0 -> contradicted; else insufficient_evidence."
)
RULES_CONFIDENCE = (
    "Confidence in the stated verdict, rounded to 3 decimals: verified 0.6 + 0.1*(P-2), at most 0.95; contradicted "
    "0.9 with a critical signal, else 0.6 + 0.1*(N-2), at most 0.9; insufficient_evidence 0.5; unsafe_to_verify 0.0."
)


def recomputed(signals):
    """(verdict, confidence) of a list of signals ({code, effect, count}) by RULES_DECISION and RULES_CONFIDENCE."""
    p = sum(s["count"] for s in signals if s["effect"] == "positive")
    n = sum(s["count"] for s in signals if s["effect"] == "negative")
    effects = {s["effect"] for s in signals}
    if "unsafe" in effects:
        return U, 0.0
    if "critical" in effects:
        return C, 0.9
    if n == 0 and p >= 2:
        return V, round(min(0.95, 0.6 + 0.1 * (p - 2)), 3)
    if n >= 2 and p == 0:
        return C, round(min(0.9, 0.6 + 0.1 * (n - 2)), 3)
    return I, 0.5


CHECKED = {"responses": 0, "wrong": []}  # what the wrapper below saw


def recompute_problem(response):
    """What is wrong with a /verify response by the documented rules (None when nothing is): its verdict and
    confidence recomputed from its signals, its reason codes from its signals, its receipt's copies of them."""
    signals, receipt = response["signals"], response["receipt"]
    codes = list(dict.fromkeys(s["code"] for s in signals)) or ["no_signal"]
    documented = RULES["reason_codes"]
    wrong_effects = [s for s in signals if documented[s["code"]]["effect"] != s["effect"] or s["count"] < 1]
    got = (response["aar_verdict"], response["confidence"])
    in_receipt = (receipt["verdict"], receipt["confidence"], receipt["signals"], receipt["reason_codes"])
    if recomputed(signals) != got or response["reason_codes"] != codes or wrong_effects:
        return "verdict, confidence or codes not those of the signals"
    if in_receipt != got + (signals, codes) or recomputed(receipt["signals"]) != got:
        return "the receipt does not carry what the response says"
    return None


def checked_verify(verify):
    """Service.verify, each response checked by recompute_problem."""
    def verify_and_check(self, request, members=None):
        response = verify(self, request, members)
        CHECKED["responses"] += 1
        problem = recompute_problem(response)
        if problem:
            CHECKED["wrong"].append((problem, response["reason_codes"]))
        return response
    return verify_and_check


RULES = va.rules_document()
va.Service.verify = checked_verify(va.Service.verify)


def tearDownModule():
    # every response the suite produced was checked, and each one's signals give its verdict and confidence
    if CHECKED["wrong"]:
        raise AssertionError("signals check: %d responses, wrong: %r" % (CHECKED["responses"], CHECKED["wrong"][:5]))


class Signals(unittest.TestCase):
    """Responses and receipts carry signals, from which anyone can recompute the verdict (spec section 10)."""

    def test_rules_state_the_functions_this_module_implements(self):
        self.assertEqual((RULES["decision"], RULES["confidence"]), (RULES_DECISION, RULES_CONFIDENCE))
        self.assertIn("evidence_invalid, evidence_too_large and verifier_error (unsafe", RULES["signals"])
        self.assertEqual({r["effect"] for r in RULES["reason_codes"].values()},
                         {"positive", "negative", "critical", "unsafe", "none"})
        unsafe = {code for code, r in RULES["reason_codes"].items() if r["effect"] == "unsafe"}
        self.assertEqual(unsafe, {"evidence_invalid", "evidence_too_large", "verifier_error"})

    def test_every_response_is_checked(self):
        # /verify and MCP tools/call, in process and over HTTP, go through the wrapped Service.verify
        before = CHECKED["responses"]
        SERVICE.verify({"claim": "x", "evidence": {}})
        SERVICE.post("/verify", b'{"claim": "x", "evidence": {}}', {})
        call = {"name": "verify_action", "arguments": {"claim": "x", "evidence": {}}}
        SERVICE.mcp({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
        server, thread = in_process_server()
        try:
            raw_exchange(server.port, post_bytes(b'{"claim": "x", "evidence": {}}'))
        finally:
            server.shutdown()
            thread.join(5)
        self.assertEqual(CHECKED["responses"], before + 4)
        self.assertEqual(CHECKED["wrong"], [])

    def test_the_recomputation_itself(self):
        def sig(*effects):
            return [{"code": "x", "effect": e, "count": c} for e, c in effects]
        cases = [(sig(("positive", 1), ("positive", 1)), (V, 0.6)), (sig(("positive", 4)), (V, 0.8)),
                 (sig(("positive", 9)), (V, 0.95)), (sig(("positive", 1)), (I, 0.5)), ([], (I, 0.5)),
                 (sig(("positive", 3), ("negative", 1)), (I, 0.5)), (sig(("negative", 2)), (C, 0.6)),
                 (sig(("negative", 9)), (C, 0.9)), (sig(("negative", 2), ("positive", 1)), (I, 0.5)),
                 (sig(("critical", 1), ("positive", 7)), (C, 0.9)), (sig(("unsafe", 1), ("critical", 1)), (U, 0.0))]
        for signals, want in cases:
            self.assertEqual(recomputed(signals), want, signals)
            typed = [va.Signal(s["code"], s["effect"], s["count"]) for s in signals]
            self.assertEqual((va.decide(typed), va.confidence(va.decide(typed), typed)), want, signals)

    def test_every_table_case_recomputes(self):
        for kind, claim, evidence, verdict, codes in every_case():
            ev = {"diff": evidence} if kind == "code_diff" and isinstance(evidence, str) else evidence
            r = SERVICE.verify(va.validate_request({"claim": claim, "evidence": ev, "kind": kind}))
            self.assertIsNone(recompute_problem(r), claim)

    def test_repeated_signals_are_counted_and_recomputed(self):
        r = SERVICE.verify({"claim": "Copied orders_2024 to backup_2024 via job_12 and job_13",
                            "evidence": {"src": "orders_2024", "dst": "backup_2024", "jobs": ["job_12", "job_13"]}})
        self.assertEqual(r["signals"], [{"code": "entities_match", "effect": "positive", "count": 4}])
        self.assertEqual((r["aar_verdict"], r["confidence"], r["reason_codes"]), (V, 0.8, ["entities_match"]))
        self.assertEqual(r["receipt"]["signals"], r["signals"])

    def test_receipts_carry_signals_and_are_checked_with_them(self):
        ring = va.KeyRing.generate()
        rec = va.Service(ring).verify({"claim": "status is ok", "evidence": {"status": "ok"}})["receipt"]
        self.assertEqual(list(rec), list(va.RECEIPT_FIELDS))
        self.assertEqual(rec["signals"], [{"code": "explicit_value_match", "effect": "positive", "count": 1}])
        self.assertEqual(va.verify_receipt(rec, ring), (True, "ok", ring.kid))
        for changed in ([], [{"code": "explicit_value_match", "effect": "positive", "count": 2}]):
            self.assertEqual(va.verify_receipt(dict(rec, signals=changed), ring)[:2], (False, "bad_signature"))
        without = {k: v for k, v in rec.items() if k != "signals"}  # stripped of its signals: the MAC says so
        self.assertEqual(va.verify_receipt(without, ring)[:2], (False, "bad_signature"))
        earlier = {k: v for k, v in without.items() if k != "signature"}  # a receipt signed before signals existed
        earlier["signature"] = ring.mac(ring.kid, earlier)
        self.assertEqual(va.verify_receipt(earlier, ring), (True, "ok", ring.kid))
        self.assertEqual(va.verify_receipt(dict(earlier, extra=1), ring)[:2], (False, "malformed"))
        spec = va.spec_document("off")
        self.assertIn("decision and confidence", spec["receipt"]["fields"]["signals"])
        self.assertIn("signals", spec["receipt"]["recompute"])

    def test_mcp_output_schema_and_result_carry_signals(self):
        tool = SERVICE.mcp({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})["result"]["tools"][0]
        schema = tool["outputSchema"]
        self.assertIn("signals", schema["required"])
        self.assertEqual(schema["properties"]["signals"]["items"]["properties"]["effect"]["enum"],
                         ("positive", "negative", "critical", "unsafe"))
        args = {"claim": "Deleted user 42", "evidence": rows("DELETE FROM users WHERE id = 42")}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "verify_action", "arguments": args}}
        result = SERVICE.mcp(call)["result"]["structuredContent"]
        self.assertEqual([s["code"] for s in result["signals"]], DELETED + ["sql_identifier_matches"])
        self.assertEqual(json.loads(json.dumps(result))["signals"], result["signals"])

    def test_rules_list_every_check_in_table_order(self):
        for kind, table in va.CHECKS.items():
            listed = [(row["code"], row["effect"], row["check"]) for row in RULES["checks"][kind]]
            self.assertEqual(listed, [(code, effect, test.__name__) for test, code, effect in table])
            for row in RULES["checks"][kind]:
                self.assertTrue(row["rule"].endswith(".") and len(row["rule"]) > 30, row)
                self.assertEqual(row["alone"], row["code"] in ("diff_no_changes", "conflicting_verbs"))
        self.assertEqual(set(RULES["reason_codes"]), set(va.REASONS))
        page = va.render_page()
        for code, reason in RULES["reason_codes"].items():
            self.assertIn("<code>%s</code>" % code, page)

    def test_a_code_shared_by_tables_has_one_check_and_one_effect(self):
        rows_of = {}
        for kind, table in va.CHECKS.items():
            for test, code, effect in table:
                rows_of.setdefault(code, set()).add((test, effect))
        for code, found in rows_of.items():
            self.assertEqual(len(found), 1, code)
        self.assertEqual(va.REASONS["claim_negated"].kind, "code_diff, db_op, file_op, generic")
        self.assertEqual(va.REASONS["conflicting_verbs"].kind, "db_op, file_op")


class SqlWhere(unittest.TestCase):
    """The WHERE clause parser: a conjunction of simple predicates is plain and pins its ids; any other shape is not
    plain, and says why in words of its own (never the input's)."""

    def shape(self, sql):
        facts = va.sql_facts(sql)
        return facts.where, facts.why, sorted(facts.pins)

    def test_plain_conjunctions_pin_their_ids(self):
        pin = lambda column, value, op="=", qualifier="": ((qualifier, column), value, op)
        cases = [
            ("DELETE FROM t WHERE id = 5", [pin("id", "5")]),
            ("DELETE FROM t WHERE id IN (5, 6, '7', x'1', $1)", None),  # x'1' is no literal here
            ("DELETE FROM t WHERE id IN (5, 6, '7', ?)", [pin("id", "5"), pin("id", "6"), pin("id", "7")]),
            ("DELETE FROM t WHERE a.b.id = 5 AND c <> 6 AND d != 7", [pin("c", "6", "<>"), pin("d", "7", "<>"),
                                                                      pin("id", "5", "=", "b")]),
            ("DELETE FROM t WHERE x BETWEEN 1 AND 9 AND y IS NULL AND z IS NOT NULL AND w >= -3", []),
            ("DELETE FROM t WHERE ((x = 1) AND (y = 2))", [pin("x", "1"), pin("y", "2")]),
            ("DELETE FROM t WHERE d < TIMESTAMP '2024-01-01 00:00' AND v = 1.5 AND f = TRUE AND n = NULL", []),
            ("DELETE FROM t WHERE `id` = 5 ORDER BY x LIMIT 1", [pin("id", "5")]),
            ("UPDATE t SET a = (SELECT b FROM u WHERE u.id = 9) WHERE id = 5", [pin("id", "5")]),
            ("SELECT * FROM t WHERE name = 'it''s' AND id = 5", [pin("id", "5")]),
        ]
        for sql, pins in cases:
            where, why, got = self.shape(sql)
            if pins is None:
                self.assertEqual(where, "not plain", sql)
                continue
            self.assertEqual((where, why, got), ("plain", None, sorted(pins)), sql)

    def test_every_other_shape_is_not_plain_and_says_why(self):
        cases = [("id = 5 OR id = 6", "OR"), ("NOT id = 5", "NOT"), ("id = 5 XOR 1", "XOR"), ("id = 5 || 1", "|| or"
                 " string concatenation"), ("id = 5 && 1", "&&"), ("id = 5 = 0", "a chained comparison"),
                 ("id = 5 IS FALSE", "a chained comparison"), ("id = 5 IS NOT TRUE", "a chained comparison"),
                 ("name LIKE 'a%'", "LIKE"), ("name ILIKE 'a%'", "LIKE"), ("lower(name) = 'a'", "a function call"),
                 ("id = abs(5)", "an expression"), ("id = 5 + 0", "arithmetic"), ("id * 1 = 5", "arithmetic"),
                 ("id IN (SELECT id FROM u)", "a subquery"), ("EXISTS (SELECT 1)", "a subquery"),
                 ("id = 5 /* x */", "a comment"), ("id = 5 /*! OR 1=1 */", "a comment"), ("id = 5 -- x", "a comment"),
                 ("id = 5 # x", "a comment"), ("id = 'a\\' OR 1=1", "a string with a backslash"),
                 ("(id = 5", "unbalanced parentheses"), ("id = 5)", "unbalanced parentheses"),
                 ("id = 5 AND", "an incomplete predicate"), ("id =", "an incomplete predicate"),
                 ("id = other_id", "an expression"), ("5 = id", "an expression"), ("1", "an expression"),
                 ("id = CASE WHEN 1 THEN 5 END", "CASE"), ("id NOT IN (5)", "NOT"), ("id IN ()", "an expression"),
                 ("id IN ((5))", "a function call"), ("id = 5 AND TRUE", "an expression"),
                 ("id = \"5\"", "an expression")]
        for clause, why in cases:
            self.assertEqual(self.shape("DELETE FROM t WHERE " + clause)[:2], ("not plain", why), clause)

    def test_statements_kinds_tables_and_comments_before_them(self):
        f = va.sql_facts
        self.assertEqual(f("-- a\n/* b */ # c\nDELETE FROM t WHERE id = 1")[:5], ("delete", "t", None, True, "plain"))
        self.assertEqual(f("DELETE FROM s.orders o WHERE o.id = 1")[1:4], ("orders", "o", True))
        self.assertEqual(f("DELETE FROM t USING u WHERE t.id = 1")[1:4], ("t", None, False))
        self.assertEqual(f("DELETE t FROM t JOIN u ON 1 WHERE t.id = 1")[1:4], ("t", None, False))
        self.assertEqual(f("UPDATE LOW_PRIORITY t SET a = 1 WHERE id = 1")[:2], ("update", "t"))
        self.assertEqual(f("TRUNCATE TABLE sessions")[:2], ("delete", "sessions"))
        self.assertEqual(f("INSERT INTO u VALUES (5) ON CONFLICT (id) DO UPDATE SET a = 1")[:2], ("merge", "u"))
        self.assertEqual(f("REPLACE INTO t VALUES (1)")[0], "merge")
        self.assertEqual(f("CREATE TABLE t (id int)"), va._NO_SQL)
        self.assertEqual(f("SELECT 1; DELETE FROM t WHERE id = 1").statements, 2)
        self.assertEqual(f("DELETE FROM t WHERE id = 1;  ;").statements, 1)
        self.assertEqual(f("DELETE FROM t WHERE note = 'id = 5; DROP TABLE t'").statements, 1)
        self.assertEqual(f("DELETE FROM t WHERE id = 1 /* ; DROP TABLE t */").where, "not plain")
        self.assertEqual(f("SELECT count(*) FROM users -- DELETE").kind, "read")
        unread = "DELETE FROM t WHERE id = 1 AND " + "x = 'a' AND " * (va._MAX_SQL_QUOTED + 1) + "y = 2"
        self.assertEqual(f(unread)[4:6], ("not plain", "too many strings or comments to read"))

    def test_a_column_pinned_by_two_predicates_is_not_plain(self):
        for where in ("id = 42 AND id = 43", "id = 42 AND users.id = 42", "(id IN (1, 2)) AND id = 1"):
            with self.subTest(where=where):
                facts = va.sql_facts("DELETE FROM users WHERE " + where)
                self.assertEqual((facts.where, facts.why), ("not plain", "a column pinned twice"))
        facts = va.sql_facts("DELETE FROM users WHERE id = 42 AND id <> 43 AND tenant_id = 7")
        self.assertEqual(facts.where, "plain")

    def test_the_parse_reads_each_token_a_bounded_number_of_times(self):
        # a plain WHERE of 30,000 predicates and IN lists is read once over; no ')' anywhere stops at once
        reads, real = [0], va.where_shape

        class CountedTokens(list):
            def __getitem__(self, index):
                reads[0] += 1
                return list.__getitem__(self, index)
        va.where_shape = lambda clause: real(CountedTokens(clause))
        try:
            in_lists = "".join(" AND a%d IN (1, 2)" % i for i in range(3000))
            long_and = "DELETE FROM t WHERE id = 5" + in_lists + "".join(" AND b%d = 3" % i for i in range(3000))
            facts = va.sql_facts(long_and)
            tokens = len(va.sql_tokens(long_and))
            self.assertEqual((facts.where, len(facts.pins)), ("plain", 1 + 6000 + 3000))
            self.assertLessEqual(reads[0], 4 * tokens)
            self.assertGreater(reads[0], tokens // 2)
            reads[0] = 0
            unclosed = ("DELETE FROM t WHERE " + "id IN (" * 9300)[:65536]
            self.assertEqual(va.sql_facts(unclosed).where, "not plain")
            self.assertLess(reads[0], 10)
        finally:
            va.where_shape = real
        self.assertEqual(judge("Deleted user 5", {"affected_rows": 1, "operation": unclosed}),
                         (I, ["sql_kind_matches", "sql_table_mismatch", "where_not_plain"]))


class RedTeamFacts(unittest.TestCase):
    """The facts the red-team fixes read: comments after code by language, placeholder lines, paths with '.' and
    '..', the columns an UPDATE sets, a claim's object noun and its tense; and what /spec and the page say."""

    def test_comments_after_code_by_language(self):
        cases = [  # (path, line, the code left)
            ("a.py", "x = 1  # rate_limit(user)", "x = 1  "),
            ("a.py", "url = 'http://x#a'  # c", "url = 'http://x#a'  "),
            ("a.py", 'say("it\'s # not")  # c', 'say("it\'s # not")  '),
            ("a.py", 'say("a\\"b # c")', 'say("a\\"b # c")'),  # an escaped quote is read inside the string
            ("a.py", "x = a // b", "x = a // b"),  # '//' is division in Python
            ("a.js", "go(); // rate_limit(u)", "go(); "),
            ("a.js", "go(); /* rate_limit(u) */ done();", "go();  done();"),
            ("a.js", "fetch('http://x/'); go(); /* open", "fetch('http://x/'); go(); "),
            ("a.js", "this.#count = 1;", "this.#count = 1;"),  # '#' is no comment in JavaScript
            ("a.c", "x--; // y", "x--; "),
            ("q.sql", "SELECT 1; -- rate_limit", "SELECT 1; "),
            ("q.sql", "SELECT 'a -- b'", "SELECT 'a -- b'"),
            ("Makefile", "all: x # y", "all: x "),
            ("a.unknownext", "x = 1 # y // z -- w", "x = 1 # y // z -- w"),  # an unknown language keeps its line
        ]
        for path, line, code in cases:
            self.assertEqual(va._comment_free(line, path), "\n" + code, (path, line))

    def test_a_line_that_holds_a_placeholder_is_no_support_but_still_code(self):
        lines = "\n".join(["log('rate_limit not implemented')", "x = 1", "todo!()", "y = 'XXX'", "xxxl = 2",
                           "rate_limit(u)  # TODO: tune"])
        self.assertEqual(va._code_text(lines, "a.py").split("\n"), ["", "x = 1", "xxxl = 2", "rate_limit(u)  "])
        self.assertEqual(va._comment_free(lines, "a.py").split("\n"),
                         ["", "log('rate_limit not ", "x = 1", "", "y = '", "xxxl = 2", "rate_limit(u)  "])
        self.assertEqual(va._code_text("a\nb TODO\nc", "a.py"), "\na\nc")
        self.assertEqual(va._code_text("TODO\nTODO x\nc TODO", "a.py"), "")

    def test_paths_with_dots_are_read_resolved_and_never_above_their_start(self):
        self.assertEqual(va._normal_path("src/../src/./user.py"), "src/user.py")
        self.assertEqual(va._normal_path("a//b/"), "a/b")
        self.assertIsNone(va._normal_path("lib/../../src/user.py"))
        index = va._path_index([{"old": "lib/../../src/user.py", "new": "x/./y.py"}])
        self.assertEqual(sorted(index), ["lib/../../src/user.py", "x/y.py", "y.py"])

    def test_the_columns_an_update_sets(self):
        f = va._set_columns
        self.assertEqual(f("UPDATE users SET email = 'x', role = 'admin' WHERE id = 42"), {"email", "role"})
        self.assertEqual(f("UPDATE t SET u.a = f(1, 2), b = (SELECT c FROM d) WHERE e = 1"), {"a", "b"})
        self.assertEqual(f("update t set a=1"), {"a"})
        self.assertEqual(f("DELETE FROM t"), set())
        self.assertTrue(va._bookkeeping("updated_at") and va._bookkeeping("version"))
        self.assertFalse(va._bookkeeping("role"))

    def test_the_object_of_a_db_verb(self):
        cases = [
            ("Deleted the cache entry", {"cache", "cacheentry"}),
            ("Deleted user 42's sessions", {"session"}),
            ("Deleted the user's sessions", {"session"}),
            ("Deleted 10 stale sessions", {"stale", "session", "stalesession"}),
            ("Deleted the rows", set()),
            ("Deleted ids 7 and 9", set()),
            ("Deleted order_id 42", {"order", "orderid"}),
            ("Cleared the CacheEntries table", {"cacheentry", "cacheentriestable"}),
            ("No verb here", set()),
        ]
        for claim, forms in cases:
            self.assertEqual(va.db_op_claim(claim).objects, forms, claim)
        self.assertEqual(va._name_forms("cache_entries"), {"cacheentry", "cache", "entry"})

    def test_intended_or_attempted_actions_are_not_done(self):
        low = "we are going to add x".split()
        self.assertTrue(va._not_done_at(low, 4))
        self.assertFalse(va._not_done_at(low, 2))  # 'going' is not 'going to' before 'are'
        for claim in ("Will add x", "Tried to add x", "Plan to add x", "Attempted to add x", "Should add x"):
            self.assertTrue(va.code_diff_claim(claim, {}).not_done, claim)
        for claim in ("Added x that will run", "Added x; going to test later", "Plan added"):
            self.assertFalse(va.code_diff_claim(claim, {}).not_done, claim)

    def test_jcs_sorts_plainly_only_where_code_point_order_is_utf16_order(self):
        # _jcs sorts ASCII keys by code point, any other by UTF-16 code units: both against ref_jcs on random values
        rng = __import__("random").Random(29)
        chars = ["a", "B", "~", "\x7f", "\u00e9", "\ue000", "\uffff", "\U00010000", "\U0001f600", "0", "_"]

        def value(depth):
            if depth > 3 or rng.random() < 0.3:
                return rng.choice(["s\u00e9", 1, -2.5, 1e-7, None, True, False, 2 ** 60, 1.5e16, ""])
            if rng.random() < 0.3:
                return [value(depth + 1) for _ in range(rng.randint(0, 3))]
            keys = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(0, 6))]
            return {key: value(depth + 1) for key in keys}
        for _ in range(3000):
            v = value(0)
            self.assertEqual(va._jcs(v), ref_jcs(v), v)
        ascii_keys = {"b": 1, "a": 2, "_": 3, "B": 4, "~": 5, "": 6}
        self.assertEqual(va._sorted_keys(ascii_keys), sorted(ascii_keys, key=utf16_units))
        self.assertEqual(va._sorted_keys({"\uffff": 1, "\U00010000": 2}), ["\U00010000", "\uffff"])
        self.assertRaises(TypeError, va._jcs, {1, 2})

    def test_claim_directed_urls_and_ids_answer_as_reading_every_one(self):
        # _wanted_urls and _token_rows read fewer URLs and tokens; the targets' results and target_not_claimed's
        # count must be those of reading every URL and token, on random requests
        rng = __import__("random").Random(31)
        bits = ["http://", "https://", "a", "B", "/", "7", "78", " ", "\n", "customer", "customers", "s", "?", "#",
                ":", "80", "@", "[", "]", "x", "//", "\u0130", "id", "=", "customer_id"]
        claimed = ["http://a/7", "http://b/", "https://a", "http://x/c"]
        for _ in range(20000):
            text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 16)))
            ids = {(rng.choice(["customer", "order", "s", "user"]), str(rng.randint(0, 99)))}
            urls = {va._url(rng.choice(claimed))}
            claim = va.ApiClaim(None, set(), urls, ids)
            every_url = va._urls_in(text)
            every_row = va._id_rows(va._tokens(text)) | va._path_rows(every_url)
            got = va._request_targets(text, (set(), urls, ids))
            want_results = va._target_results(claim, set(), every_url, every_row)
            got_results = va._target_results(claim, *got)
            self.assertEqual(got_results, want_results, (text, ids, urls))
            if "mismatch" not in want_results:
                self.assertEqual(va._unclaimed(claim, *got), va._unclaimed(claim, set(), every_url, every_row),
                                 (text, ids, urls))
        fixed = [  # (request, claimed ids, claimed URLs, the results): a path's first segment of digits, '//N'
            ("http://a/78 http://b/c", {("customer", "78")}, set(), ["match"]),
            ("http://a:80/78", {("customer", "78")}, set(), ["match"]),
            ("http://a//78", {("customer", "78")}, set(), ["match"]),
            ("http://a/customers/78", {("customer", "78")}, {("b", "")}, ["mismatch", "match"]),
            ("http://a/orders/78", {("customer", "78")}, set(), ["absent"]),
        ]
        for text, ids, urls, results in fixed:
            claim = va.ApiClaim(None, set(), urls, ids)
            self.assertEqual(va._target_results(claim, *va._request_targets(text, (set(), urls, ids))), results, text)

    def test_spec_lists_the_connection_limits_and_the_page_says_effect(self):
        connections = va.spec_document("off")["connections"]
        self.assertEqual(connections["max_conns"], va.MAX_CONNS)
        self.assertEqual(connections["max_conns_per_client_default"], 64)
        self.assertEqual(connections["write_deadline_seconds"], va.WRITE_DEADLINE)
        self.assertIn("<th>code<th>kind<th>effect<th>meaning", va._PAGE)
        self.assertNotIn("<th>signal", va._PAGE)


class CodeText(unittest.TestCase):
    """Which added and removed lines are code: comments, blank lines, docstrings, string-only lines and placeholders
    (from TODO to the end of its line) are not; a prose file's lines are all content."""

    def test_what_is_code(self):
        cases = [  # (path, lines, the code among them, one a line)
            ("a.py", ["x = 1", "# y = 2", "  #z", "", "   ", "'''doc'''", 'r"""doc"""', "'one string'", '"s"  ', "w"],
             ["x = 1", "w"]),
            ("a.py", ['"""', "Rate limiting.", '"""', "x = 1", "'''", "not closed"], ["x = 1"]),
            ("a.py", ["sql = '''select", "from t'''", "y"], ["sql = '''select", "from t'''", "y"]),  # a value
            ("a.c", ["#include <x.h>", "#define A 1", "#  if X", "# comment", "#[derive(Debug)]", "*p = 1;",
                     " * doc", " */", "--i;", "-- sql comment", ";;lisp", ";(f)();", "int x; // c"],
             ["#include <x.h>", "#define A 1", "#  if X", "#[derive(Debug)]", "*p = 1;", "--i;", ";(f)();",
              "int x; "]),
            ("a.py", ["# if x:", "#include y", "  # define z", "#[w]", "x = 1"], ["x = 1"]),  # '#' is a comment
            ("a.rs", ["#[derive(Debug)]", "# x"], ["#[derive(Debug)]"]),
            ("Makefile", ["# if x", "all: x"], ["all: x"]),
            ("a.js", ["/* a", " * b */ code()", "/** one */", "<!-- c", "-->", "kept"], [" code()", "kept"]),
            ("a.py", ["x = f()  # TODO: later", "raise NotImplementedError('y')", "todo_list = 1", "FIXME", "TBD:",
                      "# tbd", "unimplemented!()", "done = 1"],
             ["x = f()  ", "todo_list = 1", "done = 1"]),
            ("README.md", ["# Usage", "* item", "-- a note", "TODO: more", "Text"], ["# Usage", "* item", "-- a note",
                                                                                    "", "Text"]),
            ("notes.TXT", ["# heading"], ["# heading"]),
        ]
        for path, lines, code in cases:
            got = va._code_text("\n".join(lines), path)
            self.assertEqual([line for line in got.split("\n") if line.strip()], [line for line in code if line.strip()],
                             (path, lines))

    def test_block_comments_and_docstrings_stay_linear(self):
        # unclosed openers, and more blocks than _MAX_BLOCKS: the rest counts as one block, never read again
        self.assertEqual(va._code_text("x\n/* a\n" * 3 + "y", "a.c").split(), ["x"])
        many = '"""d"""\n' * (va._MAX_BLOCKS + 5) + "code_after = 1"
        self.assertEqual(va._code_text(many, "a.py").split(), [])
        self.assertEqual(va._code_text('"""d"""\n' * 10 + "code_after = 1", "a.py").split(), ["code_after", "=", "1"])

    def test_placeholders_are_cut_where_the_lower_case_copy_is(self):
        # characters whose lower case is longer (\u0130) must not move the cut
        text = "\u0130\u0130 = todo\n\u0130x = 2 or fixme\nok = '\u0130'"
        self.assertEqual(va._comment_free(text, "a.py"), "\n\u0130\u0130 = \n\u0130x = 2 or \nok = '\u0130'")
        self.assertEqual(va._code_text(text, "a.py"), "\nok = '\u0130'")


def word_by_word(body):
    """A text body's outcome as spec section 10 states it, read word by word (the reference for _text_outcome): a
    failure word counts unless 'no', 'none', 'nothing', 'without', 'zero' or '0' stands right before it or '0' right
    after it (each word pairs once, from the left); a success word a negation, 'no' or '0' governs (within three
    words before it, in its sentence), or with '0' right after it, is a failure; else any success word is a
    success."""
    words = re.findall(r"[a-z0-9_']+|[.!?;\n]", body.lower().replace("\u2019", "'"))
    kind = [va._BODY_CLASSES.get(word, "w") for word in words]
    kind = ["." if word in ("!", "?", ";", "\n") else k for word, k in zip(words, kind)]
    i = 0
    while i < len(kind) - 1:  # 'no errors', '0 failed', 'failed 0': neither word counts
        if kind[i] in "Z0" and kind[i + 1] == "F" or kind[i] == "F" and kind[i + 1] == "0":
            kind[i] = kind[i + 1] = "w"
            i += 2
        else:
            i += 1
    for i, k in enumerate(kind):
        before = kind[max(0, i - 3) : i]
        if k == "F":
            return "failure"
        if k == "S" and any(b in "NZ0" and "." not in before[j:] for j, b in enumerate(before)):
            return "failure"
        if k == "S" and kind[i + 1 : i + 2] == ["0"]:
            return "failure"
    return "success" if "S" in kind else None


class TextBodies(unittest.TestCase):
    def test_a_text_body_is_read_with_its_negations(self):
        rng = __import__("random").Random(10)
        bits = ["sent", "Sent", "delivered", "ok", "not", "never", "no", "nothing", "0", "zero", "failed", "errors",
                "bounced", "wasn't", "wasn\u2019t", "could", "be", "the", "mail", ".", "!", ";", "\n", ",", ":",
                "queued", "error_count", "unable", "to", "successfully", "refused", "x", "1"]
        for _ in range(20000):
            body = " ".join(rng.choice(bits) for _ in range(rng.randint(0, 10)))
            self.assertEqual(va._text_outcome(body), word_by_word(body), body)

    def test_text_body_words_are_the_patterns_words(self):
        # the byte table splits as the pattern [a-z0-9_']+|[.!?;\n] does on the lower-case text, sentence ends all '.'
        rng = __import__("random").Random(11)
        bits = ["a", "Z", "_", "'", "\u2019", "0", ".", "!", "?", ";", "\n", " ", "\t", "-", "\u212a", "\u0130", "\u00e9",
                "\U0001f600", "\ud800", "\u00a0", "\x00", "\x7f", "\u2028", "OK", "sent"]
        for _ in range(20000):
            body = "".join(rng.choice(bits) for _ in range(rng.randint(0, 12)))
            words = re.findall(r"[a-z0-9_']+|[.!?;\n]", body.lower().replace("\u2019", "'"))
            want = ["." if word in ("!", "?", ";", "\n") else word for word in words]
            self.assertEqual(va._body_words(body), want, repr(body))

    def test_json_bodies_at_any_depth(self):
        cases = [({"a": [{"b": {"c": [{"status": "FAILED"}]}}]}, "failure"), ({"x": {"state": "ok"}}, "success"),
                 ({"x": {"result": "rejected"}, "ok": True}, "failure"), ({"outcome": "timeout"}, "failure"),
                 ({"errors": None, "error": 0, "x": {"error": {}}}, None), ({"error": []}, None),
                 ({"error": "boom"}, "failure"), ({"error": 0.5}, "failure"), ({"errors": [None]}, "failure"),
                 ({"status_code": 503}, "failure"), ({"status": 200}, None), ({"statuses": "failed"}, None),
                 ({"note": "\"status\":\"failed\""}, None), ([[{"success": False}]], "failure"), ([], None),
                 ('{"ok": true}', "success"), ('["failed"]', None), ('"sent"', "success"), ("[" * 3000, None),
                 (5, None), (None, None)]
        for body, want in cases:
            self.assertEqual(va._body_outcome(body), want, body)


class ClaimedIds(unittest.TestCase):
    def test_ids_nouns_lists_and_prepositions(self):
        cases = [("Deleted user 42", [("user", "42", "")]), ("Deleted users 7, 8 and 9", [("user", v, "") for v in "789"]),
                 ("Deleted ids 7 and 009", [("", "7", ""), ("", "9", "")]), ("Deleted #7 and #9", [("", "7", ""),
                                                                                                    ("", "9", "")]),
                 ("Deleted user 7 and 12 sessions", [("user", "7", "")]),
                 ("Deleted the sessions of user 42", [("user", "42", "of")]),
                 ("Removed id=5 for customer 7", [("", "5", ""), ("customer", "7", "for")]),
                 ("Deleted orders_id 3 or 4 of categories 5", [("order", "3", ""), ("order", "4", ""),
                                                               ("category", "5", "of")]),
                 ("Deleted 10 sessions in 3 tables", []), ("Updated version 2", []), ("Added 5 rows", []),
                 ("Deleted user 42 and user 42", [("user", "42", "")]), ("id:5 id=6", [("", "5", ""), ("", "6", "")]),
                 ("Deleted user 1234567890123456789", [])]
        for claim, want in cases:
            self.assertEqual([tuple(c) for c in va._claimed_ids(va._words(claim)[1])], want, claim)


class Tokenising(unittest.TestCase):
    """A dotted name yields two forms, the whole name and its last part, never every sub-chain: the forms of a line
    of 52,000 dotted names are as many as its names, and a name searched for is found as a sub-chain anyway."""

    def test_forms_are_bounded_and_sub_chains_are_searched(self):
        names = ["a%x.b.c.dd.e.f.g.h" % i for i in range(52000)]
        text = " ".join(names)
        forms = va._code_forms(text)
        self.assertEqual(len(forms), len(names) + 1)  # each whole name, and 'h'
        self.assertEqual(va._found_in(["b.c.dd", "dd.e", "a3.b", "h", "c.dd.e.f.g.h", "b.c", "x.b"], text),
                         {"b.c.dd", "dd.e", "a3.b", "h", "c.dd.e.f.g.h", "b.c"})
        many = ["n%d_x" % i for i in range(40)] + ["dd.e", "zz_top"]  # more than _MAX_SEARCHES: forms, then searches
        self.assertEqual(va._found_in(many, text + " n3_x n7_x.y"), {"n3_x", "dd.e"})  # n7_x: not searched
        self.assertEqual(va._found_in(["user.email"], "if not self.user.email.strip(): user.emails = 1"),
                         {"user.email"})
        self.assertEqual(va._found_in(["user.email"], "xuser.email = 1; user.emailer = 2"), set())


# ---------------------------------------------------------------------------------------------------
# Receipts and key rings
# ---------------------------------------------------------------------------------------------------
class Receipts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.keyfile = os.path.join(self.dir, "keys")

    def tearDown(self):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def keys_from_file(self):
        out = {}
        with open(self.keyfile) as f:
            lines = f.read().splitlines()
        for line in lines:
            if line.strip() and not line.startswith("#"):
                kid, key = line.split()
                out[kid] = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
        return out

    def test_hmac_recomputed_independently(self):
        kid = va.keygen(self.keyfile)
        svc = va.Service(va.load_keyring(self.keyfile), issuer="ci-gate")
        r = svc.verify({"claim": "Added null check for `user.email` in src/user.py", "evidence": {"diff": D_USER},
                        "caller_context": {"job": "42"}})
        rec = r["receipt"]
        self.assertEqual(list(rec), list(va.RECEIPT_FIELDS))
        self.assertEqual((rec["schema"], rec["kid"], rec["issued_by"], rec["verdict"], rec["verifier_method"],
                          rec["verifier_id"], rec["policy_or_oracle_refs"], rec["caller_context"]),
                         ("verify_action_receipt.v0", kid, "ci-gate", "verified", "rule_based.code_diff",
                          "verify_action.py@" + va.VERSION, [], {"job": "42"}))
        self.assertRegex(rec["issued_at"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        unsigned = {k: v for k, v in rec.items() if k != "signature"}
        mac = hmac.new(self.keys_from_file()[kid], ref_jcs(unsigned).encode("utf-8"), hashlib.sha256).digest()
        self.assertEqual(rec["signature"], "hmac-sha256:" + base64.urlsafe_b64encode(mac).rstrip(b"=").decode())
        self.assertEqual(svc.verify({"claim": "x", "evidence": {}})["receipt"]["caller_context"], {})

    def test_any_altered_field_fails(self):
        va.keygen(self.keyfile)
        ring = va.load_keyring(self.keyfile)
        rec = va.Service(ring).verify({"claim": "status is ok", "evidence": {"status": "ok"}})["receipt"]
        self.assertEqual(va.verify_receipt(rec, ring), (True, "ok", ring.kid))
        changes = {"schema": ("verify_action_receipt.v1", "unsupported_schema"), "kid": ("other", "unknown_kid"),
                   "signature": ("hmac-sha256:AAAA", "bad_signature"), "confidence": (0.51, "bad_signature"),
                   "caller_context": ({"a": 1}, "bad_signature"), "reason_codes": ([], "bad_signature"),
                   "policy_or_oracle_refs": (["x"], "bad_signature")}
        for field in va.RECEIPT_FIELDS:
            altered = dict(rec)
            value, reason = changes.get(field, (str(rec[field]) + "x", "bad_signature"))
            altered[field] = value
            self.assertEqual(va.verify_receipt(altered, ring)[:2], (False, reason), field)
        for bad in ([], "x", dict(rec, extra=1), {k: v for k, v in rec.items() if k != "kid"}, dict(rec, kid=5),
                    dict(rec, signature="sha1:x")):
            self.assertEqual(va.verify_receipt(bad, ring)[:2], (False, "malformed"))

    def test_rotation_and_unknown_kid(self):
        k1 = va.keygen(self.keyfile)
        old = va.Service(va.load_keyring(self.keyfile)).verify({"claim": "x", "evidence": {}})["receipt"]
        time.sleep(0.01)
        k2 = va.keygen(self.keyfile)
        self.assertNotEqual(k1, k2)
        ring = va.load_keyring(self.keyfile)
        self.assertEqual((ring.kid, list(ring.keys)), (k2, [k1, k2]))
        new = va.Service(ring).verify({"claim": "x", "evidence": {}})["receipt"]
        self.assertEqual((new["kid"], va.verify_receipt(old, ring)), (k2, (True, "ok", k1)))
        self.assertEqual(va.verify_receipt(old, va.KeyRing.generate()), (False, "unknown_kid", k1))

    def test_13_keygen_appends_to_an_empty_ring_and_never_through_a_symlink(self):
        for text in (b"", b"# comments only\n"):
            fd = os.open(self.keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, text)
            os.close(fd)
            kid = va.keygen(self.keyfile)  # before: refused, as an empty ring does not load
            self.assertEqual(list(va.load_keyring(self.keyfile).keys), [kid])
        if not hasattr(os, "O_NOFOLLOW"):
            self.skipTest("no O_NOFOLLOW here (Windows)")
        link = os.path.join(self.dir, "link")
        os.symlink(self.keyfile, link)
        self.assertRaises(OSError, va.keygen, link)  # O_NOFOLLOW: the file checked is the file written
        self.assertEqual(len(va.load_keyring(self.keyfile).keys), 1)

    @unittest.skipUnless(hasattr(os, "mkfifo") and hasattr(os, "O_NOFOLLOW"), "no FIFOs or O_NOFOLLOW (Windows)")
    def test_a_key_ring_through_a_link_or_a_fifo_is_refused(self):
        va.keygen(self.keyfile)
        os.symlink(self.keyfile, os.path.join(self.dir, "link"))
        self.assertRaises(OSError, va.load_keyring, os.path.join(self.dir, "link"))  # O_NOFOLLOW
        os.mkfifo(os.path.join(self.dir, "fifo"), 0o600)  # O_NONBLOCK: refused at once, no writer awaited
        self.assertRaisesRegex(ValueError, "regular file", va.load_keyring, os.path.join(self.dir, "fifo"))

    @unittest.skipUnless(va.POSIX_MODES, "file modes are not enforced here (Windows)")
    def test_keygen_is_0600_atomically_and_refuses_open_files(self):
        mask = os.umask(0)
        try:
            va.keygen(self.keyfile)
        finally:
            os.umask(mask)
        self.assertEqual(stat.S_IMODE(os.stat(self.keyfile).st_mode), 0o600)
        va.keygen(self.keyfile)
        self.assertEqual(len(va.load_keyring(self.keyfile).keys), 2)
        os.chmod(self.keyfile, 0o640)
        self.assertRaisesRegex(ValueError, "group or others", va.load_keyring, self.keyfile)
        self.assertRaisesRegex(ValueError, "group or others", va.keygen, self.keyfile)
        os.chmod(self.keyfile, 0o604)
        self.assertRaises(ValueError, va.load_keyring, self.keyfile)

    def test_keygen_creates_with_o_excl_and_0600(self):
        # keygen opens with O_CREAT|O_EXCL and mode 0600: the file never exists with a wider mode
        calls = []
        real_open = os.open

        def spy(path, flags, mode=0o777, *a, **k):
            calls.append((flags, mode))
            return real_open(path, flags, mode, *a, **k)
        os.open = spy
        try:
            va.keygen(os.path.join(self.dir, "fresh"))
        finally:
            os.open = real_open
        self.assertTrue(calls[0][0] & os.O_CREAT and calls[0][0] & os.O_EXCL and calls[0][1] == 0o600)

    def test_keyring_parse_refusals(self):
        good = b64 = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
        self.assertEqual(list(va.KeyRing.parse("# c\n\nk1 %s  # note\nk2 %s\n" % (good, b64)).keys), ["k1", "k2"])
        for text in ("", "# only\n", "k1\n", "k1 %s extra\n" % good, "k1 %s\nk1 %s\n" % (good, good),
                     "k1 %s\n" % base64.urlsafe_b64encode(os.urandom(31)).decode(), "k1 !!!!\n", "k/1 %s\n" % good):
            self.assertRaises(ValueError, va.KeyRing.parse, text)

    def test_cli_keygen_and_verify_receipt(self):
        run = lambda *a: subprocess.run([PY, SCRIPT] + list(a), capture_output=True, timeout=20)
        r = run("keygen", "--key-file", self.keyfile)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.decode().strip(), list(va.load_keyring(self.keyfile).keys)[0])
        resp = va.Service(va.load_keyring(self.keyfile)).verify({"claim": "x", "evidence": {}})
        for name, doc, code in (("resp.json", resp, 0), ("rec.json", resp["receipt"], 0),
                                ("bad.json", dict(resp["receipt"], verdict="verified"), 1)):
            path = os.path.join(self.dir, name)
            with open(path, "w") as f:
                json.dump(doc, f)
            r = run("verify-receipt", path, "--key-file", self.keyfile)
            self.assertEqual(r.returncode, code, r.stderr)
            self.assertEqual(json.loads(r.stdout)["valid"], code == 0)
        if not va.POSIX_MODES:
            return  # Windows: the mode is not refused (OtherSystems)
        os.chmod(self.keyfile, 0o644)
        r = run("verify-receipt", path, "--key-file", self.keyfile)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"group or others", r.stderr)


# ---------------------------------------------------------------------------------------------------
# Ed25519 (RFC 8032), did:key and eddsa-jcs-2022 credentials (issue 29)
# ---------------------------------------------------------------------------------------------------
# RFC 8032 §7.1, the Ed25519 tests: (name, secret key, public key, message, signature), hex.
TEST_1024_MESSAGE = (
    "08b8b2b733424243760fe426a4b54908632110a66c2f6591eabd3345e3e4eb98fa6e264bf09efe12ee50f8f54e9f77b1"
    "e355f6c50544e23fb1433ddf73be84d879de7c0046dc4996d9e773f4bc9efe5738829adb26c81b37c93a1b270b20329d"
    "658675fc6ea534e0810a4432826bf58c941efb65d57a338bbd2e26640f89ffbc1a858efcb8550ee3a5e1998bd177e93a"
    "7363c344fe6b199ee5d02e82d522c4feba15452f80288a821a579116ec6dad2b3b310da903401aa62100ab5d1a36553e"
    "06203b33890cc9b832f79ef80560ccb9a39ce767967ed628c6ad573cb116dbefefd75499da96bd68a8a97b928a8bbc10"
    "3b6621fcde2beca1231d206be6cd9ec7aff6f6c94fcd7204ed3455c68c83f4a41da4af2b74ef5c53f1d8ac70bdcb7ed1"
    "85ce81bd84359d44254d95629e9855a94a7c1958d1f8ada5d0532ed8a5aa3fb2d17ba70eb6248e594e1a2297acbbb39d"
    "502f1a8c6eb6f1ce22b3de1a1f40cc24554119a831a9aad6079cad88425de6bde1a9187ebb6092cf67bf2b13fd65f270"
    "88d78b7e883c8759d2c4f5c65adb7553878ad575f9fad878e80a0c9ba63bcbcc2732e69485bbc9c90bfbd62481d9089b"
    "eccf80cfe2df16a2cf65bd92dd597b0707e0917af48bbb75fed413d238f5555a7a569d80c3414a8d0859dc65a46128ba"
    "b27af87a71314f318c782b23ebfe808b82b0ce26401d2e22f04d83d1255dc51addd3b75a2b1ae0784504df543af8969b"
    "e3ea7082ff7fc9888c144da2af58429ec96031dbcad3dad9af0dcbaaaf268cb8fcffead94f3c7ca495e056a9b47acdb7"
    "51fb73e666c6c655ade8297297d07ad1ba5e43f1bca32301651339e22904cc8c42f58c30c04aafdb038dda0847dd988d"
    "cda6f3bfd15c4b4c4525004aa06eeff8ca61783aacec57fb3d1f92b0fe2fd1a85f6724517b65e614ad6808d6f6ee34df"
    "f7310fdc82aebfd904b01e1dc54b2927094b2db68d6f903b68401adebf5a7e08d78ff4ef5d63653a65040cf9bfd4aca7"
    "984a74d37145986780fc0b16ac451649de6188a7dbdf191f64b5fc5e2ab47b57f7f7276cd419c17a3ca8e1b939ae49e4"
    "88acba6b965610b5480109c8b17b80e1b7b750dfc7598d5d5011fd2dcc5600a32ef5b52a1ecc820e308aa342721aac09"
    "43bf6686b64b2579376504ccc493d97e6aed3fb0f9cd71a43dd497f01f17c0e2cb3797aa2a2f256656168e6c496afc5f"
    "b93246f6b1116398a346f1a641f3b041e989f7914f90cc2c7fff357876e506b50d334ba77c225bc307ba537152f3f161"
    "0e4eafe595f6d9d90d11faa933a15ef1369546868a7f3a45a96768d40fd9d03412c091c6315cf4fde7cb68606937380d"
    "b2eaaa707b4c4185c32eddcdd306705e4dc1ffc872eeee475a64dfac86aba41c0618983f8741c5ef68d3a101e8a3b8ca"
    "c60c905c15fc910840b94c00a0b9d0"
)
RFC8032_VECTORS = [
    ("TEST 1", "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
     "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("TEST 2", "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
     "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("TEST 3", "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
     "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
    ("TEST 1024", "f5e5767cf153319517630f226876b86c8160cc583bc013744c6bf255f5cc0ee5",
     "278117fc144c72340f67d0f2316e8386ceffbf2b2428c9c51fef7c597f1d426e", TEST_1024_MESSAGE,
     "0aab4c900501b3e24d7cdf4663326a3a87df5e4843b2cbdb67cbf6e460fec350"
     "aa5371b1508f9f4528ecea23c436d94b5e8fcd4f681e30a6ac00a9704a188a03"),
    ("TEST SHA(abc)", "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
     "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
     "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
     "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
     "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b589"
     "09351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704"),
]
# The 8 points of small order, as canonical encodings (y, and the sign of x in the top bit).
SMALL_ORDER_POINTS = [
    "0100000000000000000000000000000000000000000000000000000000000000",   # order 1, the neutral point
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",   # order 2: (0, -1)
    "0000000000000000000000000000000000000000000000000000000000000000",   # order 4: (sqrt(-1), 0)
    "0000000000000000000000000000000000000000000000000000000000000080",   # order 4: (-sqrt(-1), 0)
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",   # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
]
# Bitcoin Core's base58_encode_decode.json: (hex, base58btc)
BASE58_VECTORS = [
    ("", ""), ("61", "2g"), ("626262", "a3gV"), ("636363", "aPEr"),
    ("73696d706c792061206c6f6e6720737472696e67", "2cFupjhnEsSn59qHXstmK2ffpLv2"),
    ("00eb15231dfceb60925886b67d065299925915aeb172c06647", "1NS17iag9jJgTHD1VXjvLCEnZuQ3rJDE9L"),
    ("516b6fcd0f", "ABnLTmg"), ("bf4f89001e670274dd", "3SEo3LWLoPntC"), ("572e4794", "3EFU7m"),
    ("ecac89cad93923c02321", "EJDM8drfXA6uyA"), ("10c8511e", "Rt5zm"), ("00000000000000000000", "1111111111"),
]
# did:key's test vectors (w3c-ccg/did-method-key test-vectors/ed25519-x25519.json): seed (hex) -> (did, the public
# key in base58btc)
DID_KEY_VECTORS = [
    ("00" * 32, "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp",
     "4zvwRjXUKGfvwnParsHAS3HuSVzV5cA4McphgmoCtajS"),
    ("00" * 31 + "01", "did:key:z6MkjchhfUsD6mmvni8mCdXHw216Xrm9bQe2mBH1P5RDjVJG",
     "6ASf5EcmmEHTgDJ4X4ZT5vT6iHVJBXPg5AN5YoTCpGWt"),
    ("00" * 31 + "02", "did:key:z6MknGc3ocHs3zdPiJbnaaqDi58NGb4pk1Sp9WxWufuXSdxf",
     "8pM1DN3RiT8vbom5u1sNryaNT1nyL8CTTW3b5PwWXRBH"),
    ("00" * 31 + "03", "did:key:z6MkvqoYXQfDDJRv8L4wKzxYeuKyVZBfi9Qo6Ro8MiLH3kDQ",
     "HPYVwAQmskwT1qEEeRzhoomyfyupJGASQQtCXSNG8XS2"),
    ("00" * 31 + "04", "did:key:z6MkwW6aqMnjgrhJXFUko3NnZPGzVpkNzhYK7yEhnsibmLwL",
     "J3qYF7YJMKCqQke47UQwiHizgFUXapHxRxKmxbkar89x"),
]
X25519_DID_KEY = "did:key:z6LShs9GGnqk85isEBzzshkuVWrVKsRp24GnDuHk8QWkARMW"   # the same file's X25519 key
SEED_A = hashlib.sha256(b"verify_action test key A").digest()
SEED_B = hashlib.sha256(b"verify_action test key B").digest()
CREATED = "2026-03-04T05:06:07Z"


def receipt_fields():
    """A receipt as verify_action.py issues one (HMAC signature and kid included, to be left out)."""
    return {
        "schema": "verify_action_receipt.v0",
        "claim_hash": "sha256:" + "ab" * 32,
        "evidence_manifest_hash": "sha256:" + "cd" * 32,
        "request_hash": "sha256:" + "ef" * 32,
        "verifier_id": "verify_action.py@0.4.0",
        "verifier_method": "rule_based.code_diff",
        "verdict": "verified",
        "confidence": 0.7,
        "reason_codes": ["path_in_diff", "identifier_in_changed_lines"],
        "policy_or_oracle_refs": [],
        "caller_context": {"agent": "deployer-7", "ticket": "\u00e9t\u00e9 \U0001f600"},
        "issued_at": CREATED,
        "issued_by": "verify_action.py",
        "kid": "k20260304-abcdef",
        "signature": "hmac-sha256:" + "A" * 43,
    }


def secured_credential(seed=SEED_A, issuer_seed=None, fields=None):
    """A credential for receipt_fields() issued by issuer_seed's did:key (default: seed's), proved by seed."""
    issuer = va.did_key(va.secret_to_public(issuer_seed or seed))
    credential = va.credential_for(fields or receipt_fields(), issuer, CREATED)
    return dict(credential, proof=va.create_proof(credential, seed, CREATED, va._jcs))


def encode_point(P):
    return va.point_compress(P)


def negate(P):
    X, Y, Z, T = P
    return (-X % va.p, Y, Z, -T % va.p)


class Ed25519Rfc8032(unittest.TestCase):
    """RFC 8032 §7.1's Ed25519 vectors: public key, signature byte for byte, and verification."""

    def test_vectors(self):
        for name, secret, public, message, signature in RFC8032_VECTORS:
            with self.subTest(name):
                seed, msg = bytes.fromhex(secret), bytes.fromhex(message)
                self.assertEqual(va.secret_to_public(seed).hex(), public)
                self.assertEqual(va.sign(seed, msg).hex(), signature)
                self.assertTrue(va.verify(bytes.fromhex(public), msg, bytes.fromhex(signature)))

    def test_test_1024_is_1023_bytes(self):
        self.assertEqual(len(bytes.fromhex(TEST_1024_MESSAGE)), 1023)

    def test_any_changed_bit_fails(self):
        _, secret, public, message, signature = RFC8032_VECTORS[2]
        key, msg, sig = bytes.fromhex(public), bytes.fromhex(message), bytes.fromhex(signature)
        for bit in (0, 7, 100, 255, 256, 300, 511):
            changed = bytearray(sig)
            changed[bit // 8] ^= 1 << (bit % 8)
            self.assertFalse(va.verify(key, msg, bytes(changed)), bit)
        self.assertFalse(va.verify(key, msg + b"\x00", sig))
        self.assertFalse(va.verify(key, b"\xaf\x83", sig))
        other = va.secret_to_public(SEED_A)
        self.assertFalse(va.verify(other, msg, sig))


class Ed25519StrictVerify(unittest.TestCase):
    """What strict means here: lengths and types, S < q, canonical encodings, no small order, cofactorless."""

    def setUp(self):
        self.public = va.secret_to_public(SEED_A)
        self.msg = b"strict"
        self.sig = va.sign(SEED_A, self.msg)

    def test_lengths_and_types(self):
        self.assertTrue(va.verify(self.public, self.msg, self.sig))
        self.assertFalse(va.verify(self.public, self.msg, self.sig[:63]))
        self.assertFalse(va.verify(self.public, self.msg, self.sig + b"\x00"))
        self.assertFalse(va.verify(self.public[:31], self.msg, self.sig))
        self.assertFalse(va.verify(self.public + b"\x00", self.msg, self.sig))
        self.assertFalse(va.verify(bytearray(self.public), self.msg, self.sig))
        self.assertFalse(va.verify(self.public, self.msg.decode(), self.sig))
        self.assertFalse(va.verify(None, self.msg, self.sig))
        self.assertFalse(va.verify(self.public, self.msg, self.sig.hex()))

    def test_s_plus_q_is_refused(self):
        s = int.from_bytes(self.sig[32:], "little")
        for bigger in (s + va.q, s + 2 * va.q, s + 8 * va.q):
            if bigger < 2**256:
                self.assertFalse(va.verify(self.public, self.msg, self.sig[:32] + bigger.to_bytes(32, "little")))
        self.assertFalse(va.verify(self.public, self.msg, self.sig[:32] + va.q.to_bytes(32, "little")))

    def test_small_order_keys_are_refused(self):
        for encoding in SMALL_ORDER_POINTS:
            key = bytes.fromhex(encoding)
            with self.subTest(encoding):
                self.assertTrue(va.is_small_order(va.point_decompress(key)))
                # the neutral key and R = neutral, S = 0 satisfy the equation for any message
                neutral_sig = SMALL_ORDER_POINTS[0] + "00" * 32
                self.assertFalse(va.verify(key, self.msg, bytes.fromhex(neutral_sig)))

    def test_small_order_keys_verify_anything_unless_refused(self):
        # For a key A of small order, [h]A is the neutral point whenever h is a multiple of A's order: then R = [s]G
        # (of large order) and S = s satisfy the equation for any message. Only the refusal of A stops it.
        s = 12345
        Rs = va.point_compress(va.base_mul(s))
        for encoding in SMALL_ORDER_POINTS:
            key = bytes.fromhex(encoding)
            A = va.point_decompress(key)
            messages = [b"forged %d" % counter for counter in range(200)]
            fitting = []
            for message in messages:
                hA = va.point_mul(va.sha512_modq(Rs + key + message), A)
                if va.point_equal(hA, va.NEUTRAL):
                    fitting.append(message)
            with self.subTest(encoding):
                self.assertTrue(fitting)
                self.assertFalse(va.verify(key, fitting[0], Rs + s.to_bytes(32, "little")))

    def test_point_equal(self):
        x, y = va.G[0], va.G[1]
        self.assertTrue(va.point_equal(va.G, (3 * x % va.p, 3 * y % va.p, 3, 3 * x * y % va.p)))
        self.assertFalse(va.point_equal(va.G, (x, va.p - y, 1, x * (va.p - y) % va.p)))   # same x
        self.assertFalse(va.point_equal(va.G, (va.p - x, y, 1, (va.p - x) * y % va.p)))   # same y

    def test_small_order_r_is_refused(self):
        # R = the neutral point and S = h*a mod q satisfy [S]G == R + [h]A: refused for its R alone
        a, _ = va.secret_expand(SEED_A)
        Rs = bytes.fromhex(SMALL_ORDER_POINTS[0])
        h = va.sha512_modq(Rs + self.public + self.msg)
        s = h * a % va.q
        forged = Rs + s.to_bytes(32, "little")
        hA = va.point_mul(h, va.point_decompress(self.public))
        self.assertTrue(va.point_equal(va.base_mul(s), va.point_add(va.point_decompress(Rs), hA)))
        self.assertFalse(va.verify(self.public, self.msg, forged))

    def test_non_canonical_encodings_are_refused(self):
        p = va.p
        # y >= p (p + 1 spells the neutral point's y again); "-0": x = 0 with the sign bit set
        for y, sign in ((p, 0), (p + 1, 0), (p + 1, 1), (2**255 - 1, 0), (1, 1), (p - 1, 1)):
            encoding = (y | sign << 255).to_bytes(32, "little")
            self.assertIsNone(va.point_decompress(encoding), (y, sign))
        self.assertIsNone(va.point_decompress(b"\x02" + bytes(31)))   # y = 2 is not on the curve
        neutral_again = (p + 1).to_bytes(32, "little")
        self.assertFalse(va.verify(neutral_again, self.msg, neutral_again + bytes(32)))
        # y + p fits in 255 bits only for y < 19: each such point has a second spelling, refused
        on_curve = 0
        for y in range(19):
            for sign in (0, 1):
                canonical = va.point_decompress((y | sign << 255).to_bytes(32, "little"))
                on_curve += canonical is not None
                self.assertIsNone(va.point_decompress((y + p | sign << 255).to_bytes(32, "little")), y)
        self.assertGreater(on_curve, 4)

    def test_sign_rejects_bad_seed(self):
        self.assertRaises(ValueError, va.sign, b"\x00" * 31, b"")
        self.assertRaises(ValueError, va.secret_to_public, b"\x00" * 33)
        self.assertRaises(TypeError, va.sign, bytearray(32), b"")   # lru_cache: only bytes, which cannot change

    def test_expanded_key_is_secret_expand_and_plain_double_and_add(self):
        for seed in (SEED_A, SEED_B, bytes(32), b"\xff" * 32):
            a, prefix, A = va.expanded_key(seed)
            self.assertEqual((a, prefix), va.secret_expand(seed))
            self.assertEqual(A, va.point_compress(va.point_mul(a, va.G)))
            self.assertEqual(va.expanded_key(seed), (a, prefix, A))   # the cached value, unchanged

    def test_cofactorless_equation(self):
        # Signatures that only the cofactored equation [8][S]G == [8]R + [8][h]A accepts: R moved by a point of
        # order 8, and a key moved by one (then the equation holds iff h is a multiple of 8).
        a, prefix = va.secret_expand(SEED_A)
        T8 = va.point_decompress(bytes.fromhex(SMALL_ORDER_POINTS[4]))
        A = va.base_mul(a)
        r = va.sha512_modq(prefix + self.msg)
        moved_r = va.point_compress(va.point_add(va.base_mul(r), T8))
        h = va.sha512_modq(moved_r + self.public + self.msg)
        s = (r + h * a) % va.q
        self.assertFalse(va.verify(self.public, self.msg, moved_r + s.to_bytes(32, "little")))
        moved_key = va.point_compress(va.point_add(A, T8))
        results = set()
        for counter in range(40):
            msg = b"mixed order %d" % counter
            Rs = va.point_compress(va.base_mul(r))
            h = va.sha512_modq(Rs + moved_key + msg)
            s = (r + h * a) % va.q
            results.add((h % 8 == 0, va.verify(moved_key, msg, Rs + s.to_bytes(32, "little"))))
        self.assertEqual(results, {(True, True), (False, False)})


class Ed25519BaseTable(unittest.TestCase):
    """base_mul's contract, proved against the plain double-and-add: base_mul(s) equals point_mul(s, G)."""

    def assertSamePoint(self, s):
        table = va.base_mul(s)
        plain = va.point_mul(s, va.G)
        self.assertTrue(va.point_equal(table, plain), s)
        self.assertEqual(encode_point(table), encode_point(plain), s)

    def test_edge_scalars(self):
        q = va.q
        edges = [0, 1, 2, 255, 256, 257, q - 1, q, q + 1, 8 * q, 2**252, 2**254, 2**255 - 1, 2**255, 2**256 - 1]
        edges += [2**(8 * i) - 1 for i in range(1, 32)] + [2**(8 * i) for i in range(1, 32)]
        for s in edges:
            self.assertSamePoint(s)
        self.assertEqual(encode_point(va.base_mul(q)), bytes.fromhex(SMALL_ORDER_POINTS[0]))   # [q]G is neutral

    def test_random_scalars(self):
        rng = random.Random(29)
        for _ in range(150):
            self.assertSamePoint(rng.randrange(2**256))
        for _ in range(50):
            self.assertSamePoint(rng.randrange(2**256) & ~(0xff << (8 * rng.randrange(32))))   # a zero byte

    def test_bounds(self):
        self.assertRaises(ValueError, va.base_mul, -1)
        self.assertRaises(ValueError, va.base_mul, 2**256)

    def test_table_shape(self):
        table = va.base_table()
        self.assertEqual(len(table), va.BASE_ROWS)
        self.assertEqual({len(row) for row in table}, {2**va.BASE_WINDOW})
        self.assertEqual(va.BASE_ROWS * va.BASE_WINDOW, 256)


def ssh_string(data):
    return struct.pack(">I", len(data)) + data


def openssh_private_key(seed, public):
    """An unencrypted OpenSSH private key file (PROTOCOL.key) holding the Ed25519 key of seed."""
    key_blob = ssh_string(b"ssh-ed25519") + ssh_string(public)
    check = b"\x29\x29\x29\x29"
    private = check + check + key_blob + ssh_string(seed + public) + ssh_string(b"verify_action test")
    private += bytes(range(1, 1 + (-len(private) % 8)))
    body = b"openssh-key-v1\x00" + ssh_string(b"none") + ssh_string(b"none") + ssh_string(b"")
    body += struct.pack(">I", 1) + ssh_string(key_blob) + ssh_string(private)
    text = base64.b64encode(body).decode("ascii")
    lines = [text[i:i + 70] for i in range(0, len(text), 70)]
    return "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----\n"


def read_strings(blob, count):
    """count SSH strings from blob, and what follows them."""
    found = []
    for _ in range(count):
        (length,) = struct.unpack(">I", blob[:4])
        found.append(blob[4:4 + length])
        blob = blob[4 + length:]
    return found, blob


def sshsig_parts(armored):
    """(public key blob, namespace, hash algorithm, 64 signature bytes) of an armored SSHSIG."""
    lines = armored.strip().splitlines()
    blob = base64.b64decode("".join(lines[1:-1]))
    assert blob[:6] == b"SSHSIG" and blob[6:10] == b"\x00\x00\x00\x01"
    (key, namespace, _reserved, hash_algorithm, signature), rest = read_strings(blob[10:], 5)
    assert rest == b""
    (kind, raw), rest = read_strings(signature, 2)
    assert kind == b"ssh-ed25519" and rest == b""
    return key, namespace, hash_algorithm, raw


def sshsig_signed_data(namespace, message):
    """What an SSHSIG with hash sha512 signs (PROTOCOL.sshsig §3)."""
    digest = hashlib.sha512(message).digest()
    return b"SSHSIG" + ssh_string(namespace) + ssh_string(b"") + ssh_string(b"sha512") + ssh_string(digest)


@unittest.skipUnless(shutil.which("ssh-keygen"), "ssh-keygen is not on PATH")
class Ed25519SshKeygen(unittest.TestCase):
    """Ed25519 is deterministic: ssh-keygen -Y sign with the same seed must give the same 64 bytes."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def ssh_sign(self, seed, message, namespace):
        key_file = os.path.join(self.dir, "key")
        message_file = os.path.join(self.dir, "message")
        for name in (key_file, message_file + ".sig"):
            if os.path.exists(name):
                os.remove(name)
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(openssh_private_key(seed, va.secret_to_public(seed)))
        with open(message_file, "wb") as f:
            f.write(message)
        command = ["ssh-keygen", "-q", "-Y", "sign", "-f", key_file, "-n", namespace, message_file]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        with open(message_file + ".sig") as f:
            return f.read()

    def test_signatures_match_ssh_keygen(self):
        rng = random.Random(8032)
        seeds = [bytes.fromhex(vector[1]) for vector in RFC8032_VECTORS] + [SEED_A, SEED_B]
        seeds += [bytes(rng.randrange(256) for _ in range(32)) for _ in range(5)]
        for number, seed in enumerate(seeds):
            message = b"message %d " % number + bytes(rng.randrange(256) for _ in range(number * 37))
            with self.subTest(seed=seed.hex()):
                key, namespace, hash_algorithm, raw = sshsig_parts(self.ssh_sign(seed, message, "file"))
                public = va.secret_to_public(seed)
                self.assertEqual(key, ssh_string(b"ssh-ed25519") + ssh_string(public))
                self.assertEqual((namespace, hash_algorithm), (b"file", b"sha512"))
                signed_data = sshsig_signed_data(b"file", message)
                self.assertEqual(va.sign(seed, signed_data), raw)
                self.assertTrue(va.verify(public, signed_data, raw))


class CredentialBase58(unittest.TestCase):
    """base58btc: Bitcoin Core's vectors, round trips both ways, and refusals."""

    def test_vectors(self):
        for data, text in BASE58_VECTORS:
            self.assertEqual(va.base58_encode(bytes.fromhex(data)), text)
            self.assertEqual(va.base58_decode(text), bytes.fromhex(data))
        alphabet = va.BASE58_ALPHABET
        self.assertEqual(len(alphabet), 58)
        self.assertEqual(set(alphabet) & set("0OIl"), set())

    def test_round_trips(self):
        rng = random.Random(58)
        for length in list(range(0, 40)) + [64, 90]:
            zeros = bytes(rng.randrange(4))
            data = zeros + bytes(rng.randrange(256) for _ in range(length))
            text = va.base58_encode(data)
            self.assertEqual(va.base58_decode(text), data)
            self.assertEqual(va.base58_encode(va.base58_decode(text)), text)
        for _ in range(200):   # any text of the alphabet is the encoding of exactly one byte string
            text = "".join(rng.choice(va.BASE58_ALPHABET) for _ in range(rng.randrange(1, 60)))
            self.assertEqual(va.base58_encode(va.base58_decode(text)), text)

    def test_refusals(self):
        for text in ("0", "O", "I", "l", "3mJr0", "2g ", " 2g", "2g\n", "\u0661", "\uff12g", "+", None, b"2g"):
            with self.subTest(text=text):
                self.assertRaises(ValueError, va.base58_decode, text)
        self.assertEqual(len(va.base58_decode("2" * va.BASE58_MAX_CHARS)) > 0, True)
        self.assertRaises(ValueError, va.base58_decode, "2" * (va.BASE58_MAX_CHARS + 1))

    def test_multibase(self):
        self.assertEqual(va.multibase_encode(b"\x00\x01"), "z12")
        self.assertEqual(va.multibase_decode("z12"), b"\x00\x01")
        for text in ("12", "Z12", "u12", "", "zz0"):
            self.assertRaises(ValueError, va.multibase_decode, text)


class CredentialDidKey(unittest.TestCase):
    """did:key for Ed25519: the did:key spec's test vectors, the verification method, and strict parsing."""

    def test_vectors(self):
        for seed, did, public_base58 in DID_KEY_VECTORS:
            public = va.secret_to_public(bytes.fromhex(seed))
            self.assertEqual(va.base58_encode(public), public_base58)
            self.assertEqual(va.did_key(public), did)
            self.assertEqual(va.verification_method(public), did + "#" + did[len("did:key:"):])
            self.assertEqual(va.did_key_public_key(did), public)

    def test_spec_example_and_prefix(self):
        # the did:key spec's example; every Ed25519 did:key starts z6Mk (0xed 0x01 and the key's top bits)
        public = va.did_key_public_key("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK")
        self.assertEqual(len(public), 32)
        self.assertTrue(va.did_key(va.secret_to_public(SEED_A)).startswith("did:key:z6Mk"))

    def test_refusals(self):
        did = va.did_key(va.secret_to_public(SEED_A))
        body = va.multibase_decode(did[len("did:key:"):])
        refused = [
            did.replace("did:key:", "did:web:"), did.replace("did:key:", "DID:key:"), did + "#x", did[:-1],
            did.replace(":z", ":u"), did + " ", "did:key:" + va.multibase_encode(body[:-1]),
            "did:key:" + va.multibase_encode(body + b"\x00"),
            "did:key:" + va.multibase_encode(b"\xec\x01" + body[2:]),
            "did:key:" + va.multibase_encode(b"\xed" + body[2:] + b"\x00"), X25519_DID_KEY, None, 42,
            "did:key:" + va.multibase_encode(b"\x00" + body),   # a leading zero byte: '1' before the codec
        ]
        for encoding in SMALL_ORDER_POINTS:   # decodable points of small order
            refused.append(va.did_key(bytes.fromhex(encoding)))
        refused.append(va.did_key((va.p + 1).to_bytes(32, "little")))   # y >= p
        refused.append(va.did_key(b"\x02" + bytes(31)))                    # not on the curve
        for text in refused:
            with self.subTest(text=text):
                self.assertRaises(ValueError, va.did_key_public_key, text)


class CredentialDateTime(unittest.TestCase):
    """created must be an XML Schema dateTimeStamp."""

    def test_table(self):
        good = ["2026-03-04T05:06:07Z", "2024-02-29T00:00:00Z", "2000-02-29T23:59:59Z", "2026-12-31T23:59:59.123Z",
                "2026-03-04T05:06:07+14:00", "2026-03-04T05:06:07-05:30", "0001-01-01T00:00:00Z"]
        bad = ["2026-03-04T05:06:07", "2026-03-04 05:06:07Z", "2026-3-04T05:06:07Z", "2026-03-04T05:06Z",
               "2023-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z",
               "2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z",
               "2026-01-01T00:00:60Z", "2026-01-01T00:00:00+14:01", "2026-01-01T00:00:00+15:00",
               "2026-01-01T00:00:00+05:60", "2026-01-01T00:00:00z", "2026-01-01T00:00:00Z\n",
               "\u0662026-01-01T00:00:00Z",
               "2026-01-01T00:00:00.Z", "", None, 1767225600, "12026-01-01T00:00:00Z"]
        for text in good:
            self.assertTrue(va.date_time_ok(text), text)
        for text in bad:
            self.assertFalse(va.date_time_ok(text), text)


class CredentialShape(unittest.TestCase):
    """credential_for: the VC 2.0 shape issue 29 names."""

    def test_shape(self):
        fields = receipt_fields()
        before = json.dumps(fields, sort_keys=True)
        did = va.did_key(va.secret_to_public(SEED_A))
        credential = va.credential_for(fields, did, CREATED)
        subject = {k: v for k, v in fields.items() if k not in ("signature", "kid")}
        self.assertEqual(credential, {
            "@context": ["https://www.w3.org/ns/credentials/v2"],
            "type": ["VerifiableCredential", "VerifyActionReceipt"],
            "issuer": did,
            "validFrom": CREATED,
            "credentialSubject": subject,
        })
        self.assertEqual(len(subject), len(fields) - 2)
        self.assertEqual(json.dumps(fields, sort_keys=True), before)


class CredentialProofs(unittest.TestCase):
    """eddsa-jcs-2022: what create_proof makes, and every way verify_proof must refuse a changed document."""

    def setUp(self):
        self.public_a = va.secret_to_public(SEED_A)
        self.public_b = va.secret_to_public(SEED_B)
        self.keys = [self.public_a]
        self.secured = secured_credential()

    def check(self, document, expected, keys=None):
        self.assertEqual(va.verify_proof(document, self.keys if keys is None else keys, va._jcs), expected)

    def test_created_proof(self):
        proof = self.secured["proof"]
        method = va.verification_method(self.public_a)
        self.assertEqual(set(proof), {"type", "cryptosuite", "created", "verificationMethod", "proofPurpose",
                                      "@context", "proofValue"})
        self.assertEqual(proof["type"], "DataIntegrityProof")
        self.assertEqual(proof["cryptosuite"], "eddsa-jcs-2022")
        self.assertEqual(proof["proofPurpose"], "assertionMethod")
        self.assertEqual(proof["created"], CREATED)
        self.assertEqual(proof["verificationMethod"], method)
        self.assertEqual(proof["@context"], ["https://www.w3.org/ns/credentials/v2"])
        self.assertEqual(len(va.multibase_decode(proof["proofValue"])), 64)
        self.assertEqual(secured_credential(), self.secured)   # deterministic
        self.check(self.secured, (True, "ok"))

    def test_signed_bytes_are_the_two_hashes(self):
        document = {k: v for k, v in self.secured.items() if k != "proof"}
        options = {k: v for k, v in self.secured["proof"].items() if k != "proofValue"}
        expected = hashlib.sha256(ref_jcs(options).encode()).digest()
        expected += hashlib.sha256(ref_jcs(document).encode()).digest()
        self.assertEqual(va.proof_hash_data(document, options, va._jcs), expected)
        signature = va.multibase_decode(self.secured["proof"]["proofValue"])
        self.assertTrue(va.verify(self.public_a, expected, signature))
        swapped = expected[32:] + expected[:32]
        self.assertFalse(va.verify(self.public_a, swapped, signature))

    def test_create_refusals(self):
        credential = {k: v for k, v in self.secured.items() if k != "proof"}
        self.assertRaises(ValueError, va.create_proof, self.secured, SEED_A, CREATED, va._jcs)
        self.assertRaises(ValueError, va.create_proof, [credential], SEED_A, CREATED, va._jcs)
        for created in ("2026-03-04T05:06:07", "2026-02-30T00:00:00Z", "now", None):
            self.assertRaises(ValueError, va.create_proof, credential, SEED_A, created, va._jcs)
        self.assertRaises(ValueError, va.create_proof, credential, SEED_A[:31], CREATED, va._jcs)
        no_context = {k: v for k, v in credential.items() if k != "@context"}
        self.assertNotIn("@context", va.create_proof(no_context, SEED_A, CREATED, va._jcs))

    def test_every_credential_field_altered(self):
        expected = {"@context": "malformed", "issuer": "issuer_mismatch"}   # else bad_signature
        replacements = {"@context": ["https://www.w3.org/ns/credentials/v2", "https://example.org/x"],
                        "type": ["VerifiableCredential"], "issuer": va.did_key(self.public_b),
                        "validFrom": "2026-03-04T05:06:08Z", "credentialSubject": {}}
        self.assertEqual(set(replacements), set(self.secured) - {"proof"})
        for name, value in replacements.items():
            with self.subTest(name):
                self.check(dict(self.secured, **{name: value}), (False, expected.get(name, "bad_signature")))
                removed = {k: v for k, v in self.secured.items() if k != name}
                self.check(removed, (False, expected.get(name, "bad_signature")))
        self.check(dict(self.secured, id="urn:uuid:1"), (False, "bad_signature"))

    def test_every_subject_field_altered(self):
        subject = self.secured["credentialSubject"]
        for name, value in subject.items():
            with self.subTest(name):
                for other in ("x", 0, 0.71, None, [], {"a": 1}, [value]):
                    if other == value and type(other) is type(value):
                        continue
                    changed = dict(self.secured, credentialSubject=dict(subject, **{name: other}))
                    self.check(changed, (False, "bad_signature"))
                removed = {k: v for k, v in subject.items() if k != name}
                self.check(dict(self.secured, credentialSubject=removed), (False, "bad_signature"))
        added = dict(subject, kid="k1")
        self.check(dict(self.secured, credentialSubject=added), (False, "bad_signature"))

    def test_every_proof_field_altered(self):
        proof = self.secured["proof"]
        signature = va.multibase_decode(proof["proofValue"])
        other_method = va.verification_method(self.public_b)
        rows = [   # (field, new value, keys, expected reason)
            ("type", "Ed25519Signature2020", None, "unsupported_cryptosuite"),
            ("cryptosuite", "eddsa-rdfc-2022", None, "unsupported_cryptosuite"),
            ("cryptosuite", "EDDSA-JCS-2022", None, "unsupported_cryptosuite"),
            ("created", "2026-03-04T05:06:08Z", None, "bad_signature"),
            ("created", "2026-03-04", None, "malformed"),
            ("created", 1772600767, None, "malformed"),
            ("verificationMethod", other_method, None, "unknown_key"),
            ("verificationMethod", other_method, [self.public_a, self.public_b], "issuer_mismatch"),
            ("verificationMethod", va.did_key(self.public_a), None, "unknown_key"),
            ("verificationMethod", va.did_key(self.public_a) + "#key-1", None, "unknown_key"),
            ("verificationMethod", 7, None, "malformed"),
            ("proofPurpose", "authentication", None, "malformed"),
            ("@context", ["https://www.w3.org/ns/credentials/v2", "https://example.org/x"], None, "malformed"),
            ("@context", "https://www.w3.org/ns/credentials/v2", None, "malformed"),
            ("proofValue", "u" + proof["proofValue"][1:], None, "malformed"),
            ("proofValue", "z" + va.base58_encode(signature[:63]), None, "malformed"),
            ("proofValue", "z" + va.base58_encode(signature + b"\x00"), None, "malformed"),
            ("proofValue", "z" + va.base58_encode(b"\x00" + signature), None, "malformed"),
            ("proofValue", "z" + "2" * (va.BASE58_MAX_CHARS + 1), None, "malformed"),
            ("proofValue", "z" + va.base58_encode(signature[:32] + va.q.to_bytes(32, "little")), None,
             "bad_signature"),
            ("proofValue", "z" + va.base58_encode(b"\x01" * 64), None, "bad_signature"),
            ("proofValue", None, None, "malformed"),
        ]
        for name, value, keys, reason in rows:
            with self.subTest(name=name, value=value):
                self.check(dict(self.secured, proof=dict(proof, **{name: value})), (False, reason), keys)
        for name in proof:
            with self.subTest(removed=name):
                removed = {k: v for k, v in proof.items() if k != name}
                reason = "unsupported_cryptosuite" if name in ("type", "cryptosuite") else "malformed"
                if name in ("created", "@context"):   # optional in Data Integrity, but bound by the signature
                    reason = "bad_signature"
                self.check(dict(self.secured, proof=removed), (False, reason))
        for extra in ("expires", "domain", "challenge", "nonce", "id", "previousProof", "proofValue2"):
            self.check(dict(self.secured, proof=dict(proof, **{extra: "x"})), (False, "malformed"))

    def test_one_character_of_the_signature(self):
        value = self.secured["proof"]["proofValue"]
        rng = random.Random(64)
        for position in rng.sample(range(1, len(value)), 12):
            new = va.BASE58_ALPHABET[(va.BASE58_ALPHABET.index(value[position]) + 1) % 58]
            changed = value[:position] + new + value[position + 1:]
            result = va.verify_proof(dict(self.secured, proof=dict(self.secured["proof"], proofValue=changed)),
                                       self.keys, va._jcs)
            self.assertIn(result, [(False, "bad_signature"), (False, "malformed")])   # 64 bytes or not
            if len(va.multibase_decode(changed)) == 64:
                self.assertEqual(result, (False, "bad_signature"))

    def test_proof_moved_to_another_credential(self):
        fields = dict(receipt_fields(), verdict="contradicted")
        other = secured_credential(fields=fields)
        self.check(other, (True, "ok"))
        self.check(dict(other, proof=self.secured["proof"]), (False, "bad_signature"))
        self.check(dict(self.secured, proof=other["proof"]), (False, "bad_signature"))

    def test_wrong_did_key(self):
        by_b = secured_credential(seed=SEED_B)
        self.check(by_b, (False, "unknown_key"))
        self.check(by_b, (True, "ok"), [self.public_b])
        self.check(self.secured, (False, "unknown_key"), [self.public_b])
        self.check(self.secured, (False, "unknown_key"), [])

    def test_issuer_not_the_signing_key(self):
        forged = secured_credential(seed=SEED_B, issuer_seed=SEED_A)
        both = [self.public_a, self.public_b]
        self.check(forged, (False, "issuer_mismatch"), both)
        self.check(forged, (False, "unknown_key"))   # B is not a key of the ring
        self.check(dict(self.secured, issuer={"id": self.secured["issuer"]}), (False, "issuer_mismatch"))

    def test_rotation(self):
        # every key verifies; a retired key keeps verifying
        by_b = secured_credential(seed=SEED_B)
        ring = [self.public_a, self.public_b]
        self.check(self.secured, (True, "ok"), ring)
        self.check(by_b, (True, "ok"), ring)
        self.check(by_b, (True, "ok"), reversed(ring))

    def test_proof_without_context(self):
        # the cryptosuite lets an issuer leave @context out of the proof (its Create Proof step 2 is advised)
        document = {k: v for k, v in self.secured.items() if k != "proof"}
        options = {k: v for k, v in self.secured["proof"].items() if k not in ("proofValue", "@context")}
        signature = va.sign(SEED_A, va.proof_hash_data(document, options, va._jcs))
        secured = dict(document, proof=dict(options, proofValue=va.multibase_encode(signature)))
        self.check(secured, (True, "ok"))
        self.check(dict(secured, proof=dict(secured["proof"], **{"@context": document["@context"]})),
                   (False, "bad_signature"))

    def test_not_a_secured_document(self):
        document = {k: v for k, v in self.secured.items() if k != "proof"}
        for value in (document, dict(document, proof=None), dict(document, proof=[self.secured["proof"]]),
                      [self.secured], "x", None, 7):
            self.check(value, (False, "malformed"))
        self.check(dict(self.secured, extra=float("nan")), (False, "malformed"))
        self.check(dict(self.secured, extra={1, 2}), (False, "malformed"))
        self.check(dict(self.secured, proof=dict(self.secured["proof"], created="2026-03-04T05:06:07Z")),
                   (True, "ok"))

    def test_reasons_are_closed(self):
        self.assertEqual(list(va.PROOF_REASONS), ["malformed", "unsupported_cryptosuite", "unknown_key",
                                                    "issuer_mismatch", "bad_signature", "ok"])


def seeds_of(path):
    """kid -> seed of the Ed25519 lines of a key-ring file, read apart from the module's parser."""
    seeds = {}
    with open(path) as f:
        for line in f.read().splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[1] == "ed25519":
                seeds[fields[0]] = base64.urlsafe_b64decode(fields[2] + "=")
    return seeds


def proof_verifies(credential, public):
    """Whether a credential's eddsa-jcs-2022 proof verifies under public, hashed with the tests' own RFC 8785."""
    document = {k: v for k, v in credential.items() if k != "proof"}
    options = {k: v for k, v in credential["proof"].items() if k != "proofValue"}
    signed = hashlib.sha256(ref_jcs(options).encode()).digest() + hashlib.sha256(ref_jcs(document).encode()).digest()
    return va.verify(public, signed, va.multibase_decode(credential["proof"]["proofValue"]))


class CredentialKeyRing(unittest.TestCase):
    """keygen --alg ed25519 and the key ring's Ed25519 lines: format, rotation, refusals, the seed kept inside."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.keyfile = os.path.join(self.dir, "keys")

    def test_keygen_ed25519_on_a_new_ring_adds_an_hmac_key_first(self):
        kid = va.keygen(self.keyfile, "ed25519")
        with open(self.keyfile) as f:
            lines = [line.split() for line in f.read().splitlines() if not line.startswith("#")]
        self.assertEqual([len(fields) for fields in lines], [2, 3])
        self.assertEqual((lines[1][0], lines[1][1]), (kid, "ed25519"))
        self.assertEqual(len(base64.urlsafe_b64decode(lines[1][2] + "=")), 32)
        ring = va.load_keyring(self.keyfile)
        self.assertEqual((ring.kid, ring.signer, list(ring.public_keys)), (lines[0][0], kid, [kid]))
        self.assertEqual(ring.public_keys[kid], va.secret_to_public(seeds_of(self.keyfile)[kid]))
        if va.POSIX_MODES:
            self.assertEqual(stat.S_IMODE(os.stat(self.keyfile).st_mode), 0o600)

    def test_rotation_each_kind_signs_with_its_last_key(self):
        h1 = va.keygen(self.keyfile)
        e1 = va.keygen(self.keyfile, "ed25519")
        e2 = va.keygen(self.keyfile, "ed25519")
        h2 = va.keygen(self.keyfile)
        ring = va.load_keyring(self.keyfile)
        self.assertEqual((ring.kid, ring.signer, list(ring.keys), list(ring.public_keys)), (h2, e2, [h1, h2], [e1, e2]))
        self.assertEqual([(m["kid"], m["signs"]) for m in ring.methods()], [(e1, False), (e2, True)])

    def test_an_hmac_only_ring_loads_unchanged_and_makes_no_credential(self):
        kid = va.keygen(self.keyfile)
        ring = va.load_keyring(self.keyfile)
        self.assertEqual((ring.kid, ring.signer, dict(ring.public_keys), ring.methods()), (kid, None, {}, []))
        response = va.Service(ring).verify({"claim": "x", "evidence": {}})
        self.assertEqual(list(response), list(va._RESPONSE_FIELDS))
        self.assertIsNone(ring.credential(response["receipt"]))
        self.assertIsNone(va.KeyRing.generate().signer)

    def test_parse_refusals(self):
        key = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
        seed = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
        ring = va.KeyRing.parse("h1 %s\ne1 ed25519 %s  # note\n" % (key, seed))
        self.assertEqual((list(ring.keys), list(ring.public_keys)), (["h1"], ["e1"]))
        short = base64.urlsafe_b64encode(os.urandom(31)).decode()
        long_ = base64.urlsafe_b64encode(os.urandom(33)).decode()
        refused = ["e1 ed25519 %s\n" % seed,                                    # no HMAC key
                   "h1 %s\ne1 ed25519 %s\n" % (key, short), "h1 %s\ne1 ed25519 %s\n" % (key, long_),
                   "h1 %s\ne1 ed25519\n" % key, "h1 %s\ne1 Ed25519 %s\n" % (key, seed),
                   "h1 %s\ne1 hmac %s\n" % (key, seed), "h1 %s\nh1 ed25519 %s\n" % (key, seed),
                   "h1 %s\ne1 ed25519 %s\ne1 ed25519 %s\n" % (key, seed, seed), "h1 %s\ne/1 ed25519 %s\n" % (key, seed),
                   "h1 %s\ne1 ed25519 %s x\n" % (key, seed), "h1 %s\ne1 ed25519 !!%s\n" % (key, seed[2:])]
        for text in refused:
            with self.subTest(text=text):
                with self.assertRaises(ValueError) as caught:
                    va.KeyRing.parse(text)
                self.assertNotIn(seed[5:20], str(caught.exception))
                self.assertNotIn(key[5:20], str(caught.exception))

    def test_keygen_refuses_an_unknown_alg_and_a_ring_that_does_not_load(self):
        self.assertRaises(ValueError, va.keygen, self.keyfile, "rsa")
        self.assertFalse(os.path.exists(self.keyfile))
        fd = os.open(self.keyfile, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"h1 notakey\n")
        os.close(fd)
        self.assertRaises(ValueError, va.keygen, self.keyfile, "ed25519")
        with open(self.keyfile, "rb") as f:
            self.assertEqual(f.read(), b"h1 notakey\n")

    def test_keygen_ed25519_on_a_ring_of_comments_adds_an_hmac_key(self):
        fd = os.open(self.keyfile, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"# mine")
        os.close(fd)
        kid = va.keygen(self.keyfile, "ed25519")
        ring = va.load_keyring(self.keyfile)
        self.assertEqual((len(ring.keys), ring.signer), (1, kid))

    def test_public_keys_file(self):
        dids = [va.did_key(va.secret_to_public(seed)) for seed in (SEED_A, SEED_B)]
        keys = va.parse_public_keys("# ours\n\n%s\n  %s  # retired\n" % tuple(dids))
        self.assertEqual(list(keys), dids)
        self.assertEqual(list(keys.values()), [va.secret_to_public(SEED_A), va.secret_to_public(SEED_B)])
        for text in ("", "# none\n", dids[0] + "\nnot a did\n", dids[0] + " " + dids[1], dids[0] + "x\n",
                     X25519_DID_KEY):
            self.assertRaises(ValueError, va.parse_public_keys, text)
        self.assertRaisesRegex(ValueError, "^line 2: ", va.parse_public_keys, dids[0] + "\ndid:key:zzz\n")


class CredentialService(unittest.TestCase):
    """The credential beside each receipt, its checks through Service.check, and GET /keys."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.keyfile = os.path.join(cls.dir, "keys")
        cls.retired = va.keygen(cls.keyfile, "ed25519")
        cls.old = va.Service(va.load_keyring(cls.keyfile), issuer="ci-gate").verify(
            {"claim": "status is ok", "evidence": {"status": "ok"}})
        cls.kid = va.keygen(cls.keyfile, "ed25519")
        cls.ring = va.load_keyring(cls.keyfile)
        cls.service = va.Service(cls.ring, issuer="ci-gate")
        cls.response = cls.service.verify({"claim": "Added null check for `user.email` in src/user.py",
                                           "evidence": {"diff": D_USER}, "caller_context": {"job": "42"}})
        cls.credential = cls.response["credential"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def check(self, credential):
        result = self.service.check("credential", credential)
        return result["valid"], result["reason"], result["kid"]

    def test_the_credential_is_the_receipt_as_issue_29_specifies(self):
        receipt = self.response["receipt"]
        public = self.ring.public_keys[self.kid]
        did = va.did_key(public)
        self.assertEqual(list(self.response), list(va._RESPONSE_FIELDS) + ["credential"])
        self.assertEqual(list(self.credential), ["@context", "type", "issuer", "validFrom", "credentialSubject", "proof"])
        subject = {k: v for k, v in receipt.items() if k not in ("signature", "kid")}
        self.assertEqual(self.credential["@context"], ["https://www.w3.org/ns/credentials/v2"])
        self.assertEqual(self.credential["type"], ["VerifiableCredential", "VerifyActionReceipt"])
        self.assertEqual((self.credential["issuer"], self.credential["validFrom"]), (did, receipt["issued_at"]))
        self.assertEqual(self.credential["credentialSubject"], subject)
        self.assertTrue(did.startswith("did:key:z6Mk"))
        proof = dict(self.credential["proof"])
        self.assertTrue(proof_verifies(self.credential, public))
        self.assertEqual(len(va.multibase_decode(proof.pop("proofValue"))), 64)
        self.assertEqual(proof, {"type": "DataIntegrityProof", "cryptosuite": "eddsa-jcs-2022",
                                 "created": receipt["issued_at"], "verificationMethod": did + "#" + did[8:],
                                 "proofPurpose": "assertionMethod", "@context": ["https://www.w3.org/ns/credentials/v2"]})
        self.assertEqual(self.service.check("receipt", receipt), {"valid": True, "reason": "ok", "kid": self.ring.kid})

    def test_checks(self):
        self.assertEqual(self.check(self.credential), (True, "ok", self.kid))
        self.assertEqual(self.check(self.old["credential"]), (True, "ok", self.retired))   # a retired key verifies
        self.assertTrue(proof_verifies(self.old["credential"], self.ring.public_keys[self.retired]))
        other = va.Service(va.KeyRing.parse("h %s\ne ed25519 %s\n" % ("A" * 43, "B" * 43)))
        foreign = other.verify({"claim": "status is ok", "evidence": {"status": "ok"}})["credential"]
        self.assertEqual(self.check(foreign), (False, "unknown_key", None))
        self.assertEqual(other.check("credential", foreign)["reason"], "ok")
        swapped = dict(self.credential, issuer=self.old["credential"]["issuer"])
        self.assertEqual(self.check(swapped), (False, "issuer_mismatch", None))
        moved = dict(self.credential, proof=self.old["credential"]["proof"])
        self.assertEqual(self.check(moved), (False, "issuer_mismatch", None))
        moved = dict(self.old["credential"], proof=dict(self.old["credential"]["proof"],
                                                        created=self.credential["proof"]["created"]))
        expected = "ok" if moved == self.old["credential"] else "bad_signature"
        self.assertEqual(self.check(moved)[:2], (expected == "ok", expected))
        hmac_only = va.Service(va.KeyRing.generate())
        self.assertEqual(hmac_only.check("credential", self.credential)["reason"], "unknown_key")
        self.assertEqual(self.service.check("credential", self.response["receipt"])["reason"], "malformed")
        self.assertEqual(self.service.check("receipt", self.credential)["reason"], "malformed")

    def test_every_field_altered_through_the_service(self):
        for name in self.credential:
            if name == "proof":
                continue
            altered = dict(self.credential, **{name: "x"})
            expected = {"@context": "malformed", "issuer": "issuer_mismatch"}.get(name, "bad_signature")
            self.assertEqual(self.check(altered), (False, expected, None), name)
        subject = self.credential["credentialSubject"]
        for name in subject:
            altered = dict(self.credential, credentialSubject=dict(subject, **{name: "altered"}))
            self.assertEqual(self.check(altered), (False, "bad_signature", None), name)
        proof = self.credential["proof"]
        for name in proof:
            altered = dict(self.credential, proof=dict(proof, **{name: "x"}))
            expected = {"type": "unsupported_cryptosuite", "cryptosuite": "unsupported_cryptosuite",
                        "verificationMethod": "unknown_key"}
            self.assertEqual(self.check(altered), (False, expected.get(name, "malformed"), None), name)

    def test_unsupported_schema(self):
        seed = seeds_of(self.keyfile)[self.kid]
        did = va.did_key(self.ring.public_keys[self.kid])
        fields = dict(self.response["receipt"], schema="verify_action_receipt.v1")
        for credential in (va.credential_for(fields, did, fields["issued_at"]),
                           dict(va.credential_for(self.response["receipt"], did, fields["issued_at"]),
                                type=["VerifiableCredential"])):
            credential["proof"] = va.create_proof(credential, seed, fields["issued_at"], va._jcs)
            self.assertEqual(self.check(credential), (False, "unsupported_schema", self.kid))
        credential = va.credential_for(self.response["receipt"], did, fields["issued_at"])
        credential["proof"] = va.create_proof(credential, seed, fields["issued_at"], va._jcs)
        self.assertEqual(self.check(credential), (True, "ok", self.kid))

    def test_spec_documents_the_credential(self):
        spec = va.spec_document("off")
        self.assertEqual(spec["credential"], va.credential_spec())
        self.assertEqual(spec["credential"]["format"]["proof"]["cryptosuite"], "eddsa-jcs-2022")
        self.assertIn("--public-keys F (a credential)", spec["receipt"]["verify"])

    def test_keys_document_lists_every_ed25519_key_and_no_secret(self):
        methods = self.service.keys_document()["keys"]
        self.assertEqual([(m["kid"], m["signs"]) for m in methods], [(self.retired, False), (self.kid, True)])
        for method, kid in zip(methods, (self.retired, self.kid)):
            did = va.did_key(self.ring.public_keys[kid])
            self.assertEqual(method, {"kid": kid, "signs": kid == self.kid, "id": did + "#" + did[8:],
                                      "type": "Multikey", "controller": did, "publicKeyMultibase": did[8:]})
            self.assertEqual(va.did_key_public_key(method["controller"]), self.ring.public_keys[kid])

    def test_no_secret_in_any_document(self):
        with open(self.keyfile) as f:
            secrets_text = [line.split()[-1] for line in f.read().splitlines() if not line.startswith("#")]
        secrets_bytes = list(self.ring.keys.values()) + list(seeds_of(self.keyfile).values())
        texts = [va._json_text(doc) for doc in (self.response, self.old, self.service.keys_document(),
                                                va.credential_spec(), va.rules_document(), va.TOOL,
                                                va.spec_document("off"), self.service.stats())]
        texts.append(repr(self.ring) + repr(vars(self.ring).keys()))
        for text in texts:
            for secret in secrets_text:
                self.assertNotIn(secret, text)
            for secret in secrets_bytes:
                for encoded in (secret.hex(), base64.b64encode(secret).decode()[:40], va.base58_encode(secret)):
                    self.assertNotIn(encoded, text)

    def test_documents(self):
        schema = va.TOOL["outputSchema"]
        self.assertNotIn("credential", schema["required"])
        self.assertEqual(schema["properties"]["credential"]["required"],
                         ["@context", "type", "issuer", "validFrom", "credentialSubject", "proof"])
        self.assertEqual(va.rules_document()["credential_check_reasons"], va.CREDENTIAL_REASONS)
        self.assertEqual(list(va.CREDENTIAL_REASONS), ["malformed", "unsupported_cryptosuite", "unknown_key",
                                                       "issuer_mismatch", "bad_signature", "ok", "unsupported_schema"])
        spec = va.credential_spec()
        self.assertEqual(spec["format"]["proof"]["cryptosuite"], "eddsa-jcs-2022")
        self.assertEqual(spec["reasons"], va.CREDENTIAL_REASONS)
        self.assertIn("GET /keys", va.spec_document("off")["endpoints"])


# ---------------------------------------------------------------------------------------------------
# HTTP against a real server
# ---------------------------------------------------------------------------------------------------
def raw_exchange(port, data, method="POST", timeout=5, shutdown=False):
    """Send raw bytes; return (status, headers dict, body) of the response, using http.client's parser."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if shutdown:
            s.shutdown(socket.SHUT_WR)
        r = http.client.HTTPResponse(s, method=method)
        r.begin()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        s.close()


def read_response(f, method="GET"):
    """(status, headers, body) of one response read from a binary file object."""
    status = int(f.readline().split(b" ")[1])
    headers = {}
    for line in iter(f.readline, b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.lower()] = value.strip()
    n = 0 if method == "HEAD" or status == 204 else int(headers.get("content-length", 0))
    return status, headers, f.read(n)


def post_bytes(body, path="/verify", extra=b"", ctype=b"application/json"):
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


class HttpCase(unittest.TestCase):
    """An in-process server with short deadlines, so the timing paths run fast."""

    @classmethod
    def setUpClass(cls):
        cls.service = va.Service(va.KeyRing.generate())
        cls.server = va.Server(cls.service, "127.0.0.1", 0, workers=4, origins=["https://ok.example"],
                               read_deadline=0.6, idle_timeout=3.0, queue_wait=0.4)
        cls.port = cls.server.port
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.thread.join(5)

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            c.request(method, path, body, headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def assertJsonError(self, status, headers, body, want_status, code=None):
        self.assertEqual(status, want_status, body)
        self.assertTrue(headers["content-type"].startswith("application/json"))
        obj = json.loads(body)
        self.assertEqual(sorted(obj), ["error", "message"])
        if code:
            self.assertEqual(obj["error"], code)


class Http(HttpCase):
    def test_verify_200_and_receipt_check_over_http(self):
        body = json.dumps({"claim": "Added null check for `user.email` in src/user.py", "evidence": {"diff": D_USER}})
        status, headers, raw = self.request("POST", "/verify", body, JSON)
        self.assertEqual(status, 200)
        r = json.loads(raw)
        self.assertEqual(sorted(r), sorted(["aar_verdict", "verdict", "confidence", "reason_codes", "signals",
                                            "reasoning", "kind_dispatched", "verifier_used", "details", "receipt"]))
        self.assertEqual((r["aar_verdict"], r["verdict"], r["verifier_used"]), (V, "ok", "code_diff_v1"))
        status, _, raw = self.request("POST", "/receipts/verify", json.dumps({"receipt": r["receipt"]}), JSON)
        self.assertEqual((status, json.loads(raw)), (200, {"valid": True, "reason": "ok", "kid": self.service.keyring.kid}))
        bad = dict(r["receipt"], verdict="contradicted")
        status, _, raw = self.request("POST", "/receipts/verify", json.dumps({"receipt": bad}), JSON)
        self.assertEqual(json.loads(raw)["reason"], "bad_signature")
        for body in ("[]", '{"receipt": 1}', '{"receipt": {}, "x": 1}', '{"a": 1}'):
            self.assertJsonError(*self.request("POST", "/receipts/verify", body, JSON), want_status=400)

    def test_get_endpoints(self):
        status, headers, body = self.request("GET", "/healthcheck")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok", "version": va.VERSION, "sandbox": "off"}))
        spec = json.loads(self.request("GET", "/spec")[2])
        self.assertEqual((spec["version"], spec["tool"]["name"], spec["receipt"]["schema"], spec["sandbox"]),
                         (va.VERSION, "verify_action", va.SCHEMA, "off"))
        self.assertIn("RFC 8785", spec["receipt"]["canonicalization"])
        self.assertIn("never", spec["receipt"]["fields"]["reason_codes"])
        self.assertIn("true", spec["does_not_prove"])
        rules = json.loads(self.request("GET", "/rules")[2])
        self.assertEqual(set(rules["reason_codes"]), set(va.REASONS))
        self.assertEqual(len(rules["dispatch_order"]), 6)
        status, headers, page = self.request("GET", "/")
        self.assertEqual((status, headers["content-type"]), (200, "text/html; charset=utf-8"))
        self.assertIn("default-src 'none'", headers["content-security-policy"])
        for text in (b"does not prove", b"<form", b"path_not_in_diff"):
            self.assertIn(text, page)
        self.request("POST", "/verify", json.dumps({"claim": "x", "evidence": {}}), JSON)
        stats = json.loads(self.request("GET", "/stats")[2])
        self.assertGreaterEqual(stats["by_kind"]["generic"], 1)
        self.assertNotIn("claim", json.dumps(stats))

    def test_head_options_405_404(self):
        status, headers, body = self.request("HEAD", "/healthcheck")
        self.assertEqual((status, body, headers["content-length"]), (200, b"", "49"))
        status, headers, body = raw_exchange(self.port, b"HEAD /spec HTTP/1.1\r\nHost: x\r\n\r\n", method="HEAD")
        self.assertEqual((status, body), (200, b""))
        self.assertGreater(int(headers["content-length"]), 100)
        status, headers, body = self.request("OPTIONS", "/verify")
        self.assertEqual((status, headers["allow"], body), (204, "POST, OPTIONS", b""))
        self.assertEqual(self.request("OPTIONS", "/rules")[1]["allow"], "GET, HEAD, OPTIONS")
        status, headers, body = self.request("GET", "/verify")
        self.assertJsonError(status, headers, body, 405, "method_not_allowed")
        self.assertEqual(headers["allow"], "POST, OPTIONS")
        for method, path in (("POST", "/healthcheck"), ("PUT", "/verify"), ("DELETE", "/mcp"), ("GET", "/mcp")):
            status, headers, body = self.request(method, path, "{}" if method != "GET" else None, JSON)
            self.assertJsonError(status, headers, body, 405)
            self.assertIn("allow", headers)
        for path in ("/nope", "/verify/", "/VERIFY", "/%76erify"):
            self.assertJsonError(*self.request("GET", path), want_status=404, code="not_found")
        self.assertJsonError(*self.request("POST", "/nope", "{}", JSON), want_status=404)

    def test_status_codes_of_post(self):
        good = json.dumps({"claim": "x", "evidence": {}})
        self.assertJsonError(*self.request("POST", "/verify", good, {"Content-Type": "text/plain"}), want_status=415)
        self.assertJsonError(*raw_exchange(self.port, b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"),
                             want_status=415)
        self.assertEqual(self.request("POST", "/verify", good, {"Content-Type": "application/json; charset=utf-8"})[0], 200)
        self.assertJsonError(*raw_exchange(self.port, b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"),
                             want_status=411, code="length_required")
        self.assertJsonError(*raw_exchange(self.port, post_bytes(b"{}").replace(b"Content-Length: 2", b"Content-Length: x2")),
                             want_status=400, code="bad_content_length")
        self.assertJsonError(*raw_exchange(self.port, post_bytes(b"{}").replace(b"Content-Length: 2", b"Content-Length: 2\r\nContent-Length: 2")),
                             want_status=400)
        for body, code in ((b"{", "invalid_json"), (b'{"claim": "x", "evidence": {}, "claim": "y"}', "invalid_json"),
                           (b'{"claim": "\\ud800", "evidence": {}}', "invalid_json"),
                           (b'{"claim": "\xed\xa0\x80", "evidence": {}}', "invalid_json"),
                           (b'{"claim": "x", "evidence": {"n": NaN}}', "invalid_json"),
                           (b'{"claim": "x", "evidence": {"n": 1e400}}', "invalid_json"),
                           (b'{"claim": "", "evidence": {}}', "invalid_claim"), (b'{"claim": 7, "evidence": {}}', "invalid_claim"),
                           (b'{"claim": "x", "evidence": {}, "kind": "nope"}', "unknown_kind")):
            self.assertJsonError(*raw_exchange(self.port, post_bytes(body)), want_status=400, code=code)

    def test_3_4_lone_surrogate_and_nan_get_json_400_not_a_dropped_connection(self):
        for body in (b'{"claim": "\\ud800", "evidence": {}}', b'{"claim": "x", "evidence": {"v": NaN}}',
                     b'{"claim": "x", "evidence": {"v": -Infinity}}'):
            status, headers, raw = raw_exchange(self.port, post_bytes(body))
            self.assertJsonError(status, headers, raw, 400, "invalid_json")
            va.strict_loads(raw)  # the answer itself is strict JSON: no bare NaN token

    def test_deep_nesting(self):
        def nested(levels):  # levels counts the request object as 1
            inner = "[" * (levels - 2) + "]" * (levels - 2)
            return ('{"claim": "x", "evidence": {"a": %s}}' % inner if levels > 2 else '{"claim": "x", "evidence": {}}').encode()
        self.assertEqual(raw_exchange(self.port, post_bytes(nested(32)))[0], 200)
        self.assertJsonError(*raw_exchange(self.port, post_bytes(nested(33))), want_status=400, code="invalid_json")
        self.assertJsonError(*raw_exchange(self.port, post_bytes(b'{"claim":"x","evidence":{"a":' + b"[" * 50000 + b"]" * 50000 + b"}}")),
                             want_status=400, code="invalid_json")

    def test_body_limit(self):
        head = b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.assertJsonError(*raw_exchange(self.port, head % (va.MAX_BODY + 1)), want_status=413, code="body_too_large")
        # the whole 1 MiB + 1 body sent at once still gets its 413 (the server discards, it does not reset)
        self.assertJsonError(*raw_exchange(self.port, head % (va.MAX_BODY + 1) + b"x" * (va.MAX_BODY + 1)), want_status=413)
        prefix = b'{"claim": "x", "evidence": {"pad": "'
        exact = prefix + b"a" * (va.MAX_BODY - len(prefix) - 3) + b'"}}'
        self.assertEqual(len(exact), va.MAX_BODY)
        self.assertEqual(raw_exchange(self.port, post_bytes(exact))[0], 200)

    def test_10_chunked_truncated_and_slow_bodies(self):
        chunked = (b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"1d\r\n{\"claim\": \"x\", \"evidence\": {}}\r\n0\r\n\r\n")
        status, headers, body = raw_exchange(self.port, chunked)
        self.assertJsonError(status, headers, body, 411, "length_required")
        self.assertNotIn(b"receipt", body)
        # Content-Length larger than the body: answered 408 at the read deadline (0.6 s here; the client's 5 s timeout
        # would fail the test if it were held)
        status, headers, body = raw_exchange(self.port, post_bytes(b"{}").replace(b"Content-Length: 2", b"Content-Length: 100"))
        self.assertJsonError(status, headers, body, 408, "request_timeout")
        # truncated: the client stops sending early and half-closes
        status, headers, body = raw_exchange(self.port, post_bytes(b"{}").replace(b"Content-Length: 2", b"Content-Length: 50"),
                                             shutdown=True)
        self.assertJsonError(status, headers, body, 400, "truncated_body")
        status, headers, body = raw_exchange(self.port, b"POST /verify HTTP/1.1\r\nHost:", shutdown=True)
        self.assertJsonError(status, headers, body, 400, "truncated_request")

    def test_slow_drip_head_is_cut_off(self):
        # a byte every 50 ms of a head that would take 12 s: the 408 comes at the read deadline (0.6 s here) while the
        # client is still sending, so it never sends the whole head
        head = b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sent = 0
        try:
            while sent < len(head) and not select.select([s], [], [], 0)[0]:  # until the answer comes
                s.sendall(head[sent : sent + 1])
                sent += 1
                time.sleep(0.05)
        except OSError:
            pass
        r = http.client.HTTPResponse(s)
        r.begin()
        self.assertEqual(r.status, 408)
        self.assertEqual(json.loads(r.read())["error"], "request_timeout")
        s.close()
        self.assertLess(sent, len(head))

    def test_malformed_request_lines(self):
        for line in (b"GARBAGE\r\n\r\n", b"GET /healthcheck HTTP/2.0\r\n\r\n", b"GET /healthcheck HTTP/0.9\r\n\r\n",
                     b"GET healthcheck HTTP/1.1\r\n\r\n", b"get /healthcheck HTTP/1.1\r\n\r\n",
                     b"GET /healthcheck HTTP/1.1\r\nNoColon\r\n\r\n", b"GET /healthcheck HTTP/1.1\r\n folded: x\r\n\r\n"):
            self.assertJsonError(*raw_exchange(self.port, line), want_status=400)
        self.assertJsonError(*raw_exchange(self.port, b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"), want_status=431)
        self.assertEqual(raw_exchange(self.port, b"GET /healthcheck HTTP/1.0\n\n")[0], 200)

    def test_keep_alive_and_pipelining(self):
        req = b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(req * 3 + post_bytes(json.dumps({"claim": "x", "evidence": {}}).encode()))
        f = s.makefile("rb")
        for want in (b'{"status"', b'{"status"', b'{"status"', b'{"aar_verdict"'):
            status, headers, body = read_response(f)
            self.assertEqual((status, body[:len(want)]), (200, want))
            self.assertNotIn("connection", headers)
        s.sendall(req)
        self.assertEqual(read_response(f)[0], 200)
        f.close()
        s.close()

    def test_12_http10_keep_alive_empty_lines_and_charsets(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        f = s.makefile("rb")
        try:  # an HTTP/1.0 client that asks to keep the connection is told so (before: no Connection header)
            for _ in range(2):
                s.sendall(b"GET /healthcheck HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                status, headers, _ = read_response(f)
                self.assertEqual((status, headers.get("connection")), (200, "keep-alive"))
            s.sendall(b"\r\n\r\nGET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")  # RFC 9112: empty lines first are ignored
            self.assertEqual(read_response(f)[0], 200)  # before: 400
        finally:
            f.close()
            s.close()
        self.assertEqual(raw_exchange(self.port, b"GET /healthcheck HTTP/1.0\r\n\r\n")[1]["connection"], "close")
        good = json.dumps({"claim": "x", "evidence": {}}).encode()
        for ctype, want in ((b"application/json; charset=latin-1", 415), (b"application/json;charset=\"UTF-8\"", 200),
                            (b"application/json; charset=utf-16", 415), (b"Application/JSON", 200)):
            self.assertEqual(raw_exchange(self.port, post_bytes(good, ctype=ctype))[0], want, ctype)

    def test_100_continue(self):
        body = json.dumps({"claim": "x", "evidence": {}}).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        f = s.makefile("rb")
        try:
            s.sendall(post_bytes(body, extra=b"Expect: 100-continue\r\n")[:-len(body)])
            self.assertEqual(f.readline(), b"HTTP/1.1 100 Continue\r\n")
            self.assertEqual(f.readline(), b"\r\n")
            s.sendall(body)
            self.assertEqual(read_response(f)[0], 200)
        finally:
            f.close()
            s.close()

    def test_4_integers_beyond_2_53_get_400_and_the_spec_says_so(self):
        for body in (b'{"claim": "x", "evidence": {}, "caller_context": {"amount_cents": 10000000000000001}}',
                     b'{"claim": "x", "evidence": {"account": 12345678901234567}}'):
            self.assertJsonError(*raw_exchange(self.port, post_bytes(body)), want_status=400, code="invalid_json")
        ok = b'{"claim": "x", "evidence": {"account": 9007199254740991}, "caller_context": {"n": -9007199254740991}}'
        self.assertEqual(raw_exchange(self.port, post_bytes(ok))[0], 200)
        spec = json.loads(self.request("GET", "/spec")[2])
        self.assertIn("I-JSON", spec["receipt"]["canonicalization"])
        self.assertEqual(spec["limits"]["integer_magnitude_max"], 2 ** 53 - 1)

    def test_origin_check(self):
        good = json.dumps({"claim": "x", "evidence": {}})
        self.assertJsonError(*self.request("POST", "/verify", good, dict(JSON, Origin="https://evil.example")),
                             want_status=403, code="forbidden_origin")
        self.assertJsonError(*self.request("POST", "/mcp", "{}", dict(JSON, Origin="null")), want_status=403)
        for origin in ("https://ok.example", "http://127.0.0.1:%d" % self.port, "http://localhost:%d" % self.port):
            self.assertEqual(self.request("POST", "/verify", good, dict(JSON, Origin=origin))[0], 200)
        self.assertEqual(self.request("POST", "/verify", good, dict(JSON, Origin="http://localhost:1"))[0], 403)

    def test_2_no_global_budget_and_spoofed_headers_change_nothing(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        body = json.dumps({"claim": "x", "evidence": {}})
        for i in range(300):
            c.request("POST", "/verify", body, dict(JSON, **{"X-Forwarded-For": "10.0.0.%d" % (i % 250)}))
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
        c.close()
        self.assertEqual(self.request("POST", "/verify", body, JSON)[0], 200)

    def test_pathological_claim_over_http_does_not_freeze(self):
        # the peer froze 7 s on it: here both are answered within the client's 5 s timeout, a hang guard (the time
        # itself is measured by the bench)
        body = json.dumps({"claim": "a." * 4000, "evidence": {"diff": D_USER}})
        self.assertEqual(self.request("POST", "/verify", body, JSON)[0], 200)
        self.assertEqual(self.request("GET", "/healthcheck")[0], 200)


class PageTags(html.parser.HTMLParser):
    """The tags of an HTML page: (tag, attributes, the text inside a script or style element)."""

    def __init__(self, page):
        html.parser.HTMLParser.__init__(self)
        self.tags, self.inside = [], None
        self.feed(page.decode("utf-8"))

    def handle_starttag(self, tag, attrs):
        self.tags.append([tag, dict(attrs), ""])
        self.inside = self.tags[-1] if tag in ("script", "style") else None

    def handle_data(self, data):
        if self.inside is not None:
            self.inside[2] += data


class Page(HttpCase):
    """GET /: plain HTML whose script and style are files of their own (/page.js, /page.css), nothing inline, under a
    strict Content-Security-Policy."""

    def test_no_inline_script_style_or_handler(self):
        status, headers, page = self.request("GET", "/")
        self.assertEqual((status, headers["x-content-type-options"], headers["x-frame-options"]), (200, "nosniff", "DENY"))
        csp = dict((d.strip().split(" ", 1) + [""])[:2] for d in headers["content-security-policy"].split(";"))
        self.assertEqual((csp["default-src"], csp["script-src"], csp["style-src"], csp["frame-ancestors"]),
                         ("'none'", "'self'", "'self'", "'none'"))
        self.assertNotIn("unsafe", headers["content-security-policy"])
        self.assertNotIn("sha256-", headers["content-security-policy"])
        tags = PageTags(page).tags
        scripts = [(attrs.get("src"), text.strip()) for tag, attrs, text in tags if tag == "script"]
        self.assertEqual(scripts, [("/page.js", "")])  # one script, a file, nothing inline
        self.assertNotIn("style", [tag for tag, _, _ in tags])
        self.assertEqual([attrs["href"] for tag, attrs, _ in tags if tag == "link"], ["/page.css"])
        handlers = [(tag, name) for tag, attrs, _ in tags for name in attrs if name.startswith("on") or name == "style"]
        self.assertEqual(handlers, [])
        self.assertIsNone(re.search(rb"(?i)\son[a-z]+\s*=|javascript:", page))

    def test_script_and_style_are_served_with_their_types(self):
        for path, ctype, text in (("/page.js", "text/javascript; charset=utf-8", b'fetch("/verify"'),
                                  ("/page.css", "text/css; charset=utf-8", b"font:")):
            status, headers, body = self.request("GET", path)
            self.assertEqual((status, headers["content-type"], headers["x-content-type-options"]), (200, ctype, "nosniff"))
            self.assertIn(text, body)
            self.assertEqual((body, self.request("HEAD", path)[2]), (getattr(va, "_" + ("SCRIPT" if "js" in path else "STYLE"))
                                                                     .encode("utf-8"), b""))
            self.assertEqual(self.request("POST", path, "{}", JSON)[0], 405)

    @unittest.skipUnless(shutil.which("chromium"), "chromium is not on PATH")
    def test_chromium_loads_the_page_without_a_csp_violation(self):
        served, real = [], self.server._answer
        self.server._answer = lambda method, path, *rest: served.append(path) or real(method, path, *rest)
        profile = tempfile.mkdtemp(prefix="va-chromium-")
        try:
            done = subprocess.run(
                ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0", "--dump-dom",
                 "http://127.0.0.1:%d/" % self.port], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        finally:
            self.server._answer = real
            shutil.rmtree(profile, True)
        self.assertIn(b"<form id=\"f\">", done.stdout)
        self.assertEqual(sorted(set(served)), ["/", "/page.css", "/page.js"])  # the browser fetched both files
        console = [line for line in done.stderr.decode("utf-8", "replace").splitlines() if "CONSOLE" in line]
        self.assertEqual([line for line in console if "Content Security Policy" in line or "Refused" in line], [])


class HttpMcp(HttpCase):
    def rpc(self, msg, headers=None):
        status, h, body = self.request("POST", "/mcp", msg if isinstance(msg, (bytes, str)) else json.dumps(msg),
                                       dict(JSON, **(headers or {})))
        return status, (json.loads(body) if body else None)

    def test_handshake_and_negotiation(self):
        for asked, answered in (("2024-11-05", "2024-11-05"), ("2025-03-26", "2025-03-26"), ("2025-06-18", "2025-06-18"),
                                ("2025-11-25", "2025-11-25"), ("2026-07-28", "2025-11-25"), ("1.0.0", "2025-11-25")):
            status, r = self.rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                  "params": {"protocolVersion": asked, "capabilities": {"x": {}}, "clientInfo": {"name": "t"}}})
            self.assertEqual((status, r["id"], r["result"]["protocolVersion"]), (200, 0, answered))
            self.assertEqual(r["result"]["capabilities"], {"tools": {"listChanged": False}})
        self.assertEqual(self.rpc({"jsonrpc": "2.0", "id": "p", "method": "ping"}), (200, {"jsonrpc": "2.0", "id": "p", "result": {}}))

    def test_notifications_get_202_and_no_body(self):
        for msg in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
                    {"jsonrpc": "2.0", "id": 5, "result": {}}):
            status, headers, body = self.request("POST", "/mcp", json.dumps(msg), JSON)
            self.assertEqual((status, body), (202, b""))

    def test_tools_list_and_call(self):
        status, r = self.rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        tool = r["result"]["tools"][0]
        self.assertEqual((tool["name"], tool["inputSchema"]["type"], tool["outputSchema"]["type"]), ("verify_action", "object", "object"))
        self.assertEqual(tool["annotations"], {"title": tool["title"], "readOnlyHint": True, "idempotentHint": False, "openWorldHint": False})
        args = {"claim": "Deleted 10 stale sessions", "evidence": DB_OP[0][1], "caller_context": {"agent": "a"}}
        status, r = self.rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "verify_action", "arguments": args}})
        res = r["result"]
        self.assertEqual((res["isError"], res["structuredContent"]["aar_verdict"]), (False, V))
        self.assertEqual(json.loads(res["content"][0]["text"]), res["structuredContent"])
        self.assertEqual(res["structuredContent"]["receipt"]["request_hash"], ref_sha(args))  # MCP hashes the arguments
        for prop in tool["outputSchema"]["required"]:
            self.assertIn(prop, res["structuredContent"])
        status, r = self.rpc({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "verify_action",
                                                                                          "arguments": {"claim": ""}}})
        self.assertEqual(r["result"]["isError"], True)
        self.assertIn("invalid_claim", r["result"]["content"][0]["text"])

    def test_11_errors(self):
        cases = [(b"{not json", None, -32700), (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', None, -32600),
                 (b"[]", None, -32600), ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, None, -32600),
                 ({"jsonrpc": "2.0", "id": None, "method": "ping"}, None, -32600),
                 ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, None, -32600),
                 ({"jsonrpc": "2.0", "id": True, "method": "ping"}, None, -32600),
                 ({"jsonrpc": "2.0", "id": 4, "method": 7}, 4, -32600),
                 ({"jsonrpc": "2.0", "id": 4, "method": "server/discover"}, 4, -32601),
                 ({"jsonrpc": "2.0", "id": 4, "method": "resources/list"}, 4, -32601),
                 ({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": [1, 2]}, 4, -32602),
                 ({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "nope", "arguments": {}}}, 4, -32602),
                 ({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "verify_action", "arguments": [1]}}, 4, -32602),
                 ({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"arguments": {}}}, 4, -32602),
                 ({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {}}, 4, -32602),
                 (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "id": 2}', None, -32700)]
        for msg, want_id, code in cases:
            status, r = self.rpc(msg)
            self.assertEqual((status, r["id"], r["error"]["code"]), (200, want_id, code), msg)

    def test_protocol_version_header_and_origin(self):
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        self.assertEqual(self.rpc(ping, {"MCP-Protocol-Version": "2025-06-18"})[0], 200)
        status, headers, body = self.request("POST", "/mcp", json.dumps(ping), dict(JSON, **{"MCP-Protocol-Version": "1999-01-01"}))
        self.assertJsonError(status, headers, body, 400, "unsupported_protocol_version")
        status, headers, body = self.request("POST", "/mcp", json.dumps(ping), dict(JSON, Origin="http://evil.example"))
        self.assertJsonError(status, headers, body, 403, "forbidden_origin")


class PoolAndDeadlines(unittest.TestCase):
    def test_503_when_every_worker_is_busy(self):
        # (this test used to hold the only worker with a half-sent head; since finding 3 a slow client holds none,
        # so a slow rule does it here)
        service = va.Service(va.KeyRing.generate())
        real = service.verify
        service.verify = lambda request, members=None: time.sleep(1.0) or real(request, members)
        server = va.Server(service, "127.0.0.1", 0, workers=1, read_deadline=1.5, queue_wait=0.3)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        body = json.dumps({"claim": "x", "evidence": {}}).encode()
        try:
            busy = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            busy.sendall(post_bytes(body))  # holds the only worker for 1 s
            time.sleep(0.1)
            status, headers, raw = raw_exchange(server.port, post_bytes(body))
            self.assertEqual((status, json.loads(raw)["error"]), (503, "service_unavailable"))
            f = busy.makefile("rb")
            self.assertEqual(read_response(f)[0], 200)
            f.close()
            busy.close()
            self.assertEqual(raw_exchange(server.port, b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")[0], 200)
        finally:
            server.shutdown()
            thread.join(5)

    def test_3_slow_clients_never_hold_the_workers(self):
        server, thread = in_process_server(workers=2, read_deadline=1.0, queue_wait=0.3)
        drips = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(6)]
        try:
            for s in drips:
                s.sendall(b"P")  # one byte, then nothing: each used to hold a worker until the read deadline
            time.sleep(0.2)
            status, _, raw = raw_exchange(server.port, post_bytes(json.dumps({"claim": "x", "evidence": {}}).encode()))
            self.assertEqual(status, 200, raw)  # before: 503 after queue_wait
            for s in drips:  # the selector still cuts each one off at the whole-request deadline
                f = s.makefile("rb")
                status, _, raw = read_response(f)
                self.assertEqual((status, json.loads(raw)["error"]), (408, "request_timeout"))
                f.close()
        finally:
            for s in drips:
                s.close()
            server.shutdown()
            thread.join(5)

    def test_3_refusals_never_hold_a_worker(self):
        server, thread = in_process_server(workers=1, queue_wait=0.3)
        hog = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        stop = threading.Event()

        def drip():  # the refused client keeps sending its body: the closing connection lingers (in the selector)
            while not stop.wait(0.05):
                try:
                    hog.sendall(b"x")
                except OSError:
                    return
        try:
            hog.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
                        b"\r\n\r\n" % (va.MAX_BODY + 1) + b"x" * 1000)
            f = hog.makefile("rb")
            self.assertEqual(read_response(f)[0], 413)
            t = threading.Thread(target=drip)
            t.start()
            time.sleep(0.1)
            status, _, raw = raw_exchange(server.port, post_bytes(json.dumps({"claim": "x", "evidence": {}}).encode()))
            self.assertEqual(status, 200, raw)  # before: 503, the only worker lingered up to 2 s on the refusal
            f.close()
        finally:
            stop.set()
            hog.close()
            server.shutdown()
            thread.join(5)

    def test_12_accept_errors_pause_instead_of_spinning(self):
        server = va.Server(va.Service(va.KeyRing.generate()), "127.0.0.1", 0)
        real, calls = server.sock, []

        class OutOfDescriptors(object):  # the listening socket of a process that has run out of descriptors
            def fileno(self):
                return real.fileno()

            def accept(self):
                calls.append(1)
                raise OSError(errno.EMFILE, "Too many open files")
        server.sock = OutOfDescriptors()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # pending: the listener stays ready
        try:
            time.sleep(1.0)
            self.assertLess(len(calls), 50)  # a spinning selector calls accept() thousands of times a second
            server.sock = real  # descriptors are back: the pending client is served
            client.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            f = client.makefile("rb")
            self.assertEqual(read_response(f)[0], 200)
            f.close()
        finally:
            client.close()
            server.sock = real
            server.shutdown()
            thread.join(5)

    def test_12_origins_default_ports_and_the_wildcard_bind(self):
        body = json.dumps({"claim": "x", "evidence": {}}).encode()
        server, thread = in_process_server(origins=["https://ui.example:443", "HTTP://Other.Example:80"])
        try:
            for origin, want in (("https://ui.example", 200), ("https://UI.example:443", 200), ("http://other.example", 200),
                                 ("https://ui.example:8443", 403), ("http://ui.example", 403)):
                status = raw_exchange(server.port, post_bytes(body, extra=b"Origin: " + origin.encode() + b"\r\n"))[0]
                self.assertEqual(status, want, origin)  # before: https://x:443 never matched
        finally:
            server.shutdown()
            thread.join(5)
        server = va.Server(va.Service(va.KeyRing.generate()), "0.0.0.0", 0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:  # bound to every address: the form on / works from the loopback names too (before: 403)
            for origin in ("http://127.0.0.1:%d" % server.port, "http://localhost:%d" % server.port):
                extra = ("Origin: %s\r\n" % origin).encode()
                self.assertEqual(raw_exchange(server.port, post_bytes(body, extra=extra))[0], 200, origin)
        finally:
            server.shutdown()
            thread.join(5)


def in_process_server(**kw):
    server = va.Server(va.Service(va.KeyRing.generate()), "127.0.0.1", 0, **kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


class Fairness(unittest.TestCase):
    def test_a_busy_keepalive_client_does_not_starve_others(self):
        server, thread = in_process_server(workers=1, queue_wait=1.0)
        stop, busy_done = threading.Event(), []

        def busy():  # requests back to back on one keep-alive connection, well within the grace period
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            while not stop.is_set():
                c.request("GET", "/healthcheck")
                busy_done.append(c.getresponse().read())
            c.close()
        t = threading.Thread(target=busy)
        t.start()
        try:
            time.sleep(0.2)
            status, _, _ = raw_exchange(server.port, b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(status, 200)  # before the fix: 503 after queue_wait, the busy client kept the worker
            self.assertGreater(len(busy_done), 10)
        finally:
            stop.set()
            t.join(5)
            server.shutdown()
            thread.join(5)


def client_from(source, port, timeout=5, rcvbuf=None):
    """A connected client socket bound to the local address source (127.0.0.2, ...); rcvbuf: its receive buffer."""
    s = socket.socket()
    try:
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s


def exchange_from(source, port, data=b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"):
    """(status, error code or None) of one request sent from the local address source."""
    s = client_from(source, port)
    try:
        s.sendall(data)
        f = s.makefile("rb")
        status, _, raw = read_response(f)
        f.close()
    finally:
        s.close()
    return status, json.loads(raw).get("error") if status >= 400 else None


def other_loopback_addresses():
    """127.0.0.2 and 127.0.0.3 where clients can bind them (Linux: all of 127/8; macOS: only 127.0.0.1)."""
    for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        s = socket.socket()
        try:
            s.bind((source, 0))
        except OSError:
            raise unittest.SkipTest("this system cannot bind %s" % source)
        finally:
            s.close()


class HostileClients(unittest.TestCase):
    """Clients that pipeline requests and never read the answers, and one address that opens every connection it can:
    neither holds a worker or another client's connection (spec section 10, HTTP)."""

    def wait_until_closed(self, server, open_at_most):
        end = time.monotonic() + 10  # a hang guard, not a measure: the deadlines here are a fraction of a second
        while server._open > open_at_most and time.monotonic() < end:
            time.sleep(0.05)
        return server._open

    def test_clients_that_pipeline_and_never_read_hold_no_worker(self):
        server, thread = in_process_server(workers=2, queue_wait=0.5, write_deadline=0.5)
        pipelined = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * (56 * 1024 // 27)  # about 56 KB of requests
        hogs = []
        try:
            for _ in range(32):
                hog = client_from("127.0.0.1", server.port, rcvbuf=4096)
                try:
                    hog.sendall(pipelined)
                except socket.timeout:  # the service stopped reading it: it has pipelined enough
                    pass
                hogs.append(hog)
            body = json.dumps({"claim": "x", "evidence": {}}).encode()
            for _ in range(6):  # before: 503 after queue_wait, every worker blocked writing to a client that never reads
                time.sleep(0.1)  # while the hogs' buffers fill, and after
                self.assertEqual(raw_exchange(server.port, b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")[0], 200)
                self.assertEqual(raw_exchange(server.port, post_bytes(body))[0], 200)
            # each one's response could not be written within the write deadline: its connection is closed, while the
            # clients still hold theirs
            self.assertEqual(self.wait_until_closed(server, 0), 0)
            for hog in hogs:
                hog.close()
            self.assertEqual(raw_exchange(server.port, b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")[0], 200)
        finally:
            for hog in hogs:
                hog.close()
            server.shutdown()
            thread.join(5)

    def test_a_response_the_socket_cannot_take_at_once_is_written_by_the_selector(self):
        # a client that reads late still gets every byte of every response, in order: 600 pages (7 MB) pipelined are
        # more than the kernel's buffers hold (up to 4 MB here), so some are written in parts, by the selector
        server, thread = in_process_server(workers=1)
        s = client_from("127.0.0.1", server.port, rcvbuf=4096)
        try:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 300 + b"GET /rules HTTP/1.1\r\nHost: x\r\n\r\n" * 300)
            time.sleep(0.5)  # the buffers fill; then the client reads everything
            f = s.makefile("rb")
            pages = [read_response(f) for _ in range(600)]
            page, rules = va.render_page().encode(), va._json_text(va.rules_document()).encode()
            self.assertEqual([(status, body) for status, _, body in pages], [(200, page)] * 300 + [(200, rules)] * 300)
            f.close()
        finally:
            s.close()
            server.shutdown()
            thread.join(5)

    def test_a_response_past_its_write_deadline_ends_its_connection_with_nothing_more(self):
        # a connection whose response is half written and whose next requests wait in its buffer: closed, never
        # answered 408 (that would land in the middle of the half-written response)
        server = va.Server(va.Service(va.KeyRing.generate()), "127.0.0.1", 0)
        ours, theirs = socket.socketpair()
        try:
            conn = va._Conn(ours, "127.0.0.9", time.monotonic() - 10)
            conn.out = memoryview(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\npart")
            conn.buf = bytearray(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            server._open, server._peers["127.0.0.9"] = 1, 1
            self.assertEqual(server._deadline(conn), server.write_deadline)
            server._expire(conn)
            theirs.settimeout(5)
            self.assertEqual((ours.fileno(), theirs.recv(100), server._open, dict(server._peers)), (-1, b"", 0, {}))
        finally:
            for closable in (ours, theirs, server.sock, server._sel, server._wake_r, server._wake_w):
                closable.close()

    def test_one_address_cannot_take_every_connection(self):
        other_loopback_addresses()
        server, thread = in_process_server(max_conns=8, max_conns_per_client=3)
        held = []
        try:
            held += [client_from("127.0.0.2", server.port) for _ in range(3)]  # its whole share, left idle
            for _ in range(12):  # however many more it opens, each gets 503 at once and is closed
                self.assertEqual(exchange_from("127.0.0.2", server.port), (503, "service_unavailable"))
            # before: one address could fill the table, and every other client got 503
            self.assertEqual(exchange_from("127.0.0.3", server.port), (200, None))
            held[0].sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")  # its own connections are served
            f = held[0].makefile("rb")
            self.assertEqual(read_response(f)[0], 200)
            f.close()
            self.wait_until_closed(server, 3)  # the 127.0.0.3 client has closed its connection
            self.assertEqual((server._open, dict(server._peers)), (3, {"127.0.0.2": 3}))
        finally:
            for s in held:
                s.close()
            server.shutdown()
            thread.join(5)

    def test_the_whole_table_is_still_shared(self):
        other_loopback_addresses()
        server, thread = in_process_server(max_conns=5, max_conns_per_client=3)
        held = []
        try:
            held += [client_from(source, server.port) for source in ("127.0.0.2",) * 3 + ("127.0.0.3",) * 2]
            self.wait_until_closed(server, 4)  # (all five are accepted by now; see the next line)
            self.assertEqual(exchange_from("127.0.0.4", server.port), (503, "service_unavailable"))
            held.pop().close()  # one slot frees up when a client leaves
            self.assertEqual(self.wait_until_closed(server, 4), 4)
            self.assertEqual(exchange_from("127.0.0.4", server.port), (200, None))
        finally:
            for s in held:
                s.close()
            server.shutdown()
            thread.join(5)


class IdleAndDefaults(unittest.TestCase):
    def test_idle_keepalive_connection_is_closed(self):
        server, thread = in_process_server(idle_timeout=0.5)
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        f = s.makefile("rb")
        try:
            s.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_response(f)[0], 200)
            self.assertEqual(f.read(1), b"")  # closed after 0.5 s idle (the socket's 5 s timeout would fail the test)
        finally:
            f.close()
            s.close()
            server.shutdown()
            thread.join(5)

    def test_spec_defaults(self):
        import inspect
        d = {k: v.default for k, v in inspect.signature(va.Server).parameters.items()}
        self.assertEqual((d["host"], d["port"], d["workers"], d["read_deadline"], d["idle_timeout"], d["queue_wait"],
                          d["max_body"]), ("127.0.0.1", 8092, 16, 10.0, 15.0, 5.0, 1 << 20))
        # spec section 10: a write deadline of at most 2 s; 64 connections from one address
        self.assertEqual((d["write_deadline"], d["max_conns_per_client"], va.MAX_CONNS_PER_CLIENT), (2.0, 64, 64))


class ServerProcess(object):
    """The real script as a subprocess on an ephemeral port."""

    def __init__(self, *args, command=(PY, SCRIPT)):
        self.proc = subprocess.Popen(list(command) + ["--port", "0"] + list(args), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stderr = b""
        try:
            while b"listening on" not in self.stderr:
                line = self.proc.stderr.readline()
                if not line:
                    raise AssertionError("server did not start: %r" % self.stderr)
                self.stderr += line
            self.port = int(self.stderr.split(b"listening on http://")[1].split(b":")[1].split(b" ")[0])
        except Exception:  # never leave a server running behind a failed test
            self.close()
            raise

    def close(self):
        # Stop the server (again is harmless); self.stderr then holds all it wrote.
        if not self.proc.stderr.closed:
            self.proc.terminate()
            self.proc.wait(10)
            self.stderr += self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()


class Cli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.keyfile = os.path.join(self.dir, "keys")
        va.keygen(self.keyfile)
        self.token = os.path.join(self.dir, "token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"s3cret-token-0123456789\n")
        os.close(fd)

    def tearDown(self):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def test_200_keepalive_connections_answered_with_bounded_threads(self):
        # all from 127.0.0.1: one address, so its share of the table is raised from the default 64
        srv = ServerProcess("--key-file", self.keyfile, "--max-conns-per-client", "200")
        try:
            self.assertNotIn(b"ephemeral", srv.stderr)
            body = json.dumps({"claim": "Added null check for `user.email` in src/user.py", "evidence": {"diff": D_USER}}).encode()
            socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=15) for _ in range(200)]
            files = [s.makefile("rb") for s in socks]
            for rnd in range(2):  # two requests on every connection: keep-alive holds for all 200
                for s in socks:
                    s.sendall(post_bytes(body))
                for f in files:
                    status, _, raw = read_response(f)
                    self.assertEqual((status, json.loads(raw)["aar_verdict"]), (200, V))
            if os.path.isdir("/proc/%d/task" % srv.proc.pid):  # Linux
                threads = len(os.listdir("/proc/%d/task" % srv.proc.pid))
                self.assertLessEqual(threads, 16 + 2)  # workers + selector (main) + nothing that grows
            for f, s in zip(files, socks):
                f.close()
                s.close()
        finally:
            srv.close()

    def test_one_address_gets_64_connections_by_default(self):
        srv = ServerProcess()
        socks = []
        try:
            socks += [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(va.MAX_CONNS_PER_CLIENT)]
            for s in socks[:2]:  # all are accepted: they are answered
                s.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
                f = s.makefile("rb")
                self.assertEqual(read_response(f)[0], 200)
                f.close()
            status, _, raw = raw_exchange(srv.port, b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual((status, json.loads(raw)), (503, {"error": "service_unavailable",
                                                               "message": "too many connections from this address"}))
        finally:
            for s in socks:
                s.close()
            srv.close()
        run = lambda *a: subprocess.run([PY, SCRIPT, "--port", "0"] + list(a), capture_output=True, timeout=20,
                                        stdin=subprocess.DEVNULL)
        for bad in ("0", str(va.MAX_CONNS + 1)):
            r = run("--max-conns-per-client", bad)
            self.assertEqual((r.returncode, r.stderr.strip()), (2, b"verify_action.py: error: --max-conns-per-client "
                                                                   b"must be 1-%d" % va.MAX_CONNS))

    def test_token_file_and_key_ring_over_the_real_script(self):
        srv = ServerProcess("--key-file", self.keyfile, "--token-file", self.token, "--issuer", "gate-1",
                            "--allow-origin", "https://ui.example")
        try:
            body = json.dumps({"claim": "x", "evidence": {}})
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            c.request("POST", "/verify", body, JSON)
            r = c.getresponse()
            self.assertEqual((r.status, r.getheader("WWW-Authenticate"), json.loads(r.read())["error"]), (401, "Bearer", "unauthorized"))
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            c.request("POST", "/verify", body, dict(JSON, Authorization="Bearer wrong-token-0123456789"))
            self.assertEqual(c.getresponse().status, 401)
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            c.request("POST", "/verify", body, dict(JSON, Authorization="Bearer s3cret-token-0123456789", Origin="https://ui.example"))
            r = c.getresponse()
            rec = json.loads(r.read())["receipt"]
            self.assertEqual((r.status, rec["issued_by"]), (200, "gate-1"))
            self.assertEqual(va.verify_receipt(rec, va.load_keyring(self.keyfile))[:2], (True, "ok"))
            c.request("GET", "/healthcheck")  # GETs never need the token
            self.assertEqual(c.getresponse().status, 200)
            c.close()
        finally:
            srv.close()

    def test_startup_refusals_and_warnings(self):
        run = lambda *a: subprocess.run([PY, SCRIPT, "--port", "0"] + list(a), capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        if va.POSIX_MODES:  # Windows: not refused by mode (OtherSystems)
            os.chmod(self.keyfile, 0o640)
            r = run("--key-file", self.keyfile)
            self.assertEqual(r.returncode, 2)
            self.assertIn(b"group or others", r.stderr)
            os.chmod(self.keyfile, 0o600)
            os.chmod(self.token, 0o644)
            self.assertEqual(run("--token-file", self.token).returncode, 2)
        self.assertEqual(run("--key-file", os.path.join(self.dir, "missing")).returncode, 2)
        self.assertEqual(run("--allow-origin", "https://x.example/path").returncode, 2)
        self.assertEqual(run("--workers", "0").returncode, 2)
        srv = ServerProcess()
        self.assertIn(b"ephemeral key", srv.stderr)
        srv.close()
        srv = ServerProcess("--host", "0.0.0.0")
        self.assertIn(b"WARNING", srv.stderr)
        srv.close()
        os.chmod(self.token, 0o600)
        srv = ServerProcess("--host", "0.0.0.0", "--token-file", self.token)
        self.assertNotIn(b"WARNING", srv.stderr)
        srv.close()


class CredentialEndToEnd(unittest.TestCase):
    """The real script with an Ed25519 key: HTTP, MCP over HTTP and stdio, the CLI; the seed in no output."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.keyfile = os.path.join(cls.dir, "keys")
        run = subprocess.run([PY, SCRIPT, "keygen", "--alg", "ed25519", "--key-file", cls.keyfile],
                             capture_output=True, timeout=60)
        cls.keygen_output = run.stdout + run.stderr
        cls.kid, cls.did = run.stdout.decode().split()
        with open(cls.keyfile) as f:
            cls.secrets = [line.split()[-1] for line in f.read().splitlines() if not line.startswith("#")]
        cls.server = ServerProcess("--key-file", cls.keyfile)

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
        shutil.rmtree(cls.dir)

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        try:
            c.request(method, path, None if body is None else json.dumps(body), JSON)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def run_cli(self, *args):
        return subprocess.run([PY, SCRIPT] + list(args), capture_output=True, timeout=60)

    def write(self, name, doc):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        return path

    def assertNoSecret(self, data):
        for secret in self.secrets:
            self.assertNotIn(secret.encode(), data)

    def test_keygen_prints_the_kid_and_the_did_key(self):
        ring = va.load_keyring(self.keyfile)
        self.assertEqual((ring.signer, va.did_key(ring.public_keys[ring.signer])), (self.kid, self.did))
        self.assertNoSecret(self.keygen_output)

    def test_http(self):
        status, body = self.request("POST", "/verify", {"claim": "status is ok", "evidence": {"status": "ok"}})
        self.assertEqual(status, 200)
        response = json.loads(body)
        credential = response["credential"]
        self.assertEqual(credential["issuer"], self.did)
        self.assertTrue(proof_verifies(credential, va.did_key_public_key(self.did)))
        status, body = self.request("GET", "/keys")
        self.assertEqual((status, [m["controller"] for m in json.loads(body)["keys"]]), (200, [self.did]))
        answers = []
        for document in ({"credential": credential}, {"receipt": response["receipt"]},
                         {"credential": dict(credential, validFrom="2020-01-01T00:00:00Z")}):
            status, body = self.request("POST", "/receipts/verify", document)
            answers.append((status, json.loads(body)))
        self.assertEqual(answers, [(200, {"valid": True, "reason": "ok", "kid": self.kid}),
                                   (200, {"valid": True, "reason": "ok", "kid": response["receipt"]["kid"]}),
                                   (200, {"valid": False, "reason": "bad_signature", "kid": None})])
        for document in ({"credential": credential, "receipt": response["receipt"]}, {"credential": [credential]},
                         {"credentials": credential}, {}):
            status, body = self.request("POST", "/receipts/verify", document)
            self.assertEqual((status, json.loads(body)["error"]), (400, "invalid_request"))
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "verify_action", "arguments": {"claim": "status is ok", "evidence": {"status": "ok"}}}}
        status, body = self.request("POST", "/mcp", call)
        result = json.loads(body)["result"]
        self.assertEqual(result["structuredContent"]["credential"]["issuer"], self.did)
        self.assertEqual(json.loads(result["content"][0]["text"])["credential"], result["structuredContent"]["credential"])
        for path in ("/spec", "/rules", "/stats", "/keys", "/healthcheck", "/"):
            self.assertNoSecret(self.request("GET", path)[1])

    def test_stdio(self):
        messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "verify_action", "arguments": {
                        "claim": "status is ok", "evidence": {"status": "ok"}}}}]
        lines = b"".join(json.dumps(m).encode() + b"\n" for m in messages)
        run = subprocess.run([PY, SCRIPT, "--stdio", "--key-file", self.keyfile], input=lines, capture_output=True,
                             timeout=60)
        replies = [json.loads(line) for line in run.stdout.splitlines()]
        credential = replies[1]["result"]["structuredContent"]["credential"]
        self.assertEqual(va.verify_credential(credential, va.parse_public_keys(self.did)), (True, "ok", self.did))
        self.assertNoSecret(run.stdout + run.stderr)

    def test_cli_checks_with_public_keys_alone(self):
        response = va.Service(va.load_keyring(self.keyfile)).verify({"claim": "x", "evidence": {}})
        credential = response["credential"]
        other = va.did_key(va.secret_to_public(SEED_A))
        keys = self.write("public", "# ours\n%s\n" % self.did)
        rows = [  # (file's document, flags, exit status, printed reason)
            (response, ["--public-keys", keys], 0, "ok"),
            (credential, ["--public-keys", keys], 0, "ok"),
            (credential, ["--key-file", self.keyfile], 0, "ok"),
            (response, ["--key-file", self.keyfile], 0, "ok"),                  # a response: its receipt
            (dict(credential, validFrom="2020-01-01T00:00:00Z"), ["--public-keys", keys], 1, "bad_signature"),
            (credential, ["--public-keys", self.write("other", other)], 1, "unknown_key"),
            (dict(credential, issuer=other), ["--public-keys", keys], 1, "issuer_mismatch"),
        ]
        for doc, flags, code, reason in rows:
            run = self.run_cli("verify-receipt", self.write("doc.json", doc), *flags)
            self.assertEqual((run.returncode, json.loads(run.stdout)["reason"]), (code, reason), (flags, run.stderr))
        refused = [(response["receipt"], ["--public-keys", keys], b"needs --key-file"),
                   (credential, ["--public-keys", self.write("bad", self.did + "\nnope\n")], b"line 2: "),
                   (credential, ["--public-keys", keys, "--key-file", self.keyfile], b"not allowed with"),
                   (credential, [], b"one of the arguments")]
        for doc, flags, message in refused:
            run = self.run_cli("verify-receipt", self.write("doc.json", doc), *flags)
            self.assertEqual((run.returncode, run.stdout), (2, b""))
            self.assertIn(message, run.stderr)
        run = self.run_cli("keygen", "--alg", "rsa", "--key-file", self.keyfile)
        self.assertEqual(run.returncode, 2)
        self.assertNoSecret(self.server.stderr)


class Stdio(unittest.TestCase):
    def setUp(self):
        self.proc = subprocess.Popen([PY, SCRIPT, "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    def tearDown(self):
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if not f.closed:
                f.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)

    def send(self, msg):
        self.proc.stdin.write((msg if isinstance(msg, bytes) else json.dumps(msg).encode()) + b"\n")
        self.proc.stdin.flush()

    def recv(self):
        return json.loads(self.proc.stdout.readline())

    def call(self, msg):
        self.send(msg)
        return self.recv()

    def test_session(self):
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": 0, "method": "ping"})["result"], {})
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}})["error"]["code"], -32601)
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})["error"]["code"], -32600)
        r = self.call({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
                                                                                   "capabilities": {}, "clientInfo": {"name": "t"}}})
        self.assertEqual(r["result"]["protocolVersion"], "2025-06-18")
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}})
                         ["error"]["code"], -32600)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # never answered: the next line is id 5's
        self.send(b"   ")
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": "five", "method": "tools/list"})["id"], "five")
        r = self.call({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "verify_action", "arguments": {
            "claim": "Added null check for `user.email` in src/user.py", "evidence": {"diff": D_USER}}}})
        self.assertEqual(r["result"]["structuredContent"]["aar_verdict"], V)
        self.assertEqual(self.call(b"{oops")["error"]["code"], -32700)
        self.assertEqual(self.call(b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"a":NaN}}')["error"]["code"], -32700)
        self.assertEqual(self.call(b'[{"jsonrpc":"2.0","id":8,"method":"ping"}]')["error"]["code"], -32600)
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "x"}})["error"]["code"], -32602)
        self.assertEqual(self.call({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": "x"})["error"]["code"], -32602)
        r = self.call({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "verify_action", "arguments": {"claim": 1}}})
        self.assertTrue(r["result"]["isError"])
        self.proc.stdin.close()
        self.assertEqual(self.proc.wait(5), 0)
        self.assertEqual(self.proc.stdout.read(), b"")

    def test_batches_only_under_2025_03_26(self):
        self.call({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-03-26"}})
        r = self.call([{"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                       {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}])
        self.assertEqual([m["id"] for m in r], [2, 3])
        self.send([{"jsonrpc": "2.0", "method": "notifications/initialized"}])  # nothing left to answer: no line at all
        self.assertEqual(self.call([])["error"]["code"], -32600)


# ---------------------------------------------------------------------------------------------------
# The sandbox, and systems without POSIX names or modes: child processes
# ---------------------------------------------------------------------------------------------------
def run_child(code, *args, stdin=None):
    """Run Python code in a child process with verify_action importable as va -> CompletedProcess (text)."""
    prelude = "import sys\nsys.path.insert(0, %r)\nimport verify_action as va\n" % HERE
    return subprocess.run([PY, "-c", prelude + code] + [str(a) for a in args], input=stdin, capture_output=True,
                          text=True, timeout=60)


@functools.lru_cache(maxsize=None)
def auto_sandbox():
    """What --sandbox=auto enforces on this machine."""
    done = run_child("print(va.apply_sandbox('auto'))")
    return done.stdout.strip()


def landlock_abi():
    """The Landlock ABI this machine enforces, or None."""
    status = auto_sandbox()
    return int(status.split()[-1]) if status.startswith("landlock ABI ") else None


def sandbox_flag():
    """--sandbox=on where Landlock is available (so the test proves the kernel layer), else auto."""
    return "--sandbox=" + ("on" if landlock_abi() else "auto")


# Every operation the sandbox must stop, tried after one layer restricts the child: "none" (the control), "hook"
# (the audit hook alone, as on macOS and Windows) or "kernel" (Landlock alone). A connection made before waits in
# the listener's backlog, to be accepted afterwards. Prints {operation: "ok" or [error type, errno, message]}.
SANDBOX_PROBE = r"""
import ctypes, json, os, socket, subprocess, threading
outside, port, abstract, layer = sys.argv[1:5]
listener = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(listener.getsockname())
pair, unbound = socket.socketpair(), [socket.socket() for _ in range(2)]
if layer == "kernel":
    abi, why = va.landlock()
    assert abi is not None, why
elif layer == "hook":
    sys.addaudithook(va.audit_hook)
results = {}


def attempt(name, action):
    try:
        action()
        results[name] = "ok"
    except Exception as e:
        results[name] = [type(e).__name__, getattr(e, "errno", None), str(e)]


def accept():
    conn = listener.accept()[0]
    client.sendall(b"ping")
    assert conn.recv(4) == b"ping"
    conn.sendall(b"pong")
    assert client.recv(4) == b"pong"
    conn.close()


def connect(family, address):
    with socket.socket(family) as s:
        s.connect(address)


def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


attempt("accept", accept)
attempt("socketpair", lambda: pair[0].send(b"x") and pair[1].recv(1))
attempt("read", lambda: open(outside, "rb").read())
attempt("os.open", lambda: os.close(os.open(outside, os.O_RDONLY)))
attempt("list", lambda: os.listdir(os.path.dirname(outside)))
attempt("write", lambda: open(outside, "ab").close())
attempt("create", lambda: open(outside + ".new", "xb").close())
attempt("exec", lambda: subprocess.run(["/bin/true"] if os.path.exists("/bin/true") else [sys.executable, "-V"],
                                       check=True, capture_output=True))
attempt("connect", lambda: unbound[0].connect(("127.0.0.1", int(port))))
attempt("bind", lambda: unbound[1].bind(("127.0.0.1", 0)))
attempt("new socket", socket.socket)
attempt("listen on a new socket", lambda: socket.socket().listen())  # no event of its own (it binds a port)
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", int(port))))
attempt("getaddrinfo", lambda: socket.getaddrinfo("localhost", 80))
attempt("import", lambda: __import__("colorsys"))
attempt("ctypes", lambda: ctypes.CDLL("kernel32" if os.name == "nt" else None))
attempt("os.system", lambda: os.system(""))
if os.name == "posix":
    attempt("fork", fork)
    attempt("signal", lambda: os.kill(os.getppid(), 0))
if abstract:
    attempt("abstract socket", lambda: connect(socket.AF_UNIX, "\0" + abstract))
thread = threading.Thread(target=attempt, args=("read in a later thread", lambda: open(outside, "rb").read()))
thread.start()
thread.join()
attempt("remove", lambda: os.remove(outside))
print(json.dumps(results))
"""


class SandboxLayers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.outside = os.path.join(self.dir, "secret.txt")
        with open(self.outside, "w") as f:
            f.write("not for the service\n")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(self.listener.close)
        self.abstract = ""
        if sys.platform.startswith("linux"):
            self.abstract = "verify-action-test-%d" % os.getpid()
            unix = socket.socket(socket.AF_UNIX)
            self.addCleanup(unix.close)
            unix.bind("\0" + self.abstract)
            unix.listen()

    def probe(self, layer):
        done = run_child(SANDBOX_PROBE, self.outside, self.listener.getsockname()[1], self.abstract, layer)
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout)

    def test_the_control_can_do_everything(self):
        results = self.probe("none")
        self.assertEqual(set(results.values()), {"ok"}, results)
        self.assertGreaterEqual(len(results), 18)

    def test_the_audit_hook_refuses_all_but_accepting_and_open_sockets(self):
        results = self.probe("hook")
        self.assertEqual((results.pop("accept"), results.pop("socketpair")), ("ok", "ok"))
        self.assertEqual(results.pop("import"), ["ImportError", None, "verify_action.py sandbox: import 'colorsys' "
                                                                        "refused after startup"])
        self.assertGreaterEqual(len(results), 15)
        for name, result in results.items():
            with self.subTest(name):
                self.assertEqual(result[0], "PermissionError")
                self.assertTrue(result[2].startswith("verify_action.py sandbox: "), result)
        self.assertIn("open %r refused" % self.outside, results["read"][2])
        self.assertIn("socket.bind", results["bind"][2])
        self.assertIn("socket.connect", results["connect"][2])
        self.assertIn("socket.getaddrinfo", results["getaddrinfo"][2])
        self.assertIn("socket.__new__", results["listen on a new socket"][2])
        self.assertTrue(os.path.exists(self.outside))

    def test_the_kernel_denies_every_file_and_new_tcp(self):
        abi = landlock_abi()
        if abi is None:
            self.skipTest("no Landlock here: %s" % auto_sandbox())
        results = self.probe("kernel")
        self.assertEqual((results["accept"], results["socketpair"]), ("ok", "ok"))
        denied = ["read", "os.open", "list", "write", "create", "exec", "import", "remove", "read in a later thread"]
        denied += ["connect", "bind"] if abi >= 4 else []
        for name in denied:
            with self.subTest(name):
                self.assertEqual(results[name][:2], ["PermissionError", errno.EACCES])
        for name in ("signal", "abstract socket") if abi >= 6 else ():
            with self.subTest(name):
                self.assertEqual(results[name][:2], ["PermissionError", errno.EPERM])
        self.assertTrue(os.path.exists(self.outside))
        self.assertFalse(os.path.exists(self.outside + ".new"))

    def test_tracebacks_are_formatted_after_the_restriction(self):
        code = ("import traceback\n"
                "print(va.apply_sandbox('auto'))\n"
                "try:\n"
                "    va.strict_loads(None)\n"  # AttributeError inside verify_action.py
                "except AttributeError:\n"
                "    print(traceback.format_exc())\n"
                "sys.stdout.flush()\n"
                "va.KeyRing([])\n")  # uncaught: the interpreter prints the traceback
        done = run_child(code)
        self.assertEqual(done.returncode, 1)
        self.assertTrue(done.stdout.startswith(auto_sandbox() + "\n"), done.stdout)
        self.assertIn("AttributeError: 'NoneType' object has no attribute 'decode'", done.stdout)
        if sys.version_info >= (3, 13):  # the warm-up cached this file's lines where Python code prints tracebacks
            self.assertIn('    text = raw.decode("utf-8")\n', done.stdout)
        self.assertIn("verify_action.py\", line ", done.stderr)
        self.assertTrue(done.stderr.rstrip().endswith("ValueError: the key ring has no keys"), done.stderr)
        self.assertNotIn("refused", done.stderr)

    def test_landlock_rights_by_abi(self):
        self.assertEqual([va.landlock_rights(abi) for abi in range(1, 10)],
                         [(0x1FFF, 0, 0), (0x3FFF, 0, 0), (0x7FFF, 0, 0), (0x7FFF, 3, 0), (0xFFFF, 3, 0),
                          (0xFFFF, 3, 3), (0xFFFF, 3, 3), (0xFFFF, 3, 3), (0x1FFFF, 3, 3)])


# Threads: record how many run when Landlock is applied, and have every thread started afterwards (the selector's
# workers) try a raw libc open, which no audit hook sees. Lines go straight to stderr (fd 2).
SANDBOX_THREADS = r"""
import ctypes, os, threading
outside = sys.argv[1]
raw_open = ctypes.CDLL(None).open
landlock, thread_run = va.landlock, threading.Thread.run


def counting_landlock():
    os.write(2, b"threads when restricting: %d\n" % threading.active_count())
    return landlock()


def probing_run(self):
    os.write(2, b"raw open outside: %d\n" % raw_open(outside.encode(), 0))
    thread_run(self)


va.landlock, threading.Thread.run = counting_landlock, probing_run
sys.exit(va.main(sys.argv[2:]))
"""


class KeyFilesCase(unittest.TestCase):
    """A temporary folder with a new key ring and a token file, both mode 0600."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.keyfile, self.token = os.path.join(self.dir, "keys"), os.path.join(self.dir, "token")
        va.keygen(self.keyfile)
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
        os.write(fd, b"s3cret-token-0123456789\n")
        os.close(fd)


class SandboxedServing(KeyFilesCase):

    def test_http_keeps_serving_under_the_sandbox(self):
        srv = ServerProcess("--key-file", self.keyfile, "--token-file", self.token, sandbox_flag())
        self.addCleanup(srv.close)
        self.assertIn(b"verify_action.py: sandbox: %s\n" % auto_sandbox().encode(), srv.stderr)
        auth = dict(JSON, Authorization="Bearer s3cret-token-0123456789")
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)  # one keep-alive connection for all

        def call(method, path, body=None, headers=auth):
            c.request(method, path, body if body is None or isinstance(body, bytes) else json.dumps(body), headers)
            r = c.getresponse()
            return r.status, r.read()
        status, body = call("GET", "/healthcheck", headers={})
        self.assertEqual((status, json.loads(body)["sandbox"]), (200, auto_sandbox()))
        self.assertEqual(json.loads(call("GET", "/spec", headers={})[1])["sandbox"], auto_sandbox())
        self.assertIn(b"<form", call("GET", "/", headers={})[1])
        self.assertIn(b"path_not_in_diff", call("GET", "/rules", headers={})[1])
        request = {"claim": "Added null check for `user.email` in src/user.py", "evidence": {"diff": D_USER},
                   "caller_context": {"job": "7"}}
        status, body = call("POST", "/verify", request)
        receipt = json.loads(body)["receipt"]
        self.assertEqual((status, json.loads(body)["aar_verdict"]), (200, V))
        self.assertEqual(va.verify_receipt(receipt, va.load_keyring(self.keyfile)), (True, "ok", receipt["kid"]))
        self.assertEqual(json.loads(call("POST", "/receipts/verify", {"receipt": receipt})[1])["valid"], True)
        # keys that mix U+E000-U+FFFF with astral characters take the exact encoder (UTF-16 key order)
        odd = {"claim": "status is ok", "evidence": {"\ue000": 1, "\U0001f600": 2, "status": "ok", "n": 1.5e-7}}
        receipt = json.loads(call("POST", "/verify", odd)[1])["receipt"]
        self.assertEqual(receipt["evidence_manifest_hash"], ref_sha(odd["evidence"]))
        status, body = call("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "verify_action", "arguments": request}})
        self.assertEqual(json.loads(body)["result"]["structuredContent"]["aar_verdict"], V)
        self.assertEqual(json.loads(call("POST", "/mcp", b"{oops")[1])["error"]["code"], -32700)
        self.assertEqual(json.loads(call("POST", "/verify", b'{"claim": NaN}')[1])["error"], "invalid_json")
        self.assertEqual(call("GET", "/nowhere", headers={})[0], 404)
        self.assertEqual(json.loads(call("GET", "/stats", headers={})[1])["verifications"], 3)
        c.close()

        def client(results):  # concurrent keep-alive connections: the workers started after the restriction
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            for _ in range(3):
                conn.request("POST", "/verify", json.dumps(request), auth)
                response = conn.getresponse()
                results.append((response.status, json.loads(response.read())["aar_verdict"]))
            conn.close()
        results = []
        threads = [threading.Thread(target=client, args=(results,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, [(200, V)] * 24)
        self.assertIsNone(srv.proc.poll())
        srv.close()
        self.assertNotIn(b"refused", srv.stderr)
        self.assertNotIn(b"Traceback", srv.stderr)

    def test_stdio_keeps_serving_under_the_sandbox(self):
        messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "verify_action", "arguments": {
                        "claim": "Added null check for `user.email` in src/user.py", "evidence": {"diff": D_USER}}}},
                    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "verify_action",
                                                                                   "arguments": {"claim": 1}}},
                    {"jsonrpc": "2.0", "id": 5, "method": "ping"}]
        lines = b"".join(json.dumps(m).encode() + b"\n" for m in messages) + b"{oops\n"
        done = subprocess.run([PY, SCRIPT, "--stdio", "--key-file", self.keyfile, sandbox_flag()], input=lines,
                              capture_output=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        replies = [json.loads(line) for line in done.stdout.splitlines()]
        self.assertEqual([r.get("id") for r in replies], [1, 2, 3, 4, 5, None])
        receipt = replies[2]["result"]["structuredContent"]["receipt"]
        self.assertEqual(va.verify_receipt(receipt, va.load_keyring(self.keyfile))[:2], (True, "ok"))
        self.assertTrue(replies[3]["result"]["isError"])
        self.assertEqual(replies[5]["error"]["code"], -32700)
        self.assertEqual(done.stderr, b"verify_action.py: sandbox: %s\n" % auto_sandbox().encode())

    def test_no_thread_escapes(self):
        if landlock_abi() is None:
            self.skipTest("no Landlock here: %s" % auto_sandbox())
        prelude = "import sys\nsys.path.insert(0, %r)\nimport verify_action as va\n" % HERE
        command = [PY, "-c", prelude + SANDBOX_THREADS, self.keyfile]  # a file readable before the restriction
        for mode, opened in (("on", [False] * 3), ("off", [True] * 3)):  # off: the control
            with self.subTest(mode):
                srv = ServerProcess("--sandbox=" + mode, "--workers", "3", command=command)
                self.addCleanup(srv.close)
                self.assertEqual(raw_exchange(srv.port, b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")[0], 200)
                # one worker answered, but the others may not have run yet: wait for all three probes
                # (ended after 10 s, when readline then meets the end of the stream)
                deadline = threading.Timer(10, srv.proc.terminate)
                deadline.start()
                while srv.stderr.count(b"raw open outside: ") < 3:
                    line = srv.proc.stderr.readline()
                    if not line:
                        break
                    srv.stderr += line
                deadline.cancel()
                srv.close()
                fds = re.findall(rb"raw open outside: (-?[0-9]+)", srv.stderr)
                self.assertEqual([int(fd) >= 0 for fd in fds], opened)
                self.assertEqual(b"threads when restricting: 1\n" in srv.stderr, mode == "on")
        done = subprocess.run(command + ["--stdio", "--sandbox=on"], input=b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
                              capture_output=True, timeout=30)
        self.assertEqual((done.returncode, json.loads(done.stdout)["result"]), (0, {}))
        self.assertIn(b"threads when restricting: 1\n", done.stderr)

    def test_a_daemon_thread_running_at_exit(self):
        # a worker still judging when the interpreter exits is ended by pthread_exit, for which glibc opens
        # libgcc_s; under Landlock that read was refused and glibc aborted the process
        if landlock_abi() is None:
            self.skipTest("no Landlock here: %s" % auto_sandbox())
        code = ("import threading, time\nva.apply_sandbox('on')\n\n\ndef spin():\n    while True:\n        pass\n\n\n"
                "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.05)\n")
        done = run_child(code)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("libgcc_s", done.stderr)


class SandboxFlag(unittest.TestCase):
    def stdio(self, *args, code=None):
        command = [PY, "-c", code] if code else [PY, SCRIPT]
        return subprocess.run(command + ["--stdio"] + list(args), input=b"", capture_output=True, timeout=30)

    def test_auto_says_what_is_enforced(self):
        status = auto_sandbox()
        self.assertRegex(status, r"\A(landlock ABI [0-9]+|audit hook only)\Z")
        for unset in ((), ("--sandbox=",), ("--sandbox=${user_config.sandbox}",), ("--sandbox", "auto")):
            with self.subTest(unset):
                done = self.stdio(*unset)
                self.assertEqual((done.returncode, done.stderr.decode().splitlines()[-1].split(" (")[0]),
                                 (0, "verify_action.py: sandbox: " + status))

    def test_off_and_unknown(self):
        self.assertEqual(self.stdio("--sandbox", "off").stderr.splitlines()[-1], b"verify_action.py: sandbox: off")
        srv = ServerProcess("--sandbox=off")
        self.addCleanup(srv.close)
        self.assertEqual(json.loads(raw_exchange(srv.port, b"GET /healthcheck HTTP/1.0\r\n\r\n")[2])["sandbox"], "off")
        done = self.stdio("--sandbox=maybe")
        self.assertEqual((done.returncode, done.stdout), (2, b""))
        self.assertIn(b"argument --sandbox: invalid choice: 'maybe'", done.stderr)

    def test_on_refuses_to_start_without_landlock_and_auto_falls_back(self):
        code = ("import sys\nsys.path.insert(0, %r)\nimport verify_action as va\n"
                "va.LANDLOCK_MACHINES = ()\n"  # as on a kernel without Landlock
                "sys.exit(va.main(sys.argv[1:]))\n" % HERE)
        done = self.stdio("--sandbox=on", code=code)
        self.assertEqual((done.returncode, done.stdout), (2, b""))
        self.assertIn(b"verify_action.py: error: --sandbox=on needs Landlock (no Landlock on ", done.stderr)
        done = self.stdio("--sandbox=auto", code=code)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(b"verify_action.py: sandbox: audit hook only (no Landlock on ", done.stderr)
        if landlock_abi():
            done = self.stdio("--sandbox=on")
            self.assertTrue(done.stderr.endswith(b"\nverify_action.py: sandbox: landlock ABI %d\n" % landlock_abi()))

    def test_other_systems_get_the_audit_hook_without_touching_linux_names(self):
        code = ("sys.platform = 'win32'\n"
                "for name in ('uname', 'O_CLOEXEC', 'O_NOFOLLOW'):\n"
                "    if hasattr(va.os, name):\n"
                "        delattr(va.os, name)\n"
                "print(va.apply_sandbox('auto'))\n"
                "open(sys.argv[1], 'rb')\n")
        done = run_child(code, SCRIPT)
        self.assertEqual(done.stdout, "audit hook only\n")
        self.assertIn("verify_action.py: sandbox: audit hook only (no Landlock on win32)", done.stderr)
        self.assertIn("PermissionError: verify_action.py sandbox: open ", done.stderr)


# A Python without POSIX-only names, as on Windows: deleted from os before verify_action is imported, with the
# selector Windows has (select); POSIX_MODES set to the argument (Windows: False, file modes are not enforced).
NO_POSIX_NAMES = r"""
import os, selectors, sys
for name in ("O_NOFOLLOW", "O_NONBLOCK", "O_DIRECTORY", "O_CLOEXEC"):
    if hasattr(os, name):
        delattr(os, name)
os.supports_dir_fd.clear()
os.supports_fd.clear()
selectors.DefaultSelector = selectors.SelectSelector
sys.path.insert(0, sys.argv.pop(1))
import verify_action as va
va.POSIX_MODES = sys.argv.pop(1) == "True"
sys.stderr.write("max connections %d\n" % va.MAX_CONNS)
sys.exit(va.main(sys.argv[1:]))
"""


class OtherSystems(KeyFilesCase):

    def child(self, posix_modes):
        return [PY, "-c", NO_POSIX_NAMES, HERE, str(posix_modes)]

    def test_without_posix_names_it_imports_and_serves(self):
        srv = ServerProcess("--key-file", self.keyfile, "--token-file", self.token, command=self.child(True))
        self.addCleanup(srv.close)
        self.assertIn(b"max connections 500\n", srv.stderr)
        status, _, body = raw_exchange(srv.port, post_bytes(json.dumps({"claim": "x", "evidence": {}}).encode(),
                                                            extra=b"Authorization: Bearer s3cret-token-0123456789\r\n"))
        self.assertEqual((status, json.loads(body)["receipt"]["kid"]), (200, va.load_keyring(self.keyfile).kid))
        done = subprocess.run(self.child(True) + ["--stdio", "--key-file", self.keyfile], capture_output=True,
                              input=b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n', timeout=30)
        self.assertEqual((done.returncode, json.loads(done.stdout)["result"]), (0, {}), done.stderr)
        self.assertNotIn(b"Windows", srv.stderr + done.stderr)

    def test_where_modes_are_not_enforced_it_says_so_once_instead_of_refusing(self):
        if va.POSIX_MODES:
            os.chmod(self.keyfile, 0o644)  # refused where modes are enforced (Cli), only noted where they are not
            os.chmod(self.token, 0o644)
        done = subprocess.run(self.child(False) + ["--stdio", "--key-file", self.keyfile, "--token-file", self.token],
                              input=b"", capture_output=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        for path in (self.keyfile, self.token):
            note = "verify_action.py: Windows does not enforce file modes; keep %s readable only by you\n" % path
            self.assertEqual(done.stderr.decode().count(note), 1)
        done = subprocess.run(self.child(False) + ["keygen", "--key-file", self.keyfile], capture_output=True,
                              timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.keyfile) as f:
            self.assertEqual(len(va.KeyRing.parse(f.read()).keys), 2)


# ---------------------------------------------------------------------------------------------------
# Benchmark: python3 test_verify_action.py bench
# ---------------------------------------------------------------------------------------------------
BASELINE = r'''
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version, disable_nagle_algorithm = "HTTP/1.1", True  # no 40 ms Nagle/delayed-ACK stall
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"ok":true}'
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
sys.stderr.write("listening on http://127.0.0.1:%d x\n" % s.server_address[1]); sys.stderr.flush()
s.serve_forever()
'''


def bench_body():
    return json.dumps({"claim": "Added null check for `user.email` in src/user.py before saving", "evidence": {"diff": D_USER},
                       "kind": "code_diff"}).encode()


def load(port, conns, seconds, body):
    """Keep-alive POST /verify from conns threads for seconds; returns (requests/s, p50 ms, p99 ms, errors)."""
    lat, errors, stop, lock = [], [], time.monotonic() + seconds, threading.Lock()

    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        try:
            while time.monotonic() < stop:
                t = time.perf_counter()
                c.request("POST", "/verify", body, JSON)
                r = c.getresponse()
                r.read()
                mine.append(time.perf_counter() - t)
                if r.status != 200:
                    errors.append(r.status)
        except (OSError, http.client.HTTPException) as e:
            errors.append(type(e).__name__)
        c.close()
        with lock:
            lat.extend(mine)
    threads = [threading.Thread(target=client) for _ in range(conns)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat.sort()
    return len(lat) / (time.monotonic() - t0), lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000, len(errors)


def wrk(port, conns, seconds, body):
    """The same load from wrk (a C client, when installed) -> (requests/s, p50 ms, p99 ms, non-2xx), else None."""
    if not shutil.which("wrk"):
        return None
    script = os.path.join(tempfile.mkdtemp(prefix="va-wrk-"), "post.lua")
    with open(script, "w") as f:
        f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = [==[%s]==]\n'
                % body.decode())
    out = subprocess.run(["wrk", "-t%d" % min(2, conns), "-c%d" % conns, "-d%ds" % seconds, "--latency", "-s", script,
                          "http://127.0.0.1:%d/verify" % port], capture_output=True, text=True, timeout=seconds + 30).stdout
    shutil.rmtree(os.path.dirname(script), True)

    def ms(label):
        value, unit = re.search(r"\s%s\s+([0-9.]+)(us|ms|s)\b" % label, out).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return (float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1)), ms("50%"), ms("99%"),
            int(bad.group(1)) if bad else 0)


def bench(seconds=4.0):
    body = bench_body()
    print("POST /verify, %d-byte code_diff body, keep-alive, stdlib http.client threads as the client" % len(body))
    print("CPython %s, %d cores, load average %.2f at start; baseline = stdlib ThreadingHTTPServer answering a fixed "
          "200 (same run)\n" % (sys.version.split()[0], os.cpu_count(), os.getloadavg()[0]))
    rows, wrk_rows = [], []
    for name, cmd in (("baseline", [PY, "-c", BASELINE]), ("verify_action", [PY, SCRIPT, "--port", "0"]),
                      ("  --workers 4", [PY, SCRIPT, "--port", "0", "--workers", "4"])):
        p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        line = p.stderr.readline()
        while b"listening on" not in line:
            line = p.stderr.readline()
        port = int(line.split(b"http://127.0.0.1:")[1].split(b" ")[0])
        try:
            load(port, 4, 0.5, body)  # warm-up
            rows.append((name, load(port, 1, seconds, body), load(port, 16, seconds, body)))
            if shutil.which("wrk"):
                wrk_rows.append((name, wrk(port, 1, int(seconds), body), wrk(port, 16, int(seconds), body)))
        finally:
            p.terminate()
            p.wait(10)
    print("%-14s %10s %8s %8s   %10s %8s %8s   %s" % ("server", "req/s c=1", "p50 ms", "p99 ms", "req/s c=16", "p50 ms",
                                                       "p99 ms", "errors"))
    for name, one, sixteen in rows:
        print("%-14s %10.0f %8.2f %8.2f   %10.0f %8.2f %8.2f   %d" % ((name,) + one[:3] + sixteen[:3] + (one[3] + sixteen[3],)))
    (_, b1, b16), (_, v1, v16) = rows[:2]
    for name, one, sixteen in rows[1:]:
        print("%-14s %10.2f %8.2f %8.2f   %10.2f %8.2f %8.2f" % (
            "ratio va/base" if name == "verify_action" else "ratio w4/base", one[0] / b1[0],
            one[1] / b1[1], one[2] / b1[2], sixteen[0] / b16[0], sixteen[1] / b16[1], sixteen[2] / b16[2]))
    if wrk_rows:
        print("\nthe same servers under wrk (C client; -t1 for c=1, -t2 for c=16), same run:")
        for name, one, sixteen in wrk_rows:
            print("%-14s %10.0f %8.2f %8.2f   %10.0f %8.2f %8.2f   %d" % ((name,) + one[:3] + sixteen[:3] +
                                                                     (one[3] + sixteen[3],)))
        (_, wb1, wb16), (_, wv1, wv16) = wrk_rows[:2]
        print("%-14s %10.2f %8.2f %8.2f   %10.2f %8.2f %8.2f" % ("ratio va/base", wv1[0] / wb1[0], wv1[1] / wb1[1],
                                                                  wv1[2] / wb1[2], wv16[0] / wb16[0], wv16[1] / wb16[1],
                                                                  wv16[2] / wb16[2]))
    else:
        print("\n(wrk is not installed: stdlib client only; its own 16 threads add to the c=16 tail)")
    print("targets: >= 1600 req/s (c=1), >= 1400 req/s (c=16), p99 <= 10 ms (c=16); peer here: 790 / 690 req/s, p99 33 ms")
    print("(with more than 2 connections open, each answered connection goes back to the selector, so requests are "
          "served in arrival order rather than by whichever thread wins the GIL)")
    print("verify_action vs peer: %.2fx (c=1), %.2fx (c=16)" % (v1[0] / 790, v16[0] / 690))
    worst, where = 0.0, ""
    for claim in PATHOLOGICAL:  # the peer's freezing claims against every evidence shape
        for i, ev in enumerate(pathological_evidence(claim)):
            d, _ = cpu_ms(lambda: answer("/verify", json.dumps({"claim": claim[:8192], "evidence": ev}).encode()), 1)
            worst, where = max((worst, where), (d, "%r... x evidence #%d" % (claim[:12], i)))
    print("\npathological claims (%d claims x %d evidence shapes): worst %.1f ms (%s)"
          % (len(PATHOLOGICAL), len(pathological_evidence("x")), worst, where))
    adversarial_table()


def cpu_ms(run, repeat=3):
    """(the least CPU time of repeat runs in ms, the last result); the collector as the service runs it (paused)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        result = run()
        best = min(best, (time.process_time() - t) * 1000)
    return best, result


CANONICAL_DUMPS = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), check_circular=False)


def parse_floor(body, canonical=False):
    """The standard library's json.loads of the body, the collector paused as the service pauses it; canonical: then
    the one json.dumps (keys sorted, compact) that any verifier built on the standard library needs to write the
    RFC 8785 text its receipts hash, the least work a body can cost."""
    gc.disable()
    try:
        value = json.loads(body)
        if canonical:
            CANONICAL_DUMPS.encode(value)
    except ValueError:
        pass
    finally:
        gc.enable()


def adversarial_table():
    """Every adversarial body through Service.post (strict parse, validation, rules, receipt, response object),
    beside the floor of the same bytes: json.loads and the one json.dumps of the canonical text a receipt hashes
    (parse_floor's canonical), the least any verifier built on the standard library spends on a body. Each body's
    bound is max(100 ms, 2 x floor) (spec section 10, Speed). CPU time, least of 3 runs each."""
    rows = []
    for label, path, body in adversarial_bodies():
        floor = cpu_ms(lambda: parse_floor(body, True))[0]
        total, verdict = cpu_ms(lambda: answer(path, body))
        rows.append((label, len(body), floor, max(100.0, 2 * floor), total, verdict))
    print("\nadversarial bodies: %d, up to the %d-byte limit; CPU ms, least of 3 runs; floor: json.loads and the "
          "json.dumps of the canonical text a receipt hashes; bound: max(100 ms, 2 x floor)" % (len(rows), va.MAX_BODY))
    print("  %-48s %8s %7s %7s %7s %7s  %-4s %s" % ("body", "bytes", "floor", "bound", "time", "/floor", "over", "answer"))
    for label, size, floor, bound, total, verdict in rows:
        print("  %-48s %8d %7.1f %7.1f %7.1f %6.1fx  %-4s %s" % (label[:48], size, floor, bound, total,
                                                              total / max(floor, 0.01), "OVER" * (total > bound), verdict))
    over = [row for row in rows if row[4] > row[3]]
    worst = sorted(rows, key=lambda row: row[4] / row[3], reverse=True)[:3]
    print("  %d of %d bodies over their bound; closest to it: %s" % (len(over), len(rows), "; ".join(
        "%s %.1f ms of %.1f" % (row[0], row[4], row[3]) for row in worst)))


def connections_per_second(port, seconds, body):
    """POST /verify on a new connection each time (Connection: close), one client: requests/s. Each is an accept,
    which the audit hook examines."""
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        status = raw_exchange(port, post_bytes(body, extra=b"Connection: close\r\n"))[0]
        done += status == 200
    return done / seconds


def bench_sandbox(seconds=3.0, rounds=3):
    """Throughput with the sandbox on (--sandbox=auto) and off, servers started in turn (off, auto, off, auto...),
    so that the ratio of the best runs shows the sandbox's cost rather than the machine's drift."""
    body, best = bench_body(), {}
    for _ in range(rounds):
        for mode in ("off", "auto"):
            srv = ServerProcess("--sandbox=" + mode)
            try:
                load(srv.port, 4, 0.5, body)  # warm-up
                runs = (load(srv.port, 1, seconds, body)[0], load(srv.port, 16, seconds, body)[0],
                        connections_per_second(srv.port, seconds, body))
            finally:
                srv.close()
            best[mode] = [max(old, new) for old, new in zip(best.get(mode, [0] * 3), runs)]
            status = srv.stderr.split(b"sandbox: ")[1].split(b"\n")[0].decode()
    print("\nthe sandbox's cost: POST /verify, best of %d alternating %g s runs per server; load average %.2f at the "
          "end" % (rounds, seconds, getattr(os, "getloadavg", lambda: [float("nan")])()[0]))
    print("%-34s %10s %10s %14s" % ("server", "req/s c=1", "req/s c=16", "new conn/s c=1"))
    for label, mode in (("--sandbox=off", "off"), ("--sandbox=auto (%s)" % status, "auto")):
        print("%-34s %10.0f %10.0f %14.0f" % tuple([label] + best[mode]))
    print("%-34s %10.2f %10.2f %14.2f" % tuple(["ratio auto/off"] + [a / b for a, b in zip(best["auto"], best["off"])]))


def median_us(function, runs):
    """The median wall time of runs calls of function, in microseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e6


def bench_credentials(seconds=4.0, rounds=3):
    """Issue 29's cost: throughput of POST /verify with an Ed25519 key signing a credential beside each receipt, and
    with HMAC alone, as ratios to the stdlib floor server (best of rounds alternating runs); then sign, the
    credential and its check, timed alone (medians)."""
    body, best = bench_body(), {}
    folder = tempfile.mkdtemp(prefix="va-bench-")
    rings = {"hmac": os.path.join(folder, "hmac"), "ed25519": os.path.join(folder, "ed25519")}
    va.keygen(rings["hmac"])
    va.keygen(rings["ed25519"], "ed25519")
    servers = (("baseline", [PY, "-c", BASELINE], []), ("hmac only", [PY, SCRIPT], ["--key-file", rings["hmac"]]),
               ("ed25519 credential", [PY, SCRIPT], ["--key-file", rings["ed25519"]]))
    for _ in range(rounds):
        for name, command, args in servers:
            srv = ServerProcess(*args, command=command)
            try:
                load(srv.port, 4, 0.5, body)  # warm-up
                runs = (load(srv.port, 1, seconds, body)[0], load(srv.port, 16, seconds, body)[0])
            finally:
                srv.close()
            best[name] = [max(old, new) for old, new in zip(best.get(name, [0, 0]), runs)]
    print("\ncredentials (issue 29): POST /verify, best of %d alternating %g s runs per server; load average %.2f"
          % (rounds, seconds, getattr(os, "getloadavg", lambda: [float("nan")])()[0]))
    print("%-22s %10s %10s %12s %12s" % ("server", "req/s c=1", "req/s c=16", "ratio c=1", "ratio c=16"))
    floor = best["baseline"]
    for name, _, _ in servers:
        one, sixteen = best[name]
        print("%-22s %10.0f %10.0f %12.2f %12.2f" % (name, one, sixteen, one / floor[0], sixteen / floor[1]))
    print("goal: ed25519 credential >= 0.15x the floor at c=1 (the peer, HMAC: 0.13x)")
    ring = va.load_keyring(rings["ed25519"])
    seed = seeds_of(rings["ed25519"])[ring.signer]
    service = va.Service(ring)
    hmac_service = va.Service(va.KeyRing.generate())
    request = json.loads(body)
    response = service.verify(request)
    shutil.rmtree(folder)
    va.base_table.cache_clear()
    start = time.perf_counter()
    va.base_table()
    table_ms = (time.perf_counter() - start) * 1000
    message = bytes(64)
    rows = [
        ("sign, 64 bytes (RFC 8032 §5.1.6)", median_us(lambda: va.sign(seed, message), 2000)),
        ("the credential of a receipt (sign, 2 JCS, 2 SHA-256)", median_us(lambda: ring.credential(response["receipt"]),
                                                                          1000)),
        ("Service.verify, ed25519 ring", median_us(lambda: service.verify(request), 1000)),
        ("Service.verify, hmac ring", median_us(lambda: hmac_service.verify(request), 1000)),
        ("verify_credential (strict verify)", median_us(lambda: va.verify_credential(response["credential"],
                                                                                   ring.public_keys), 200)),
    ]
    print("base_table, once at startup: %.1f ms" % table_ms)
    for name, microseconds in rows:
        print("%-58s %8.0f us (median)" % (name, microseconds))


if __name__ == "__main__":
    if sys.argv[1:2] == ["bench"]:
        bench()
        bench_sandbox()
        bench_credentials()
    elif sys.argv[1:2] == ["credentials"]:  # issue 29's part of the bench alone
        bench_credentials()
    elif sys.argv[1:2] == ["adversarial"]:  # the adversarial table alone
        adversarial_table()
    else:
        unittest.main()
