#!/usr/bin/env python3
"""verify_action.py: check an AI agent's claim about an action against the evidence it supplies, and sign a
receipt of what was judged. One file, Python standard library only (CPython 3.9+); vendor it by copying it.

  python3 verify_action.py [--host H] [--port P] [--key-file F] ...   HTTP on 127.0.0.1:8092
  python3 verify_action.py --stdio [--key-file F]                     MCP over stdio
  python3 verify_action.py keygen --key-file F [--alg ed25519]        create a key ring, or add a key
  python3 verify_action.py verify-receipt FILE --key-file F           check a receipt offline (exit 0/1)
  python3 verify_action.py verify-receipt FILE --public-keys F        check a credential with did:keys alone
Deterministic rules that fetch nothing judge whether the evidence is consistent with the claim; a receipt (HMAC-SHA256
over RFC 8785 canonical JSON) proves which service judged which request, when, with what result: never the claim.
"""

import argparse, base64, collections, functools, gc, hashlib, hmac, html, http, ipaddress, itertools, json, operator
import os, re, secrets, selectors, socket, stat, sys, threading, time, urllib.parse

# ============================================================================================================
# §1 Constants, verdicts, signals and the decision
# ============================================================================================================

VERSION = "1.0.0"
SCHEMA = "verify_action_receipt.v0"
VERDICTS = ("verified", "contradicted", "insufficient_evidence", "unsafe_to_verify")
LEGACY = dict(zip(VERDICTS, ("ok", "mismatch", "uncertain", "rejected")))  # the peer's verdict names, kept as aliases
KINDS = ("code_diff", "db_op", "file_op", "api_call", "generic")
MAX_CLAIM = 8192  # characters (code points) of a claim
MAX_CONTEXT = 8192  # characters of a context
MAX_DEPTH = 32  # JSON nesting; the request object is level 1
MAX_BODY = 1 << 20  # bytes of a POST body (--max-body)
MAX_CALLER_KEYS = 8  # keys of caller_context
MAX_CALLER_STR = 64  # characters of each caller_context key and string value
REQUEST_FIELDS = ("claim", "evidence", "kind", "context", "caller_context")
BOUNDS = {  # per-kind evidence bounds: beyond them the verdict is unsafe_to_verify (evidence_too_large)
    "diff_chars": 4 << 20,
    "diff_files": 5000,
    "diff_headers": 20000,  # lines a diff's structure is read from (diff --git, ---, +++, @@ ...)
    "operation_chars": 65536,
    "path_chars": 4096,
    "request_chars": 4 << 20,
    "count_max": 2**53,
}
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  # MCP, newest first
PROVES = (
    "Which service (key id kid) judged which exact request (SHA-256 of the claim, of the evidence and "
    "of the whole request in RFC 8785 canonical form), when, and with what verdict, signals and reason codes."
)
NOT_PROVES = (
    "That the claim is true. The service never reaches into databases, repositories or APIs; it only "
    "judges whether the evidence is consistent with the claim, and evidence can be fabricated or incomplete."
)

# What a signal does to the decision. Unsafe is kept for evidence that could not be examined (evidence_invalid,
# evidence_too_large) and for a rule that failed (verifier_error): nothing was judged.
POSITIVE = "positive"
NEGATIVE = "negative"
CRITICAL = "critical"
UNSAFE = "unsafe"
EFFECTS = (POSITIVE, NEGATIVE, CRITICAL, UNSAFE)
DECISION = (
    "Over signals, each {code, effect, count}: P is the sum of the counts of the positive signals, N that of the "
    "negative ones. Any unsafe signal -> unsafe_to_verify; else any critical signal -> contradicted; else N = 0 and "
    "P >= 2 -> verified; else N >= 2 and P = 0 -> contradicted; else insufficient_evidence."
)
CONFIDENCE = (
    "Confidence in the stated verdict, rounded to 3 decimals: verified 0.6 + 0.1*(P-2), at most 0.95; contradicted "
    "0.9 with a critical signal, else 0.6 + 0.1*(N-2), at most 0.9; insufficient_evidence 0.5; unsafe_to_verify 0.0."
)


class Signal(collections.namedtuple("Signal", "code effect count")):
    """A reason code the decision counts: its effect (EFFECTS) and how often it fired (1, or once an entity)."""

    __slots__ = ()

    def as_json(self):
        """{"code", "effect", "count"}: a signal as responses and receipts carry it."""
        return {"code": self.code, "effect": self.effect, "count": self.count}


def _tally(signals):
    """effect -> the counts of the signals of that effect, added up (P: positive, N: negative)."""
    totals = dict.fromkeys(EFFECTS, 0)
    for signal in signals:
        totals[signal.effect] += signal.count
    return totals


def decide(signals):
    """The verdict DECISION gives a list of signals."""
    totals = _tally(signals)
    positives = totals[POSITIVE]
    negatives = totals[NEGATIVE]
    if totals[UNSAFE]:
        return "unsafe_to_verify"
    if totals[CRITICAL]:
        return "contradicted"
    if not negatives and positives >= 2:
        return "verified"
    if negatives >= 2 and not positives:
        return "contradicted"
    return "insufficient_evidence"


def confidence(verdict, signals):
    """The confidence CONFIDENCE gives verdict over the signals it was decided from."""
    totals = _tally(signals)
    positives = totals[POSITIVE]
    negatives = totals[NEGATIVE]
    if verdict == "verified":
        score = min(0.95, 0.6 + 0.1 * (positives - 2))
    elif verdict == "contradicted" and totals[CRITICAL]:
        score = 0.9
    elif verdict == "contradicted":
        score = min(0.9, 0.6 + 0.1 * (negatives - 2))
    elif verdict == "insufficient_evidence":
        score = 0.5
    else:
        score = 0.0
    return round(score, 3)


# ============================================================================================================
# §2 Canonical JSON (RFC 8785) and hashing
# ============================================================================================================
# The RFC 8785 text of a parsed value is json.dumps's (in C), keys sorted and compact, with two corrections:
# - numbers: json.dumps writes a float as repr does, RFC 8785 as ECMAScript does; _es_floats lays them out again;
# - key order: json.dumps sorts keys by code point, RFC 8785 by UTF-16 code unit; where the two can differ, marks
#   before astral characters make them agree: in the keys of a few objects, in place (_in_utf16_order), or in the
#   raw text, parsed again as a twin of the value (_marked_text).
# _jcs writes the same text in pure Python, for single values and receipts. The tests check both against an
# independent implementation, on random values.


def _sha(data):
    """'sha256:' and the hex SHA-256 of bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _b64url(data):
    """Unpadded base64url of bytes, as text."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_encode_str = json.encoder.encode_basestring  # RFC 8785 strings: only " \ and controls escaped, \u00xx lowercase
_SORTED = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"),
                           check_circular=False)
_INFINITY = float("inf")
_EXACT = 2 ** 53  # integers below it in magnitude are written as they are

# ---- numbers -----------------------------------------------------------------------------------------------
# repr and ECMAScript write the same shortest round-trip digits; their layouts differ in these cases only
# (repr -> ECMAScript): an integral value (12.0 -> 12, -0.0 -> 0), exponents -7 to -9 (1e-07 -> 1e-7), and the
# exponents ECMAScript writes out: -5 and -6 (1.5e-05 -> 0.000015) and +16 to +20 (1.5e+16 -> 15000000000000000).
_FLOAT_LITERALS = (  # (repr's text, ECMAScript's) between strings, where a number always ends before , ] or }
    ("-0.0,", "0,"), ("-0.0]", "0]"), ("-0.0}", "0}"),  # minus zero before ".0", which would leave "-0"
    (".0,", ","), (".0]", "]"), (".0}", "}"),
    ("e-07", "e-7"), ("e-08", "e-8"), ("e-09", "e-9"),
)
# The numbers ECMAScript writes out, read reversed ("1.5e+16" reads "61+e5.1"): each starts at its exponent, and the
# zeros ECMAScript adds after its digits come before them, so a %-format lays them out again, reversed.
_SMALL_DIGITS = r"([0-9]*)\.?([0-9])"  # after e-05 or e-06, reversed: the other digits, the first digit
_LARGE_DIGITS = r"([0-9]*)\."  # after e+16 to e+20, reversed: the digits after the point (see _whole_large)
_WRITTEN_OUT = (  # (exponent, its digits in reversed text, their layout, reversed)
    ("e-05", _SMALL_DIGITS, "%s%s0000.0"),  # 1.5e-05: "5", "1" -> "510000.0"
    ("e-06", _SMALL_DIGITS, "%s%s00000.0"),
    ("e+16", _LARGE_DIGITS, "%16s"),  # 1.5e+16: "5" -> 15 spaces and "5"; the spaces become zeros
    ("e+17", _LARGE_DIGITS, "%17s"),
    ("e+18", _LARGE_DIGITS, "%18s"),
    ("e+19", _LARGE_DIGITS, "%19s"),
    ("e+20", _LARGE_DIGITS, "%20s"),
)


def _from_exponent(exponent, digits):
    """A pattern for reversed text: a number's exponent (reversed) where no digit precedes it (e+16 is not the end
    of e+160), then the digits that follow it there. The exponent comes first, so a search finds it at once."""
    backwards = re.escape(exponent[::-1])
    return re.compile(backwards + "(?<![0-9]" + backwards + ")" + digits)


_WRITTEN_OUT_PATTERN = {exponent: _from_exponent(exponent, digits) for exponent, digits, _ in _WRITTEN_OUT}


def _split_at_strings(text):
    """json.dumps text split at its strings' quotes: the odd parts are the strings' contents. Escaped backslashes
    and quotes are masked first (as \x01 and \x02, which json.dumps escapes, so they are free)."""
    masked = text.replace("\\\\", "\x01").replace('\\"', "\x02")
    return masked.split('"')


def _join_at_strings(parts):
    """The inverse of _split_at_strings."""
    return '"'.join(parts).replace("\x02", '\\"').replace("\x01", "\\\\")


def _written_out(outside, rows):
    """The text between strings with the numbers of the exponents in rows (of _WRITTEN_OUT) written out, in the
    reversed text: for each exponent, a number that repeats, then each one left."""
    backwards = outside[::-1]
    for exponent, _, layout in rows:
        pattern = _WRITTEN_OUT_PATTERN[exponent]
        backwards = _lay_out_repeated(backwards, pattern, layout)
        backwards = _lay_out_each(backwards, pattern, layout)
    return backwards[::-1].replace(" ", "0")


def _lay_out_repeated(backwards, pattern, layout):
    """Reversed text with the first number pattern finds laid out wherever it repeats, by literal replacements (in
    C), if it follows a comma a thousand times or more. It is replaced only after , ] or } (a number ends before one, so
    e+16 is not read in e+160) and, without a point, with the character after it (reversed, 1e-05 is the start of
    1.1e-05): only where it is the same number."""
    found = pattern.search(backwards)
    if found is None:
        return backwards
    end = found.end()
    if "." not in found.group():
        end += 1
    number = backwards[found.start():end]
    if backwards.count("," + number) < 1000:
        return backwards
    laid_out = (layout % found.groups()).replace(" ", "0") + backwards[found.end():end]
    for before in ",]}":
        backwards = backwards.replace(before + number, before + laid_out)
    return backwards


def _lay_out_each(backwards, pattern, layout):
    """Reversed text with each number pattern finds laid out: one split and one %-format, both in C."""
    pieces = pattern.split(backwards)  # text, then (the digits' groups, text) for each number
    numbers = len(pieces) // (pattern.groups + 1)
    if not numbers:
        return backwards
    layouts = (layout + "%s") * numbers
    return ("%s" + layouts) % tuple(pieces)


def _whole_large(outside, exponent):
    """The text between strings with its numbers of exponent +16 to +20 that have no fraction written out (1e+16 is 1
    and 16 zeros): a literal replacement, as a number always ends before , ] or } (so e+16 is not read in e+160)."""
    zeros = "0" * int(exponent[2:])
    for end in ",]}":
        outside = outside.replace(exponent + end, zeros + end)
    return outside


def _es_floats(text):
    """json.dumps text with its floats laid out as ECMAScript lays them out (see _FLOAT_LITERALS)."""
    parts = _split_at_strings(text)
    outside = "\x03".join(parts[0::2])  # numbers, literals and punctuation: no space, no \x03
    for repr_text, es_text in _FLOAT_LITERALS:
        outside = outside.replace(repr_text, es_text)
    present = [row for row in _WRITTEN_OUT if row[0] in outside]
    patterned = present
    if "." not in outside:  # no fraction anywhere: the large exponents' patterns, which need one, cannot match
        patterned = [row for row in present if row[1] == _SMALL_DIGITS]
    if patterned:
        outside = _written_out(outside, patterned)
    for exponent, digits, _ in present:
        if digits == _LARGE_DIGITS and exponent in outside:  # those with a fraction are written out already
            outside = _whole_large(outside, exponent)
    parts[0::2] = outside.split("\x03")
    return _join_at_strings(parts)


def _es_number(x):
    """A number as ECMAScript's Number.prototype.toString writes it, as RFC 8785 requires: an integer below 2^53 as
    it is, any other as a double (2^60 is 1152921504606847000). ValueError for NaN and the infinities."""
    if isinstance(x, int) and -_EXACT < x < _EXACT:
        return str(x)
    if x != x or x in (_INFINITY, -_INFINITY):
        raise ValueError("NaN and Infinity have no canonical JSON form")
    if x == 0:
        return "0"
    text = repr(float(x))
    if "e" not in text and not text.endswith(".0"):
        return text  # positional with a fraction: written alike
    return _es_floats("[%s]" % text)[1:-1]


def _utf16_order(key):
    """A key's sort key in RFC 8785: its UTF-16 code units (big-endian bytes sort as the units do)."""
    return key.encode("utf-16-be", "surrogatepass")


def _sorted_keys(obj):
    """An object's keys in RFC 8785 order (UTF-16 code units). Code point order is that order where no key holds a
    character above U+FFFF, and plainly so where every key is ASCII: sorted() then needs no sort key."""
    if "".join(obj).isascii():
        return sorted(obj)
    return sorted(obj, key=_utf16_order)


def _jcs_object(obj):
    """The RFC 8785 text of an object (dict), its keys sorted by UTF-16 code units."""
    members = [_encode_str(key) + ":" + _jcs(obj[key]) for key in _sorted_keys(obj)]
    return "{" + ",".join(members) + "}"


def _jcs(v):
    """The RFC 8785 text of a JSON value, in pure Python."""
    kind = type(v)
    if kind is str:
        return _encode_str(v)
    if kind is dict:
        return _jcs_object(v)
    if kind is list:
        return "[" + ",".join(map(_jcs, v)) + "]"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _es_number(v)
    if isinstance(v, str):
        return _encode_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(map(_jcs, v)) + "]"
    if isinstance(v, dict):
        return _jcs_object(v)
    raise TypeError("not a JSON value: %s" % type(v).__name__)


# ---- key order ---------------------------------------------------------------------------------------------
# Code point and UTF-16 order differ only between a character of U+E000-U+FFFF and an astral one (above U+FFFF),
# which UTF-16 writes as a surrogate pair (D800-DFFF), and so sorts first. A mark before each astral character makes
# code point order UTF-16 order: its first code point, U+DBFF, sorts against any other character as a high
# surrogate does, and after equal marks astral characters compare as in UTF-16. The mark's U+10FFFF makes its
# removal exact: every U+10FFFF of the input has a mark before it, so no U+DBFF of the input stands before one.
_MARK = "\udbff\U0010ffff"
_MARK_JSON = b"\\udbff\xf4\x8f\xbf\xbf"  # _MARK in UTF-8 JSON text: an escaped lone U+DBFF, then U+10FFFF
# Keys marked in place, in a parsed value, take _KEY_MARK instead: no parsed text holds it, as json.loads joins an
# escaped surrogate pair into one character and UTF-8 text holds no surrogate.
_KEY_MARK = "\udbff\udfff"
_KEY_SEPARATOR = "\ud800\udc00"  # between keys joined to be marked at once; no parsed text holds it either
_BEFORE_ASTRAL = re.compile("(?=[\U00010000-\U0010ffff])")
_ESCAPED_HIGH_SURROGATE = re.compile(rb"(\\u[dD][89abAB])")
_ASTRAL_LEADS = (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")  # the lead bytes of a 4-byte (astral) UTF-8 character
_NOT_ASTRAL_LEAD = bytes(b for b in range(256) if not 0xF0 <= b <= 0xF4)  # what bytes.translate deletes to count them
_ESCAPED_HIGH_BMP = re.compile(rb"\\u[eEfF]")
# The rest of a string, from an astral character to the next one (so each search is linear) or the string's end,
# then a ':' after it: that string is a key. The two patterns start where an astral character does, as it is and
# escaped; each starts with what a search can find at once.
_TO_KEY_END = rb'[^"\\\xf0-\xf4]*(?:\\(?!u[dD][89abAB]).[^"\\\xf0-\xf4]*)*"[ \t\n\r]*:'
_RAW_ASTRAL_IN_KEY = re.compile(rb"[\xf0-\xf4]" + _TO_KEY_END)
_ESCAPED_ASTRAL_IN_KEY = re.compile(rb"\\u[dD][89abAB]" + _TO_KEY_END)


def _astral_in_key(data):
    """Whether UTF-8 JSON text may have a key holding an astral character: never a miss; a false alarm only where an
    escaped backslash stands before text that reads like an escaped high surrogate."""
    if _RAW_ASTRAL_IN_KEY.search(data):
        return True
    return bool(_ESCAPED_ASTRAL_IN_KEY.search(data))


def _may_mix(data):
    """Whether UTF-8 JSON text may hold a character of U+E000-U+FFFF and a key holding an astral one, as they are
    or escaped: only then may an object need UTF-16 key order. An escaped backslash before 'u' only costs a closer
    look."""
    return _has_high_bmp(data) and _astral_in_key(data)


def _has_high_bmp(data):
    """Whether UTF-8 JSON text holds a character of U+E000-U+FFFF: its lead byte (EE or EF), or escaped."""
    if b"\xee" in data or b"\xef" in data:
        return True
    return b"\\u" in data and bool(_ESCAPED_HIGH_BMP.search(data))


def _astral_count(data):
    """How many astral characters UTF-8 JSON text holds, as they are or escaped (an escaped backslash before text
    that reads like an escaped high surrogate counts one more)."""
    as_they_are = len(data.translate(None, _NOT_ASTRAL_LEAD))  # one pass, not one bytes.count for each lead
    return as_they_are + len(_ESCAPED_HIGH_SURROGATE.findall(data))


def _marked_text(data):
    """UTF-8 JSON text with _MARK before each astral character, as it is or escaped as a surrogate pair.
    Where a mark goes is noted first by a byte UTF-8 never holds (FF), so that no step marks another's marks.
    Escaped backslashes are written \\u005c first (which parses alike), so that every \\u left starts an escape."""
    unescaped = data.replace(b"\\\\", b"\\u005c")
    pieces = _ESCAPED_HIGH_SURROGATE.split(unescaped)  # text, then (an escaped high surrogate, text) for each
    escapes = pieces[1::2]
    pieces[1::2] = [b"\xff" + escape for escape in escapes]
    noted = b"".join(pieces)
    for lead in _ASTRAL_LEADS:
        noted = noted.replace(lead, b"\xff" + lead)
    return noted.replace(b"\xff", _MARK_JSON)


def _holding_astral_keys(objects):
    """Those objects (each of two or more keys, so none joins its keys into "") with a key that holds an astral
    character: each object's largest key character compared, in C (a Python test for each costs twice as much)."""
    largest = map(max, map("".join, objects))
    astral = map("\uffff".__lt__, largest)
    return list(itertools.compress(objects, astral))


def _marked_keys(objects):
    """The keys of objects, in order, with _KEY_MARK before each astral character: joined, marked in one split and
    join, and split apart again, all in C."""
    keys = _KEY_SEPARATOR.join(itertools.chain.from_iterable(objects))
    marked = _KEY_MARK.join(_BEFORE_ASTRAL.split(keys))
    return marked.split(_KEY_SEPARATOR)


def _in_utf16_order(objects, write):
    """write() while the keys of those objects that hold an astral character carry _KEY_MARK before each one, so
    that json.dumps sorts them in UTF-16 order; the objects' members are restored afterwards, in their order."""
    marked = _holding_astral_keys(objects)
    saved = list(map(dict.copy, marked))
    values = itertools.chain.from_iterable(map(dict.values, saved))
    pairs = zip(_marked_keys(marked), values)  # each object takes as many pairs as it has members, in turn
    try:
        for obj, size in zip(marked, map(len, saved)):
            obj.clear()
            obj.update(itertools.islice(pairs, size))
        return write()
    finally:
        for obj, members in zip(marked, saved):
            obj.clear()
            obj.update(members)


# ---- the canonical text ------------------------------------------------------------------------------------
# an integer that may reach 2^53 (ECMAScript writes it as a double), from a run's start: 16 digits from 9, or 17
_BIG_INT = re.compile(r"(?<![0-9.])(?:9[0-9]{15}|[0-9]{17})")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a string in JSON text; unrolled: its parts never overlap
_FLOAT_FORMS = re.compile(r"\.0[,\]}]|e-0[5-9]|e\+(?:1[6-9]|20)(?![0-9])")  # see _FLOAT_LITERALS


def _has_big_int(text):
    """Whether json.dumps text holds an integer that may reach 2^53: a quick search, then one outside strings."""
    if not _BIG_INT.search(text):
        return False
    outside = _JSON_STRING.sub("", text)
    return bool(_BIG_INT.search(outside))


def _may_need_es_layout(text):
    """Whether json.dumps text may hold a float that ECMAScript lays out otherwise: literal scans in C, then one
    search (strings can only make it say yes)."""
    if ".0" in text or "e-0" in text or "e+" in text:
        return bool(_FLOAT_FORMS.search(text))
    return False


def _canonical_text(value, exact_ints=False, marked=None):
    """The RFC 8785 text of a parsed JSON value. exact_ints: the value holds no integer beyond +-(2^53 - 1) (the
    parser refused them), so none needs the pure-Python path. marked: the mark the value's astral characters
    carry (_MARK: a twin from _marked_text; _KEY_MARK: keys marked in place), or "" when none is needed; None:
    found out here, and where json.dumps's text may need UTF-16 key order, that text is marked and parsed again."""
    if not isinstance(value, (dict, list)):
        return _jcs(value)
    text = _SORTED.encode(value)
    if marked is None and not text.isascii():
        encoded = text.encode("utf-8", "surrogatepass")
        if _may_mix(encoded):
            twin = json.loads(_marked_text(encoded))
            return _canonical_text(twin, exact_ints, _MARK)
    if not exact_ints and _has_big_int(text):
        text = _jcs(value)
    elif _may_need_es_layout(text):
        text = _es_floats(text)
    if marked:
        text = text.replace(marked, "")
    return text


def canonical_members(value, exact_ints=False, along=("evidence",), marked=None):
    """{None: the RFC 8785 text of value, along[0]: that of its member along[0]}, or for that member its own
    canonical_members along the rest. Made once per request, it serves the strict-JSON checks, the rules that read
    JSON text, and both receipt hashes (MCP: along params, arguments, evidence). The members on either side of the
    one along are written by one json.dumps each, however many they are. marked: see _canonical_text."""
    key = along[0] if along else None
    if not (isinstance(value, dict) and key in value):
        return {None: _canonical_text(value, exact_ints, marked)}
    inner = canonical_members(value[key], exact_ints, along[1:], marked)
    before, after = _beside(value, key)
    before_text = _canonical_text(before, exact_ints, marked)[1:-1]
    middle = _encode_str(key) + ":" + inner[None]
    after_text = _canonical_text(after, exact_ints, marked)[1:-1]
    written = filter(None, (before_text, middle, after_text))  # a side with no members is left out
    whole = "{" + ",".join(written) + "}"
    if len(along) == 1:
        inner = inner[None]
    return {None: whole, key: inner}


def _beside(value, key):
    """(the members of an object before key, those after it). key is ASCII, so code point and UTF-16 order agree
    on which members come before it."""
    before = {}
    after = {}
    for name, member in value.items():
        if name < key:
            before[name] = member
        elif name > key:
            after[name] = member
    return before, after


# ============================================================================================================
# §3 Rules per kind (pure)
# ============================================================================================================
# Each kind parses the claim into a facts record and the evidence into another (what it holds about the things the
# claim names), then runs its table of named checks: one row a reason code. Inputs are tokenised once with
# single-class patterns and judged with set look-ups and str methods: time is linear, and no pattern has nested or
# adjacent overlapping quantifiers (the peer froze on "a." * 4000).

# ---- §3.1 Checks, words, tokens and the things a claim names ----------------------------------------------


# Each kind's table has a row (check, code, effect) for each of its reason codes: check(claim facts, evidence facts)
# says how often code fires (0, False or None: not at all), and effect is what each firing does to the decision. A
# code in ALONE that fires is its judgement's only signal: the rows after it are not run (an empty diff, a claim of
# two opposite actions).
ALONE = frozenset(["diff_no_changes", "conflicting_verbs"])


def run_checks(table, claim, evidence):
    """The signals of a table's rows over the claim's and the evidence's facts, in table order."""
    signals = []
    for test, code, effect in table:
        count = test(claim, evidence)
        if not count:
            continue
        signal = Signal(code, effect, int(count))
        if code in ALONE:
            return [signal]
        signals.append(signal)
    return signals


def claim_is_negated(claim, evidence):
    """The claim negates or reverses its action (did not, never, skipped, reverted, rolled back...): whatever the
    evidence shows, it cannot be verified."""
    return claim.negated


def claim_is_not_done(claim, evidence):
    """The claim states its action as intended or attempted, not done (will add, going to add, plan to, tried to,
    attempted to): whatever the evidence shows, it cannot be verified."""
    return claim.not_done


def claim_has_conflicting_verbs(claim, evidence):
    """The claim names actions that contradict each other (deleted and inserted)."""
    return claim.conflicting


def _word_set(text):
    """The set of the words of text."""
    return frozenset(text.split())


# a token: a run of characters other than spaces, quotes and brackets. ASCII text is split by str methods instead,
# several times faster than the pattern and with the same tokens (str.split's whitespace is the pattern's \s).
_TOKEN = re.compile(r"[^\s`'\"();<>\[\]{}|]+")
_UNQUOTED = str.maketrans("`'\"();<>[]{}|", " " * 13)
# An http(s) URL's host and path. The netloc ends at / ? # or a space, and its user info at its last @. After it, an
# IPv6 host is what follows '[' up to the first ']' (with no ']', up to the netloc's last character, which is left
# out), and any other host is what comes before a port's ':'. Each quantifier backtracks over one run at most.
# At a token's start (_URL_AT), and anywhere in a text (_URLS): that pattern starts at '://' and looks behind it for
# the scheme, as a literal start lets the search skip text without URLs.
_URL_REST = (
    r"(?:[^/?#\s\"'<>]*@)?\[?((?<=\[)(?:[^/?#\s\"'<>@\]]*(?=[^/?#\s\"'<>@]))?|(?<!\[)[^/?#\s\"'<>:]*)"
    r"[^/?#\s\"'<>]*(/[^?#\s\"'<>]*)?"
)
_URL_AT = re.compile(r"(?i:\bhttps?)://" + _URL_REST)
_URLS = re.compile(r"://(?:(?<=(?i:\bhttp)://)|(?<=(?i:\bhttps)://))" + _URL_REST)
# An email address: a local part of letters, digits and ._+-%, then a domain of letters, digits, '.' and '-' that
# holds a '.' and neither starts nor ends with one. Alone (a token), and within text as a whole token, which may
# carry the sentence punctuation _tokens strips.
_EMAIL_SHAPE = (
    r"[\w.+%-]+@(?=(?:[^\W_]|-)+\.(?:[^\W_]|[.-])*(?:[^\W_]|-))(?:[^\W_]|-)(?:[^\W_]|[.-])*(?:[^\W_]|-)"
)
_EMAIL = re.compile(_EMAIL_SHAPE)
_EMAILS = re.compile(r"(?<![^\s`'\"();<>\[\]{}|])[,*:!?]*(%s)[.,:!?*]*(?![^\s`'\"();<>\[\]{}|])" % _EMAIL_SHAPE)
# words of code, camelCase and CAPS split (it backtracks one character at most)
_CODE_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
EXTENSIONS = _word_set("""py js ts tsx jsx go rs c h cc cpp hpp java kt rb php cs swift m sh bash md txt json yaml
    yml toml ini cfg conf html htm css scss sql xml csv tsv lock log env gradle mk r scala lua pl proto dart vue
    svelte ex hs ml tf dockerfile gitignore pdf png jpg jpeg gif svg zip gz tar bin so ipynb db sqlite""")
_STOP = _word_set("""a an the and or but if then than that this these those with without from into for to of in on
    at by as is are was were be been being it its they them their there here which what when where while who why how
    not no so too very can could should would will may might must do does did done have has had having also just
    only still some any all each every both either more most less least other such same via per over under after
    before about above below between through during again now new old file files code line lines function functions
    method methods class classes module modules test tests value values variable variables logic handling support
    issue issues bug bugs case cases call calls return returns using used use make made sure properly correctly
    correct small minor simple basic proper instead within across onto among until since around against toward
    towards upon beyond inside outside past near along amid except unlike versus""")
_NOT_ID = _word_set("""version versions step steps phase page pages port attempt attempts retry retries level day
    days hour hours minute minutes second seconds week weeks month months year years http https status code codes
    error errors times item items row rows record records percent top""")
_NOT = _word_set("not never didn wasn isn couldn cannot weren hasn haven doesn don won unable")
_NEGATION = _NOT | _word_set("no nothing none neither nor without failed")  # before a verb: 'no rows were'
# Words that undo or skip the action they go with ('skipped adding', 'reverted the change that added'); after an
# article they name a thing instead ('an undo button').
_REVERSALS = _word_set("skip skips skipped skipping revert reverts reverted reverting undid undo undoes undoing "
                       "rollback")
_REVERSAL_PAIRS = frozenset([("rolled", "back"), ("roll", "back"), ("rolling", "back"), ("backed", "out")])
_REVERSAL_WORDS = _REVERSALS | {first for first, _ in _REVERSAL_PAIRS}  # a claim without them reverses nothing
_ARTICLES = ("the", "a", "an", "file")
_PREPOSITIONS = _word_set("for of from by in under within belonging owned")  # 'sessions of user 42'
_VERB_SUFFIXES = ("s", "es", "d", "ed", "ing")


def _verb_forms(word):
    """word's -s -es -d -ed -ing -ied -ies forms."""
    stem = word[:-1]
    return [word + suffix for suffix in _VERB_SUFFIXES] + [stem + "ied", stem + "ies"]


def _verbs(classes):
    """word -> class for the base words of each class (class -> its words) and their forms (_verb_forms)."""
    table = {word: cls for cls, words in classes.items() for word in words.split()}
    forms = {}
    for word, cls in table.items():
        forms.update(dict.fromkeys(_verb_forms(word), cls))
    forms.update(table)  # a base word keeps its own class when it is also another's form
    return forms


VERB_CLASSES = {  # base words; each also matches its -s -es -d -ed -ing forms
    "code_diff": {
        "add": "add introduce create implement write wrote",
        "check": "check validate guard ensure verify",
        "fix": "fix",
        "modify": "change update modify refactor rename set edit replace tweak",
        "remove": "remove delete drop dropped",
    },
    "db_op": {
        "delete": "delete remove purge drop dropped truncate clear",
        "insert": "insert add create append import",
        "update": "update modify change set mark edit",
        "read": "read select query fetch count list retrieve",
    },
    "file_op": {
        "create": "create add make made generate touch",
        "write": "write wrote written save",
        "delete": "delete remove erase unlink rm",
        "rename": "rename move mv",
        "modify": "modify update edit append change overwrite overwrote overwritten truncate",
    },
}
_CODE_VERBS = _verbs(VERB_CLASSES["code_diff"])
_DB_VERBS = _verbs(VERB_CLASSES["db_op"])
_FILE_VERBS = _verbs(VERB_CLASSES["file_op"])
_ALL_VERBS = frozenset(_CODE_VERBS).union(_DB_VERBS, _FILE_VERBS)
# api_call: a claim's success and failure words
_OK_WORDS = _word_set("sent delivered posted created succeeded ok success successful successfully accepted")
_FAIL_WORDS = _word_set("failed fail fails failure error errored rejected bounced denied unsuccessful unable")
_STATUS_KEYS = _word_set("status state result outcome conclusion")
# status words of evidence values
_STATUS_OK = _word_set("ok success succeeded successful sent delivered accepted created completed done")
_STATUS_FAIL = _word_set("error failed failure fail rejected bounced denied invalid")
_NOT_NOUN = _STOP.union(_NOT_ID, _ALL_VERBS, _OK_WORDS, _FAIL_WORDS, _STATUS_OK)  # never the noun of 'user 5'
# words a claim's content words never are (code_diff): stopwords, verbs, negations and reversals
_NOT_CONTENT = _STOP.union(_ALL_VERBS, _NEGATION, _REVERSALS)


def _strip(token):
    """token without the sentence punctuation around it."""
    return token.rstrip(".,:!?*").lstrip(",*:!?")


def _digits(text):
    """Whether text is ASCII digits only (str.isdigit alone also takes '²' and Arabic-Indic digits)."""
    return text.isascii() and text.isdigit()


def _raw_tokens(text):
    """text split at spaces, quotes and brackets (_TOKEN), by str methods where it is ASCII."""
    if text.isascii():
        return text.translate(_UNQUOTED).split()
    return _TOKEN.findall(text)


def _tokens(text):
    """The tokens of text, each without the sentence punctuation around it (as _strip), empty ones dropped: in C."""
    trimmed = map(str.rstrip, _raw_tokens(text), itertools.repeat(".,:!?*"))
    stripped = map(str.lstrip, trimmed, itertools.repeat(",*:!?"))
    return list(filter(None, stripped))


def _lower(tokens):
    """The tokens in lower case."""
    return list(map(str.lower, tokens))


def _words(text):
    """(the tokens of text, the same in lower case)."""
    tokens = _tokens(text)
    return tokens, _lower(tokens)


def _stems(word):
    """word and its stems without -ing -ed -es -s (a stem keeps at least 3 letters)."""
    stems = [word]
    for suffix in ("ing", "ed", "es", "s"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) >= 3:
            stems.append(stem)
    return stems


def _grouped(parts):
    """Whether the parts of a number split at commas group its digits by three ('1', '000')."""
    lengths = list(map(len, parts))
    return 1 <= lengths[0] <= 3 and set(lengths[1:]) <= {3}


def _number(tok):
    """A plain or comma-grouped decimal number ('1,000', '2.5') as int or float, else None."""
    if len(tok) > 24:
        return None
    parts = tok.split(",")
    if len(parts) > 1 and not _grouped(parts):
        return None
    whole, dot, fraction = "".join(parts).partition(".")
    if not _digits(whole) or dot and not _digits(fraction):
        return None
    if dot:
        return float(whole + dot + fraction)
    return int(whole)


def _name_part(part):
    """Whether part can be one part of an identifier: ASCII letters, digits and _, not starting with a digit."""
    if not part or not part.isascii():
        return False
    starts_well = part[0].isalpha() or part[0] == "_"
    return starts_well and part.replace("_", "a").isalnum()


def _camel(word):
    """Whether word is camelCase: a lower-case letter right before a capital ('Added' is not)."""
    if word[1:].islower():
        return False
    pairs = zip(word, word[1:])
    return any(a.islower() and b.isupper() for a, b in pairs)


def _identifier(tok, explicit=False):
    """tok if it is a dotted, snake_case or camelCase identifier (any word when explicit: backticked), else None."""
    if not explicit and tok.isalpha() and not _camel(tok):
        return None  # a plain word
    parts = tok.split(".")
    if not all(map(_name_part, parts)):
        return None
    if len(parts) > 1:  # 'e.g' is no identifier unless backticked: `x.y` is one
        longest = max(map(len, parts))
        return tok if longest > 1 or explicit else None
    if explicit or _camel(tok) or "_" in tok.strip("_"):
        return tok
    return None


def _email(tok):
    """The address in lower case if tok is an email address, else None."""
    if _EMAIL.fullmatch(tok):
        return tok.lower()
    return None


def _emails_in(text):
    """The email addresses among text's tokens, in lower case: one C pass, however many tokens."""
    if "@" not in text:
        return set()
    return set(map(str.lower, _EMAILS.findall(text)))


def _url(tok):
    """(host in lower case, path without a trailing '/') if tok starts with an http(s) URL that has a host, else
    None."""
    match = _URL_AT.match(tok)
    if not match or not match.group(1):
        return None
    path = match.group(2) or ""
    return match.group(1).lower(), path.rstrip("/")


def _column(rows, number):
    """Item number of each row, lazily (operator.itemgetter mapped over them: in C)."""
    return map(operator.itemgetter(number), rows)


def _urls_in(text):
    """{(host, path)} of every http(s) URL in text that has a host, each read as _url reads one. A URL never spans a
    space: each distinct run between spaces is read once (a request that repeats one URL 116,000 times costs one
    match), then each URL once, by C passes."""
    if "://" not in text:
        return set()
    found = _URLS.findall(" ".join(set(text.split())))
    hosts = list(map(str.lower, _column(found, 0)))
    paths = map(str.rstrip, _column(found, 1), itertools.repeat("/"))
    return set(itertools.compress(zip(hosts, paths), hosts))


_PATH_STARTS = ("/", "./", "~/")
_MAX_PATH = BOUNDS["path_chars"]


def _pathish(tok):
    """Whether tok names a file: a known extension, or clearly a path (./x, /x, ~/x, a/b/c)."""
    if "://" in tok or "@" in tok or len(tok) > _MAX_PATH:
        return False
    base = tok.rsplit("/", 1)[-1]
    name, dot, ext = base.rpartition(".")
    named = name or base.startswith(".")
    if dot and ext.lower() in EXTENSIONS and named and not _digits(name):
        return True
    rooted = tok.startswith(_PATH_STARTS) or tok.count("/") >= 2
    return "/" in tok and bool(base) and rooted


def _suffix_of(claimed, path):
    """Whether the claimed path is path or a whole-component suffix of it (a.py never matches data.py)."""
    if not claimed:
        return False
    return path == claimed or path.endswith("/" + claimed)


def _singular(noun):
    """noun without a plural's -s or -ies ('categories': 'category'; 'class' stays)."""
    if noun.endswith("ies"):
        return noun[:-3] + "y"
    if noun.endswith("s") and not noun.endswith("ss"):
        return noun[:-1]
    return noun


def _unprefixed(token):
    """token without a leading './'."""
    if token[:2] == "./":
        return token[2:]
    return token


# The names of explicit ids in tokens joined one a line and lower-cased, as (name, N): '#N', 'id=N' and 'id:N' (name
# ''), or a token and the number token after it (name: that token), N of 1 to 18 digits and written without leading
# zeros; names kept as _id_noun keeps them.
_ID_ROWS = re.compile(r"\n(?:#|id[=:]|([^\n]*)\n)(?=[0-9]{1,18}\n)0*([0-9]+)")
_ID_NAME = re.compile(r"((?:.*_)?id)?")
_NOUN_LENGTH = re.compile(r".{3,4}|.{5,}(?<!ed)")
_ID_NUMBER = re.compile(r"[0-9]{1,18}")


def _noun_like(name):
    """Whether a lower-case name is a noun an id may follow: letters only, at least 3, never a stopword, verb or past
    participle of 5 letters or more ('user 5' yes, 'added 5' no)."""
    return name not in _NOT_NOUN and name.isalpha() and bool(_NOUN_LENGTH.fullmatch(name))


def _id_noun(name):
    """The noun an id's lower-case name gives ('' for '', id and ids; 'user' for user_id, users_id, user and users),
    or None when it names no id: it must be id, end in _id, or be noun-like (_noun_like)."""
    if _ID_NAME.fullmatch(name):
        stem = name[:-3] if name.endswith("_id") else ""
    elif _noun_like(name):
        stem = name
    else:
        return None
    noun = _singular(stem)
    return "" if noun == "id" else noun


def _id_rows(toks):
    """{(name, N)} of the explicit ids among the tokens, names as written (lower case), kept where _id_noun gives them
    a noun. One pattern over them all, then the names judged once each by C calls (a request can hold 100,000
    tokens). Lower-cased once joined: a line break ends a word as a token's end does, so even a final sigma comes out
    as str.lower gives it token by token."""
    joined = "\n%s\n" % "\n".join(toks)
    rows = set(_ID_ROWS.findall(joined.lower()))
    names = set(_column(rows, 0))
    nouns = filter(str.isalpha, filter(_NOUN_LENGTH.fullmatch, names - _NOT_NOUN))
    kept = set(filter(_ID_NAME.fullmatch, names)).union(nouns)
    return set(itertools.compress(rows, map(kept.__contains__, _column(rows, 0))))


class ClaimedId(collections.namedtuple("ClaimedId", "noun value introduced")):
    """An id a claim names: noun ('' for a bare id=N, id N or #N; 'user' for user N or user_id N), value (its digits
    without leading zeros), introduced (the preposition before it: 'sessions of user 42'; "'s" for a possessive:
    'user 42's sessions'; '' when none)."""

    __slots__ = ()


def _at(tokens, i):
    """tokens[i], or '' past the end."""
    return tokens[i] if i < len(tokens) else ""


def _id_value(text):
    """The digits of an id (1 to 18 ASCII digits) without leading zeros, or None."""
    if _ID_NUMBER.fullmatch(text):
        return str(int(text))
    return None


def _id_at(low, i):
    """(noun, value, tokens read) of an explicit id starting at low[i], or None."""
    token = low[i]
    if token[:1] == "#" and _id_value(token[1:]):
        return "", _id_value(token[1:]), 1
    if token[:3] in ("id=", "id:") and _id_value(token[3:]):
        return "", _id_value(token[3:]), 1
    value = _id_value(_at(low, i + 1))
    noun = _id_noun(token) if value else None  # a name is judged only where a number follows it
    if noun is None:
        return None
    return noun, value, 2


_LIST_WORDS = ("and", "or", "&")
_LIST_FOLLOWERS = _STOP | frozenset(_LIST_WORDS)


def _listed_values(low, at):
    """(the numbers listed from low[at] on: ', 8 and 9', where to read on). Each is followed by the list's end, a
    conjunction or a stopword: in 'user 7 and 12 sessions', 12 is a count, not an id."""
    values = []
    while at < len(low):
        if low[at] in _LIST_WORDS:
            at += 1
            continue
        value = _id_value(low[at])
        following = _at(low, at + 1) or "and"
        if value is None or following not in _LIST_FOLLOWERS:
            break
        values.append(value)
        at += 1
    return values, at


def _claimed_ids(low):
    """The ids the lower-cased tokens of a claim name, in order, without repeats (see ClaimedId)."""
    found = []
    i = 0
    while i < len(low):
        at = _id_at(low, i)
        if at is None:
            i += 1
            continue
        noun, value, read = at
        before = low[i - 1] if i else ""
        introduced = before if before in _PREPOSITIONS else ""
        if _at(low, i + read) == "s":  # user 42's sessions: the id names whose rows, as 'of user 42' does
            introduced = "'s"
        listed, i = _listed_values(low, i + read)
        found += [ClaimedId(noun, each, introduced) for each in [value] + listed]
    return list(dict.fromkeys(found))


def _negated_at(low, i):
    """Whether a negation ('did not delete', 'no rows were') stands within three tokens before token i."""
    before = low[max(0, i - 3) : i]
    return not _NEGATION.isdisjoint(before)


def _reversed(low):
    """Whether the claim reverses or skips its action: skipped, reverted, undid, undo, rolled back, backed out
    (a reversal word after an article names a thing: 'an undo button')."""
    if _REVERSAL_WORDS.isdisjoint(low):
        return False
    pairs = list(zip([""] + low[:-1], low))  # (the word before, each word)
    for before, word in pairs:
        if word in _REVERSALS and before not in _ARTICLES:
            return True
    return not _REVERSAL_PAIRS.isdisjoint(pairs)


# Words that put an action in the future or make it only an attempt: 'will add', 'going to add', 'plan to',
# 'tried to', 'attempted to'. A claim of one states no action done.
_NOT_DONE = _word_set("will shall gonna should must might")
_INTENDED = _word_set("going plan plans planned planning attempt attempts attempted attempting try tries tried trying "
                      "intend intends intended want wants wanted need needs about aim aims hope hopes")


def _not_done_at(low, i):
    """Whether the action at token i is only intended or attempted: will, shall, or going/plan/tried/attempted... to
    within three tokens before it."""
    start = max(0, i - 3)
    for at in range(start, i):
        word = low[at]
        if word in _NOT_DONE or word in _INTENDED and _at(low, at + 1) == "to":
            return True
    return False


class Actions(collections.namedtuple("Actions", "classes negated not_done first")):
    """The action classes a claim's verbs name (a verb that a negation governs left out); whether its action is
    negated or reversed: its first verb negated ('did not delete'; 'added X without changing Y' is not), or a
    reversal word anywhere (skipped, reverted...); whether its first verb is only intended or attempted (will add,
    tried to add: _not_done_at); and the position of its first verb (None without one)."""

    __slots__ = ()


def _actions(low, verbs):
    """The Actions of the lower-cased tokens of a claim, by a verb table (word -> class)."""
    positions = [i for i, word in enumerate(low) if word in verbs]
    found = [(verbs[low[i]], _negated_at(low, i)) for i in positions]
    classes = frozenset(cls for cls, negated in found if not negated)
    first_negated = bool(found) and found[0][1]
    first = positions[0] if positions else None
    not_done = first is not None and _not_done_at(low, first)
    return Actions(classes, first_negated or _reversed(low), not_done, first)


_COUNT_FILLERS = ("the", "all", "exactly", "only")  # words between a verb and its count: 'removed all 3'


def _claim_count(low, verbs):
    """The integer right after an action verb ('deleted 10 rows', 'removed all 3'), else None."""
    for i, word in enumerate(low):
        if word not in verbs:
            continue
        window = low[i + 1 : i + 4]
        after = [w for w in window if w not in _COUNT_FILLERS]
        number = _number(after[0]) if after else None
        if isinstance(number, int):
            return number
    return None


# ---- §3.2 code_diff ----------------------------------------------------------------------------------------


class EvidenceTooLarge(ValueError):
    """A rule stopped at a bound (BOUNDS) of its kind: the verdict is unsafe_to_verify (evidence_too_large)."""


# The lines a diff's structure is read from; hunk bodies are skipped by their counts, other lines by this search.
_DIFF_HEADER = re.compile(
    r"^(?:diff --git |--- |\+\+\+ |@@ |new file mode|deleted file mode|rename from |rename to |GIT binary patch"
    r"|Binary files )[^\n]*",
    re.M,
)
# The end of a run of lines a hunk may hold (added, removed, context, "\ No newline at end of file", and blank lines:
# context that lost its space): a newline before any other line. A run always ends before the next @@ line, so runs
# never overlap: linear.
_HUNK_END = re.compile(r"\n(?![-+ \\\n]|\r\n|\r$)")
_HUNK_START = ("-", "+", " ", "\\", "\n", "\r\n")  # what a hunk body starts with
_HUNK_COUNTS = re.compile(r"@@ -[0-9]+(?:,([0-9]{1,9}))? \+[0-9]+(?:,([0-9]{1,9}))?(?: |$)")  # the usual @@ line
_CHANGED_LINE = re.compile(r"\n([-+][^\n]*)")  # an added or removed line, after its newline
_ADDED_LINE = re.compile(r"^\+[^\n]*", re.M)
_REMOVED_LINE = re.compile(r"^-[^\n]*", re.M)
_SIGNED_LINES = {"+": _ADDED_LINE, "-": _REMOVED_LINE}


def _head_paths(rest):
    """(old, new) from the rest of a 'diff --git' line, with or without a/ b/ prefixes."""
    rest = rest.strip()
    middle = rest.find(" b/")
    if rest.startswith("a/") and middle >= 0:
        return rest[2:middle], rest[middle + 3 :]
    half = len(rest) // 2
    first = rest[:half]
    if len(rest) % 2 and first == rest[half + 1 :]:  # --no-prefix: the same path twice
        return first, first
    old, _, new = rest.partition(" ")
    return old, new or old


def _header_path(value):
    """The path of a ---/+++ line: diff -u appends a tab and a timestamp; git quotes unusual names."""
    value = value.split("\t", 1)[0].rstrip()
    quoted = value[:1] == value[-1:] == '"'
    if quoted and len(value) > 1:
        return value[1:-1]
    return value


def _without_prefix(path):
    """path without git's a/ or b/ prefix (/dev/null stays)."""
    if path[1:2] == "/":
        return path[2:]
    return path


def _prefixed(path, prefix):
    """Whether path starts with prefix (a/ or b/) or is /dev/null."""
    return path.startswith(prefix) or path == "/dev/null"


def _unprefix(old, new):
    """The paths without git's a/ b/ prefixes, when both sides have them (or are /dev/null)."""
    if _prefixed(old, "a/") and _prefixed(new, "b/"):
        return _without_prefix(old), _without_prefix(new)
    return old, new


def _lenient_count(field):
    """The count of one '-a,b' or '+c,d' field of an unusual @@ line: b (1 when missing), 0 when not a number."""
    count = field[1:].partition(",")[2] or "1"
    if _digits(count) and len(count) < 10:
        return int(count)
    return 0


def _hunk_counts(header):
    """The old and new line counts of a hunk's @@ line: a missing count is 1, a malformed one 0."""
    usual = _HUNK_COUNTS.match(header)
    if usual:
        return [int(count) for count in usual.groups("1")]
    counts = [_lenient_count(field) for field in header.split(" ")[1:3]]
    return (counts + [0, 0])[:2]


def _line_counts(body):
    """(lines, added, removed, notes) of a run of hunk lines (a newline before each): counts of line starts, in C."""
    lines = body.count("\n")
    added = body.count("\n+")
    removed = body.count("\n-")
    return lines, added, removed, body.count("\n\\")


def _fits(counts, old, new):
    """Whether a run of hunk lines (its _line_counts) fits the @@ line's counts: the old count covers the removed and
    context lines (every line but the added and the notes, '\\'), the new count the added and context lines."""
    lines, added, removed, notes = counts
    old_lines = lines - added - notes
    new_lines = lines - removed - notes
    return old_lines <= old and new_lines <= new


def _fitting_start(body, old, new):
    """The longest start of a run of hunk lines that fits the counts: a binary search over the run's marks (one
    character a line: its first, a space for a blank or \\r line), each try counted by str.count in C."""
    run = body[1:].split("\n")
    firsts = [line[:1] or " " for line in run]
    marks = "".join(firsts).replace("\r", " ")
    low = 0
    high = len(run)
    while low < high:  # the largest k whose first k lines fit
        middle = (low + high + 1) // 2
        context = marks.count(" ", 0, middle)
        removed = marks.count("-", 0, middle)
        added = marks.count("+", 0, middle)
        if removed + context <= old and added + context <= new:
            low = middle
        else:
            high = middle - 1
    if not low:
        return ""
    return "\n" + "\n".join(run[:low])


def _hunk_body(text, start, header):
    """(the body of the hunk whose @@ line (header) ends at start, as text with a newline before each line ('' for
    none); its _line_counts): the longest run of hunk lines that fits the @@ line's counts. Mostly the whole run fits,
    which counts of its line starts tell, in C."""
    if not text.startswith(_HUNK_START, start):
        return "", (0, 0, 0, 0)
    old, new = _hunk_counts(header)
    stop = _HUNK_END.search(text, start)
    end = stop.start() if stop else len(text)
    body = "\n" + text[start:end]
    counts = _line_counts(body)
    if _fits(counts, old, new):
        return body, counts
    body = _fitting_start(body, old, new)
    return body, _line_counts(body)


class _DiffReader(object):
    """Reads a unified diff: the lines that carry its structure (found by _DIFF_HEADER) one at a time, each hunk's
    body at once. files: [{old, new, status, added, removed, binary}]; changed: every added and removed line, its
    sign first, in order; spans: each file's [first, end) in changed."""

    def __init__(self, text):
        self.text = text
        self.files = []
        self.changed = []
        self.spans = []
        self.current = None  # the file whose headers or hunks are being read
        self.git_header = False  # current came from a 'diff --git' line and has not had its '+++ ' line yet
        self.minus = None  # the path of a '--- ' line, waiting for its '+++ '
        self.at = 0  # where the next line starts

    def read(self):
        """(files, changed, spans); EvidenceTooLarge beyond BOUNDS' diff_files files or diff_headers lines."""
        for _ in range(BOUNDS["diff_headers"] + 1):
            match = _DIFF_HEADER.search(self.text, self.at)
            if match is None:
                return self.files, self.changed, self.spans
            self.at = match.end() + 1
            line = match.group().rstrip("\r")
            reader = _DIFF_LINE_READERS[line[:3]]  # its first three characters name the kind of line
            reader(self, line)
            if len(self.files) > BOUNDS["diff_files"]:
                break
        raise EvidenceTooLarge()

    def new_file(self, old, new):
        """Start a file entry and make it the current one."""
        self.current = {"old": old, "new": new, "status": "modified", "added": 0, "removed": 0, "binary": False}
        self.files.append(self.current)
        first = len(self.changed)
        self.spans.append([first, first])

    def git_line(self, line):
        """'diff --git a/x b/x': a new file."""
        self.new_file(*_head_paths(line[11:]))
        self.git_header = True

    def minus_line(self, line):
        """'--- a/x': the old path, kept for the '+++ ' line."""
        self.minus = _header_path(line[4:])

    def plus_line(self, line):
        """'+++ b/x' after a '--- ' line: the file's paths (a new file unless a 'diff --git' line began it);
        /dev/null on one side makes it created or deleted."""
        if self.minus is None:
            return
        plus = _header_path(line[4:])
        old, new = _unprefix(self.minus, plus)
        if not self.git_header:
            self.new_file(old, new)
        self.current.update(old=old, new=new)
        self.git_header = False
        self.minus = None
        if old == "/dev/null":
            self.current.update(status="added", old=new)
        elif new == "/dev/null":
            self.current.update(status="deleted", new=old)

    def hunk_line(self, line):
        """'@@ -a,b +c,d @@': a hunk, whose + and - lines are counted into the current file and kept in changed."""
        if self.current is None:
            self.new_file("", "")
        self.git_header = False
        body, (lines, added, removed, _) = _hunk_body(self.text, self.at, line)
        if not body:
            return
        self.at += len(body)
        self.current["added"] += added
        self.current["removed"] += removed
        if added + removed == lines:  # every line a change: a split is cheaper than matching each
            self.changed += body[1:].split("\n")
        else:
            self.changed += _CHANGED_LINE.findall(body)
        self.spans[-1][1] = len(self.changed)

    def mode_line(self, line):
        """'new file mode' or 'deleted file mode'."""
        if self.current is not None:
            self.current["status"] = "added" if line[0] == "n" else "deleted"

    def rename_line(self, line):
        """'rename from x' or 'rename to y': a path of a rename."""
        if self.current is None:
            return
        if line.startswith("rename from "):
            self.current.update(status="renamed", old=line[12:])
        else:
            self.current.update(status="renamed", new=line[10:])

    def binary_patch_line(self, line):
        """'GIT binary patch': the current file is binary."""
        if self.current is not None:
            self.current["binary"] = True

    def binary_files_line(self, line):
        """'Binary files a/x and b/x differ': a binary file (the current one after a 'diff --git' line)."""
        if not line.endswith(" differ"):
            return
        old, _, new = line[13:-7].partition(" and ")
        if not self.git_header:
            self.new_file(*_unprefix(old, new))
        self.current["binary"] = True
        self.git_header = False


_DIFF_LINE_READERS = {  # the first three characters of a structure line -> how it is read
    "dif": _DiffReader.git_line,  # diff --git
    "---": _DiffReader.minus_line,
    "+++": _DiffReader.plus_line,
    "@@ ": _DiffReader.hunk_line,
    "new": _DiffReader.mode_line,  # new file mode
    "del": _DiffReader.mode_line,  # deleted file mode
    "ren": _DiffReader.rename_line,  # rename from, rename to
    "GIT": _DiffReader.binary_patch_line,  # GIT binary patch
    "Bin": _DiffReader.binary_files_line,  # Binary files ... differ
}


def parse_diff(text):
    """Unified diff (git, diff -u, --no-prefix) -> ([{old, new, status, added, removed, binary}], the +/- lines, each
    with its sign, in order). Raises EvidenceTooLarge beyond BOUNDS' diff_files files or diff_headers lines."""
    files, changed, _ = _DiffReader(text).read()
    return files, changed


# Which added or removed lines are code. The patterns read text with a newline before each line, so that a search
# skips from line to line in C. Docstrings and block comments that start a line run to their closer (or to the end);
# after _MAX_BLOCKS of them in one file the rest of it counts as one, so the work stays linear.
_BLOCK_OPENER = re.compile(r"\n[ \t]*[rRbBuU]?(\"\"\"|'''|/\*|<!--)")
_BLOCK_CLOSER = {'"""': '"""', "'''": "'''", "/*": "*/", "<!--": "-->"}
_MAX_BLOCKS = 2000
# A whole line that is a comment or only a string (a one-line docstring). '#' lines are comments, except the
# preprocessor lines and attributes of the languages that have them (_HASH_CODE: '#include', '#  if X', Rust's
# '#[derive]'; elsewhere '# if x:' is a comment); '--' is a comment before a space, '*' (inside a block comment)
# before a space or '/', ';' before a space or another ';' (C's '--i', '*p = 1' and JavaScript's ';(f)()' are code).
_OTHER_COMMENTS = (
    r"//|--(?![^ \t\n])|\*(?![^ \t\n/])|;(?![^ \t\n;])|<!--|-->|[rRbBuU]?(?:\"[^\"\n]*\"|'[^'\n]*')[ \t]*(?![^\n])"
)
_COMMENT_LINE = re.compile(r"\n[ \t]*(?:#|%s)[^\n]*" % _OTHER_COMMENTS)
_C_COMMENT_LINE = re.compile(
    r"\n[ \t]*(?:#(?!\[|[ \t]*(?:include|define|undef|if|ifdef|ifndef|elif|else|endif|pragma|error|import)\b)|%s)"
    r"[^\n]*" % _OTHER_COMMENTS
)
# the extensions of files whose '#' lines may be code: C, C++, CUDA, Objective-C, C#, F#, Swift, Rust, Arduino
_HASH_CODE = frozenset("c h cc cpp cxx c++ hpp hh hxx h++ ipp inl cu cuh m mm cs fs fsi fsx swift rs ino".split())
# What says the work is not done, in lower case: TODO, FIXME, TBD (whole words), not (yet) implemented,
# NotImplementedError, unimplemented!(). Each pattern starts with a literal, so a search skips text without it in C,
# and takes the rest of the line (group 1).
_TODO = re.compile(r"(todo(?<![a-z0-9_]todo)(?![a-z0-9_])[^\n]*)")
_FIXME = re.compile(r"(fixme(?<![a-z0-9_]fixme)(?![a-z0-9_])[^\n]*)")
_TBD = re.compile(r"(tbd(?<![a-z0-9_]tbd)(?![a-z0-9_])[^\n]*)")
_NOT_IMPLEMENTED = re.compile(
    r"(implemented(?:(?<=not implemented)|(?<=not yet implemented)|(?<=notimplemented)|(?<=unimplemented))[^\n]*)"
)
_XXX = re.compile(r"(xxx(?<![a-z0-9_]xxx)(?![a-z0-9_])[^\n]*)")
_PLACEHOLDERS = (("todo", _TODO), ("fixme", _FIXME), ("tbd", _TBD), ("xxx", _XXX), ("implemented", _NOT_IMPLEMENTED))
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # keeps every length
# files of prose, whose every line is content (a '# Heading' in README.md is no comment)
_PROSE = frozenset("md markdown rst txt adoc org".split())
# Trailing comments after code on a line, by the marker the file's language uses; a file without an extension
# (Makefile, Dockerfile) takes '#'. Where a language has none of these, the line is kept whole.
_HASH_TRAILING = frozenset("py pyi pyw rb sh bash zsh ksh fish pl pm r yaml yml toml cfg ini conf tf ps1 cmake mk "
                           "nix ex exs jl cr coffee".split())
_SLASH_TRAILING = frozenset("c h cc cpp cxx hpp hh hxx c++ h++ ipp inl cu cuh m mm cs java kt kts scala go rs swift "
                            "js jsx ts tsx mjs cjs php dart groovy gradle proto zig sol ino fs fsx vue svelte".split())
_DASH_TRAILING = frozenset("sql lua hs elm ada psql".split())
_IN_STRINGS = r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'"  # a quoted string on one line, its escapes read


def _trailing_comment(marker):
    """A pattern for the comment that marker starts after code on a line (outside quoted strings): group 1 is what
    comes before it, from the line's newline. Its alternatives start with different characters, so it backtracks
    over each character of a line once at most."""
    first = re.escape(marker[0])
    lone = ""
    if len(marker) > 1:  # the marker's first character alone is code ('/' of a division, '-' of a subtraction)
        lone = "|%s(?!%s)" % (first, re.escape(marker[1:]))
    return re.compile(r"(\n(?:[^'\"%s\n]%s|%s)*)%s[^\n]*" % (first, lone, _IN_STRINGS, re.escape(marker)))


_INLINE_BLOCK = re.compile(r"/\*[^\n]*?(?:\*/|(?=\n)|\Z)")  # /* ... */ within a line, or from /* to its end
_TRAILING = {"#": _trailing_comment("#"), "//": _trailing_comment("//"), "--": _trailing_comment("--")}
# bytes that are no part of a code token ([A-Za-z0-9_.]+) -> ' '
_CODE_BYTES = b"_.0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NOT_CODE_CHARS = bytes(byte if byte in _CODE_BYTES else 32 for byte in range(256))
_MAX_SEARCHES = 16  # claimed identifiers looked for by a pattern each (the others by set look-ups)


def _unsigned(lines, sign):
    """lines (a text of lines, each with its sign, all of them sign) without their signs."""
    return ("\n" + lines).replace("\n" + sign, "\n")[1:]


def _signed_text(lines, sign):
    """The lines of one sign ('+' or '-') of lines (a text of lines, each with its sign), without their signs."""
    found = _SIGNED_LINES[sign].findall(lines)
    return "\n".join(found).replace("\n" + sign, "\n")[1:]


def _without_blocks(text):
    """text (a newline before each line) without the docstrings and block comments that start a line, each up to its
    closer (or the end)."""
    kept = []
    at = 0
    for _ in range(_MAX_BLOCKS):
        opener = _BLOCK_OPENER.search(text, at)
        if opener is None:
            kept.append(text[at:])
            break
        kept.append(text[at : opener.start()])
        closer = _BLOCK_CLOSER[opener.group(1)]
        end = text.find(closer, opener.end())
        at = len(text) if end < 0 else end + len(closer)
    return "\n".join(kept)


def _cut(text, low, pattern):
    """(text, low) without each match of pattern in low (text in ASCII lower case) and the rest of its line: low is
    split at the matches, and text cut where low is, as both have the same length."""
    pieces = pattern.split(low)  # kept, cut, kept, ..., kept
    kept = []
    at = 0
    for index, piece in enumerate(pieces):
        if index % 2 == 0:
            kept.append(text[at : at + len(piece)])
        at += len(piece)
    return "".join(kept), "".join(pieces[::2])


def _without_placeholders(text):
    """text without each placeholder (TODO, FIXME, not implemented...) and the rest of its line."""
    low = text.translate(_ASCII_LOWER)
    for word, pattern in _PLACEHOLDERS:
        if word in low:
            text, low = _cut(text, low, pattern)
    return text


def _cut_lines(text, low, pattern):
    """(text, low) without each whole line (a newline before each) where pattern matches low (text in ASCII lower
    case, of the same length). Each search starts past the last line cut, so each character is read once."""
    kept = []
    at = 0
    match = pattern.search(low)
    while match is not None:
        start = low.rfind("\n", at, match.start())
        kept.append((at, start))
        end = low.find("\n", match.end())
        at = len(low) if end < 0 else end
        match = pattern.search(low, at)
    kept.append((at, len(low)))
    text_kept = [text[start:end] for start, end in kept]
    low_kept = [low[start:end] for start, end in kept]
    return "".join(text_kept), "".join(low_kept)


def _without_placeholder_lines(text):
    """text (a newline before each line) without the lines that hold a placeholder (TODO, FIXME, XXX, TBD, not
    implemented, NotImplementedError, unimplemented!, todo!()): a line that says its work is not done is no support
    for an add, check or fix, not even the code before the placeholder."""
    low = text.translate(_ASCII_LOWER)
    for word, pattern in _PLACEHOLDERS:
        if word in low:
            text, low = _cut_lines(text, low, pattern)
    return text


def _extension(path):
    """The extension of the file at path, in lower case ('' for none: Makefile)."""
    name = path.rpartition("/")[2]
    if "." not in name:
        return ""
    return name.rpartition(".")[2].lower()


def _trailing_markers(extension):
    """The markers of trailing comments in the language of a file's extension (see _HASH_TRAILING)."""
    if extension in _SLASH_TRAILING:
        return ("/*", "//")
    if extension in _HASH_TRAILING or not extension:
        return ("#",)
    if extension in _DASH_TRAILING:
        return ("/*", "--")
    return ()


def _without_trailing_comments(text, extension):
    """text (a newline before each line) without the comments after code on its lines, in the language of a file's
    extension."""
    for marker in _trailing_markers(extension):
        if marker not in text:
            continue
        if marker == "/*":
            text = _INLINE_BLOCK.sub("", text)
        else:
            text = _TRAILING[marker].sub(r"\1", text)
    return text


def _without_comments(text, path):
    """text (a file's added or removed lines), a newline before each line: unless the file is prose (README.md,
    notes.txt: none of its lines is a comment), without comments (whole lines, blocks and the comments after code),
    docstrings and string-only lines. '#' lines are code in the languages of _HASH_CODE (see _COMMENT_LINE)."""
    text = "\n" + text
    extension = _extension(path)
    if extension in _PROSE:
        return text
    comment_line = _C_COMMENT_LINE if extension in _HASH_CODE else _COMMENT_LINE
    text = comment_line.sub("\n", _without_blocks(text))
    return _without_trailing_comments(text, extension)


def _comment_free(text, path):
    """What a file's lines (text) still hold as code: without comments (see _without_comments), and without each
    placeholder (TODO, not implemented) and the rest of its line."""
    if not text:
        return ""
    return _without_placeholders(_without_comments(text, path))


def _code_text(text, path):
    """The code of a file's lines (text) that supports an add, check or fix: without comments (see
    _without_comments), and without every line that holds a placeholder."""
    if not text:
        return ""
    return _without_placeholder_lines(_without_comments(text, path))


def _code_forms(text):
    """The forms under which code text offers a claimed identifier: each run of [A-Za-z0-9_.] with its outer dots
    trimmed, and a dotted run's last part. Two forms a run: tokenising is linear, however many parts a name has."""
    code = text.encode("utf-8").translate(_NOT_CODE_CHARS)
    runs = set(code.decode("ascii").split())
    whole = set(map(str.strip, runs, itertools.repeat(".")))
    parted = map(str.rpartition, whole, itertools.repeat("."))
    return whole.union(_column(parted, 2))


def _occurrences(name):
    """A pattern for name where it stands in code as a whole run of [A-Za-z0-9_] characters, or as dotted parts of a
    longer name (user.email in self.user.email.lower()). It starts with name itself, and looks behind it after, so
    that a search skips text without name in C."""
    literal = re.escape(name)
    return re.compile(r"%s(?<![A-Za-z0-9_]%s)(?![A-Za-z0-9_])" % (literal, literal))


def _searched(names, text):
    """The names that occur in code text (see _occurrences), each found by a search."""
    return {name for name in names if _occurrences(name).search(text)}


def _found_in(names, text):
    """The names that occur in code text (see _occurrences). Up to _MAX_SEARCHES names are searched for; more are
    looked up among the text's forms (_code_forms), and _MAX_SEARCHES of those not found there searched for (the
    rest count as not found)."""
    if len(names) <= _MAX_SEARCHES:
        return _searched(names, text)
    found = _code_forms(text).intersection(names)
    unresolved = sorted(set(names) - found)[:_MAX_SEARCHES]
    return found | _searched(unresolved, text)


_WORD_SUFFIXES = ("", "s", "es", "ed", "ing")


def _words_found(words, text):
    """Whether a content word (or its stem, with -s -es -ed -ing allowed on either side) is a word of text, its
    camelCase and snake_case names split."""
    have = set(map(str.lower, _CODE_WORD.findall(text)))
    stems = {stem for word in words for stem in _stems(word)}
    forms = {stem + suffix for stem in stems for suffix in _WORD_SUFFIXES}
    return not have.isdisjoint(forms)


def _suffixes(path):
    """path's whole-component suffixes of up to 16 components."""
    parts = path.split("/")
    first = max(0, len(parts) - 16)
    starts = range(first, len(parts))
    return ["/".join(parts[k:]) for k in starts]


def _normal_path(path):
    """path with its '.' and 'x/..' components resolved (and no empty ones), or None when it climbs above its start
    ('../x', 'a/../../x')."""
    parts = []
    for part in path.split("/"):
        if part == ".." and not parts:
            return None
        if part == "..":
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def _indexed_path(path):
    """The path whose suffixes index a diff path: itself, or resolved when it has '.' or '..' components; a path
    that climbs above its start is indexed only whole (no claimed suffix names a file outside the tree)."""
    if "/." not in "/" + path:
        return path, True
    normal = _normal_path(path)
    if normal is None:
        return path, False
    return normal, True


def _path_index(files):
    """Every whole-component suffix (of up to 16 components) of every path in the diff -> the numbers of its files
    (see _indexed_path)."""
    index = {}
    for number, file in enumerate(files):
        for path in {file["old"], file["new"]} - {"", "/dev/null"}:
            indexed, by_suffix = _indexed_path(path)
            suffixes = _suffixes(indexed) if by_suffix else [indexed]
            for suffix in suffixes:
                index.setdefault(suffix, set()).add(number)
    return index


class Diff(collections.namedtuple("Diff", "files changed spans index")):
    """A parsed diff: files, changed and spans as _DiffReader reads them; index as _path_index makes it."""

    __slots__ = ()

    def lines(self, number):
        """The added and removed lines of file number, each with its sign."""
        first, end = self.spans[number]
        return self.changed[first:end]

    def path(self, number):
        """The path of file number (its new path, or its old one where there is none)."""
        file = self.files[number]
        if file["new"] in ("", "/dev/null"):
            return file["old"]
        return file["new"]


def read_diff(text):
    """The Diff of a unified diff's text (see parse_diff)."""
    files, changed, spans = _DiffReader(text).read()
    return Diff(files, changed, spans, _path_index(files))


class CodeClaim(collections.namedtuple("CodeClaim",
                                         "actions negated paths identifiers words removed_paths not_done tests")):
    """A code_diff claim: actions (add, check, fix, modify, remove: the classes of its verbs, those a negation
    governs left out), negated, not_done (its action only intended or attempted: will add, tried to), paths (those
    it names, as written), identifiers (backticked, dotted, snake or camel case; never part of a path), words
    (content words: at least 4 letters, no stopword or verb), removed_paths (the files a remove verb names as its
    object: 'Removed old_api.py', 'Deleted the file x.py'), tests (it speaks of
    tests: test, tests, spec, a test file's path)."""

    __slots__ = ()


def _term(token, index, backticked):
    """What a claim token is: 'path' (a file of the diff, or path-like), 'identifier', 'word' (content) or None.
    Letters alone are no path, email or URL."""
    name = _unprefixed(token)
    if name in index:
        return "path"
    if token.isalpha():  # as _identifier reads a word: backticked or camelCase, and ASCII
        named = token in backticked or not token.islower() and _camel(token)
        if named and token.isascii():
            return "identifier"
        if len(token) >= 4 and token.lower() not in _NOT_CONTENT:
            return "word"
        return None
    if _pathish(name):
        return "path"
    if _email(token) or _url(token):
        return None
    if _identifier(token, token in backticked):
        return "identifier"
    return None


def _removed_paths(toks, low, index):
    """The files a remove verb not negated names as its object (the first token of the three after it that is not an
    article), when they are files of the diff or look like files."""
    named = []
    for i, word in enumerate(low):
        if _CODE_VERBS.get(word) != "remove" or _negated_at(low, i):
            continue
        window = toks[i + 1 : i + 4]
        objects = [_unprefixed(token) for token in window if token.lower() not in _ARTICLES]
        target = objects[0] if objects else ""
        if target in index or _pathish(target):
            named.append(target)
    return named


def _backticked(claim):
    """The tokens between backticks in claim."""
    if claim.count("`") < 2:
        return set()
    spans = claim.split("`")[1::2]
    return set(_tokens(" ".join(spans)))


# What makes a claim speak of tests, and the paths of test files: in a test directory, or named test_x, x_test,
# x.test.js, x.spec.ts, XTest.java, XTests.cs.
_TEST_WORDS = _word_set("test tests tested testing spec specs unittest unittests")
_TEST_PATH = re.compile(r"(?:^|/)(?:tests?|specs?|__tests__|testing|testdata)/|(?:^|/)test_[^/]*$|_test\.[^/]*$"
                        r"|\.(?:test|spec)\.[^/]*$|[a-z0-9](?:Test|Tests|Spec)\.[^/]*$")


def code_diff_claim(claim, index):
    """The CodeClaim of a claim, its paths recognised against the diff's index. Paths are taken first, so old_api.py
    is a path, never an identifier; any backticked word is an identifier."""
    toks, low = _words(claim)
    actions = _actions(low, _CODE_VERBS)
    backticked = _backticked(claim)
    paths = []
    named = set()
    words = []
    for token in toks:
        term = _term(token, index, backticked)
        if term == "path":
            paths.append(_unprefixed(token))
        elif term == "identifier":
            named.add(token)
        elif term == "word":
            words.append(token.lower())
    identifiers = sorted(named)
    removed = _removed_paths(toks, low, index)
    tests = not _TEST_WORDS.isdisjoint(low) or any(map(_TEST_PATH.search, paths))
    return CodeClaim(actions.classes, actions.negated, paths, identifiers, words, removed, actions.not_done, tests)


class DiffFacts(collections.namedtuple(
        "DiffFacts", "files paths_found paths_missing named elsewhere total moved identifiers_missing "
                     "identifiers_back identifiers_restored words_found deleted_named deleted_missing tests_only")):
    """What a diff shows about a claim's names. files: files changed; paths_found, paths_missing: the claim's paths
    in the diff and not; named: the files they name; elsewhere, total: changed lines in the other files and in all;
    moved: each claimed action -> 'code' (its lines are there as code), 'other' (only as comments, blank lines,
    docstrings or placeholders), 'none'; identifiers_missing: claimed identifiers not in the lines the action needs;
    identifiers_back, identifiers_restored (remove claims): removed identifiers some of whose removed occurrences come
    back in added code of the same file, and all of them; words_found: a content word is in those lines (read when
    the claim names no identifier);
    deleted_named, deleted_missing: the files a remove verb names that the diff deletes, and not; tests_only: every
    file of the scope (the named files, else all) that has changed lines is a test file (see _TEST_PATH)."""

    __slots__ = ()


_CODE_ACTIONS = frozenset(["add", "check", "fix"])  # actions only code supports


def _needs_code(claim):
    """Whether only code lines support the claim: an add, check or fix claim, or one that names no action."""
    return not claim.actions or not _CODE_ACTIONS.isdisjoint(claim.actions)


def _needed_signs(actions):
    """The signs of the lines an action set needs: + for add and check, - for remove, both for anything else."""
    if actions and actions <= {"add", "check"}:
        return "+"
    if actions == {"remove"}:
        return "-"
    return "+-"


def _scope(diff, named):
    """The numbers of the files a claim's action is judged in: those it names, else all."""
    if named:
        return sorted(named)
    return range(len(diff.files))


def _file_texts(diff, number, supports, presents):
    """sign -> (all lines, code lines that support an add, check or fix, code lines) of that sign in file number, one
    a line, without their signs (see _code_text and _comment_free). The code lines are read only for the signs in
    supports and in presents (the signs a claim reads them for), else ''."""
    lines = "\n".join(diff.lines(number))
    path = diff.path(number)
    file = diff.files[number]
    texts = {}
    for sign, others in (("+", file["removed"]), ("-", file["added"])):
        every = _signed_text(lines, sign) if others else _unsigned(lines, sign)  # all of one sign: no search
        support = _code_text(every, path) if sign in supports else ""
        present = _comment_free(every, path) if sign in presents else ""
        texts[sign] = (every, support, present)
    return texts


def _code_signs(claim):
    """(the signs whose code lines support the claim, the signs whose code a remove claim reads for what comes
    back): see _needed_text, _moved and _removals."""
    supports = _needed_signs(claim.actions) if _needs_code(claim) else ""
    presents = "+" if claim.actions == {"remove"} else ""
    return supports, presents


def _joined(texts, sign, which):
    """The lines of one sign of all the files' texts (see _file_texts): which 0 for all of them, 1 for the code that
    supports an add, check or fix, 2 for all code."""
    return "\n".join(text[sign][which] for text in texts)


def _moved(action, counts, code, otherwise):
    """How the scope's lines carry one action: 'code', 'other' (lines there, but none of them code) or 'none'.
    counts: sign -> lines of that sign; code: sign -> the code among them; otherwise: see _status_change."""
    if action == "remove":
        return "code" if counts["-"] or otherwise == "deleted" else "none"
    if action not in _CODE_ACTIONS:  # modify: any change
        return "code" if counts["+"] + counts["-"] or otherwise else "none"
    signs = "+-" if action == "fix" else "+"
    if any(code[sign].strip() for sign in signs):
        return "code"
    if any(counts[sign] for sign in signs):
        return "other"
    return "none"


def _status_change(files):
    """'deleted' if a file is deleted, True if one is binary, created or renamed, else False."""
    statuses = {file["status"] for file in files}
    if "deleted" in statuses:
        return "deleted"
    binary = any(file["binary"] for file in files)
    return binary or bool(statuses - {"modified"})


def _comes_back(name, texts):
    """(files where some removed occurrences of name come back in added code, files where every one does, files
    that remove it), over the files' texts (see _file_texts)."""
    pattern = _occurrences(name)
    some = 0
    every = 0
    removing = 0
    for text in texts:
        if name not in text["-"][0]:
            continue
        removed = len(pattern.findall(text["-"][0]))
        added = len(pattern.findall(text["+"][2]))
        removing += removed > 0
        some += removed > 0 and added > 0
        every += removed > 0 and added >= removed
    return some, every, removing


def _removals(claim, texts):
    """(identifiers removed and added back in part, identifiers whose every removed occurrence comes back) for a claim
    whose only action is remove. Identifiers beyond the first _MAX_SEARCHES count as added back in part: unread."""
    if claim.actions != {"remove"}:
        return 0, 0
    back = max(0, len(claim.identifiers) - _MAX_SEARCHES)
    restored = 0
    for name in claim.identifiers[:_MAX_SEARCHES]:
        some, every, removing = _comes_back(name, texts)
        restored += bool(removing) and every == removing
        back += bool(some) and every < removing
    return back, restored


def _deletions(diff, claim):
    """(files a remove verb names that the diff deletes, those it does not delete or does not have)."""
    deleted = 0
    missing = 0
    for path in claim.removed_paths:
        numbers = diff.index.get(path, ())
        gone = {diff.files[number]["status"] for number in numbers} == {"deleted"}
        deleted += gone
        missing += not gone
    return deleted, missing


def _changed(file):
    """Whether a file of a diff has added or removed lines."""
    return file["added"] + file["removed"] > 0


def _line_totals(files):
    """{'+': lines added, '-': lines removed} over files, in one pass."""
    added = 0
    removed = 0
    for file in files:
        added += file["added"]
        removed += file["removed"]
    return {"+": added, "-": removed}


def _needed_text(claim, texts):
    """The lines a claim's identifiers and content words must be in: those its action needs (see _needed_signs),
    only code for an add, check or fix claim or one that names no action, any removed line for a remove claim."""
    which = 1 if _needs_code(claim) and claim.actions != {"remove"} else 0  # texts' code lines, or all
    signs = _needed_signs(claim.actions)
    return "\n".join(_joined(texts, sign, which) for sign in signs)


def code_diff_facts(diff, claim):
    """The DiffFacts of a diff for a claim."""
    found = [path for path in claim.paths if path in diff.index]
    named = set().union(*(diff.index[path] for path in found))
    scope = _scope(diff, named)
    in_scope = [diff.files[number] for number in scope]
    totals = _line_totals(diff.files)
    counts = _line_totals(in_scope) if named else totals
    total = totals["+"] + totals["-"]
    here = counts["+"] + counts["-"]
    supports, presents = _code_signs(claim)
    reads_lines = supports or presents or claim.identifiers or claim.words
    texts = [_file_texts(diff, number, supports, presents) for number in scope] if reads_lines else []
    code = {sign: _joined(texts, sign, 1) for sign in "+-"}
    otherwise = _status_change(in_scope)
    moved = {action: _moved(action, counts, code, otherwise) for action in claim.actions}
    needed = _needed_text(claim, texts)
    missing = len(claim.identifiers) - len(_found_in(claim.identifiers, needed))
    back, restored = _removals(claim, texts)
    words_found = bool(claim.words) and not claim.identifiers and _words_found(claim.words, needed)
    deleted, not_deleted = _deletions(diff, claim)
    files = len(diff.files)
    paths_found = len(found)
    paths_missing = len(claim.paths) - paths_found
    named_files = len(named)
    elsewhere = total - here
    changed_paths = [diff.path(number) for number in scope if _changed(diff.files[number])]
    tests_only = bool(changed_paths) and all(map(_TEST_PATH.search, changed_paths))
    return DiffFacts(files, paths_found, paths_missing, named_files, elsewhere, total, moved, missing, back, restored,
                     words_found, deleted, not_deleted, tests_only)


# The checks: each a reason code's rule over (CodeClaim, DiffFacts).


def diff_is_empty(claim, facts):
    """The diff contains no file changes: nothing else is judged."""
    return not facts.files


def all_paths_in_diff(claim, facts):
    """Every file the claim names is changed in the diff (a whole-component suffix: a.py never matches data.py)."""
    return claim.paths and not facts.paths_missing


def some_paths_missing(claim, facts):
    """Some files the claim names are in the diff, some are not."""
    return facts.paths_found and facts.paths_missing


def no_path_in_diff(claim, facts):
    """None of the files the claim names is in the diff."""
    return claim.paths and not facts.paths_found


def identifiers_in_lines(claim, facts):
    """Every identifier the claim names is in the changed lines its action needs (add, check: added; remove: removed;
    else either): as code for an add, check or fix claim, and for a remove claim none comes back in added code."""
    back = facts.identifiers_back or facts.identifiers_restored
    return claim.identifiers and not facts.identifiers_missing and not back


def identifier_missing(claim, facts):
    """An identifier the claim names is not in the changed lines its action needs (comments do not count for an add,
    check or fix claim)."""
    return facts.identifiers_missing


def identifier_still_present(claim, facts):
    """A remove claim's identifier is removed, but some of its removed occurrences come back in added code of the
    same file: it is still there."""
    return facts.identifiers_back


def identifier_restored(claim, facts):
    """A remove claim's identifier comes back in added code of the same file as often as it is removed: the critical
    form of identifier_still_present (a call removed and added again is no removal)."""
    return facts.identifiers_restored


def content_words_missing(claim, facts):
    """The claim names no identifier, and none of its content words (-s -es -ed -ing allowed) is in the changed lines
    its action needs (as code for an add, check or fix claim): 'rate limiting' is not a print."""
    return not claim.identifiers and claim.words and not facts.words_found


def action_in_lines(claim, facts):
    """Lines moved as each claimed action needs in the named files (all files when none is named): add and check:
    added code; fix: changed code; modify: any change; remove: removed lines or a deleted file."""
    states = set(facts.moved.values())
    return claim.actions and states == {"code"}


def action_only_in_non_code(claim, facts):
    """The lines an add, check or fix claim needs are there, but only as comments, blank lines, docstrings or
    placeholders (TODO, not implemented): they are no support."""
    states = set(facts.moved.values())
    return "other" in states and "none" not in states


def action_not_in_lines(claim, facts):
    """A claimed action has no lines of the kind it needs in the named files (added for add and check, removed for
    remove)."""
    return "none" in facts.moved.values()


def removed_files_deleted(claim, facts):
    """Every file a remove verb names (Removed x.py) is deleted in the diff."""
    return facts.deleted_named and not facts.deleted_missing


def removed_file_not_deleted(claim, facts):
    """A remove verb names a file that the diff does not delete."""
    return facts.deleted_missing


def _others_changed(facts):
    """Whether the claim names files and the diff changes others too."""
    return facts.named and facts.named < facts.files


def unnamed_files_changed(claim, facts):
    """The claim names files, and the diff also changes others (at most half of the changed lines)."""
    return _others_changed(facts) and 2 * facts.elsewhere <= facts.total


def changes_only_in_tests(claim, facts):
    """An add, check or fix claim that does not speak of tests is carried only by test files: every file of its
    scope with changed lines is a test file (tests/, test_x.py, x_test.go, x.spec.ts...)."""
    code_claim = not _CODE_ACTIONS.isdisjoint(claim.actions)
    return code_claim and not claim.tests and facts.tests_only


def changes_mostly_elsewhere(claim, facts):
    """The claim names files, and more than half of the changed lines are in files it does not name."""
    return _others_changed(facts) and 2 * facts.elsewhere > facts.total


CODE_DIFF_CHECKS = (
    (diff_is_empty, "diff_no_changes", NEGATIVE),
    (all_paths_in_diff, "path_in_diff", POSITIVE),
    (some_paths_missing, "path_partly_in_diff", NEGATIVE),
    (no_path_in_diff, "path_not_in_diff", CRITICAL),
    (identifiers_in_lines, "identifier_in_changed_lines", POSITIVE),
    (identifier_missing, "identifier_not_in_changed_lines", NEGATIVE),
    (identifier_still_present, "identifier_still_present", NEGATIVE),
    (identifier_restored, "identifier_restored", CRITICAL),
    (content_words_missing, "content_words_absent", NEGATIVE),
    (action_in_lines, "action_matches_lines", POSITIVE),
    (action_only_in_non_code, "changed_lines_not_code", NEGATIVE),
    (action_not_in_lines, "action_mismatch_lines", NEGATIVE),
    (removed_files_deleted, "file_deleted", POSITIVE),
    (removed_file_not_deleted, "file_not_deleted", NEGATIVE),
    (claim_is_negated, "claim_negated", NEGATIVE),
    (claim_is_not_done, "claim_not_done", NEGATIVE),
    (unnamed_files_changed, "unnamed_files_changed", NEGATIVE),
    (changes_mostly_elsewhere, "changes_mostly_elsewhere", CRITICAL),
    (changes_only_in_tests, "changes_only_in_tests", NEGATIVE),
)


_PUBLIC = ("old", "new", "status", "added", "removed", "binary")  # the keys of a file that details show


def _public(file):
    """A file's entry as details show it."""
    return {key: file[key] for key in _PUBLIC}


def _code_diff_details(diff, claimed):
    """details of a code_diff judgement: the first 100 files, the counts, and what the claim names."""
    files = [_public(file) for file in diff.files[:100]]
    changed = len(diff.files)
    totals = _line_totals(diff.files)
    paths = claimed.paths[:50]
    identifiers = claimed.identifiers[:50]
    actions = sorted(claimed.actions)
    details = {
        "files": files,
        "files_changed": changed,
        "lines_added": totals["+"],
        "lines_removed": totals["-"],
        "claimed_paths": paths,
        "identifiers": identifiers,
        "actions": actions,
    }
    return details


def judge_code_diff(claim, ev, ev_json=None):
    """{diff}: the paths, identifiers and action the claim names, against the parsed diff."""
    diff = read_diff(ev["diff"])
    claimed = code_diff_claim(claim, diff.index)
    facts = code_diff_facts(diff, claimed)
    return run_checks(CHECKS["code_diff"], claimed, facts), _code_diff_details(diff, claimed)


# ---- §3.3 db_op --------------------------------------------------------------------------------------------

_SQL_KINDS = {  # statement keyword -> the action class it performs; merge gives no direction
    "SELECT": "read",
    "INSERT": "insert",
    "UPDATE": "update",
    "DELETE": "delete",
    "TRUNCATE": "delete",
    "MERGE": "merge",
    "REPLACE": "merge",
    "UPSERT": "merge",
}
# SQL text is cut into code, strings, quoted names and comments in one forward pass: each is found by its opener,
# its closer by one match or str.find (an unclosed one runs to the end). Code between them is tokenised by one
# findall. After _MAX_SQL_QUOTED strings and comments the rest is one unread token (no plain WHERE reaches past it).
_SQL_OPENER = re.compile(r"['\"`#]|--|/\*")
_SQL_STRING = re.compile(r"'[^']*(?:''[^']*)*'")  # '' inside is a quote; unrolled: the parts never overlap
_SQL_CLOSERS = {'"': '"', "`": "`", "#": "\n", "--": "\n", "/*": "*/"}
_SQL_CODE_TOKEN = re.compile(
    r"[A-Za-z_][A-Za-z0-9_$]*|[0-9]+(?:\.[0-9]+)?|[$:@?%][A-Za-z0-9_]*|<>|!=|<=|>=|\|\||&&|==|\S"
)
_MAX_SQL_QUOTED = 4096
_SQL_COMMENT = "/**/"  # the token a comment becomes
_SQL_UNREAD = "\x00"  # the token the text past _MAX_SQL_QUOTED becomes
_SQL_BAD_STRING = "'\\'"  # a string literal holding a backslash, which dialects read differently


def _sql_string_token(literal):
    """The token of a string literal (quotes included): its digits if it is a whole number ('42'), _SQL_BAD_STRING if it
    holds a backslash, else "'s'"."""
    inner = literal[1:-1]
    if "\\" in inner:
        return _SQL_BAD_STRING
    if _digits(inner) and len(inner) <= 18:
        return "'%s'" % inner
    return "'s'"


def _sql_quoted(sql, opener):
    """(token, where the text after it starts) of the string, quoted name or comment that starts at opener."""
    start = opener.start()
    kind = opener.group()
    if kind == "'":
        literal = _SQL_STRING.match(sql, start)
        if literal is None:
            return _SQL_BAD_STRING, len(sql)
        return _sql_string_token(literal.group()), literal.end()
    closer = _SQL_CLOSERS[kind]
    end = sql.find(closer, opener.end())
    stop = len(sql) if end < 0 else end + len(closer)
    if kind in ('"', "`") and end >= 0:
        return sql[start:stop], stop
    return _SQL_COMMENT, stop


def sql_tokens(sql):
    """The tokens of SQL text: words, numbers, placeholders ($1, :name, ?), operators and punctuation; a string
    literal as one token (see _sql_string_token); a quoted name as one token with its quotes; a comment as '/**/'."""
    tokens = []
    at = 0
    for _ in range(_MAX_SQL_QUOTED):
        opener = _SQL_OPENER.search(sql, at)
        if opener is None:
            break
        tokens += _SQL_CODE_TOKEN.findall(sql, at, opener.start())
        token, at = _sql_quoted(sql, opener)
        tokens.append(token)
    else:
        return tokens + [_SQL_UNREAD]
    return tokens + _SQL_CODE_TOKEN.findall(sql, at)


# A plain WHERE clause: a conjunction (AND) of simple predicates, 'column OP literal', 'column IN (literal, ...)',
# 'column IS [NOT] NULL' or 'column BETWEEN literal AND literal', with grouping parentheses. Anything else is not
# plain, and why is said in one of these words (never the input's own text).
_COMPARISONS = frozenset(["=", "==", "<", ">", "<=", ">=", "<>", "!="])
_WHY_NOT_PLAIN = {
    "OR": "OR", "||": "|| or string concatenation", "NOT": "NOT", "!": "NOT", "XOR": "XOR", "&&": "&&",
    "LIKE": "LIKE", "ILIKE": "LIKE", "RLIKE": "LIKE", "REGEXP": "LIKE", "GLOB": "LIKE", "SIMILAR": "LIKE",
    "EXISTS": "a subquery", "SELECT": "a subquery", "CASE": "CASE", "IS": "a chained comparison",
    "+": "arithmetic", "-": "arithmetic", "*": "arithmetic", "/": "arithmetic", "%": "arithmetic",
    "DIV": "arithmetic", "MOD": "arithmetic", "&": "arithmetic", "|": "arithmetic", "^": "arithmetic",
    "<<": "arithmetic", ">>": "arithmetic",
    "(": "a function call", _SQL_COMMENT: "a comment", _SQL_UNREAD: "too many strings or comments to read",
    _SQL_BAD_STRING: "a string with a backslash", ";": "a second statement",
}
_SQL_WORDS = frozenset("""AND OR NOT XOR IN IS NULL TRUE FALSE LIKE ILIKE BETWEEN EXISTS SELECT CASE WHEN THEN ELSE END
    WHERE FROM SET VALUES INTO AS ON USING JOIN ORDER GROUP BY LIMIT RETURNING HAVING UNION DIV MOD""".split())
_SQL_WHERE_END = frozenset(["ORDER", "LIMIT", "RETURNING", "OFFSET", "FETCH"])  # what may follow a WHERE clause
_SQL_TYPED = frozenset(["DATE", "TIME", "TIMESTAMP"])  # DATE '2024-01-01'
_SQL_MODIFIERS = frozenset("LOW_PRIORITY QUICK IGNORE ONLY TABLE DELAYED HIGH_PRIORITY TOP".split())


def _why(token):
    """Why a token where a WHERE clause needs AND, an operator or a literal makes it not plain ('' for the end)."""
    if not token:
        return "an incomplete predicate"
    if token in _COMPARISONS:
        return "a chained comparison"
    return _WHY_NOT_PLAIN.get(token.upper(), "an expression")


_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def _name_token(token):
    """A token's name, if it can be a part of a column or table name: a word that is no SQL keyword, or a quoted name
    (its quotes removed); in lower case. None otherwise."""
    if token[:1] in ('"', "`") and len(token) > 1:
        return token[1:-1].lower()
    if _SQL_NAME.fullmatch(token) and token.upper() not in _SQL_WORDS:
        return token.lower()
    return None


def _qualified_name(tokens, at):
    """((qualifier, name), next position) of a name at tokens[at] (name, or q.name, q1.q2.name: the part before the
    last is its qualifier, '' for none); (None, at) when there is none."""
    parts = [""]
    while at < len(tokens):
        part = _name_token(tokens[at])
        if part is None:
            break
        parts.append(part)
        at += 1
        if _at(tokens, at) != ".":
            break
        at += 1
    if len(parts) == 1:
        return None, at
    return (parts[-2], parts[-1]), at


_LITERAL_WORDS = ("NULL", "TRUE", "FALSE")
_SQL_PLACEHOLDERS = ("$", ":", "@", "?", "%")  # ?, $1, :name, @name, %s


def _whole_number(text):
    """text's digits without leading zeros, if it is a whole number, else None."""
    if _digits(text):
        return str(int(text))
    return None


def _literal(tokens, at):
    """(is a literal, its value, next position) at tokens[at]: a number ('-' allowed; a whole one's value is its
    digits), a string ('42' has the value 42), NULL, TRUE, FALSE, DATE/TIME/TIMESTAMP 'text', or a placeholder
    (?, $1, :name, @name, %s); the value None where it is not a whole number."""
    token = _at(tokens, at)
    following = _at(tokens, at + 1)
    if token == "-" and following[:1].isdigit():
        value = _whole_number(following)
        return True, value and "-" + value, at + 2
    quoted = token[:1] == "'" and token != _SQL_BAD_STRING
    if token[:1].isdigit() or quoted:
        return True, _whole_number(token.strip("'")), at + 1
    if token.upper() in _LITERAL_WORDS or token.startswith(_SQL_PLACEHOLDERS):
        return True, None, at + 1
    typed = token.upper() in _SQL_TYPED and following[:1] == "'"
    if typed and following != _SQL_BAD_STRING:
        return True, None, at + 2
    return False, None, at


def _in_list(tokens, at):
    """(values, next position, None) of '(literal, ...)' at tokens[at] (a value None where it is no whole number), or
    (None, at, why) when there is none."""
    if _at(tokens, at) != "(":
        return None, at, "a subquery"
    values = []
    while True:
        is_literal, value, after = _literal(tokens, at + 1)
        following = _at(tokens, after)
        if not is_literal:
            return None, at, _why(following)
        values.append(value)
        if following == ")":
            return values, after + 1, None
        if following != ",":
            return None, at, _why(following)
        at = after


_PINNING = {"=": "=", "==": "=", "<>": "<>", "!=": "<>"}  # comparisons that pin a value, or exclude one


def _comparison(tokens, column, at):
    """(pins, next position, None) of 'OP literal' at tokens[at], or (None, at, why)."""
    is_literal, value, after = _literal(tokens, at + 1)
    if not is_literal:
        return None, at, _why(_at(tokens, at + 1))
    op = _PINNING.get(tokens[at])
    if op and value:
        return [(column, value, op)], after, None
    return [], after, None


def _null_test(tokens, at):
    """([], next position, None) of 'IS NULL' or 'IS NOT NULL' at tokens[at], or (None, at, why)."""
    first = _at(tokens, at + 1).upper()
    second = _at(tokens, at + 2).upper()
    if first == "NULL":
        return [], at + 2, None
    if first == "NOT" and second == "NULL":
        return [], at + 3, None
    return None, at, "a chained comparison"


def _between(tokens, at):
    """([], next position, None) of 'BETWEEN literal AND literal' at tokens[at], or (None, at, why)."""
    low, _, after = _literal(tokens, at + 1)
    conjunction = _at(tokens, after).upper()
    high, _, end = _literal(tokens, after + 1)
    if low and conjunction == "AND" and high:
        return [], end, None
    return None, at, "an expression"


def _in_predicate(tokens, column, at):
    """(pins, next position, None) of 'IN (literal, ...)' at tokens[at], or (None, at, why)."""
    values, after, why = _in_list(tokens, at + 1)
    if values is None:
        return None, at, why
    return [(column, value, "=") for value in values if value], after, None


def _predicate(tokens, at):
    """(pins, next position, None) of one simple predicate at tokens[at], pins being ((qualifier, column), N, '=')
    for 'column = N' and each N of 'column IN (N, ...)', and ((qualifier, column), N, '<>') for 'column <> N' and
    'column != N'; (None, at, why) when there is none there."""
    column, at = _qualified_name(tokens, at)
    op = _at(tokens, at).upper()
    if column is None:
        return None, at, _why(op)
    if op in _COMPARISONS:
        return _comparison(tokens, column, at)
    if op == "IN":
        return _in_predicate(tokens, column, at)
    if op == "IS":
        return _null_test(tokens, at)
    if op == "BETWEEN":
        return _between(tokens, at)
    return None, at, _why(op)


def _run_of(tokens, at, token):
    """How many tokens equal to token stand one after another from tokens[at] on."""
    count = 0
    while _at(tokens, at + count) == token:
        count += 1
    return count


def _equality_columns(pins):
    """The columns that pins of one predicate hold equal to literals (op '='), by column name alone."""
    return {column for (_, column), _, op in pins if op == "="}


def where_shape(clause):
    """('plain', pins, None) when the tokens of a WHERE clause are a conjunction of simple predicates (see
    _predicate), in grouping parentheses or not, no two of them pinning one column equal to literals (pins are one
    list, so 'id = 42 AND id = 43', which no row meets, would read as 'id IN (42, 43)'); else ('not plain', [],
    why)."""
    pins = []
    pinned = set()
    depth = 0
    at = 0
    while True:
        opened = _run_of(clause, at, "(")
        depth += opened
        found, at, why = _predicate(clause, at + opened)
        if found is None:
            return "not plain", [], why
        columns = _equality_columns(found)
        if columns & pinned:
            return "not plain", [], "a column pinned twice"
        pinned |= columns
        pins += found
        closed = _run_of(clause, at, ")")
        depth -= closed
        at += closed
        if depth < 0:
            return "not plain", [], "unbalanced parentheses"
        if at == len(clause):
            break
        if clause[at].upper() != "AND":
            return "not plain", [], _why(clause[at])
        at += 1
    if depth:
        return "not plain", [], "unbalanced parentheses"
    return "plain", pins, None


class SqlFacts(collections.namedtuple("SqlFacts", "kind table alias single where why pins statements")):
    """An SQL operation. kind: the first statement's action (read, insert, update, delete, merge; None if unknown);
    table, alias: its target table's name and alias, in lower case (None if unknown); single: it names one table
    (no join, USING or second table); where: 'none', 'plain' or 'not plain' (why: what made it so); pins: ((qualifier,
    column), N, op) of each 'column = N' and 'column IN (N, ...)' (op '=') and 'column <> N' (op '<>') of a plain
    WHERE; statements: 1, or 2 for more."""

    __slots__ = ()


_NO_SQL = SqlFacts(None, None, None, False, "none", None, [], 1)  # the facts of a db_op without an operation


def _kind_keyword(upper):
    """The position of a statement's kind keyword among its tokens in upper case: its first, or after WITH the first
    statement keyword outside parentheses (len(upper) when there is none)."""
    if upper[:1] != ["WITH"]:
        return 0
    depth = 0
    for at, token in enumerate(upper):
        depth += (token == "(") - (token == ")")
        if depth <= 0 and token in _SQL_KINDS:
            return at
    return len(upper)


def _statement_kind(upper, at):
    """The kind of the statement whose kind keyword is at upper[at]; INSERT ... ON CONFLICT and ON DUPLICATE KEY are
    merges."""
    kind = _SQL_KINDS.get(_at(upper, at))
    upsert = "CONFLICT" in upper or "DUPLICATE" in upper
    if kind == "insert" and upsert:
        return "merge"
    return kind


def _index(tokens, token, start):
    """The position of the first token equal to token from start on, or len(tokens)."""
    try:
        return tokens.index(token, start)
    except ValueError:
        return len(tokens)


_TARGET_AFTER = {"DELETE": "FROM", "SELECT": "FROM", "INSERT": "INTO", "REPLACE": "INTO", "MERGE": "INTO",
                 "UPSERT": "INTO"}  # the word a statement's target table follows (UPDATE, TRUNCATE: the keyword)
_ONE_TABLE_NEXT = ("", "WHERE", "SET", "(", "VALUES", "SELECT", "DEFAULT", "ORDER", "LIMIT", "RETURNING")


def _target(tokens, upper, at):
    """(table, alias, single) of the statement whose kind keyword is at tokens[at]: the name after FROM (DELETE,
    SELECT), INTO (INSERT, MERGE, REPLACE) or the keyword itself (UPDATE, TRUNCATE), modifiers skipped."""
    before = _TARGET_AFTER.get(upper[at])
    if before:
        at = _index(upper, before, at)
    at += 1
    while _at(upper, at) in _SQL_MODIFIERS:
        at += 1
    name, at = _qualified_name(tokens, at)
    if name is None:
        return None, None, False
    if _at(upper, at) == "AS":
        at += 1
    alias = _name_token(_at(tokens, at))
    if alias is not None:
        at += 1
    return name[1], alias, _at(upper, at) in _ONE_TABLE_NEXT


def _where_clause(tokens, upper):
    """The tokens of a statement's WHERE clause (after WHERE, outside parentheses, up to ORDER, LIMIT, RETURNING...),
    or None when it has none."""
    depth = 0
    start = None
    for at, token in enumerate(upper):
        depth += (token == "(") - (token == ")")
        if depth:
            continue
        if start is None and token == "WHERE":
            start = at + 1
        elif start is not None and token in _SQL_WHERE_END:
            return tokens[start:at]
    if start is None:
        return None
    return tokens[start:]


def _first_statement(tokens):
    """(the tokens of the first statement, after the comments before it; whether other statements follow)."""
    start = _run_of(tokens, 0, _SQL_COMMENT)
    end = _index(tokens, ";", start)
    rest = set(tokens[end + 1 :]) - {";", _SQL_COMMENT}
    return tokens[start:end], bool(rest)


_SQL_WRITES = frozenset(keyword for keyword, kind in _SQL_KINDS.items() if kind != "read")


def sql_facts(sql):
    """The SqlFacts of an SQL operation (its first statement; comments before it are skipped). A WITH clause that
    writes (WITH x AS (DELETE ... RETURNING *) ...) is a statement of its own."""
    statement, more = _first_statement(sql_tokens(sql))
    upper = list(map(str.upper, statement))
    at = _kind_keyword(upper)
    more = more or not _SQL_WRITES.isdisjoint(upper[:at])
    kind = _statement_kind(upper, at)
    if kind is None:
        return _NO_SQL._replace(statements=1 + more)
    table, alias, single = _target(statement, upper, at)
    clause = _where_clause(statement, upper) if kind in _WHERE_KINDS else None
    if clause is None:
        return SqlFacts(kind, table, alias, single, "none", None, [], 1 + more)
    where, pins, why = where_shape(clause)
    return SqlFacts(kind, table, alias, single, where, why, pins, 1 + more)


_WHERE_KINDS = ("read", "update", "delete")  # the statements whose WHERE clause confirms ids


class DbClaim(collections.namedtuple("DbClaim", "action writes conflicting negated count ids not_done objects "
                                                "every words")):
    """A db_op claim: action (its one action class: delete, insert, update or read; None), writes (its write
    classes), conflicting (more than one write class), negated, count (the number after its verb: 'deleted 10
    rows'), ids (ClaimedId, each once), not_done (its action only intended or attempted: will delete, tried to),
    objects (the forms of the noun its verb acts on, see _object_forms; empty when it names none), every (its verb
    acts on all, every or each of a thing: 'deleted all users'), words (its tokens in lower case)."""

    __slots__ = ()


# The noun phrase a db_op verb acts on ('the cache entry', 'stale sessions', 'user 42's sessions') ends at one of
# these words, a number or an id; words of no one table ('rows', 'entries') name no object of their own.
_OBJECT_ENDS = _PREPOSITIONS | _word_set("to into onto where with without and or but because so that which who whose "
                                         "since after before on at as via than then if when while whom")
_GENERIC_OBJECTS = _word_set("row rows record records entry entries item items data datum one ones it them everything "
                             "thing things value values object objects element elements stuff table tables id ids")
_OBJECT_WORD = re.compile(r"[a-z][a-z_]*")


def _name_forms(name):
    """The forms under which a table or column name may meet a claimed object: itself singular and without '_', and
    each of its snake_case parts singular ('cache_entries': cacheentry, cache, entry)."""
    forms = {_singular(part) for part in name.split("_") if part}
    forms.add(_singular(name).replace("_", ""))
    return forms


def _object_phrase(low, verb):
    """The words of the noun phrase after the verb at low[verb]: stopwords and counts before it skipped, a
    possessive restarting it ('user 42's sessions', 'the user's sessions': sessions)."""
    words = []
    i = verb + 1
    while i < len(low):
        word = low[i]
        possessive = _at(low, i + 1) == "s"
        if word == "s" and words:  # the user's sessions
            words = []
        elif _id_value(word) and possessive:  # user 42's sessions
            words = []
            i += 1
        elif word in _OBJECT_ENDS or word in _ALL_VERBS or words and _id_value(word):
            break
        elif _OBJECT_WORD.fullmatch(word) and word not in _STOP:
            words.append(word)
        elif words:
            break
        i += 1
    return words


_EVERY = _word_set("all every each")


def _quantified(low, verb):
    """Whether the verb at low[verb] acts on all, every or each of a thing ('deleted all users', 'removed all the
    sessions'); False without a verb."""
    if verb is None:
        return False
    return not _EVERY.isdisjoint(low[verb + 1 : verb + 3])


def _object_forms(low, verb):
    """The forms under which a table may name the object of the verb at low[verb] (None: no verb): the forms of each
    word of its noun phrase (see _name_forms) but the generic ones (row, entry, id), and the whole phrase joined
    ('cache entry': cacheentry). Empty when every word is generic or the phrase is empty."""
    if verb is None:
        return frozenset()
    phrase = _object_phrase(low, verb)
    nouns = [word for word in phrase if word not in _GENERIC_OBJECTS]
    if not nouns:
        return frozenset()
    forms = set()
    for word in nouns:
        forms.update(_name_forms(word))
    joined = "".join(phrase[:-1]) + _singular(phrase[-1])
    forms.add(joined.replace("_", ""))
    return frozenset(forms - _GENERIC_OBJECTS)


def _db_action(classes):
    """The one action a set of db_op classes claims: its one write, or read alone; else None."""
    writes = classes - {"read"}
    if len(writes) == 1:
        return next(iter(writes))
    if classes == {"read"}:
        return "read"
    return None


def db_op_claim(claim):
    """The DbClaim of a claim."""
    low = _lower(_tokens(claim))
    actions = _actions(low, _DB_VERBS)
    writes = actions.classes - {"read"}
    count = _claim_count(low, _DB_VERBS)
    action = _db_action(actions.classes)
    conflicting = len(writes) > 1
    ids = _claimed_ids(low)
    objects = _object_forms(low, actions.first)
    every = _quantified(low, actions.first)
    return DbClaim(action, writes, conflicting, actions.negated, count, ids, actions.not_done, objects, every,
                   frozenset(low))


class DbFacts(collections.namedtuple("DbFacts", "sql kind delta affected reached counts ids_where matched "
                                                "mismatched unconfirmed rows_pinned object_fits sets_unclaimed")):
    """What the evidence says about a db_op claim. sql: SqlFacts; kind: the SQL statement's kind when it gives a
    direction (MERGE, UPSERT and REPLACE do not); delta: after_count - before_count (None unless both); affected:
    affected_rows; reached: the most rows the operation reached (affected_rows or |delta|); counts: the row counts a
    claimed count may meet (affected_rows, and |delta| unless an update is claimed); ids_where: the WHERE shape that
    judges the claim's ids ('none', 'plain', 'not plain'; None when the claim names none or the statement has no
    WHERE to judge them by); matched, mismatched, unconfirmed: how many claimed ids a plain WHERE pins under their
    noun, contradicts, or neither (see _id_state); rows_pinned: the distinct claimed ids that name the rows written
    (see _pins_rows); object_fits: whether the statement's table is the noun the claim's verb acts on (for an
    update, a column of the statement may be: 'column'), None when the claim names no such noun or the table is
    unknown; sets_unclaimed: when the claim's noun is a column the update sets, how many other columns it sets that
    the claim does not name (bookkeeping columns such as updated_at aside)."""

    __slots__ = ()


def _owner(sql, qualifier):
    """The table a column belongs to by its qualifier: the target table for its own name or alias, or no qualifier
    in a one-table statement; the qualifier's table otherwise; None when unknown."""
    if qualifier and qualifier in (sql.table, sql.alias):
        return sql.table
    if qualifier:
        return qualifier
    return sql.table if sql.single else None


def _pin_noun(sql, pin):
    """The noun whose ids a pinned column holds: its table's for id (None when unknown), x's for x_id; None for any
    other column."""
    qualifier, column = pin[0]
    if column == "id":
        owner = _owner(sql, qualifier)
        return _singular(owner) if owner else None
    if column.endswith("_id"):
        return _singular(column[:-3])
    return None


def _claimed_noun(sql, claimed):
    """The noun a claimed id names: its own, or for a bare id (id=N, #N) the target table's (None when unknown)."""
    if claimed.noun:
        return claimed.noun
    return _singular(sql.table) if sql.table else None


def _agrees(sql, pin, noun):
    """Whether a pinned column holds ids of noun: id in the noun's table, noun_id, or nounid (orderId)."""
    column = pin[0][1]
    return column == noun + "id" or _pin_noun(sql, pin) == noun


def _pins_rows(sql, claimed):
    """Whether a claimed id names the rows written: a bare id, one that no preposition brings in ('user 42'), or one
    whose noun is the target table's; not one of another entity ('the sessions of user 42')."""
    if not claimed.noun or not claimed.introduced:
        return True
    return sql.table is not None and _singular(sql.table) == claimed.noun


def _id_state(sql, claimed):
    """'matched', 'mismatched' or 'unconfirmed': a claimed id against the pins of a plain WHERE. An id keeps its
    noun: order 42 is matched by id = 42 in the order(s) table or by order_id = 42 (or orderId); it is mismatched when
    its column pins another value or excludes this one (id <> 42), when its value is pinned for another noun
    (customer_id = 42), or when it names the rows written but the WHERE pins only other nouns' ids."""
    noun = _claimed_noun(sql, claimed)
    if noun is None:
        return "unconfirmed"
    agreeing = [pin for pin in sql.pins if _agrees(sql, pin, noun)]
    equal = {value for _, value, op in agreeing if op == "="}
    excluded = {value for _, value, op in agreeing if op == "<>"}
    if claimed.value in equal - excluded:
        return "matched"
    pinned = [pin for pin in sql.pins if pin[2] == "="]
    nouns = {_pin_noun(sql, pin) for pin in pinned} - {None}
    same_value = [pin for pin in pinned if pin[1] == claimed.value]
    others = {_pin_noun(sql, pin) for pin in same_value} - {None, noun}
    if agreeing or others or nouns and _pins_rows(sql, claimed):
        return "mismatched"
    return "unconfirmed"


def _id_states(sql, ids):
    """Each claimed id's state (_id_state) under a plain WHERE, else 'unconfirmed'. In a statement of more than one
    table (a join, USING, several targets) a pin confirms no id, as the rows written may be another table's; it can
    still contradict one."""
    states = []
    for claimed in ids:
        state = "unconfirmed"
        if sql.where == "plain":
            state = _id_state(sql, claimed)
        if state == "matched" and not sql.single:
            state = "unconfirmed"
        states.append(state)
    return states


def _ids_where(claim, sql):
    """The WHERE shape that judges a claim's ids, or None (see DbFacts)."""
    if not claim.ids or sql.kind not in _WHERE_KINDS:
        return None
    return sql.where


def _object_fits(claim, sql, columns):
    """Whether the table of the statement is the object of the claim's verb (True), or for an update one of the
    columns it sets ('column'); None when either is unknown (see DbFacts)."""
    if not claim.objects or sql.table is None:
        return None
    if not claim.objects.isdisjoint(_name_forms(sql.table)):
        return True
    if sql.kind != "update":
        return False
    return "column" if any(not claim.objects.isdisjoint(_name_forms(name)) for name in columns) else False


_SET_END = frozenset(["WHERE", "FROM", "RETURNING", "ORDER", "LIMIT"])  # what ends an UPDATE's SET list
# columns an update may set beside the ones a claim names: when and by whom a row changed, its version
_BOOKKEEPING = _word_set("version lock_version revision etag modified updated last_modified last_updated")


def _set_columns(operation):
    """The names of the columns the SET list of an UPDATE's first statement assigns ('SET a = 1, t.b = 2': a, b)."""
    tokens = _first_statement(sql_tokens(operation))[0]
    upper = list(map(str.upper, tokens))
    at = _index(upper, "SET", 0) + 1
    columns = set()
    depth = 0
    expecting = True  # a column's name comes first, and after each ',' of the list
    while at < len(tokens):
        token = upper[at]
        depth += (token == "(") - (token == ")")
        if depth == 0 and token in _SET_END:
            break
        name, after = _qualified_name(tokens, at) if depth == 0 and expecting else (None, at)
        if name is not None:
            columns.add(name[1])
            at = after
            expecting = False
            continue
        expecting = depth == 0 and token == ","
        at += 1
    return columns


def _bookkeeping(column):
    """Whether a column only records when, by whom or in which version a row changed (updated_at, modified_by)."""
    return column in _BOOKKEEPING or column.endswith(("_at", "_on", "_by"))


def _sets_unclaimed(claim, columns):
    """How many of the columns an update sets are neither named by the claim (in any of its words' forms) nor
    bookkeeping."""
    named = set()
    for word in claim.words:
        named.update(_name_forms(word))
    unnamed = [column for column in columns if named.isdisjoint(_name_forms(column)) and not _bookkeeping(column)]
    return len(unnamed)


def _direction(sql):
    """The SQL statement's kind, if it gives a direction (MERGE, UPSERT and REPLACE do not), else None."""
    if sql.kind == "merge":
        return None
    return sql.kind


def db_op_facts(ev, claim):
    """The DbFacts of db_op evidence for a claim."""
    before = ev.get("before_count")
    after = ev.get("after_count")
    affected = ev.get("affected_rows")
    delta = None if before is None or after is None else after - before
    reached = max(affected or 0, abs(delta or 0))
    counts = {affected}
    if delta is not None and claim.action != "update":  # an update moves no rows in or out
        counts.add(abs(delta))
    counts.discard(None)
    operation = ev.get("operation")
    sql = _NO_SQL if operation is None else sql_facts(operation)
    states = _id_states(sql, claim.ids)
    pinned = {(claimed.noun, claimed.value) for claimed in claim.ids if _pins_rows(sql, claimed)}
    direction = _direction(sql)
    ids_where = _ids_where(claim, sql)
    matched = states.count("matched")
    mismatched = states.count("mismatched")
    unconfirmed = states.count("unconfirmed")
    rows_pinned = len(pinned)
    columns = _set_columns(operation) if claim.objects and sql.kind == "update" else set()
    object_fits = _object_fits(claim, sql, columns)
    sets_unclaimed = _sets_unclaimed(claim, columns) if object_fits == "column" else 0
    return DbFacts(sql, direction, delta, affected, reached, counts, ids_where, matched, mismatched, unconfirmed,
                   rows_pinned, object_fits, sets_unclaimed)


# The checks: each a reason code's rule over (DbClaim, DbFacts).
_DELTA_SIGNS = {"delete": -1, "insert": 1, "update": 0, "read": 0}  # the sign of the row delta each action needs


def _delta_fits(claim, facts):
    """Whether the sign of the row delta is the one the claimed action needs (None when either is unknown)."""
    if not claim.action or facts.delta is None:
        return None
    sign = (facts.delta > 0) - (facts.delta < 0)
    return sign == _DELTA_SIGNS[claim.action]


def sql_kind_matches(claim, facts):
    """The SQL statement's kind (DELETE, TRUNCATE: delete; INSERT; UPDATE; SELECT: read) is the claimed action."""
    return claim.action and facts.kind == claim.action


def sql_kind_conflicts(claim, facts):
    """A write is claimed but the SQL statement is a SELECT."""
    return claim.writes and facts.kind == "read"


def sql_kind_differs(claim, facts):
    """The SQL statement's kind differs from the claimed action (other than a write claimed against a SELECT)."""
    differs = claim.action and facts.kind and facts.kind != claim.action
    return differs and not sql_kind_conflicts(claim, facts)


def several_statements(claim, facts):
    """The operation holds more than one statement; only the first is judged, and it confirms no id."""
    return facts.sql.statements > 1


def row_delta_fits(claim, facts):
    """The sign of after_count - before_count fits the claimed action (delete: fewer, insert: more, update and
    read: the same)."""
    return _delta_fits(claim, facts) is True


def row_delta_differs(claim, facts):
    """The sign of after_count - before_count does not fit the claimed action."""
    return _delta_fits(claim, facts) is False


def affected_rows_zero(claim, facts):
    """A write is claimed but affected_rows is 0."""
    return claim.writes and facts.affected == 0


def _affected_and_delta(claim, facts):
    """Whether a write is claimed and both affected_rows (not 0) and the row delta are known."""
    return claim.writes and facts.affected and facts.delta is not None


def affected_rows_consistent(claim, facts):
    """affected_rows (not 0) fits the row delta: equal to its size, or for an update, with a delta of 0."""
    if not _affected_and_delta(claim, facts):
        return False
    if claim.action == "update":
        return facts.delta == 0
    return facts.affected == abs(facts.delta)


def affected_rows_differ(claim, facts):
    """affected_rows (not 0) differs from the size of the row delta (a write other than an update claimed)."""
    known = _affected_and_delta(claim, facts) and claim.action != "update"
    return known and facts.affected != abs(facts.delta)


def count_meets_rows(claim, facts):
    """The count in the claim ('deleted 10 rows') is affected_rows or the size of the row delta."""
    return claim.count is not None and claim.count in facts.counts


def count_differs(claim, facts):
    """The count in the claim differs from affected_rows and from the size of the row delta."""
    return claim.count is not None and facts.counts and claim.count not in facts.counts


def rows_exceed_ids(claim, facts):
    """The claim names N ids of the rows it wrote (user 42; ids 7 and 9) but affected_rows or the size of the row
    delta is larger than N: the operation reached rows the claim does not name."""
    return facts.rows_pinned and facts.reached > facts.rows_pinned


def table_not_claimed(claim, facts):
    """The claim names the thing its verb acts on ('the cache entry', 'stale sessions'), and the statement's table
    is not it under any form (singular or plural, snake_case parts, the words joined): 'Deleted the cache entry'
    against DELETE FROM users. For an update, a column of the statement may be the thing ('the email of user 42')."""
    return facts.object_fits is False


def sets_unclaimed_columns(claim, facts):
    """The claim names the column it updated ('updated user 42's email'), and the statement also sets others it
    does not name (role = 'admin'); when, by whom and in which version a row changed (updated_at, modified_by,
    version) aside. One signal a column."""
    return facts.sets_unclaimed


def all_claimed_but_pinned(claim, facts):
    """The claim's verb acts on all, every or each of a thing ('deleted all users'), but the WHERE clause pins ids
    (id = 42): the statement reached only the rows it names."""
    pinned = [pin for pin in facts.sql.pins if pin[2] == "="]
    return claim.every and bool(pinned)


def where_not_plain(claim, facts):
    """The claim names ids, but the WHERE clause is not a conjunction (AND) of simple predicates (column = literal,
    IN, IS NULL, BETWEEN, comparisons): OR, NOT, XOR, ||, chained comparisons, LIKE, functions, arithmetic,
    subqueries or a comment leave the ids unconfirmed, and no write that names them is verified. Stricter than
    spec section 10: two predicates that pin one column to literals (id = 42 AND id = 43) are not plain either."""
    return facts.ids_where == "not plain"


def ids_match_where(claim, facts):
    """Every id the claim names (id=N, id N, #N, user N) is pinned by the one statement's plain WHERE under its noun:
    order 42 by id = 42 in the orders table, or by order_id = 42. The statement writes one table: with USING, a
    join or several targets, the rows written may be another table's."""
    plain = facts.ids_where == "plain" and facts.sql.statements == 1
    return plain and facts.matched == len(claim.ids)


def ids_mismatch_where(claim, facts):
    """An id the claim names is contradicted by the plain WHERE: its column pins another value or excludes it, or
    its value is pinned for another noun (order 42 against customer_id = 42)."""
    return facts.mismatched


def ids_unchecked(claim, facts):
    """The claim names ids that the SQL does not confirm (no WHERE, a WHERE that does not pin them, an INSERT whose
    values are not compared, several statements), and none that it contradicts."""
    confirmed = ids_match_where(claim, facts) or facts.mismatched
    return claim.ids and not confirmed and facts.ids_where != "not plain"


DB_OP_CHECKS = (
    (claim_has_conflicting_verbs, "conflicting_verbs", NEGATIVE),
    (claim_is_negated, "claim_negated", NEGATIVE),
    (claim_is_not_done, "claim_not_done", NEGATIVE),
    (sql_kind_matches, "sql_kind_matches", POSITIVE),
    (sql_kind_differs, "sql_kind_mismatch", NEGATIVE),
    (sql_kind_conflicts, "sql_kind_conflicts", CRITICAL),
    (several_statements, "sql_multiple_statements", NEGATIVE),
    (table_not_claimed, "sql_table_mismatch", NEGATIVE),
    (sets_unclaimed_columns, "sql_sets_unclaimed_columns", NEGATIVE),
    (all_claimed_but_pinned, "sql_where_narrower_than_claim", NEGATIVE),
    (row_delta_fits, "row_delta_matches", POSITIVE),
    (row_delta_differs, "row_delta_mismatch", NEGATIVE),
    (affected_rows_zero, "affected_rows_zero", NEGATIVE),
    (affected_rows_consistent, "affected_rows_consistent", POSITIVE),
    (affected_rows_differ, "affected_rows_mismatch", NEGATIVE),
    (count_meets_rows, "count_matches", POSITIVE),
    (count_differs, "count_mismatch", CRITICAL),
    (rows_exceed_ids, "affected_rows_exceed_claim", CRITICAL),
    (where_not_plain, "where_not_plain", NEGATIVE),
    (ids_match_where, "sql_identifier_matches", POSITIVE),
    (ids_mismatch_where, "sql_identifier_mismatch", CRITICAL),
    (ids_unchecked, "sql_identifier_unchecked", NEGATIVE),
)


def _db_op_details(claimed, facts):
    """details of a db_op judgement: the claimed action and count, the SQL statement's kind, WHERE shape and pinned
    ids, the row delta and affected_rows."""
    sql = facts.sql
    equal = {value for _, value, op in sql.pins if op == "="}
    pinned = sorted(equal)[:50]
    where = sql.where if sql.where != "not plain" else "not plain: " + sql.why
    details = {
        "claimed_action": claimed.action,
        "sql_kind": sql.kind,
        "row_delta": facts.delta,
        "affected_rows": facts.affected,
        "sql_identifiers": pinned,
        "where": where,
        "claimed_count": claimed.count,
    }
    return details


def judge_db_op(claim, ev, ev_json=None):
    """{before_count, after_count, operation, affected_rows}: the claimed action against the SQL statement's kind,
    the sign of the row delta and affected_rows; claimed ids against the ids a plain WHERE clause pins."""
    claimed = db_op_claim(claim)
    facts = db_op_facts(ev, claimed)
    return run_checks(CHECKS["db_op"], claimed, facts), _db_op_details(claimed, facts)


# ---- §3.4 file_op ------------------------------------------------------------------------------------------

_FILE_STATES = {  # (exists_before, exists_after) each file_op verb needs; None: either
    "create": (False, True),
    "write": (None, True),
    "delete": (True, False),
    "modify": (True, True),
    "rename": (True, True),
}
# bytes a size unit means
_SIZE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 1000, "kib": 1024, "mb": 1000000, "mib": 1048576,
               "gb": 1000000000, "gib": 1073741824}
_CHANGE_VERBS = (None, "write", "rename")  # a quantity after any other file verb is a change: 'removed 3 lines'


def _leading_number(token):
    """(the number a token starts with, the rest of it): ('12', 'KiB') for '12KiB'; ('', token) when none."""
    if len(token) > 32:
        return "", token
    rest = token.lstrip("0123456789.,")
    return token[: len(token) - len(rest)], rest


def _quantity(low, i):
    """('lines' or 'bytes', value) of a quantity at token i ('120 lines', '1.5 MB', '12KiB', '1,000 bytes'), else
    None."""
    digits, unit = _leading_number(low[i])
    number = _number(digits) if digits else None
    unit = unit or _at(low, i + 1)
    if number is None:
        return None
    if unit in ("line", "lines") and isinstance(number, int):
        return "lines", number
    if unit in _SIZE_UNITS:
        return "bytes", number * _SIZE_UNITS[unit]
    return None


class FileClaim(collections.namedtuple("FileClaim", "action conflicting negated tokens lines sizes not_done")):
    """A file_op claim: action (create, write, delete, rename, modify; None), conflicting (two actions), negated,
    not_done (its action only intended or attempted),
    tokens (its tokens, for its paths), lines and sizes (the totals it states, in lines and bytes; a quantity after
    a verb, 'removed 3 lines', is a change, not a total)."""

    __slots__ = ()


def _file_classes(low, edits):
    """The Actions of a file_op claim, each verb before a quantity (edits: their positions) read as modify; a write
    beside another action is part of it ('created x and wrote 3 lines')."""
    verbs = ["modify" if i in edits else word for i, word in enumerate(low)]
    actions = _actions(verbs, _FILE_VERBS)
    if len(actions.classes) > 1:
        return actions._replace(classes=actions.classes - {"write"})
    return actions


def _edits(low, quantities):
    """The positions of the verbs that stand right before a quantity and change content ('removed 3 lines')."""
    edits = set()
    for i, _ in quantities:
        verb = _FILE_VERBS.get(low[i - 1]) if i else None
        if verb not in _CHANGE_VERBS:
            edits.add(i - 1)
    return edits


def file_op_claim(claim):
    """The FileClaim of a claim."""
    toks, low = _words(claim)
    quantities = [(i, _quantity(low, i)) for i in range(len(low))]
    quantities = [(i, found) for i, found in quantities if found]
    edits = _edits(low, quantities)
    actions = _file_classes(low, edits)
    classes = actions.classes
    action = next(iter(classes)) if len(classes) == 1 else None
    totals = [found for i, found in quantities if i - 1 not in edits]
    lines = [value for unit, value in totals if unit == "lines"]
    sizes = [value for unit, value in totals if unit == "bytes"]
    return FileClaim(action, len(classes) > 1, actions.negated, toks, lines, sizes, actions.not_done)


class FileFacts(collections.namedtuple("FileFacts", "paths path_state new_path_missing end_ok start_ok "
                                                    "lines_off line_count size_off")):
    """What file_op evidence says about a claim. paths: the claimed paths (those that look like paths or are path or
    new_path); path_state: 'matches', 'mismatch' or 'not_named'; new_path_missing: a rename without new_path;
    end_ok, start_ok: exists_after and exists_before are what the claimed action needs (None: no action to judge);
    lines_off: |claimed lines - line_count| (None unless both); size_off: |claimed size - size_bytes| / size_bytes
    (None unless both)."""

    __slots__ = ()


def _names_file(name, path, new):
    """Whether a claimed name is path or new_path (a whole-component suffix of either)."""
    return _suffix_of(name, path) or bool(new) and _suffix_of(name, new)


def _path_state(claimed, action, path, new):
    """'matches', 'mismatch' or 'not_named': every claimed path must be path or new_path (a whole-component suffix),
    and a rename names path (the old name) first."""
    unknown = [c for c in claimed if not _names_file(c, path, new)]
    if action == "rename" and not new and len(unknown) == 1 < len(claimed):
        unknown = []  # the destination, which the evidence does not give (new_path_missing says so)
    order = [not _suffix_of(c, path) for c in claimed]
    if action == "rename" and new and order != sorted(order):
        unknown = claimed
    if unknown:
        return "mismatch"
    return "matches" if claimed else "not_named"


def _relative_size(claimed, size):
    """How far a claimed size is from size_bytes, as a fraction of it (claimed 0 of 0: 0.0; anything else of 0: 1.0)."""
    if not size:
        return float(claimed != 0)
    return abs(claimed - size) / size


def _first_off(claimed, actual, measure):
    """measure(the first claimed total, the evidence's), or None unless both are there."""
    if not claimed or actual is None:
        return None
    return measure(claimed[0], actual)


def _line_distance(claimed, actual):
    """How many lines a claimed line count is off."""
    return abs(claimed - actual)


def _existence(ev, action):
    """(end_ok, start_ok): whether exists_after and exists_before are what the action needs; (None, None) with no
    action to judge (none, or a rename without new_path). For a rename they describe path, then new_path."""
    if action is None or action == "rename" and not ev.get("new_path"):
        return None, None
    want_before, want_after = _FILE_STATES[action]
    start_ok = want_before is None or ev["exists_before"] == want_before
    return ev["exists_after"] == want_after, start_ok


def file_op_facts(ev, claim):
    """The FileFacts of file_op evidence for a claim."""
    path = ev["path"]
    new = ev.get("new_path")
    names = map(_unprefixed, claim.tokens)
    claimed = [name for name in names if _pathish(name) or _names_file(name, path, new)]
    end_ok, start_ok = _existence(ev, claim.action)
    line_count = ev.get("line_count")
    lines_off = _first_off(claim.lines, line_count, _line_distance)
    size_off = _first_off(claim.sizes, ev.get("size_bytes"), _relative_size)
    state = _path_state(claimed, claim.action, path, new)
    new_path_missing = claim.action == "rename" and not new
    return FileFacts(claimed, state, new_path_missing, end_ok, start_ok, lines_off, line_count, size_off)


# The checks: each a reason code's rule over (FileClaim, FileFacts).


def paths_match(claim, facts):
    """Every path the claim names is path or new_path (a whole-component suffix: report.txt matches /tmp/report.txt)."""
    return facts.path_state == "matches"


def path_differs(claim, facts):
    """A path the claim names is neither path nor new_path, or a rename names them the other way round."""
    return facts.path_state == "mismatch"


def no_path_named(claim, facts):
    """The claim names no file that is path or new_path: the target is unconfirmed."""
    return facts.path_state == "not_named"


def rename_without_new_path(claim, facts):
    """A rename or move is claimed but the evidence has no new_path."""
    return facts.new_path_missing


def existence_fits(claim, facts):
    """exists_before and exists_after are what the claimed action needs (create: absent then present; delete:
    present then absent; write: present after; modify, rename: present both times)."""
    return facts.end_ok and facts.start_ok


def start_state_differs(claim, facts):
    """exists_after fits the claimed action but exists_before does not."""
    return facts.end_ok and facts.start_ok is False


def end_state_differs(claim, facts):
    """exists_after contradicts the claimed action."""
    return facts.end_ok is False


def _lines_far(facts):
    """Whether the stated line count is off by more than 50 lines or more than 10% of line_count."""
    off = facts.lines_off
    return off > 50 or off > 0.1 * facts.line_count


def line_count_equal(claim, facts):
    """The line count the claim states equals line_count."""
    return facts.lines_off == 0


def line_count_near(claim, facts):
    """The stated line count differs from line_count by at most 10% and at most 50 lines."""
    return bool(facts.lines_off) and not _lines_far(facts)


def line_count_far(claim, facts):
    """The stated line count is off by more than 10% or more than 50 lines."""
    return facts.lines_off is not None and _lines_far(facts)


def size_within(claim, facts):
    """The stated size (B, KB and MB: powers of 1000; KiB, MiB: of 1024) is within 1% of size_bytes."""
    return facts.size_off is not None and facts.size_off <= 0.01


def size_near(claim, facts):
    """The stated size is off by more than 1% and at most 50%."""
    return facts.size_off is not None and 0.01 < facts.size_off <= 0.5


def size_far(claim, facts):
    """The stated size is off by more than 50%."""
    return facts.size_off is not None and facts.size_off > 0.5


FILE_OP_CHECKS = (
    (claim_has_conflicting_verbs, "conflicting_verbs", NEGATIVE),
    (claim_is_negated, "claim_negated", NEGATIVE),
    (claim_is_not_done, "claim_not_done", NEGATIVE),
    (paths_match, "path_matches", POSITIVE),
    (path_differs, "path_mismatch", CRITICAL),
    (no_path_named, "path_not_named", NEGATIVE),
    (rename_without_new_path, "new_path_missing", NEGATIVE),
    (existence_fits, "existence_matches", POSITIVE),
    (start_state_differs, "start_state_mismatch", NEGATIVE),
    (end_state_differs, "end_state_mismatch", CRITICAL),
    (line_count_equal, "line_count_matches", POSITIVE),
    (line_count_near, "line_count_off", NEGATIVE),
    (line_count_far, "line_count_mismatch", CRITICAL),
    (size_within, "size_matches", POSITIVE),
    (size_near, "size_off", NEGATIVE),
    (size_far, "size_mismatch", CRITICAL),
)


def judge_file_op(claim, ev, ev_json=None):
    """{path, exists_before, exists_after, line_count?, size_bytes?, new_path?}: verb vs existence, named paths vs
    path and new_path, stated totals vs line_count and size_bytes."""
    claimed = file_op_claim(claim)
    facts = file_op_facts(ev, claimed)
    paths = facts.paths[:50]
    lines = claimed.lines[:1]
    sizes = claimed.sizes[:1]
    path = ev["path"]
    new = ev.get("new_path")
    details = {
        "claimed_action": claimed.action,
        "path": path,
        "new_path": new,
        "claimed_paths": paths,
        "claimed_lines": lines,
        "claimed_bytes": sizes,
    }
    return run_checks(CHECKS["file_op"], claimed, facts), details


# ---- §3.5 api_call -----------------------------------------------------------------------------------------

_URL_KEYS = frozenset(["url", "uri", "endpoint", "href"])  # request fields that hold the target URL
_EMAIL_KEYS = frozenset(["to", "recipient", "recipients", "email", "cc", "bcc"])  # request fields of recipients
# (key, value text) of every member, at any depth, valued a scalar or a flat list in json.dumps text: one C pass
_MEMBER = re.compile(r'(?<!\\)"([^"\\]{1,64})": ("[^"\\]*(?:\\.[^"\\]*)*"|\[[^\[\]{}]*\]|[^,{}\[\]"]*)')
# A path's segment and the next, when that is a number (paths one a line). A segment is tried only where one starts:
# tried inside one too, a segment with no '/' after it took time quadratic in its length.
_PATH_ID = re.compile(r"(?<![^/\n])([^/\n]*)/(?=([0-9]{1,18})(?:[/\n]|\Z))")
# A text body's words: runs of [a-z0-9_'] in its lower-case text, and each sentence end (. ! ? ; or a line break) as
# a word '.'. Its UTF-8 bytes are translated by a table (word bytes kept, ends to '.', any other to a space) and split.
_BODY_WORD_BYTES = b"abcdefghijklmnopqrstuvwxyz0123456789_'"
_BODY_END_BYTES = b".!?;\n"


def _body_byte(byte):
    """What a byte of a text body's lower-case UTF-8 is translated to: itself in a word, '.' at a sentence's end,
    else a space."""
    if byte in _BODY_WORD_BYTES:
        return byte
    if byte in _BODY_END_BYTES:
        return ord(".")
    return ord(" ")


_BODY_BYTES = bytes(map(_body_byte, range(256)))
# The words by what they say (spec section 10): S a success word, F a failure word, N a negation, Z a 'no' (no,
# none, without...), 0 the number zero, '.' a sentence's end, w any other word.
_BODY_SUCCESS = _STATUS_OK | {"posted", "successfully"}
_BODY_FAILURE = _STATUS_FAIL | _word_set("errors errored failing fails refused exceeded declined unable undeliverable "
                                         "unsuccessful timeout")
_BODY_NEGATION = _word_set("not never cannot can't couldn't didn't doesn't don't isn't wasn't weren't won't wouldn't "
                           "hasn't haven't hadn't shouldn't aren't neither nor")
_BODY_NO = _word_set("no none nothing without zero")
_BODY_WORDS = {"S": _BODY_SUCCESS, "F": _BODY_FAILURE, "N": _BODY_NEGATION, "Z": _BODY_NO, "0": {"0"},
               ".": {"."}}  # class -> its words
_BODY_CLASSES = {word: cls for cls, words in _BODY_WORDS.items() for word in words}
_NO_FAILURE = re.compile(r"[Z0]F|F0")  # 'no errors', '0 failed', 'failed: 0' report no failure
# a success word within three words after a negation or a zero, in a sentence; or right before a zero ('Sent: 0')
_GOVERNED_SUCCESS = re.compile(r"[NZ0][^.]{0,2}S|S0")
# In a JSON body's compact text, in lower case, at any depth: a status, state, result, outcome or conclusion valued
# a failure word; ok or success false; an error that is not null, false, "", 0, [] or {}, or errors that are not
# empty; a status code of 400-599. And the marks of success.
_OUTCOME_KEYS = '"(?:status|state|result|outcome|conclusion)":'
_FAILED = "|".join(sorted(_STATUS_FAIL | {"refused", "declined", "errored", "timeout"}))
_SUCCEEDED = "|".join(sorted(_STATUS_OK))
_JSON_FAILURE = re.compile(
    _OUTCOME_KEYS + '"(?:%s)"' % _FAILED
    + r'|"(?:ok|success)":false|"errors?":(?!null|false|""|0[,}\]]|\[\]|\{\})'
    + r'|"(?:status|status_code|statuscode)":[45][0-9][0-9][,}\]]'
    + r'|"(?:sent|delivered|accepted|succeeded|sent_count|delivered_count|success_count)":(?:0|false)[,}\]]'
    + r'|"(?:failed|failures|rejected|bounced|undeliverable|failed_recipients|rejected_recipients)"'
    + r':(?!null|false|""|0[,}\]]|\[\]|\{\})'
)
_JSON_SUCCESS = re.compile(_OUTCOME_KEYS + '"(?:%s)"|"(?:ok|success)":true' % _SUCCEEDED)


def _body_words(text):
    """The words of a text body (see _BODY_BYTES), a typographic apostrophe read as '."""
    low = text.lower().replace("\u2019", "'").encode("utf-8", "surrogatepass")
    spaced = low.translate(_BODY_BYTES).replace(b".", b" . ")
    return spaced.decode("ascii").split()


def _text_outcome(text):
    """'failure', 'success' or None for a text body: a failure word (failed, error, rejected, bounced, refused,
    denied, quota exceeded...) unless a 'no' or 0 stands beside it, or a success word that a negation or a zero
    governs in its sentence (not, never, no, could not, cannot, unable to, n't, 0 ... within three words before it;
    or 0 right after it: 'Sent 0 emails', 'delivered: 0'), is a failure; else a success word is a success."""
    words = _body_words(text)
    classes = "".join(map(_BODY_CLASSES.get, words, itertools.repeat("w")))
    classes = _NO_FAILURE.sub("ww", classes)
    if "F" in classes or _GOVERNED_SUCCESS.search(classes):
        return "failure"
    return "success" if "S" in classes else None


def _json_outcome(value):
    """'failure', 'success' or None for a JSON body (an object or a list), read at every depth: any failure mark
    (_JSON_FAILURE; also a count of sent or delivered of 0, and failed, rejected or bounced recipients) is a failure;
    else any success mark is a success."""
    text = _json_text(value).lower()
    if _JSON_FAILURE.search(text):
        return "failure"
    return "success" if _JSON_SUCCESS.search(text) else None


def _body_outcome(body):
    """'success', 'failure' or None: judged structurally for JSON (an object or a list, or a string holding one) and
    word by word for other text."""
    if isinstance(body, str):
        try:  # its structure is all that is read, so json.loads (strict_loads would also canonicalise it)
            body = json.loads(body)
        except (ValueError, RecursionError):
            return _text_outcome(body)
    if isinstance(body, str):
        return _text_outcome(body)
    if isinstance(body, (dict, list)):
        return _json_outcome(body)
    return None


def _path_id_pattern(segments):
    """_PATH_ID for the segments given only (a search then skips, in C, every path segment that is none of them)."""
    names = "|".join(map(re.escape, sorted(segments)))
    return re.compile(r"(?<![^/\n])(%s)/(?=([0-9]{1,18})(?:[/\n]|\Z))" % names)


def _path_rows(urls, segments=None):
    """The id rows ('customers_id', '78') that URLs' paths name (/customers/78), all the paths at once; only those of
    the given segment names (customers), or of every one for None. Lower-cased once joined: a line break, like '/',
    ends a word as the path's end does, so each segment comes out as str.lower gives it alone (even a final
    sigma)."""
    paths = "\n".join(_column(urls, 1))
    pattern = _PATH_ID if segments is None else _path_id_pattern(segments)
    pairs = pattern.findall(paths.lower())
    names = map(operator.add, _column(pairs, 0), itertools.repeat("_id"))
    return set(zip(names, _column(pairs, 1)))


def _member_texts(request):
    """(keys in lower case, values as text, keys as written) of every member of a request object, at any depth."""
    members = _MEMBER.findall(json.dumps(request, ensure_ascii=False))
    keys = list(_column(members, 0))
    texts = list(map(str.strip, _column(members, 1), itertools.repeat('"')))
    return list(map(str.lower, keys)), texts, keys


def _member_rows(lows, texts, keys):
    """The id rows of id-like members valued a number ('id', 'user_id', 'userId': 'NAME_id N')."""
    numbered = itertools.compress(zip(keys, lows, texts), map(_ID_NUMBER.fullmatch, texts))
    rows = set()
    for key, low, text in numbered:
        if low == "id" or low.endswith("_id") or key.endswith("Id"):
            name = low[:-2].rstrip("_") + "_id"
            rows.add((name, str(int(text))))
    return rows


def _values_of(texts, keys, fields):
    """The texts of the members whose keys are among fields, joined by spaces."""
    chosen = map(fields.__contains__, keys)
    return " ".join(itertools.compress(texts, chosen))


def _request_targets(request, wanted):
    """(emails, URLs as {(host, path)}, id rows as _id_rows gives them) in the request's target fields: emails in
    to, recipient...; URLs in url, uri...; ids in id-like keys and in those URLs' paths. A string request is all
    target. Only the kinds the claim names (wanted: its emails, URLs, ids) are looked for, each by C passes over the
    whole request (a request can hold 70,000 URLs or 100,000 tokens)."""
    want_emails, want_urls, want_ids = map(bool, wanted)
    if isinstance(request, str):
        emails_text = urls_text = request
        rows = _token_rows(request, wanted[2]) if want_ids else set()
    else:
        lows, texts, keys = _member_texts(request)
        # the values of the email and URL fields ('Eve <eve@x.com>'), joined by spaces, which no email or URL spans
        emails_text = _values_of(texts, lows, _EMAIL_KEYS)
        urls_text = _values_of(texts, lows, _URL_KEYS)
        rows = _member_rows(lows, texts, keys)
    urls = _wanted_urls(urls_text, wanted) if want_urls or want_ids else set()
    if want_ids:
        rows |= _path_rows(urls, _claimed_segments(wanted[2]))
    emails = _emails_in(emails_text) if want_emails else set()
    return emails, urls, rows


def _may_hold_path_ids(text, ids):
    """Whether a URL in text may have a path id that can meet a claimed id: a claimed segment (see
    _claimed_segments) then '/' and a digit somewhere in its lower-case text, or for the segment '' a digit after
    '//' or after a URL's host and '/'; always, for a bare id or a segment that is not ASCII."""
    segments = _claimed_segments(ids)
    if segments is None or not "".join(segments).isascii():
        return True
    named = sorted(segments - {""})
    patterns = ["/(?:%s)/[0-9]" % "|".join(map(re.escape, named))] if named else []
    if "" in segments:  # the segment '' names a path's first segment of digits (/78), or one after '//'
        patterns += ["//[0-9]", "://[^/?#\\s\"'<>]*/[0-9]"]
    return re.search("|".join(patterns), text.lower()) is not None


def _first_url(text):
    """{(host, path)} of the first http(s) URL in text that has a host (read as _urls_in reads it), or set()."""
    for match in _URLS.finditer(text):
        host, path = match.groups()
        if host:
            return {(host.lower(), (path or "").rstrip("/"))}
    return set()


def _wanted_urls(text, wanted):
    """The URLs of text that the claim's targets (wanted: emails, URLs, ids) can meet, as _urls_in reads them: all of
    them where a claimed URL's host is in the text (or is not ASCII), or a path may hold an id a claimed one can
    meet; else none can meet a claimed URL, and the first URL alone says the request has one (target_mismatch).
    A request can hold 62,000 URLs: none is read when the claim names another host."""
    if "://" not in text:
        return set()
    claimed_urls, claimed_ids = wanted[1], wanted[2]
    if claimed_ids and _may_hold_path_ids(text, claimed_ids):
        return _urls_in(text)
    if not claimed_urls:
        return set()
    hosts = [host for host, _ in claimed_urls]
    if not "".join(hosts).isascii():
        return _urls_in(text)
    low = text.lower()
    if any(host in low for host in hosts):
        return _urls_in(text)
    return _first_url(text)


def _agreeing_names(ids):
    """The names of the id rows that can meet the claimed ids ((noun, value)): those that agree with a claimed noun
    (customer, customers, customer_id... for customer: see _id_names) or with none (id), or None (every name) when
    the claim names a bare id (#78, id 78)."""
    nouns = {noun for noun, _ in ids}
    if "" in nouns:
        return None
    return _id_names("").union(*map(_id_names, nouns))


def _claimed_segments(ids):
    """The path segments whose ids can meet the claimed ids (see _agreeing_names), or None for every one."""
    names = _agreeing_names(ids)
    if names is None:
        return None
    return {name[:-3] for name in names if name.endswith("_id")}


def _token_rows(text, ids):
    """The id rows of a string request's tokens (see _id_rows) that can meet the claimed ids: none without reading
    its tokens when no name that agrees with a claimed noun (nor '#' or 'id') is in its lower-case text, as a row is
    a token (its name) and the number after it."""
    names = _agreeing_names(ids)
    if names is not None and "".join(names).isascii():
        low = text.lower()
        kept = [name for name in names if name and (_ID_NAME.fullmatch(name) or _noun_like(name))]  # as _id_rows
        kept += ["#", "id"]  # the name '' of #N, id=N and id:N
        if not any(name in low for name in kept):
            return set()
    return _id_rows(_tokens(text))


def _id_names(noun):
    """The names of the id rows whose noun is noun: each stem whose singular it is, alone and before _id ('customer':
    customer, customers, customer_id, customers_id); '' and id for the noun ''."""
    plurals = (noun, noun + "s", noun[:-1] + "ies")
    stems = {stem for stem in plurals if _singular(stem) == noun}
    names = {name for stem in stems for name in (stem, stem + "_id")}
    if not noun:
        names.add("id")
    return names


class ApiClaim(collections.namedtuple("ApiClaim", "intent emails urls ids")):
    """An api_call claim: intent ('success', 'failure' or None: the outcome it states), and the targets it names:
    emails (lower case), urls ((host, path)), ids ((noun, value))."""

    __slots__ = ()


def _intent(low):
    """'success', 'failure' or None: a success word (sent, delivered...) states success unless a negation governs it
    ('was not sent': failure); a failure word states failure; both, or neither, state nothing."""
    positions = [i for i, word in enumerate(low) if word in _OK_WORDS]
    negated = [_negated_at(low, i) for i in positions]
    success = False in negated
    failure = True in negated or not _FAIL_WORDS.isdisjoint(low)
    if success and not failure:
        return "success"
    if failure and not success:
        return "failure"
    return None


def api_call_claim(claim):
    """The ApiClaim of a claim."""
    toks, low = _words(claim)
    urls = set(filter(None, map(_url, toks)))
    ids = {claimed[:2] for claimed in _claimed_ids(low)}  # (noun, value)
    return ApiClaim(_intent(low), _emails_in(claim), urls, ids)


class ApiFacts(collections.namedtuple("ApiFacts", "status body targets unclaimed")):
    """What api_call evidence says about a claim: status (response_status), body ('success', 'failure' or None: what
    response_body reports), targets (for each email, URL and id the claim names: 'match' when the request's target
    fields have it, 'mismatch' when they have another of its kind, 'absent' when they have none), unclaimed (how many
    targets of a kind the claim names the request has beside them, which the claim does not name: see
    _unclaimed)."""

    __slots__ = ()


def _target_results(claim, emails, urls, rows):
    """The results (see ApiFacts) of the claim's targets against the request's emails, URLs and id rows."""
    results = []
    for email in claim.emails:
        results.append(_result(email in emails, emails))
    bare = [host for host, path in claim.urls if not path]
    hosts = set(_column(urls, 0)) if bare else set()  # the request's hosts, for a claimed bare host: any path on it
    for host, path in claim.urls:
        hit = (host, path) in urls or not path and host in hosts
        results.append(_result(hit, urls))
    nouns = {noun for noun, value in claim.ids}
    names = set(_column(rows, 0)) if nouns - {""} else set()  # the request's ids can be 100,000: read when needed
    numbers = set(_column(rows, 1)) if "" in nouns else set()
    for noun, value in claim.ids:  # compared with the request's ids whose noun agrees ('' agrees with any)
        if not noun:
            results.append(_result(value in numbers, rows))
            continue
        agreeing = _id_names(noun) | _id_names("")
        hit = any((name, value) in rows for name in agreeing)
        results.append(_result(hit, not names.isdisjoint(agreeing)))
    return results


def _unclaimed(claim, emails, urls, rows):
    """How many of the request's targets the claim does not name, among the kinds it names: other addresses (to, cc,
    bcc...), other URLs (a claimed bare host names every path on it), other ids under a noun the claim names with
    its id (customer 78 beside customer_id 79)."""
    others = len(emails - claim.emails) if claim.emails else 0
    if claim.urls:
        other_urls = urls - claim.urls
        hosts = {host for host, path in claim.urls if not path}
        if hosts:
            other_urls = [url for url in other_urls if url[0] not in hosts]
        others += len(other_urls)
    nouns = {noun for noun, _ in claim.ids} - {""}
    owner = {name: noun for noun in nouns for name in _id_names(noun)}  # an id row's name -> the noun it holds
    owned = list(itertools.compress(rows, map(owner.__contains__, _column(rows, 0))))  # in C: up to 100,000 rows
    claimed_rows = zip(map(owner.__getitem__, _column(owned, 0)), _column(owned, 1))  # (noun, value)
    other_ids = set(claimed_rows) - set(claim.ids)
    return others + len(other_ids)


def _result(hit, others):
    """'match' for a hit, else 'mismatch' when the request has others of the kind, else 'absent'."""
    if hit:
        return "match"
    return "mismatch" if others else "absent"


def api_call_facts(ev, claim):
    """The ApiFacts of api_call evidence for a claim."""
    wanted = (claim.emails, claim.urls, claim.ids)
    request = ev.get("request") or {}
    emails, urls, rows = _request_targets(request, wanted)
    targets = _target_results(claim, emails, urls, rows)
    unclaimed = 0 if "mismatch" in targets else _unclaimed(claim, emails, urls, rows)  # see target_not_claimed
    body = _body_outcome(ev.get("response_body"))
    return ApiFacts(ev["response_status"], body, targets, unclaimed)


# The checks: each a reason code's rule over (ApiClaim, ApiFacts).


def _status_says(facts):
    """'success' for 2xx, 'failure' for 4xx and 5xx, None for 1xx and 3xx."""
    if 200 <= facts.status < 300:
        return "success"
    if facts.status >= 400:
        return "failure"
    return None


def status_fits(claim, facts):
    """The HTTP status class fits the claimed success (2xx) or failure (4xx, 5xx)."""
    return claim.intent and _status_says(facts) == claim.intent


def status_fails(claim, facts):
    """Success is claimed but the HTTP status is 4xx or 5xx."""
    return claim.intent == "success" and _status_says(facts) == "failure"


def status_succeeds(claim, facts):
    """Failure is claimed but the HTTP status is 2xx."""
    return claim.intent == "failure" and _status_says(facts) == "success"


def body_fits(claim, facts):
    """The response body reports the claimed outcome."""
    return claim.intent and facts.body == claim.intent


def body_fails(claim, facts):
    """Success is claimed but the response body reports a failure: in a text body, a failure word or a negated
    success word ('could not be delivered'); in a JSON body, at any depth and in lists, a status, state, result or
    outcome failure word, ok or success false, an error that is not null, non-empty errors, or a 4xx/5xx status."""
    return claim.intent == "success" and facts.body == "failure"


def body_succeeds(claim, facts):
    """Failure is claimed but the response body reports success."""
    return claim.intent == "failure" and facts.body == "success"


def targets_match(claim, facts):
    """Every email, URL and id the claim names is in the request's target fields (to, url, NAME_id, /noun/N)."""
    return facts.targets and set(facts.targets) == {"match"}


def target_differs(claim, facts):
    """A target field of the request names a different email, URL or id of the kind the claim names."""
    return "mismatch" in facts.targets


def target_not_claimed(claim, facts):
    """Beside the targets the claim names, the request sends to others of their kind that it does not name (an
    address in to, cc or bcc; another URL; another id of the claimed noun): one signal a target. Where a claimed
    target is missing, target_mismatch says so already."""
    if "mismatch" in facts.targets:
        return 0
    return facts.unclaimed


def target_absent(claim, facts):
    """The request has no target field of a kind the claim names (and none names a different one)."""
    return "absent" in facts.targets and "mismatch" not in facts.targets


API_CALL_CHECKS = (
    (status_fits, "status_matches_claim", POSITIVE),
    (status_fails, "status_failure", CRITICAL),
    (status_succeeds, "status_contradicts_failure_claim", NEGATIVE),
    (body_fits, "body_matches_claim", POSITIVE),
    (body_fails, "body_failure", CRITICAL),
    (body_succeeds, "body_contradicts_failure_claim", NEGATIVE),
    (targets_match, "target_matches", POSITIVE),
    (target_differs, "target_mismatch", CRITICAL),
    (target_not_claimed, "target_not_claimed", NEGATIVE),
    (target_absent, "target_not_in_request", NEGATIVE),
)


def judge_api_call(claim, ev, ev_json=None):
    """{request, response_status, response_body}: the claimed success or failure against the status class and the
    body; the emails, URLs and ids the claim names against the request's targets."""
    claimed = api_call_claim(claim)
    facts = api_call_facts(ev, claimed)
    status_class = "%dxx" % (facts.status // 100)
    details = {"claimed_outcome": claimed.intent, "status_class": status_class, "body_outcome": facts.body}
    return run_checks(CHECKS["api_call"], claimed, facts), details


# ---- §3.6 generic ------------------------------------------------------------------------------------------

# a string or other scalar (a value's text); in masked text (_values_text), a key with its ':', and a string that is
# not a key (kept, as group 1) or a key
_SCALAR = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^,{}\[\]"]*')
_MASKED_KEY = re.compile(r'"[^"]*":')
_STRING_OR_KEY = re.compile(r'("[^"]*")(?!:)|"[^"]*":')
_FILLERS = _word_set("not no now still also the a an being set already currently")  # never a stated value


def _meanings(true_words, false_words):
    """word -> True for each of true_words, False for each of false_words."""
    table = dict.fromkeys(true_words.split(), True)
    table.update(dict.fromkeys(false_words.split(), False))
    return table


# States: what the claim says a key is (a negation before the word flips it), and how the evidence writes them.
_CLAIM_STATES = _meanings("on enabled enable enables activated activate active true",
                          "off disabled disable disables deactivated deactivate inactive false")
_VALUE_STATES = _meanings("true on enabled active yes", "false off disabled inactive no")
# Outcomes (True: success): the claim's words, and the words of status values in the evidence. 'completed' and
# 'done' claim success, but in evidence they say only that something finished (GitHub: status completed,
# conclusion failure).
_CLAIM_OUTCOMES = _meanings("pass passed passes succeed succeeded succeeds success successful successfully complete "
                            "completed ok green",
                            "fail failed fails failing errored timed cancelled canceled aborted crashed")
_VALUE_OUTCOMES = _meanings("ok success succeeded successful passed pass green",
                            "failed failure fail error errored timeout timed_out cancelled canceled aborted rejected "
                            "denied invalid bounced")
_FLAG_KEYS = frozenset(["ok", "success"])  # booleans that report an outcome


def _value_meanings():
    """What a stated value means, so that 'dark_mode is on' meets true and 'status: passed' meets "success"."""
    meanings = {}
    for table in (_CLAIM_STATES, _VALUE_STATES):
        for word, state in table.items():
            meanings[word] = ("state", state)
    for word, outcome in _VALUE_OUTCOMES.items():
        meanings[word] = ("outcome", outcome)
    return meanings


_MEANINGS = _value_meanings()
# Counters of failures above zero, at any depth of the evidence's canonical text in lower case (failed: 3, errors: 1,
# a summary's failures: 2), a failed flag, or a list of errors that is not empty; and in a flat counts, summary,
# stats or totals object, a failure counter written as a word of its own (error, failure, fail, failing, failed,
# singular or plural); and keys of failures of some thing (failed_tests, tests_failed, num_failures). The object's
# members are read up to its end, where the search goes on: each is read once.
_FAILURE_COUNTER = re.compile(
    r'"(?:failed|failures|failing|errors|errored|error_count|errors_count|failed_count|failure_count'
    r'|failures_count|fail_count|num_failed|num_errors)":(?:"?[1-9]|\[(?!\]))|"(?:failed|failing)":true'
    r'|"(?:counts|summary|stats|totals)":\{[^{}\[\]]*?"(?:errors?|failures?|fails?|failing|failed)":"?[1-9]'
    r'|"(?:failed|failing)_[a-z_]*":(?:"?[1-9]|\[(?!\]))|"[a-z_]*_(?:failed|failures|failing)":(?:"?[1-9]|\[(?!\]))'
)
_COUNTER_NAMES = ('"fail', '"error', '"num_')  # what each of them starts with: a search only where one is
# a flat object (no object or list inside) with "passed": 0, and its totals above zero
_ZERO_PASSED = re.compile(r'\{[^{}\[\]]*?"passed":0(?=[,}])[^{}\[\]]*\}')
_TOTAL_ABOVE_ZERO = re.compile(r'"(?:[a-z_]*total[a-z_]*|tests|count|ran|run|executed|num_tests)":"?[1-9]')


def _key_like(word):
    """Whether a word can be a key: letters, digits, '_' and '-'."""
    return word.replace("_", "a").replace("-", "a").isalnum()


_LINKS = ("is", "was", "=", "are", "were")  # what joins a key and the value a claim states for it


def _stated_pair(raw, toks, i):
    """(key, value) the claim states at token i ('KEY is/was/are/were/= VALUE', 'KEY: VALUE', 'KEY=VALUE'), or
    ('', '')."""
    token = raw[i]
    if token.endswith(":") and len(token) > 1:
        return token[:-1], toks[i + 1]
    link = _at(raw, i + 1).lower()
    if link in _LINKS and _at(raw, i + 2):
        return toks[i], toks[i + 2]
    if "=" in token.strip("="):
        key, _, value = token.partition("=")
        return key, _strip(value)
    return "", ""


def _stated_values(raw, toks):
    """key -> the values the claim states for it (see _stated_pair), keys and values in lower case; at most 32 keys,
    so the work is bounded however long the claim."""
    stated = {}
    for i in range(len(raw) - 1):
        key, value = _stated_pair(raw, toks, i)
        name = key.lower()[:64]
        value = value.lower()
        if not name or not value or value in _FILLERS or not _key_like(name):
            continue
        if name in stated or len(stated) < 32:
            stated.setdefault(name, set()).add(value)
    return stated


def _said(low, table):
    """[(position, what a word of table says there)] for the words of a claim that the table holds, each flipped by
    a negation before it ('did not enable': off; 'did not pass': failed)."""
    said = []
    for i, word in enumerate(low):
        if word in table:
            said.append((i, table[word] != _negated_at(low, i)))
    return said


def _nearest_state(words, at):
    """The state of the state word nearest to token position at (words: [(position, state)])."""
    distances = [(abs(position - at), state) for position, state in words]
    return min(distances, key=operator.itemgetter(0))[1]


def _claimed_states(low, text, stated):
    """key -> the state (True: on) the claim gives it: each key of the evidence named within 6 tokens of a state word
    ('enabled dark_mode', 'auto_save is off') takes the nearest one's state, flipped by a negation before it ('did
    not enable x': off). Keys the claim states a value for are judged by that value instead. At most 32 look-ups in
    the evidence text, so the work is bounded however long the claim."""
    words = _said(low, _CLAIM_STATES)
    near = set()
    for i, _ in words:
        near.update(range(i - 6, i + 7))
    excluded = set(_CLAIM_STATES) | _STOP | set(stated)
    nearby = [low[j] for j in sorted(near) if 0 <= j < len(low)]
    candidates = [word for word in nearby if word not in excluded and _key_like(word)]
    first = list(dict.fromkeys(candidates))[:32]
    keys = [word for word in first if '"%s":' % word in text]
    return {key: _nearest_state(words, low.index(key)) for key in keys}


def _evidence_values(text, keys):
    """key -> the first 100 scalar values (texts) that canonical JSON text in lower case has for each of keys, at any
    depth. str.find scans, in C: the work is bounded by the keys and the cap, not by the members of the evidence.
    Inside a JSON string a quote is always escaped, so '"key":' matches members only."""
    values = {}
    for key in keys:
        needle = '"%s":' % key
        found = []
        at = text.find(needle)
        while at >= 0 and len(found) < 100:
            value = _SCALAR.match(text, at + len(needle)).group()  # empty for an object or a list
            if value:
                found.append(value.strip('"'))
            at = text.find(needle, at + len(needle))
        if found:
            values[key] = found
    return values


def _value_code(claimed, found):
    """'explicit_value_conflict', 'explicit_value_match' or None for one key, however often the claim states it:
    numbers meet numbers (in ECMAScript form), words meet strings and literals, alike or of the same meaning. The
    found values (at most 100) are read once."""
    numbers = [n for n in map(_number, found) if n is not None]
    found_numbers = set(map(_es_number, numbers))
    found_words = {v for v in found if _number(v) is None}
    found_meanings = set(map(_MEANINGS.get, found_words)) - {None}
    same = set()
    for val, num in zip(claimed, map(_number, claimed)):  # a value meets only found values of its type, if any
        if num is not None and found_numbers:
            same.add(_es_number(num) in found_numbers)
        elif num is None and found_words:
            meaning = _MEANINGS.get(val)
            same.add(val in found_words or meaning in found_meanings)
    if not same:
        return None
    return "explicit_value_conflict" if False in same else "explicit_value_match"


_COLON_STRING_STARTS = ('{":', '[":', ',":', ':":')  # a string that starts with ':', where it can start


def _values_text(text):
    """Canonical JSON text without its keys, its values apart from each other. Once escaped backslashes and quotes
    are masked, every quote left delimits a string. Keys are then found by a plain pattern, tried at every quote:
    from a closing quote it spans the gap to the next string, so it can take '",":' for a key only where a string
    starts with ':'. There, one pass takes every string whole from the first quote on instead (a key goes with its
    ':', any other string stays). Each character is read at most twice either way."""
    masked = text.replace("\\\\", "\x01").replace('\\"', "\x02")
    colon_first = text.startswith('":') or any(start in text for start in _COLON_STRING_STARTS)
    if colon_first:
        masked = _STRING_OR_KEY.sub(r"\1 ", masked)
    else:
        masked = _MASKED_KEY.sub(" ", masked)
    unmasked = masked.replace("\x02", '\\"').replace("\x01", "\\\\")
    return unmasked.replace(",", ", ")


class GenericClaim(collections.namedtuple("GenericClaim", "low entities stated outcome negated not_done every")):
    """A generic claim: low (its tokens in lower case), entities (distinct normalised numbers of 10 or more, emails,
    URLs, paths and identifiers; never true, false or null), stated (key -> the values it states: KEY is VALUE),
    outcome (True: it says something passed, succeeded or completed; False: failed; None: neither, or both),
    negated (it holds a negation: not, never, didn't...), not_done (it opens with an action only intended or
    attempted: 'Will deploy', 'We are going to', 'Tried to'), every (it speaks of all, every or each of a thing:
    'all tests passed')."""

    __slots__ = ()


def _entity(token):
    """Whether a token is an email, URL, path or identifier."""
    if _email(token) or _url(token):
        return True
    return _pathish(token) or bool(_identifier(token))


def _entities(toks):
    """The distinct normalised entities among a claim's tokens (see GenericClaim). Numbers below 10 match by chance
    ('3 databases', '0 errors')."""
    numbers = [n for n in map(_number, toks) if n is not None and n >= 10]
    entities = set(map(_es_number, numbers))
    for token in toks:
        word = token.lower()
        if word not in ("true", "false", "null") and _number(token) is None and _entity(token):
            entities.add(word)
    return entities


def _claimed_outcome(low):
    """True, False or None: the claim's outcome words (a negation flips them: 'did not pass'), when they agree."""
    outcomes = {outcome for _, outcome in _said(low, _CLAIM_OUTCOMES)}
    return outcomes.pop() if len(outcomes) == 1 else None


def generic_claim(claim):
    """The GenericClaim of a claim."""
    raw = _raw_tokens(claim)
    toks = [_strip(token) for token in raw]
    low = _lower(toks)
    negated = not _NOT.isdisjoint(low)
    stated = _stated_values(raw, toks)
    not_done = _not_done_at(low, min(3, len(low)))  # no verb table: the claim's first three words
    every = not _EVERY.isdisjoint(low)
    return GenericClaim(low, _entities(toks), stated, _claimed_outcome(low), negated, not_done, every)


class GenericFacts(collections.namedtuple("GenericFacts", "entities_matched values states reported partial")):
    """What an object says about a generic claim. entities_matched: how many of the claim's entities (when it names
    at least 3) are among the evidence's values (a key that matches is no support); values: each stated key's
    result, 'explicit_value_match' or 'explicit_value_conflict'; states: each key the claim turns on or off ->
    'match' or 'conflict'; reported: the outcomes (True, False) that status, state, result, outcome and conclusion
    values, ok and success flags, and failure counters (failed: 3; passed: 0 beside a total above 0) report at any
    depth; partial: a flat object at any depth counts fewer passed than its total (passed: 9, total: 10)."""

    __slots__ = ()


def _as_values(entity):
    """How an entity may stand among the values' tokens: alone, or with what may follow a value in JSON text or
    prose."""
    return [entity + end for end in ("", ".", ",", ":", "/", "!", "?")]


def _matched_entities(entities, text):
    """How many entities are values of the evidence (canonical text in lower case), with what may follow a value in
    JSON text or prose. Fewer than 3 entities cannot support a verdict: the evidence is then not tokenised."""
    if len(entities) < 3:
        return 0
    have = set(_raw_tokens(_values_text(text)))
    return sum(not have.isdisjoint(_as_values(entity)) for entity in entities)


def _counters_fail(text):
    """Whether failure counters in the evidence report a failure: a counter of failures above zero anywhere, or
    passed: 0 beside a total above zero in the same (flat) object."""
    named = any(name in text for name in _COUNTER_NAMES)
    if named and _FAILURE_COUNTER.search(text):
        return True
    if '"passed":0' not in text:
        return False
    zero_passed = _ZERO_PASSED.findall(text)[:100]
    return any(map(_TOTAL_ABOVE_ZERO.search, zero_passed))


# a flat object (no object or list inside) that counts what passed; and the keys of the totals beside it
_PASSED_OBJECT = re.compile(r'\{[^{}\[\]]*?"passed":[0-9]+(?=[,}])[^{}\[\]]*\}')
_TOTAL_KEYS = frozenset(["total", "tests", "count", "ran", "run", "executed", "num_tests", "total_count"])


def _fewer_passed(text):
    """Whether a flat object of the evidence (canonical text in lower case; the first 100 that count passed) counts
    fewer passed than a total beside it."""
    if '"passed":' not in text:
        return False
    for found in _PASSED_OBJECT.findall(text)[:100]:
        counts = json.loads(found)
        totals = [value for key, value in counts.items() if key in _TOTAL_KEYS or key.startswith("total")]
        numbers = [value for value in totals if type(value) is int]  # neither a bool nor a float
        if any(value > counts["passed"] for value in numbers):
            return True
    return False


def _reported(values, stated, text):
    """The outcomes the evidence reports (see GenericFacts); keys the claim states a value for are judged by that
    value instead."""
    reported = set()
    for key in _STATUS_KEYS - set(stated):
        found = map(str.strip, values.get(key, ()))
        reported.update(map(_VALUE_OUTCOMES.get, found))
    for key in _FLAG_KEYS - set(stated):
        reported.update(map(_VALUE_STATES.get, values.get(key, ())))
    if _counters_fail(text):
        reported.add(False)
    return reported - {None}


def _state_result(state, found):
    """'conflict' when a value of the key holds the other state, 'match' when one holds this one, else None."""
    states = {_VALUE_STATES.get(value) for value in found} - {None}
    if (not state) in states:
        return "conflict"
    return "match" if states else None


def generic_facts(ev, ev_json, claim):
    """The GenericFacts of an object for a claim (ev_json: its canonical text, when the caller has it)."""
    text = ev_json if ev_json is not None else _canonical_text(ev)
    text = text.lower()
    states = _claimed_states(claim.low, text, claim.stated)
    keys = _STATUS_KEYS.union(claim.stated, states, _FLAG_KEYS)
    values = _evidence_values(text, keys)
    value_results = []
    for key, claimed in claim.stated.items():
        value_results.append(_value_code(claimed, values.get(key, [])))
    state_results = []
    for key, state in states.items():
        state_results.append(_state_result(state, values.get(key, ())))
    entities = _matched_entities(claim.entities, text)
    partial = claim.every and claim.outcome is True and _fewer_passed(text)
    return GenericFacts(entities, value_results, state_results, _reported(values, claim.stated, text), partial)


# The checks: each a reason code's rule over (GenericClaim, GenericFacts).


def entities_found(claim, facts):
    """The claim names at least 3 distinct entities (numbers >= 10, URLs, emails, paths, identifiers) that are values
    of the evidence: one signal for each entity found, when at least 3 are."""
    return facts.entities_matched if facts.entities_matched >= 3 else 0


def values_match(claim, facts):
    """The value the claim states for a key (KEY is VALUE, KEY: VALUE) is the evidence's, at any depth: one signal a
    key."""
    return facts.values.count("explicit_value_match")


def values_conflict(claim, facts):
    """A value the claim states for a key differs from the evidence's: one signal a key."""
    return facts.values.count("explicit_value_conflict")


def states_match(claim, facts):
    """A key the claim turns on (enabled, true, active) or off holds that state: one signal a key."""
    return facts.states.count("match")


def states_conflict(claim, facts):
    """A key the claim turns on or off (did not enable: off) holds the other state: one signal a key."""
    return facts.states.count("conflict")


def _opposite_reported(claim, facts):
    """Whether the claim states an outcome and the evidence reports the opposite."""
    return claim.outcome is not None and (not claim.outcome) in facts.reported


def outcome_agrees(claim, facts):
    """The claim's outcome (passed, succeeded, completed; failed) is what the evidence reports, and nothing there
    reports the opposite."""
    return claim.outcome in facts.reported and not _opposite_reported(claim, facts)


def outcome_contradicted(claim, facts):
    """The evidence reports the opposite of the claim's outcome at any depth: a status, state, result, outcome or
    conclusion value, an ok or success flag, or for a claimed success a counter of failures above zero (failed,
    failures, errors, error_count...) or passed: 0 beside a total above zero. Entity matches never outweigh it."""
    return _opposite_reported(claim, facts)


def not_all_passed(claim, facts):
    """The claim says all (every, each) passed or succeeded, and the evidence counts fewer passed than its total
    (passed: 9 beside total: 10), where no outcome_conflict says more."""
    return facts.partial and not _opposite_reported(claim, facts)


def failure_reported(claim, facts):
    """The claim states no outcome, but the evidence reports a failure (a status value, a flag or a counter)."""
    return claim.outcome is None and False in facts.reported


GENERIC_CHECKS = (
    (entities_found, "entities_match", POSITIVE),
    (values_match, "explicit_value_match", POSITIVE),
    (values_conflict, "explicit_value_conflict", CRITICAL),
    (states_match, "state_matches", POSITIVE),
    (states_conflict, "state_conflict", CRITICAL),
    (outcome_agrees, "outcome_matches", POSITIVE),
    (outcome_contradicted, "outcome_conflict", CRITICAL),
    (not_all_passed, "not_all_passed", CRITICAL),
    (failure_reported, "evidence_reports_failure", NEGATIVE),
    (claim_is_negated, "claim_negated", NEGATIVE),
    (claim_is_not_done, "claim_not_done", NEGATIVE),
)


def judge_generic(claim, ev, ev_json=None):
    """Any object, judged conservatively: at least 3 distinct entities among the evidence's values, values the claim
    states for keys (KEY is VALUE), states it gives keys (enabled X), and its outcome (passed, failed) against every
    status value and failure counter."""
    claimed = generic_claim(claim)
    facts = generic_facts(ev, ev_json, claimed)
    details = {"entities_matched": facts.entities_matched}
    return run_checks(CHECKS["generic"], claimed, facts), details


# ---- §3.7 Evidence checks, dispatch, judgement and the vocabulary ------------------------------------------


def _is_count(value):
    """Whether value is a count: an integer (not a bool) from 0 to BOUNDS' count_max."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return 0 <= value <= BOUNDS["count_max"]


def _is_text(value):
    """Whether value is a string."""
    return isinstance(value, str)


def _is_nonempty_text(value):
    """Whether value is a string that is not empty."""
    return isinstance(value, str) and value != ""


def _is_flag(value):
    """Whether value is true or false."""
    return isinstance(value, bool)


def _is_status(value):
    """Whether value is an HTTP status code (100-599)."""
    return _is_count(value) and 100 <= value <= 599


def _is_request(value):
    """Whether value is a request as api_call reads it: a string or an object."""
    return isinstance(value, (str, dict))


EVIDENCE = {  # kind -> ({field: (type check, length bound)}, groups of fields: the evidence needs one complete group)
    "code_diff": ({"diff": (_is_text, "diff_chars")}, [("diff",)]),
    "db_op": (
        {
            "before_count": (_is_count, None),
            "after_count": (_is_count, None),
            "affected_rows": (_is_count, None),
            "operation": (_is_nonempty_text, "operation_chars"),
        },
        [("before_count", "after_count"), ("affected_rows",), ("operation",)],
    ),
    "file_op": (
        {
            "path": (_is_nonempty_text, "path_chars"),
            "new_path": (_is_nonempty_text, "path_chars"),
            "exists_before": (_is_flag, None),
            "exists_after": (_is_flag, None),
            "line_count": (_is_count, None),
            "size_bytes": (_is_count, None),
        },
        [("path", "exists_before", "exists_after")],
    ),
    "api_call": ({"response_status": (_is_status, None), "request": (_is_request, "request_chars")},
                 [("response_status",)]),
    "generic": ({}, [()]),
}


def _has_all(ev, fields):
    """Whether the evidence has each of fields (null is absent)."""
    return all(ev.get(field) is not None for field in fields)


def check_evidence(kind, ev):
    """A code when the evidence cannot be judged as kind (evidence_invalid: a field of the wrong type;
    evidence_too_large: beyond its bound; evidence_missing_fields: no complete group), else None. A null field is
    absent."""
    fields, groups = EVIDENCE[kind]
    for name, (type_ok, bound) in fields.items():
        value = ev.get(name)
        if value is not None and not type_ok(value):
            return "evidence_invalid"
        if bound and isinstance(value, str) and len(value) > BOUNDS[bound]:
            return "evidence_too_large"
    complete = [group for group in groups if _has_all(ev, group)]
    return None if complete else "evidence_missing_fields"


CHECKS = {  # kind -> its table of checks; each judge looks it up when it runs
    "code_diff": CODE_DIFF_CHECKS,
    "db_op": DB_OP_CHECKS,
    "file_op": FILE_OP_CHECKS,
    "api_call": API_CALL_CHECKS,
    "generic": GENERIC_CHECKS,
}
_JUDGES = {  # kind -> judge(claim, evidence, the evidence's canonical JSON text or None) -> (signals, details)
    "code_diff": judge_code_diff,
    "db_op": judge_db_op,
    "file_op": judge_file_op,
    "api_call": judge_api_call,
    "generic": judge_generic,
}
_SHAPES = (  # dispatch by evidence shape, in this order
    ("code_diff", ("diff",)),
    ("db_op", ("before_count", "after_count", "affected_rows")),
    ("file_op", ("exists_before", "exists_after", "line_count", "size_bytes")),
    ("api_call", ("request", "response_status", "response_body")),
)


def _dispatch_order():
    """The order in which a request's kind is chosen, as /rules states it."""
    order = ["the kind field, case-insensitive"]
    for kind, fields in _SHAPES:
        order.append("any of %s -> %s" % (", ".join(fields), kind))
    order.append("otherwise generic (operation alone never selects db_op)")
    return order


DISPATCH = _dispatch_order()


def dispatch_kind(evidence, kind=None):
    """The requested kind (case-insensitive), else by evidence shape (null is absent, as for checks)."""
    if kind:
        return kind.lower()
    for shaped, fields in _SHAPES:
        if any(evidence.get(field) is not None for field in fields):
            return shaped
    return "generic"


GENERAL_CODES = {  # code -> (effect, meaning): the codes no kind's table holds
    "no_signal": ("none", "No check fired: reason_codes holds this code alone, and signals is empty."),
    "evidence_missing_fields": (NEGATIVE, "The evidence lacks the fields this kind needs (see evidence)."),
    "evidence_invalid": (UNSAFE, "A field this kind reads has the wrong type or shape: nothing was judged."),
    "evidence_too_large": (UNSAFE, "A field exceeds this kind's bound (see bounds): nothing was judged."),
    "verifier_error": (UNSAFE, "A rule failed unexpectedly: nothing was judged."),
}


class Reason(collections.namedtuple("Reason", "kind effect meaning summary")):
    """A reason code of the closed vocabulary: the kinds whose tables hold it ('any' for a general code), its effect,
    what it means (its check's docstring), and that in short (for a response's reasoning)."""

    __slots__ = ()


def _meaning(test):
    """A check's docstring on one line: the meaning of its code."""
    return " ".join(test.__doc__.split())


_ASIDE = re.compile(r"\s*\([^()]*\)")  # a meaning's words in parentheses


def _summary(meaning):
    """A meaning in short: without its words in parentheses, and up to its first ': '."""
    plain = _ASIDE.sub("", meaning)
    head = plain.split(": ", 1)[0]
    return head.rstrip(".") + "."


def _vocabulary():
    """code -> Reason for every code a response can carry: the general codes, then each table's in table order."""
    kinds = {}
    rows = {}
    for kind, table in CHECKS.items():
        for test, code, effect in table:
            kinds.setdefault(code, []).append(kind)
            rows.setdefault(code, (test, effect))
    reasons = {}
    for code, (effect, meaning) in GENERAL_CODES.items():
        reasons[code] = Reason("any", effect, meaning, _summary(meaning))
    for code, (test, effect) in rows.items():
        kind = ", ".join(kinds[code])
        meaning = _meaning(test)
        reasons[code] = Reason(kind, effect, meaning, _summary(meaning))
    return reasons


REASONS = _vocabulary()  # the closed vocabulary: nothing else is emitted


class Judgement(collections.namedtuple("Judgement", "kind signals codes details verdict confidence")):
    """What the rules made of a request: the kind judged, the signals (in table order), codes (their distinct codes
    in order, or no_signal alone), details (facts of the kind, never raw input beyond paths), verdict, confidence."""

    __slots__ = ()


def _unsafe(code):
    """The signals of a judgement stopped before its checks ran."""
    return [Signal(code, UNSAFE, 1)]


def _in_vocabulary(signal):
    """Whether a signal's code is in the vocabulary with its effect, and fired at least once."""
    reason = REASONS.get(signal.code)
    return reason is not None and reason.effect == signal.effect and signal.count >= 1


def _signals(kind, claim, evidence, evidence_json):
    """The signals of one request (see judge)."""
    try:
        problem = check_evidence(kind, evidence)
        if problem:
            return [Signal(problem, REASONS[problem].effect, 1)], {}
        signals, details = _JUDGES[kind](claim, evidence, evidence_json)
    except EvidenceTooLarge:
        return _unsafe("evidence_too_large"), {}
    except Exception:  # any bug: answered and signed, never dropped
        return _unsafe("verifier_error"), {}
    if not all(map(_in_vocabulary, signals)):  # a misspelt code: the vocabulary is closed
        return _unsafe("verifier_error"), {}
    return signals, details


def judge(kind, claim, evidence, evidence_json=None):
    """The Judgement of a claim and its evidence as kind; never raises: a rule failure is unsafe_to_verify
    (verifier_error). evidence_json: the evidence's canonical text, if the caller has it (generic reads it instead
    of re-encoding)."""
    signals, details = _signals(kind, claim, evidence, evidence_json)
    distinct = dict.fromkeys(signal.code for signal in signals)
    codes = list(distinct) or ["no_signal"]
    verdict = decide(signals)
    return Judgement(kind, signals, codes, details, verdict, confidence(verdict, signals))


# ============================================================================================================
# §4 Receipts (pure given a key ring)
# ============================================================================================================

RECEIPT_FIELDS = {  # field -> what it holds, in the order receipts carry them (GET /spec documents each)
    "schema": "\"verify_action_receipt.v0\".",
    "claim_hash": "\"sha256:\" + hex SHA-256 of the claim's UTF-8.",
    "evidence_manifest_hash": "\"sha256:\" + hex SHA-256 of the RFC 8785 canonical JSON of evidence.",
    "request_hash": "The same over the whole request as received (MCP: the arguments): kind and contexts are bound.",
    "verifier_id": "\"verify_action.py@<version>\".",
    "verifier_method": "\"rule_based.<kind>\".",
    "verdict": "The aar_verdict.",
    "confidence": "In the verdict, 0..1.",
    "reason_codes": "The distinct codes of signals, in order (no_signal alone when there are none); never input.",
    "signals": (
        "[{code, effect, count}] in the order the rules produced them: GET /rules' decision and confidence functions "
        "applied to them give verdict and confidence. A receipt issued before this field existed has none and is "
        "checked over the fields it has."
    ),
    "policy_or_oracle_refs": "[]: no oracle is used.",
    "caller_context": "As received; {} when absent.",
    "issued_at": "RFC 3339 UTC time.",
    "issued_by": "--issuer.",
    "kid": "Key id in the operator's key ring.",
    "signature": (
        "\"hmac-sha256:\" + unpadded base64url HMAC-SHA256 under the kid's key of the canonical JSON of the receipt "
        "without signature."
    ),
}
_EARLIER_FIELDS = frozenset(RECEIPT_FIELDS) - {"signals"}  # a receipt issued before signals were added
_RECEIPT_FIELD_SETS = (frozenset(RECEIPT_FIELDS), _EARLIER_FIELDS)
_KID_PUNCTUATION = {ord(c): "a" for c in "-_."}  # allowed in a kid besides letters and digits
VERIFIER_ID = "verify_action.py@" + VERSION


def _key_bytes(field):
    """The bytes of a base64url key (padding optional), or b'' when it is not base64url."""
    padding = "=" * (-len(field) % 4)
    try:
        return base64.urlsafe_b64decode(field + padding)
    except (ValueError, TypeError):
        return b""


def _kid_ok(kid):
    """Whether kid is a key id: at most 64 ASCII letters, digits, '-', '_' and '.'."""
    if not kid.isascii() or len(kid) > 64:
        return False
    return kid.translate(_KID_PUNCTUATION).isalnum()


def _key_pair(fields):
    """(kid, key) of the fields of a key-ring line, or None unless they are a kid and a key of at least 32 bytes."""
    if len(fields) != 2 or not _kid_ok(fields[0]):
        return None
    key = _key_bytes(fields[1])
    if len(key) < 32:
        return None
    return fields[0], key


ED25519_ALG = "ed25519"  # keygen --alg, and the second field of an Ed25519 key-ring line


def _ed25519_pair(fields):
    """(kid, seed) of the fields of an Ed25519 key-ring line, 'kid ed25519 seed' (the seed: 32 bytes, base64url),
    or None unless they are one."""
    if len(fields) != 3 or fields[1] != ED25519_ALG or not _kid_ok(fields[0]):
        return None
    seed = _key_bytes(fields[2])
    if len(seed) != 32:
        return None
    return fields[0], seed


KEY_LINES = {  # the lines of a key ring: its format, as keygen writes it and /spec documents it
    "hmac": "kid key: an HMAC-SHA256 key of at least 32 bytes, unpadded base64url.",
    ED25519_ALG: "kid ed25519 seed: an Ed25519 private key, its 32-byte seed (RFC 8032), unpadded base64url.",
    "rules": (
        "'#' starts a comment. Each kid appears once. The last key of each kind signs; every key verifies, so a "
        "retired key is kept. A ring needs an HMAC key: every receipt carries an HMAC signature."
    ),
}
_KEY_LINE_ERROR = (
    "line %d: expected 'kid key' (a base64url key of >= 32 bytes) or 'kid ed25519 seed' (a base64url seed of 32 "
    "bytes), with a new kid"
)


class KeyRing(object):
    """HMAC keys by kid: the last key signs new receipts, every key verifies. Ed25519 seeds by kid: when there are
    any, the last signs a credential beside each receipt, and every public key verifies credentials."""

    def __init__(self, pairs, ephemeral=False, ed25519=()):
        if not pairs and ed25519:
            raise ValueError("the key ring has no HMAC key: receipts need one (run keygen without --alg)")
        if not pairs:
            raise ValueError("the key ring has no keys")
        self.keys = collections.OrderedDict(pairs)
        self.kid = pairs[-1][0]
        self.ephemeral = ephemeral
        self._seeds = collections.OrderedDict(ed25519)
        publics = [(kid, secret_to_public(seed)) for kid, seed in ed25519]
        self.public_keys = collections.OrderedDict(publics)  # kid -> 32-byte Ed25519 public key, retired ones too
        self.signer = ed25519[-1][0] if ed25519 else None  # the kid of the Ed25519 key that signs credentials

    @classmethod
    def parse(cls, text, allow_empty=False):
        """The key ring of KEY_LINES' lines. Raises ValueError; None for a ring without keys when allow_empty."""
        pairs = []
        seeds = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            pair = _key_pair(fields)
            into = pairs
            if pair is None:
                pair = _ed25519_pair(fields)
                into = seeds
            if pair is None or pair[0] in dict(pairs + seeds):
                raise ValueError(_KEY_LINE_ERROR % number)
            into.append(pair)
        if pairs or seeds or not allow_empty:
            return cls(pairs, ed25519=seeds)
        return None

    def methods(self):
        """GET /keys: every Ed25519 verification method of the ring, retired ones too, as {kid, signs, id, type,
        controller, publicKeyMultibase}; never a seed or an HMAC key."""
        methods = []
        for kid, public in self.public_keys.items():
            did = did_key(public)
            method = {
                "kid": kid,
                "signs": kid == self.signer,
                "id": verification_method(public),
                "type": "Multikey",
                "controller": did,
                "publicKeyMultibase": did[len(DID_KEY):],
            }
            methods.append(method)
        return methods

    def credential(self, receipt):
        """The receipt as a Verifiable Credential secured by the signing Ed25519 key's eddsa-jcs-2022 proof, or None
        when the ring has no Ed25519 key. Its validFrom and the proof's created are the receipt's issued_at."""
        if self.signer is None:
            return None
        issued_at = receipt["issued_at"]
        did = did_key(self.public_keys[self.signer])
        credential = credential_for(receipt, did, issued_at)
        proof = create_proof(credential, self._seeds[self.signer], issued_at, _jcs)
        credential["proof"] = proof
        return credential

    @classmethod
    def generate(cls):
        """A one-process key ring: its receipts cannot be verified after a restart."""
        kid = "ephemeral-" + secrets.token_hex(4)
        return cls([(kid, secrets.token_bytes(32))], ephemeral=True)

    def mac(self, kid, body):
        """The signature field of a receipt body (without signature) under key kid. A receipt body is small, and
        carries a version string json.dumps text could be misread by: _jcs writes it directly."""
        text = _jcs(body).encode("utf-8")
        mac = hmac.new(self.keys[kid], text, hashlib.sha256)
        return "hmac-sha256:" + _b64url(mac.digest())


def _signals_json(signals):
    """Signals as responses and receipts carry them: [{"code", "effect", "count"}]."""
    return [signal.as_json() for signal in signals]


def issue_receipt(request, judgement, keyring, issuer, now, members=None):
    """A signed receipt for one judged request (request: the object as received, already validated; judgement: its
    Judgement; members: its canonical_members, when the caller has them)."""
    members = members or canonical_members(request)
    claim_hash = _sha(request["claim"].encode("utf-8"))
    evidence_hash = _sha(members["evidence"].encode("utf-8"))
    request_hash = _sha(members[None].encode("utf-8"))
    caller = request.get("caller_context", {})
    issued_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    method = "rule_based." + judgement.kind
    codes = list(judgement.codes)
    signals = _signals_json(judgement.signals)
    body = {
        "schema": SCHEMA,
        "claim_hash": claim_hash,
        "evidence_manifest_hash": evidence_hash,
        "request_hash": request_hash,
        "verifier_id": VERIFIER_ID,
        "verifier_method": method,
        "verdict": judgement.verdict,
        "confidence": judgement.confidence,
        "reason_codes": codes,
        "signals": signals,
        "policy_or_oracle_refs": [],
        "caller_context": caller,
        "issued_at": issued_at,
        "issued_by": issuer,
        "kid": keyring.kid,
    }
    body["signature"] = keyring.mac(keyring.kid, body)
    return body


def _receipt_shape(receipt):
    """Whether receipt has a receipt's fields (RECEIPT_FIELDS, or those of an earlier receipt, without signals) and a
    kid and an hmac-sha256 signature that are strings."""
    if not isinstance(receipt, dict) or set(receipt) not in _RECEIPT_FIELD_SETS:
        return False
    signature = receipt["signature"]
    signed = isinstance(signature, str) and signature.startswith("hmac-sha256:")
    return signed and isinstance(receipt["kid"], str)


def verify_receipt(receipt, keyring):
    """(valid, reason, kid): reason is ok, malformed, unsupported_schema, unknown_kid or bad_signature."""
    if not _receipt_shape(receipt):
        return False, "malformed", None
    kid = receipt["kid"]
    if receipt["schema"] != SCHEMA:
        return False, "unsupported_schema", kid
    if kid not in keyring.keys:
        return False, "unknown_kid", kid
    unsigned = dict(receipt)
    del unsigned["signature"]
    try:
        expected = keyring.mac(kid, unsigned)
    except (TypeError, ValueError):  # a field that is not JSON (NaN...)
        return False, "malformed", kid
    signature = receipt["signature"].encode("utf-8", "replace")
    valid = hmac.compare_digest(expected.encode("utf-8"), signature)
    return valid, "ok" if valid else "bad_signature", kid



# ============================================================================================================
# §4b Ed25519 signatures, did:key and eddsa-jcs-2022 credentials (pure)
# ============================================================================================================
# RFC 8032 §6's arithmetic with its names. Points are tuples of extended coordinates (X, Y, Z, T): x = X/Z,
# y = Y/Z, x*y = T/Z. Verification is strict, as verified_memory.py's: a key or R that is not the canonical
# encoding of a curve point (y >= p, "-0") fails to decode, a key or R of small order is refused (such a key lets
# anyone forge), S must be below q, and the equation is the cofactorless [S]G == R + [h]A.
# Signing handles a secret, and pure Python cannot be constant time: see base_mul.

p = 2**255 - 19                                          # the field: integers mod p
q = 2**252 + 27742317777372353535851937790883648493      # the order of G (L in RFC 8032 §5.1)


def modp_inv(x):
    """1/x mod p. Python's modular inverse (3.8+), far cheaper than the RFC's x^(p-2)."""
    return pow(x, -1, p)


d = -121665 * modp_inv(121666) % p                       # the curve: -x^2 + y^2 = 1 + d x^2 y^2
modp_sqrt_m1 = pow(2, (p - 1) // 4, p)                   # a square root of -1
NEUTRAL = (0, 1, 1, 0)                                   # the point (0, 1), the group's neutral element


def sha512_modq(s):
    """SHA-512 of the bytes s, read as a little-endian integer and reduced mod q."""
    digest = hashlib.sha512(s).digest()
    return int.from_bytes(digest, "little") % q


def point_add(P, Q):
    """P + Q (RFC 8032 §5.1.4: add-2008-hwcd-3, complete for this curve, so it also doubles)."""
    X1, Y1, Z1, T1 = P
    X2, Y2, Z2, T2 = Q
    A = (Y1 - X1) * (Y2 - X2) % p
    B = (Y1 + X1) * (Y2 + X2) % p
    C = 2 * T1 * T2 * d % p
    D = 2 * Z1 * Z2 % p
    E = B - A
    F = D - C
    G = D + C
    H = B + A
    X3 = E * F % p
    Y3 = G * H % p
    Z3 = F * G % p
    T3 = E * H % p
    return (X3, Y3, Z3, T3)


def point_mul(s, P):
    """[s]P for an integer s >= 0, by double-and-add from the lowest bit (variable time: for public s only)."""
    Q = NEUTRAL
    while s > 0:
        if s & 1:
            Q = point_add(Q, P)
        P = point_add(P, P)
        s >>= 1
    return Q


def point_equal(P, Q):
    """True iff P and Q are the same point: x1/z1 == x2/z2 and y1/z1 == y2/z2."""
    X1, Y1, Z1, _ = P
    X2, Y2, Z2, _ = Q
    if (X1 * Z2 - X2 * Z1) % p != 0:
        return False
    if (Y1 * Z2 - Y2 * Z1) % p != 0:
        return False
    return True


def is_small_order(P):
    """True iff [8]P is the neutral element: P is one of the 8 points of order 1, 2, 4 or 8."""
    return point_equal(point_mul(8, P), NEUTRAL)


def recover_x(y, sign):
    """The x of the curve point with this y whose low bit is `sign`, or None if there is none (RFC 8032 §5.1.3)."""
    if y >= p:
        return None
    # Reduced before the test for 0: RFC 8032 §6 tests the unreduced product and so decodes "-0" forms.
    u = y * y - 1
    v = d * y * y + 1
    x2 = u * modp_inv(v) % p
    if x2 == 0:
        if sign:
            return None
        return 0
    x = pow(x2, (p + 3) // 8, p)                         # if x2 is a square: a root of x2 or of -x2
    if (x * x - x2) % p != 0:
        x = x * modp_sqrt_m1 % p
    if (x * x - x2) % p != 0:
        return None                                      # x2 is not a square: no such point
    if (x & 1) != sign:
        x = p - x
    return x


def point_compress(P):
    """The 32-byte encoding of P (RFC 8032 §5.1.2): y, little-endian, with the low bit of x in the top bit."""
    X, Y, Z, _ = P
    zinv = modp_inv(Z)
    x = X * zinv % p
    y = Y * zinv % p
    return int.to_bytes(y | ((x & 1) << 255), 32, "little")


def point_decompress(s):
    """The point whose canonical 32-byte encoding is s (RFC 8032 §5.1.3), or None."""
    if len(s) != 32:
        return None
    y = int.from_bytes(s, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = recover_x(y, sign)
    if x is None:
        return None
    return (x, y, 1, x * y % p)


g_y = 4 * modp_inv(5) % p                                # the base point G: y = 4/5, x even
g_x = recover_x(g_y, 0)
G = (g_x, g_y, 1, g_x * g_y % p)
BASE_WINDOW = 8                                          # bits of the scalar each row of base_table covers
BASE_ROWS = 256 // BASE_WINDOW


@functools.lru_cache(maxsize=None)
def base_table():
    """Row i, entry j: the point [j * 2^(BASE_WINDOW * i)]G, for every row of a 256-bit scalar. Made once, on
    first use: BASE_ROWS tuples of 2^BASE_WINDOW points."""
    rows = []
    start = G                                            # [2^(BASE_WINDOW * i)]G for the row being made
    for _ in range(BASE_ROWS):
        row = [NEUTRAL]
        for _ in range((1 << BASE_WINDOW) - 1):
            row.append(point_add(row[-1], start))
        rows.append(tuple(row))
        start = point_add(row[-1], start)
    return tuple(rows)


def base_mul(s):
    """[s]G for 0 <= s < 2^256, from base_table: equals point_mul(s, G), in BASE_ROWS additions whatever s is.
    The index of each lookup is a byte of s, which is secret when signing (the key a, the nonce r). Indexing a
    Python list takes the same steps for every index, but the entry read shows in the cache, and big-integer
    arithmetic is faster on some values (the neutral entry for a zero byte), so a process that can time this one
    or watch its cache may learn bits of s, and from them the key."""
    if not 0 <= s < 1 << 256:
        raise ValueError("base_mul takes a scalar below 2^256")
    mask = (1 << BASE_WINDOW) - 1
    Q = NEUTRAL
    for row in base_table():
        Q = point_add(Q, row[s & mask])
        s >>= BASE_WINDOW
    return Q


def secret_expand(secret):
    """(a, prefix) of a 32-byte seed (RFC 8032 §5.1.5): the clamped scalar, and the nonce key."""
    if len(secret) != 32:
        raise ValueError("an Ed25519 secret key is 32 bytes")
    h = hashlib.sha512(secret).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    return (a, h[32:])


@functools.lru_cache(maxsize=64)
def expanded_key(secret):
    """(a, prefix, A) of a 32-byte seed: secret_expand's scalar and nonce key, and the public key A = [a]G encoded.
    Cached, as a key ring signs with one seed again and again and [a]G costs half a signature. A is always made
    here from the seed, never taken from a caller: two signatures of one message under different A reveal a."""
    a, prefix = secret_expand(secret)
    A = point_compress(base_mul(a))
    return (a, prefix, A)


def secret_to_public(secret):
    """The 32-byte public key of a 32-byte seed (RFC 8032 §5.1.5)."""
    return expanded_key(secret)[2]


def sign(secret, msg):
    """The 64-byte Ed25519 signature R || S of the bytes msg under a 32-byte seed (RFC 8032 §5.1.6)."""
    a, prefix, A = expanded_key(secret)
    r = sha512_modq(prefix + msg)
    Rs = point_compress(base_mul(r))
    h = sha512_modq(Rs + A + msg)
    s = (r + h * a) % q
    return Rs + int.to_bytes(s, 32, "little")


def verify(public, msg, signature):
    """True iff signature (64 bytes) is a strict Ed25519 signature of msg by public (32 bytes), as this
    section's first lines define strict. Anything else gives False, whatever its type: never raises."""
    inputs = (public, msg, signature)
    if not all(isinstance(value, bytes) for value in inputs):
        return False
    if len(public) != 32 or len(signature) != 64:
        return False
    A = point_decompress(public)
    if A is None or is_small_order(A):
        return False
    Rs = signature[:32]
    R = point_decompress(Rs)
    if R is None or is_small_order(R):
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= q:                                           # S + q would verify too (RFC 8032 §8.4)
        return False
    h = sha512_modq(Rs + public + msg)
    sB = base_mul(s)
    hA = point_mul(h, A)
    return point_equal(sB, point_add(R, hA))


# base58btc (the Bitcoin alphabet), multibase and did:key (W3C CCG did:key v0.9; the Multibase section of W3C
# Controlled Identifiers). A run of leading zero bytes is a run of '1's; the rest is one big-endian number in base 58.
BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
BASE58_DIGITS = {char: value for value, char in enumerate(BASE58_ALPHABET)}
BASE58_MAX_CHARS = 128            # longer than any key or signature here; the decoding's cost grows as its square
MULTIBASE_BASE58BTC = "z"
ED25519_PUB_MULTICODEC = b"\xed\x01"  # the varint of 0xed, multicodec ed25519-pub
DID_KEY = "did:key:"


def base58_encode(data):
    """The base58btc text of the bytes data."""
    zeros = len(data) - len(data.lstrip(b"\x00"))
    n = int.from_bytes(data, "big")
    digits = []
    while n:
        n, digit = divmod(n, 58)
        digits.append(BASE58_ALPHABET[digit])
    digits.reverse()
    return "1" * zeros + "".join(digits)


def base58_decode(text):
    """The bytes whose base58btc text is text (at most BASE58_MAX_CHARS characters); ValueError otherwise."""
    if not isinstance(text, str) or len(text) > BASE58_MAX_CHARS:
        raise ValueError("not base58btc text of a key or signature")
    zeros = len(text) - len(text.lstrip("1"))
    n = 0
    for char in text:
        digit = BASE58_DIGITS.get(char)
        if digit is None:
            raise ValueError("a character outside the base58btc alphabet")
        n = n * 58 + digit
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return b"\x00" * zeros + body


def multibase_encode(data):
    """data as a multibase base58btc string: 'z' and its base58btc text."""
    return MULTIBASE_BASE58BTC + base58_encode(data)


def multibase_decode(text):
    """The bytes of a multibase base58btc string; ValueError for any other string or base."""
    if not isinstance(text, str) or not text.startswith(MULTIBASE_BASE58BTC):
        raise ValueError("not a multibase base58btc string")
    return base58_decode(text[1:])


def did_key(public):
    """The did:key of a 32-byte Ed25519 public key: did:key:z6Mk..."""
    return DID_KEY + multibase_encode(ED25519_PUB_MULTICODEC + public)


def verification_method(public):
    """The verification method of a did:key, as its DID document names it: did:key:z6Mk...#z6Mk..."""
    did = did_key(public)
    return did + "#" + did[len(DID_KEY):]


def did_key_public_key(did):
    """The 32-byte Ed25519 public key of an Ed25519 did:key; ValueError unless the key is the canonical encoding
    of a curve point of large order. Base58btc text and bytes correspond one to one, so did == did_key(key)."""
    if not isinstance(did, str) or not did.startswith(DID_KEY):
        raise ValueError("not a did:key")
    decoded = multibase_decode(did[len(DID_KEY):])
    public = decoded[len(ED25519_PUB_MULTICODEC):]
    if not decoded.startswith(ED25519_PUB_MULTICODEC) or len(public) != 32:
        raise ValueError("not an Ed25519 did:key")
    point = point_decompress(public)
    if point is None or is_small_order(point):
        raise ValueError("the did:key's Ed25519 public key is not a usable curve point")
    return public


# Data Integrity proofs, cryptosuite eddsa-jcs-2022 (W3C Data Integrity EdDSA Cryptosuites v1.0 §3.3). The
# signed bytes are SHA-256 of the RFC 8785 text of the proof configuration (the proof without proofValue, with
# the document's @context), then SHA-256 of the RFC 8785 text of the document without its proof. `canonical`, a
# function from a JSON value to its RFC 8785 text, is passed in; it raises TypeError or ValueError for a value
# JSON cannot hold.
CREDENTIALS_V2_CONTEXT = "https://www.w3.org/ns/credentials/v2"
CREDENTIAL_TYPE = "VerifiableCredential"
RECEIPT_TYPE = "VerifyActionReceipt"
PROOF_TYPE = "DataIntegrityProof"
CRYPTOSUITE = "eddsa-jcs-2022"
PROOF_PURPOSE = "assertionMethod"
PROOF_REQUIRED = frozenset(["type", "cryptosuite", "verificationMethod", "proofPurpose", "proofValue"])
PROOF_OPTIONAL = frozenset(["created", "@context"])
PROOF_REASONS = {  # verify_proof's reasons, in the order it checks
    "malformed": "not a secured document with one proof of known fields and well-formed values",
    "unsupported_cryptosuite": "the proof is not a DataIntegrityProof of cryptosuite eddsa-jcs-2022",
    "unknown_key": "the verificationMethod is not the did:key of one of the given public keys",
    "issuer_mismatch": "the issuer is not the did:key that made the proof",
    "bad_signature": "the signature does not verify: the document or its proof was altered",
    "ok": "the proof verifies under one of the given keys, which is the issuer",
}
# XML Schema 1.1 dateTimeStamp (a time zone is required), with a four-digit year; ranges checked by date_time_ok
DATE_TIME_STAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:Z|[+-]([0-9]{2}):([0-9]{2}))"
)
MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def days_in_month(year, month):
    """The days of a month (1-12) of a year of the Gregorian calendar."""
    if month != 2:
        return MONTH_DAYS[month - 1]
    if year % 400 == 0:
        return 29
    if year % 100 == 0:
        return 28
    if year % 4 == 0:
        return 29
    return 28


def date_time_ok(text):
    """True iff text is an XML Schema dateTimeStamp with a four-digit year, such as 2026-01-02T03:04:05Z: each field
    in range (Feb 29 only in a leap year, no 24:00:00 or leap second), the time zone Z or at most +-14:00."""
    match = DATE_TIME_STAMP.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return False
    fields = [int(field or "0") for field in match.groups()]     # Z leaves the offset's groups None: 00:00
    year, month, day, hour, minute, second, offset_hours, offset_minutes = fields
    if not 1 <= month <= 12:
        return False
    if not 1 <= day <= days_in_month(year, month):
        return False
    if hour > 23 or minute > 59 or second > 59:
        return False
    return offset_minutes <= 59 and offset_hours * 60 + offset_minutes <= 14 * 60


def without(mapping, *names):
    """A shallow copy of the dict mapping without the members names."""
    return {name: value for name, value in mapping.items() if name not in names}


def proof_hash_data(document, proof_options, canonical):
    """The 64 bytes an eddsa-jcs-2022 proof signs: SHA-256 of the canonical proof configuration (the proof
    without proofValue), then SHA-256 of the canonical document (without proof)."""
    config_text = canonical(proof_options).encode("utf-8")
    document_text = canonical(document).encode("utf-8")
    return hashlib.sha256(config_text).digest() + hashlib.sha256(document_text).digest()


def create_proof(document, seed, created, canonical):
    """The eddsa-jcs-2022 proof of a JSON object document (which has no proof) by the Ed25519 key of a 32-byte
    seed, made at created (a dateTimeStamp): a new dict; the secured document is the document with it as proof.
    It carries the document's @context, as the cryptosuite's Create Proof step 2 says. ValueError for a document
    that has a proof, a created that is not a dateTimeStamp, or a seed that is not 32 bytes."""
    if not isinstance(document, dict) or "proof" in document:
        raise ValueError("create_proof takes a JSON object without a proof")
    if not date_time_ok(created):
        raise ValueError("created must be an XML Schema dateTimeStamp, such as 2026-01-02T03:04:05Z")
    method = verification_method(secret_to_public(seed))
    proof = {
        "type": PROOF_TYPE,
        "cryptosuite": CRYPTOSUITE,
        "created": created,
        "verificationMethod": method,
        "proofPurpose": PROOF_PURPOSE,
    }
    if "@context" in document:
        proof["@context"] = document["@context"]
    signature = sign(seed, proof_hash_data(document, proof, canonical))
    proof["proofValue"] = multibase_encode(signature)
    return proof


def proof_shape_ok(secured_document, proof):
    """True iff the proof has exactly the known fields, each well formed, and its @context, when it has one, is
    the document's (the cryptosuite allows the document's to extend it; this receipt format does not)."""
    fields = set(proof)
    if not PROOF_REQUIRED <= fields <= PROOF_REQUIRED | PROOF_OPTIONAL:
        return False
    if not isinstance(proof["verificationMethod"], str) or proof["proofPurpose"] != PROOF_PURPOSE:
        return False
    if "created" in proof and not date_time_ok(proof["created"]):
        return False
    if "@context" in proof and proof["@context"] != secured_document.get("@context"):
        return False
    return True


def proof_signature(proof):
    """The 64 signature bytes of a proof's proofValue, or None if it is not multibase base58btc of 64 bytes."""
    try:
        signature = multibase_decode(proof["proofValue"])
    except ValueError:
        return None
    if len(signature) != 64:
        return None
    return signature


def verify_proof(secured_document, public_keys, canonical):
    """(valid, reason) for a document secured by one eddsa-jcs-2022 proof: reason is a key of PROOF_REASONS, 'ok'
    only if the proof's verificationMethod is the did:key of one of public_keys (32-byte Ed25519 keys), the
    document's issuer is that did:key, and the signature verifies. Never raises for any JSON value."""
    proof = secured_document.get("proof") if isinstance(secured_document, dict) else None
    if not isinstance(proof, dict):
        return (False, "malformed")
    if proof.get("type") != PROOF_TYPE or proof.get("cryptosuite") != CRYPTOSUITE:
        return (False, "unsupported_cryptosuite")
    signature = proof_signature(proof) if proof_shape_ok(secured_document, proof) else None
    if signature is None:
        return (False, "malformed")
    keys = {verification_method(public): public for public in public_keys}
    method = proof["verificationMethod"]
    if method not in keys:
        return (False, "unknown_key")
    if secured_document.get("issuer") != did_key(keys[method]):
        return (False, "issuer_mismatch")
    try:
        hash_data = proof_hash_data(without(secured_document, "proof"), without(proof, "proofValue"), canonical)
    except (TypeError, ValueError):                      # a value JSON cannot hold (NaN, a set...)
        return (False, "malformed")
    if not verify(keys[method], hash_data, signature):
        return (False, "bad_signature")
    return (True, "ok")


def credential_for(receipt_fields, did, created):
    """The unsigned Verifiable Credential 2.0 of a receipt, issued by did at created (the receipt's issued_at):
    its credentialSubject is the receipt's fields without signature and kid."""
    subject = without(receipt_fields, "signature", "kid")
    credential = {
        "@context": [CREDENTIALS_V2_CONTEXT],
        "type": [CREDENTIAL_TYPE, RECEIPT_TYPE],
        "issuer": did,
        "validFrom": created,
        "credentialSubject": subject,
    }
    return credential


CREDENTIAL_REASONS = dict(PROOF_REASONS)  # verify_credential's reasons: verify_proof's, then one of its own
CREDENTIAL_REASONS["unsupported_schema"] = "the proof verifies, but the credential is not a receipt of this schema"


def _is_receipt_credential(credential):
    """Whether a credential whose proof verified is a receipt's: its types, and a subject of this schema."""
    subject = credential.get("credentialSubject")
    if credential.get("type") != [CREDENTIAL_TYPE, RECEIPT_TYPE] or not isinstance(subject, dict):
        return False
    return subject.get("schema") == SCHEMA


def verify_credential(credential, public_keys):
    """(valid, reason, kid) of a receipt's credential: reason is a key of CREDENTIAL_REASONS; public_keys maps a
    kid to a 32-byte Ed25519 public key, and kid is the one whose key made the proof, or None."""
    valid, reason = verify_proof(credential, list(public_keys.values()), _jcs)
    if not valid:
        return False, reason, None
    method = credential["proof"]["verificationMethod"]
    kids = [kid for kid, public in public_keys.items() if verification_method(public) == method]
    if not _is_receipt_credential(credential):
        return False, "unsupported_schema", kids[0]
    return True, "ok", kids[0]


def parse_public_keys(text):
    """did:key -> 32-byte public key of a --public-keys file's text: one Ed25519 did:key a line, '#' starts a
    comment. ValueError naming the first line that is not one, or when there is none."""
    public_keys = collections.OrderedDict()
    for number, line in enumerate(text.splitlines(), 1):
        did = line.split("#", 1)[0].strip()
        if not did:
            continue
        try:
            public_keys[did] = did_key_public_key(did)
        except ValueError as e:
            raise ValueError("line %d: %s" % (number, e))
    if not public_keys:
        raise ValueError("no did:key in the public keys file")
    return public_keys


# ============================================================================================================
# §5 Key-ring and token files (I/O)
# ============================================================================================================


# Where the OS has them: binary (Windows), not inherited by child processes, no link followed
_OPEN_FLAGS = getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | _OPEN_FLAGS | getattr(os, "O_NONBLOCK", 0)  # opening a FIFO never waits for a writer
_CREATE_FLAGS = _OPEN_FLAGS | os.O_WRONLY | os.O_CREAT | os.O_EXCL
_APPEND_FLAGS = _OPEN_FLAGS | os.O_RDWR | os.O_APPEND
# Windows keeps no POSIX modes (os.stat shows 0o666, or 0o444 read-only, whatever its ACLs say): no refusal by mode
POSIX_MODES = os.name == "posix"
_KEY_RING_HEADER = (
    "# verify_action.py key ring: 'kid key' (HMAC) or 'kid ed25519 seed' per line; the last key of each kind signs,\n"
    "# every key verifies. Private: never share this file; share the did:keys of GET /keys.\n"
)
KEY_ALGS = ("hmac", ED25519_ALG)  # keygen --alg


def read_private_file(path, limit=65536, fd=None):
    """Text of a regular file group and others cannot access (else ValueError); reads fd if given. Where modes are
    not enforced (Windows) it says so on stderr instead of refusing by mode."""
    own = fd is None
    if own:
        fd = os.open(path, _READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode  # of the open file: no race between checking and reading
        data = os.read(fd, limit + 1)
    finally:
        if own:
            os.close(fd)
    shared = POSIX_MODES and mode & 0o077
    if not stat.S_ISREG(mode) or shared or len(data) > limit:
        raise ValueError(
            "refusing %s: it must be a regular file of at most %d bytes, not accessible by group or "
            "others (mode %03o; run chmod 600 on it)" % (path, limit, mode & 0o777)
        )
    if not POSIX_MODES:
        sys.stderr.write("verify_action.py: Windows does not enforce file modes; keep %s readable only by you\n" % path)
    return data.decode("utf-8")


def load_keyring(path):
    """The key ring in a file that group and others cannot read (else ValueError)."""
    return KeyRing.parse(read_private_file(path))


def load_public_keys(path, limit=65536):
    """did:key -> public key of a --public-keys file of at most limit bytes (else ValueError); see
    parse_public_keys. Public keys are not secret: any file mode will do."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError("%s: more than %d bytes" % (path, limit))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("%s: not UTF-8 text" % path)
    return parse_public_keys(text)


def _new_key_line(alg):
    """(kid, key-ring line) of a new key of kind alg (KEY_ALGS): 32 random bytes, an HMAC key or an Ed25519 seed."""
    day = time.strftime("%Y%m%d", time.gmtime())
    kid = "k%s-%s" % (day, secrets.token_hex(3))
    secret = _b64url(secrets.token_bytes(32))
    if alg == ED25519_ALG:
        return kid, "%s %s %s\n" % (kid, ED25519_ALG, secret)
    return kid, "%s %s\n" % (kid, secret)


def keygen(path, alg="hmac"):
    """Create the key ring (O_CREAT|O_EXCL, 0600) or append through one checked O_NOFOLLOW descriptor; the new
    key's kid. A first Ed25519 key comes after a new HMAC key when the ring has none: every receipt needs one."""
    if alg not in KEY_ALGS:
        raise ValueError("--alg must be one of: " + ", ".join(KEY_ALGS))
    kid, line = _new_key_line(alg)
    try:  # a new file never exists with a wider mode
        fd = os.open(path, _CREATE_FLAGS, 0o600)
        prefix, ring = _KEY_RING_HEADER, None
    except FileExistsError:
        fd = os.open(path, _APPEND_FLAGS)
        prefix = None
    try:
        if prefix is None:
            prefix, ring = _before_new_key(path, fd)
        if ring is None and alg == ED25519_ALG:
            prefix += _new_key_line("hmac")[1]
        written = prefix + line
        os.write(fd, written.encode("ascii"))
    finally:
        os.close(fd)
    return kid


def _before_new_key(path, fd):
    """(what goes before a new key line in the key ring open at fd: a line break if its last line lacks one, the
    ring as it loads, or None when it has no keys). ValueError if the ring does not load: a key is never appended
    to a file that does not load."""
    old = read_private_file(path, fd=fd)  # the file written is the file checked
    ring = KeyRing.parse(old, allow_empty=True)
    if old and not old.endswith("\n"):
        return "\n", ring
    return "", ring


# ============================================================================================================
# §6 Request validation and strict JSON
# ============================================================================================================
# json.loads is lenient: it reads NaN, keeps the last of duplicate keys, lets lone surrogates and any depth through,
# and reads integers of any size. strict_parse parses once with json.loads and refuses each of those by a named
# check, most of them over the canonical text it makes anyway.


class RequestError(ValueError):
    """A refusal: code (snake_case, or a JSON-RPC number), message (never input), HTTP status and headers."""

    def __init__(self, code, message, status=400, headers=()):
        ValueError.__init__(self, message)
        self.code = code
        self.message = message
        self.status = status
        self.headers = list(headers)


MAX_INT = 2 ** 53 - 1  # I-JSON (RFC 7493): larger integers have no exact canonical (double) form
_DIGITS_AS_ZEROS = bytes(48 if 48 <= b < 58 else 32 for b in range(256))  # bytes.translate: digits "0", others " "
_BRACKETS = bytes.maketrans(b"{}", b"[]")  # bytes.translate: every container as [ ]
_STEPS = bytes.maketrans(b"[]", b"\x01\xff")  # bytes.translate: brackets as steps, +1 and -1 (signed bytes)
_NOT_BRACKET_OR_QUOTE = bytes(sorted(set(range(256)) - set(b'[]{}"')))  # the bytes bytes.translate then deletes
_NOT_OPENING = bytes(sorted(set(range(256)) - set(b"[{")))  # bytes.translate deletes them to count containers


def need(ok, code, message):
    """Raise RequestError(code, message) unless ok."""
    if not ok:
        raise RequestError(code, message)


def _bad_json(message):
    """Raise RequestError('invalid_json', message)."""
    raise RequestError("invalid_json", message)


def _exact_int(digits):
    """An integer of JSON text (json.loads's parse_int), refused beyond +-(2^53 - 1)."""
    value = MAX_INT + 1
    if len(digits) <= 17:  # a longer run is beyond it anyway, and int() of a long run is slow
        value = int(digits)
    if not -MAX_INT <= value <= MAX_INT:
        _bad_json("an integer beyond +-(2^53 - 1) (I-JSON, RFC 7493)")
    return value


def _no_constant(name):
    """json.loads's parse_constant: NaN, Infinity and -Infinity are refused."""
    _bad_json("NaN and Infinity are not JSON")


class _CollectorPause(object):
    """The cyclic garbage collector stays off while any thread handles a request: a 1 MiB body can hold 500,000
    containers, none in a cycle, and every collection meanwhile would walk them all. A request frees what it made by
    reference counting; collection resumes when none is in flight. list.append and list.pop are atomic; a thread
    that enables the collector just as another enters costs that one a collection, never a wrong answer."""

    def __init__(self):
        self._inside = []

    def __enter__(self):
        self._inside.append(1)
        gc.disable()

    def __exit__(self, *exc_info):
        self._inside.pop()
        if not self._inside:
            gc.enable()


_REQUEST = _CollectorPause()


def strict_loads(raw, exact_ints=True):
    """Strict UTF-8 JSON: no NaN, duplicate keys, lone surrogates, depth > 32, integers beyond +-(2^53-1)."""
    value, _ = strict_parse(raw, exact_ints)
    return value


def strict_parse(raw, exact_ints=True, along=("evidence",)):
    """(value, its canonical_members along the given keys) of strict JSON (see strict_loads). The canonical text
    made for the checks is kept for the rules and the receipt: a request is parsed once and canonicalised once."""
    try:
        text = raw.decode("utf-8")
        value, members = _parse_and_canonicalise(raw, text, exact_ints, along)
        canonical = members[None]
        canonical.encode("utf-8")  # a lone surrogate has no UTF-8 form (and a receipt hashes UTF-8)
    except RequestError:
        raise
    except UnicodeError:
        _bad_json("not UTF-8, or a string holds a lone surrogate")
    except RecursionError:
        _bad_json("nesting deeper than %d" % MAX_DEPTH)
    except ValueError as e:
        _bad_json(_problem(e))
    _refuse_duplicate_keys(text, canonical)
    _refuse_deep_nesting(raw)
    return value, members


def _containers(raw):
    """How many arrays and objects JSON text may hold: its opening brackets, those in strings too (one pass)."""
    return len(raw.translate(None, _NOT_OPENING))


def _may_hold_big_int(raw):
    """Whether JSON text has a run of 16 digits, which any integer beyond 2^53 starts with: only then are integers
    read one by one (in Python) to refuse such ones."""
    return b"0" * 16 in raw.translate(_DIGITS_AS_ZEROS)


def _loads(text, integers_one_by_one, object_hook=None):
    """json.loads, refusing NaN and the infinities, and (if asked) integers beyond +-(2^53 - 1)."""
    parse_int = _exact_int if integers_one_by_one else None
    return json.loads(text, parse_int=parse_int, parse_constant=_no_constant, object_hook=object_hook)


def _parse_and_canonicalise(raw, text, exact_ints, along):
    """(value, its canonical_members) of JSON text. Where key order may differ from code point order (_may_mix),
    objects with keys that hold an astral character are marked in place while the canonical text is written, or,
    where such characters are many, that text is written from a twin parsed from the raw text, marked: marking an
    object in place costs about as much as parsing sixteen containers again."""
    integers = exact_ints and _may_hold_big_int(raw)
    if not _may_mix(raw):
        value = _loads(text, integers)
        return value, canonical_members(value, exact_ints, along, "")
    if 16 * _astral_count(raw) > _containers(raw):
        value = _loads(text, integers)
        twin = json.loads(_marked_text(raw))
        return value, canonical_members(twin, exact_ints, along, _MARK)
    objects = []

    def collect(obj):  # json.loads's object_hook: key order can matter only to an object of two or more keys
        if len(obj) > 1:
            objects.append(obj)
        return obj
    value = _loads(text, integers, collect)
    return value, _in_utf16_order(objects, lambda: canonical_members(value, exact_ints, along, _KEY_MARK))


def _problem(error):
    """What json.loads or json.dumps found wrong, with the character it was found at."""
    problem = getattr(error, "msg", "invalid JSON")
    if "Out of range" in str(error):  # json.dumps refuses the infinity json.loads read for 1e400
        problem = "a number does not fit a double"
    return "%s (at character %s)" % (problem, getattr(error, "pos", "?"))


def _refuse_duplicate_keys(text, canonical):
    """json.loads keeps the last of duplicate keys. Each member has one ':' outside strings, and strings hold as many
    in the canonical text as in the request once its escaped ones (\\u003a) are counted: a dropped duplicate leaves
    fewer in the canonical text."""
    escaped = 0
    if "\\u" in text:  # escaped backslashes go first, so that each \u003a left is an escape
        escaped = text.replace("\\\\", "").lower().count("\\u003a")
    if text.count(":") + escaped != canonical.count(":"):
        _bad_json("duplicate object key")


def _refuse_deep_nesting(raw):
    """Nesting deeper than MAX_DEPTH (the request object is level 1)."""
    if _containers(raw) <= MAX_DEPTH:
        return  # too few to nest that deep
    if _depth(_brackets_outside_strings(raw)) > MAX_DEPTH:
        _bad_json("nesting deeper than %d" % MAX_DEPTH)


def _depth(brackets):
    """How deep balanced brackets ('[' and ']' only) nest. A round removes the innermost pairs, lowering every level
    by one, while that removes a fifth or more (so the rounds cost at most five passes); the depth of what is left
    is the highest running sum of its steps, +1 and -1, each run of four like steps taken as one step."""
    rounds = 0
    fewer = brackets.replace(b"[]", b"")
    while 5 * len(fewer) <= 4 * len(brackets) and brackets:
        rounds += 1
        brackets = fewer
        fewer = brackets.replace(b"[]", b"")
    steps = brackets.translate(_STEPS).replace(b"\x01" * 4, b"\x04").replace(b"\xff" * 4, b"\xfc")
    return rounds + max(itertools.accumulate(memoryview(steps).cast("b")), default=0)


def _brackets_outside_strings(raw):
    """The brackets of JSON text outside its strings, every container as [ ]. Escaped backslashes and quotes go
    first, so that each quote left starts or ends a string. Once only brackets and quotes are kept, two adjacent
    quotes enclose no bracket that counts (an empty string, or the space between two strings): dropping them all
    at once leaves only the strings that hold brackets to split out."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = unescaped.translate(_BRACKETS, _NOT_BRACKET_OR_QUOTE).replace(b'""', b"")
    return b"".join(kept.split(b'"')[0::2])


def validate_request(obj):
    """A /verify body or MCP arguments, checked: RequestError on the first problem, never truncation."""
    need(isinstance(obj, dict), "invalid_request", "the request must be a JSON object")
    unknown = set(obj) - set(REQUEST_FIELDS)
    need(not unknown, "unknown_field", "allowed fields: " + ", ".join(REQUEST_FIELDS))
    claim = obj.get("claim")
    need(isinstance(claim, str) and claim.strip(), "invalid_claim", "claim must be a non-empty string")
    need(len(claim) <= MAX_CLAIM, "claim_too_long", "claim is longer than %d characters" % MAX_CLAIM)
    need(isinstance(obj.get("evidence"), dict), "invalid_evidence", "evidence must be a JSON object")
    kind = obj.get("kind")
    known = kind is None or isinstance(kind, str) and kind.lower() in KINDS
    need(known, "unknown_kind", "kind: " + ", ".join(KINDS))
    context = obj.get("context")
    need(context is None or isinstance(context, str), "invalid_context", "context must be a string")
    short = context is None or len(context) <= MAX_CONTEXT
    need(short, "context_too_long", "context exceeds %d characters" % MAX_CONTEXT)
    need(_caller_context_ok(obj.get("caller_context")), "invalid_caller_context", _CALLER_CONTEXT)
    return obj


_CALLER_CONTEXT = "caller_context: at most 8 keys of 1-64 characters; values strings (<= 64), numbers, booleans or null"


def _caller_context_ok(caller):
    """Whether caller_context is absent, or an object of at most MAX_CALLER_KEYS valid entries."""
    if caller is None:
        return True
    if not isinstance(caller, dict) or len(caller) > MAX_CALLER_KEYS:
        return False
    return all(map(_caller_entry_ok, caller.keys(), caller.values()))


def _caller_entry_ok(key, value):
    """A caller_context entry: a key of 1-64 characters; a scalar value, a string one of at most 64."""
    if not 0 < len(key) <= MAX_CALLER_STR:
        return False
    if isinstance(value, str):
        return len(value) <= MAX_CALLER_STR
    return value is None or isinstance(value, (bool, int, float))


# ============================================================================================================
# §7 The service: /verify, receipts and MCP handlers, shared by HTTP and stdio
# ============================================================================================================

_EVIDENCE_DOC = (
    "code_diff {diff}; db_op {before_count, after_count, operation, affected_rows}; file_op {path, "
    "exists_before, exists_after, line_count?, size_bytes?, new_path?}; api_call {request, "
    "response_status, response_body}; generic: any object."
)
_STRING = {"type": "string"}
_OBJECT = {"type": "object"}
_TITLE = "Verify an agent's claimed action"
_LEGACY_VERDICTS = tuple(LEGACY.values())
_SIGNAL_SCHEMA = {
    "type": "object",
    "required": ["code", "effect", "count"],
    "properties": {
        "code": _STRING,
        "effect": {"type": "string", "enum": EFFECTS},
        "count": {"type": "integer", "minimum": 1},
    },
}
_RESPONSE_SCHEMA = {  # the /verify response: field -> JSON schema, in the order responses carry them
    "aar_verdict": {"type": "string", "enum": VERDICTS},
    "verdict": {"type": "string", "enum": _LEGACY_VERDICTS},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    "reason_codes": {"type": "array", "items": _STRING},
    "signals": {"type": "array", "items": _SIGNAL_SCHEMA},
    "reasoning": _STRING,
    "kind_dispatched": {"type": "string", "enum": KINDS},
    "verifier_used": _STRING,
    "details": _OBJECT,
    "receipt": _OBJECT,
}
_RESPONSE_FIELDS = tuple(_RESPONSE_SCHEMA)  # every response has these; credential only with an Ed25519 key
_PROOF_SCHEMA = {
    "type": "object",
    "required": ["type", "cryptosuite", "created", "verificationMethod", "proofPurpose", "@context", "proofValue"],
    "properties": {
        "type": {"const": PROOF_TYPE},
        "cryptosuite": {"const": CRYPTOSUITE},
        "created": _STRING,
        "verificationMethod": _STRING,
        "proofPurpose": {"const": PROOF_PURPOSE},
        "@context": {"type": "array", "items": _STRING},
        "proofValue": _STRING,
    },
}
_RESPONSE_SCHEMA["credential"] = {
    "type": "object",
    "description": "With an Ed25519 key in the ring: the receipt as a W3C Verifiable Credential 2.0, proof "
                   "eddsa-jcs-2022 (GET /spec's credential).",
    "required": ["@context", "type", "issuer", "validFrom", "credentialSubject", "proof"],
    "properties": {
        "@context": {"type": "array", "items": _STRING},
        "type": {"type": "array", "items": _STRING},
        "issuer": _STRING,
        "validFrom": _STRING,
        "credentialSubject": _OBJECT,
        "proof": _PROOF_SCHEMA,
    },
}
_CALLER_DOC = "At most 8 scalar values; keys and strings <= 64 characters."
_INPUT_SCHEMA = {
    "type": "object",
    "required": ["claim", "evidence"],
    "additionalProperties": False,
    "properties": {
        "claim": {"type": "string", "minLength": 1, "maxLength": MAX_CLAIM},
        "evidence": {"type": "object", "description": _EVIDENCE_DOC},
        "kind": {"type": "string", "enum": KINDS},
        "context": {"type": "string", "maxLength": MAX_CONTEXT},
        "caller_context": {"type": "object", "description": _CALLER_DOC},
    },
}
TOOL = {
    "name": "verify_action",
    "title": _TITLE,
    "annotations": {"title": _TITLE, "readOnlyHint": True, "idempotentHint": False, "openWorldHint": False},
    "description": (
        "Check whether a claim about an action (code change, database operation, file operation, API call, or "
        "anything else) is consistent with the evidence supplied, using deterministic rules; returns a verdict, "
        "the signals it was decided from, reason codes and a signed receipt (and, when the service has an Ed25519 "
        "key, the receipt as a credential anyone can check with its public key). It fetches nothing, so a receipt "
        "never proves the claim true."
    ),
    "inputSchema": _INPUT_SCHEMA,
    "outputSchema": {"type": "object", "required": _RESPONSE_FIELDS, "properties": _RESPONSE_SCHEMA},
}
SIGNALS_DOC = (
    "Each response and receipt carries signals: [{code, effect, count}], one for each check that fired, in the "
    "order of its kind's table (checks; a check marked alone that fires is the only one), or the one signal of "
    "evidence that could not be judged: evidence_missing_fields (negative), or evidence_invalid, evidence_too_large "
    "and verifier_error (unsafe: nothing was judged). effect is positive, negative or critical, and unsafe for those "
    "three codes only; count is how often the check fired (once, or once for each entity it found). reason_codes "
    "lists the distinct codes of signals in order, or no_signal alone when signals is empty. The verdict and the "
    "confidence are the functions decision and confidence of signals alone."
)


def _check_row(test, code, effect):
    """A row of a table as /rules lists it: its code and effect, and its check's name and rule."""
    name = test.__name__
    rule = _meaning(test)
    alone = code in ALONE
    return {"code": code, "effect": effect, "check": name, "rule": rule, "alone": alone}


def _check_rows(table):
    """The rows of a table as /rules lists them, in order."""
    return [_check_row(*row) for row in table]


def _evidence_fields(fields, groups):
    """A kind's evidence as /rules lists it: its fields, and the groups of them it needs one of."""
    return {"fields": sorted(fields), "needs_one_of": groups}


def rules_document():
    """GET /rules: the decision and confidence functions over signals, dispatch order, evidence fields, verbs,
    bounds, every kind's table of checks, and every reason code."""
    evidence = {kind: _evidence_fields(*fields) for kind, fields in EVIDENCE.items()}
    api_words = {"success": sorted(_OK_WORDS), "failure": sorted(_FAIL_WORDS)}
    verbs = dict(VERB_CLASSES, api_call=api_words)
    checks = {kind: _check_rows(table) for kind, table in CHECKS.items()}
    codes = {code: reason._asdict() for code, reason in REASONS.items()}
    rules = {
        "decision": DECISION,
        "confidence": CONFIDENCE,
        "signals": SIGNALS_DOC,
        "bounds": BOUNDS,
        "dispatch_order": DISPATCH,
        "evidence": evidence,
        "verbs": verbs,
        "checks": checks,
        "reason_codes": codes,
        "receipt_check_reasons": RECEIPT_CHECK_REASONS,
        "credential_check_reasons": CREDENTIAL_REASONS,
    }
    return rules


def credential_spec():
    """What GET /spec says of credentials: the format, the key ring's lines, how to check one, and what it proves."""
    credential = {
        "when": "On every /verify response and MCP tool result while the key ring holds an Ed25519 key.",
        "format": {
            "@context": [CREDENTIALS_V2_CONTEXT],
            "type": [CREDENTIAL_TYPE, RECEIPT_TYPE],
            "issuer": "The signing key's did:key (did:key:z6Mk...).",
            "validFrom": "The receipt's issued_at.",
            "credentialSubject": "The receipt's fields without signature and kid.",
            "proof": {
                "type": PROOF_TYPE,
                "cryptosuite": CRYPTOSUITE,
                "created": "The receipt's issued_at.",
                "verificationMethod": "did:key:z6Mk...#z6Mk...",
                "proofPurpose": PROOF_PURPOSE,
                "@context": "The credential's @context.",
                "proofValue": "'z' + base58btc of the 64-byte Ed25519 signature (RFC 8032).",
            },
        },
        "signed_bytes": (
            "SHA-256 of the RFC 8785 text of the proof without proofValue, then SHA-256 of the RFC 8785 text of the "
            "credential without proof (W3C Data Integrity EdDSA Cryptosuites v1.0, eddsa-jcs-2022)."
        ),
        "verify": (
            "POST /receipts/verify {\"credential\": {}}, or verify_action.py verify-receipt FILE --public-keys F "
            "(did:keys, one a line) or --key-file F; any eddsa-jcs-2022 verifier works too. The proof's "
            "verificationMethod must be a key of GET /keys (or of the list given) and the issuer that key."
        ),
        "reasons": CREDENTIAL_REASONS,
        "keys": "GET /keys: every Ed25519 verification method of the ring, retired ones included.",
        "key_ring_lines": KEY_LINES,
        "proves": (
            "The holder of that Ed25519 key issued this receipt as it reads: that service judged a request with "
            "these hashes, then, with this verdict. Checking needs only the public key, which cannot make one."
        ),
        "does_not_prove": (
            "That the claim is true, that the evidence is real, or who sent the request; nor, by itself, that the key "
            "is the service's: take the did:key from the operator (GET /keys over a channel you trust)."
        ),
    }
    return credential


def spec_document(sandbox):
    """GET /spec: tool schema, kinds, verdicts, receipt fields, the canonical form, limits, endpoints, and what the
    sandbox enforces."""
    receipt = {
        "schema": SCHEMA,
        "fields": RECEIPT_FIELDS,
        "verify": ("POST /receipts/verify {\"receipt\": {}} or {\"credential\": {}}, or verify_action.py "
                   "verify-receipt FILE --key-file F (a receipt) or --public-keys F (a credential)"),
        "recompute": "GET /rules' decision and confidence over a receipt's signals give its verdict and confidence.",
        "canonicalization": (
            "RFC 8785 (JCS): keys sorted by UTF-16 code units, no whitespace, ECMAScript numbers, minimal "
            "escapes, UTF-8. Numbers are doubles, so a request with an integer beyond +-(2^53 - 1) is refused "
            "(400, I-JSON, RFC 7493): two such integers could otherwise hash alike."
        ),
    }
    limits = {"claim_chars": MAX_CLAIM, "context_chars": MAX_CONTEXT, "json_depth": MAX_DEPTH,
              "integer_magnitude_max": MAX_INT}
    connections = {
        "max_conns": MAX_CONNS,
        "max_conns_per_client_default": MAX_CONNS_PER_CLIENT,
        "write_deadline_seconds": WRITE_DEADLINE,
        "note": ("Connections are capped in all and per peer address (--max-conns-per-client; behind a reverse "
                 "proxy every client is the proxy); beyond either cap a new connection gets 503 at once. A response "
                 "not written within the write deadline closes its connection."),
    }
    endpoints = ["%s %s" % (method, path) for path, method in ROUTES.items()]
    verdicts = {"aar_verdict": VERDICTS, "legacy_verdict": LEGACY}
    spec = {
        "name": "verify_action.py",
        "version": VERSION,
        "sandbox": sandbox,
        "proves": PROVES,
        "does_not_prove": NOT_PROVES,
        "tool": TOOL,
        "kinds": KINDS,
        "evidence": _EVIDENCE_DOC,
        "verdicts": verdicts,
        "receipt": receipt,
        "credential": credential_spec(),
        "limits": limits,
        "connections": connections,
        "endpoints": endpoints,
        "mcp": {"protocol_versions": PROTOCOL_VERSIONS, "transports": ["POST /mcp (JSON responses)", "--stdio"]},
    }
    return spec


def _rpc_error(msg_id, code, message):
    """A JSON-RPC error reply."""
    error = {"code": code, "message": message}
    return {"jsonrpc": "2.0", "id": msg_id, "error": error}


def _text_content(text):
    """An MCP text content item."""
    return {"type": "text", "text": text}


def _json_text(obj):
    """obj as compact JSON text (non-ASCII kept)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _tool_error(error):
    """The tools/call result for arguments that were refused: a tool execution error, so the model can correct them."""
    text = "invalid arguments: %s: %s" % (error.code, error.message)
    return {"content": [_text_content(text)], "isError": True}


_MCP_ALONG = ("params", "arguments", "evidence")  # where a tools/call's evidence is (see canonical_members)
_USE_VERSIONS = "use " + ", ".join(PROTOCOL_VERSIONS)
_CHECK_BODIES = {"receipt": frozenset(["receipt"]), "credential": frozenset(["credential"])}  # a body's one member
RECEIPT_CHECK_REASONS = {  # verify_receipt's reasons
    "malformed": "not a receipt: its fields, or a kid and an hmac-sha256 signature that are strings",
    "unsupported_schema": "a receipt of another schema",
    "unknown_kid": "the kid is not a key of the ring",
    "bad_signature": "the signature does not verify: the receipt was altered",
    "ok": "the signature verifies under the kid's key",
}
_SERVER_INFO = {"name": "verify_action", "title": "verify_action.py", "version": VERSION}
_INSTRUCTIONS = (
    "Call verify_action with a claim and its evidence before acting on the claim. A receipt proves what was "
    "judged, never that the claim is true."
)


def _checked_document(body):
    """(member, document) of a POST /receipts/verify body, which must be {"receipt": {...}} or {"credential": {...}};
    RequestError otherwise."""
    members = set(body) if isinstance(body, dict) else set()
    names = [name for name, shape in _CHECK_BODIES.items() if members == shape]
    document = body[names[0]] if names else None
    shape = "the body must be {\"receipt\": {...}} or {\"credential\": {...}}"
    need(isinstance(document, dict), "invalid_request", shape)
    return names[0], document


def _valid_id(msg):
    """Whether a JSON-RPC message's id, if it has one, is a string or an integer (not a bool)."""
    msg_id = msg.get("id")
    if isinstance(msg_id, bool):
        return False
    return "id" not in msg or isinstance(msg_id, (str, int))


class Service(object):
    """What HTTP and stdio share: the key ring, the issuer, the counters and every handler."""

    sandbox = "off"  # what apply_sandbox enforces (GET /healthcheck and /spec say it)

    def __init__(self, keyring, issuer="verify_action.py", clock=time.time):
        self.keyring = keyring
        self.issuer = issuer
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        by_kind = dict.fromkeys(KINDS, 0)
        by_verdict = dict.fromkeys(VERDICTS, 0)
        self.counts = {
            "verifications": 0,
            "by_kind": by_kind,
            "by_verdict": by_verdict,
            "receipt_checks": 0,
            "mcp_messages": 0,
            "errors_by_status": {},
        }

    def count(self, key, sub=None):
        """One more in a GET /stats counter (never request content)."""
        with self._lock:
            table = self.counts if sub is None else self.counts[key]
            name = key if sub is None else sub
            table[name] = table.get(name, 0) + 1

    def stats(self):
        """GET /stats: a copy of the counters and the uptime."""
        with self._lock:
            counts = json.loads(json.dumps(self.counts))
        uptime = self.clock() - self.started
        counts["uptime_s"] = round(uptime, 3)
        return counts

    def verify(self, request, members=None):
        """Judge a validated request and sign the result: the /verify response. members: the request's
        canonical_members, made once (by strict_parse, or here) for the rules and the receipt."""
        members = members or canonical_members(request)
        evidence = request["evidence"]
        kind = dispatch_kind(evidence, request.get("kind"))
        judgement = judge(kind, request["claim"], evidence, members["evidence"])
        verdict = judgement.verdict
        receipt = issue_receipt(request, judgement, self.keyring, self.issuer, self.clock(), members)
        credential = self.keyring.credential(receipt)
        self.count("verifications")
        self.count("by_kind", kind)
        self.count("by_verdict", verdict)
        meanings = " ".join(REASONS[code].summary for code in judgement.codes)
        legacy = LEGACY[verdict]
        signals = receipt["signals"]  # as the receipt signs them
        reasoning = "%s (%s): %s" % (verdict, kind, meanings)
        verifier = kind + "_v1"
        response = {
            "aar_verdict": verdict,
            "verdict": legacy,
            "confidence": judgement.confidence,
            "reason_codes": judgement.codes,
            "signals": signals,
            "reasoning": reasoning,
            "kind_dispatched": kind,
            "verifier_used": verifier,
            "details": judgement.details,
            "receipt": receipt,
        }
        if credential is not None:
            response["credential"] = credential
        return response

    def check(self, member, document):
        """POST /receipts/verify: {valid, reason, kid} of a receipt (member "receipt") under the ring's HMAC keys, or
        of a credential (member "credential") under its Ed25519 public keys."""
        self.count("receipt_checks")
        if member == "credential":
            valid, reason, kid = verify_credential(document, self.keyring.public_keys)
        else:
            valid, reason, kid = verify_receipt(document, self.keyring)
        return {"valid": valid, "reason": reason, "kid": kid}

    def keys_document(self):
        """GET /keys: the ring's Ed25519 verification methods (never a seed or an HMAC key)."""
        return {"keys": self.keyring.methods()}

    def post(self, path, raw, headers):
        """(status, JSON object, or None for an empty 202) for a POST body to path."""
        with _REQUEST:  # the garbage collector waits, and what the request made is freed before it resumes
            return self._post(path, raw, headers)

    def _post(self, path, raw, headers):
        """post, with the collector paused."""
        version = headers.get("mcp-protocol-version", PROTOCOL_VERSIONS[0])
        if path == "/mcp" and version not in PROTOCOL_VERSIONS:
            return 400, {"error": "unsupported_protocol_version", "message": _USE_VERSIONS}
        along = _MCP_ALONG if path == "/mcp" else ("evidence",)
        try:
            obj, members = strict_parse(raw, along=along)
            if path == "/mcp":  # mcp() answers every message itself
                return self._mcp_reply(obj, members)
            if path == "/verify":
                return 200, self.verify(validate_request(obj), members)
            member, document = _checked_document(obj)
        except RequestError as e:
            if path == "/mcp":  # over MCP a parse error is a JSON-RPC error, not an HTTP 400
                return 200, _rpc_error(None, -32700, "Parse error: " + e.message)
            return 400, {"error": e.code, "message": e.message}
        return 200, self.check(member, document)

    def _mcp_reply(self, obj, members):
        """(status, reply) of one POST /mcp message: 202 and no body when it needs no reply."""
        reply = self.mcp(obj, members)
        if reply is None:
            return 202, None
        return 200, reply

    def mcp(self, msg, members=None, session=None):
        """The JSON-RPC reply to a message, or None; session is None over HTTP (stateless), a dict over stdio."""
        if isinstance(msg, list):
            return self._batch(msg, session)
        self.count("mcp_messages")
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return _rpc_error(None, -32600, "Invalid Request")
        msg_id = msg.get("id")
        if "method" not in msg:
            return None  # a response from the client: a tools-only server sends no requests
        if not _valid_id(msg):
            return _rpc_error(None, -32600, "Invalid Request: id must be a string or an integer")
        if not isinstance(msg["method"], str):
            return _rpc_error(msg_id, -32600, "Invalid Request: method")
        if "id" not in msg:
            return None  # notifications are never answered
        params_members = (members or {}).get("params")  # canonical_members of the message, along _MCP_ALONG
        params = msg.get("params", {})
        try:
            result = self._method(msg["method"], params, session, params_members)
        except RequestError as e:
            return _rpc_error(msg_id, e.code, e.message)
        except Exception:
            return _rpc_error(msg_id, -32603, "Internal error")
        return {"jsonrpc": "2.0", "id": msg_id, "result": result}

    def _batch(self, msgs, session):
        """The replies to a batch: only over stdio under protocol 2025-03-26, and never an empty one."""
        version = (session or {}).get("version")
        if version != "2025-03-26" or not msgs:
            return _rpc_error(None, -32600, "Invalid Request: batches are not supported")
        replies = [self.mcp(msg, None, session) for msg in msgs]
        return [reply for reply in replies if reply is not None] or None

    def _method(self, method, params, session, members):
        """The result of one JSON-RPC method; RequestError(code) for a JSON-RPC error."""
        need(isinstance(params, dict), -32602, "Invalid params: params must be an object")
        if method == "ping":
            return {}
        if method == "initialize":
            return self._initialize(params, session)
        need(method in ("tools/list", "tools/call"), -32601, "Method not found")
        initialized = session is None or session.get("version")
        need(initialized, -32600, "Invalid Request: not initialized")
        if method == "tools/list":
            return {"tools": [TOOL]}
        return self._call_tool(params, members)

    def _call_tool(self, params, members):
        """tools/call: the /verify response as structuredContent and as text, or a tool error for bad arguments."""
        name = params.get("name")
        args = params.get("arguments", {})
        shaped = isinstance(name, str) and isinstance(args, dict)
        need(shaped, -32602, "Invalid params: name and arguments")
        need(name == TOOL["name"], -32602, "Unknown tool")
        made = (members or {}).get("arguments")  # the arguments' canonical_members, made by strict_parse
        try:
            result = self.verify(validate_request(args), made if isinstance(made, dict) else None)
        except RequestError as e:
            return _tool_error(e)
        content = [_text_content(_json_text(result))]
        return {"content": content, "structuredContent": result, "isError": False}

    def _initialize(self, params, session):
        """initialize: the protocol version negotiated (the client's if supported, else our newest)."""
        asked = params.get("protocolVersion")
        need(isinstance(asked, str), -32602, "Invalid params: protocolVersion must be a string")
        fresh = session is None or not session.get("version")
        need(fresh, -32600, "Invalid Request: already initialized")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        if session is not None:
            session["version"] = version
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": _SERVER_INFO,
            "instructions": _INSTRUCTIONS,
        }
        return result


def _skip_rest(line, inp, max_line):
    """Read on past the end of an oversized stdio message (line: its start)."""
    while line and not line.endswith(b"\n"):
        line = inp.readline(max_line)


def _stdio_reply(service, line, session, inp, max_line):
    """The reply to one stdio line (None for none); an oversized line's rest is skipped."""
    try:
        if len(line) > max_line and not line.endswith(b"\n"):
            _skip_rest(line, inp, max_line)
            _bad_json("message too large")
        if not line.strip():
            return None
        with _REQUEST:
            return service.mcp(*strict_parse(line, along=_MCP_ALONG), session=session)
    except RequestError as e:
        return _rpc_error(None, -32700, "Parse error: " + e.message)


def serve_stdio(service, inp, out, max_line=4 << 20):
    """MCP over stdio: newline-delimited JSON-RPC from inp, replies to out, until EOF or the client goes."""
    session = {}
    for line in iter(lambda: inp.readline(max_line + 1), b""):
        reply = _stdio_reply(service, line, session, inp, max_line)
        if reply is None:
            continue
        text = _json_text(reply).encode("utf-8")
        try:
            out.write(text + b"\n")
            out.flush()
        except (BrokenPipeError, ValueError):
            return  # the client has gone


# ============================================================================================================
# §8 HTTP server: a selector for idle connections, a fixed worker pool, deadlines, routes, the page
# ============================================================================================================

ROUTES = {
    "/": "GET",
    "/page.js": "GET",
    "/page.css": "GET",
    "/healthcheck": "GET",
    "/spec": "GET",
    "/rules": "GET",
    "/stats": "GET",
    "/verify": "POST",
    "/receipts/verify": "POST",
    "/keys": "GET",
    "/mcp": "POST",
}
_ALLOW = {"GET": "GET, HEAD, OPTIONS", "POST": "POST, OPTIONS", "*": "GET, HEAD, POST, OPTIONS"}  # by route kind
_SINGLE = frozenset({"content-length", "transfer-encoding", "authorization", "origin", "content-type"})  # once a head
_PHRASES = {s.value: s.phrase for s in http.HTTPStatus}
MAX_HEAD = 16384  # bytes of a request line and headers
GRACE = 0.05  # seconds a worker waits on a quiet keep-alive connection for its next request
LINGER = 2.0  # seconds a closing connection's input is discarded, so that the client reads the answer, not a reset
WRITE_DEADLINE = 2.0  # seconds a response may take to be written; a client that does not read loses its connection
# connections open at once; select(), Windows' only selector, watches at most 512 sockets there
MAX_CONNS = 500 if selectors.DefaultSelector is selectors.SelectSelector else 1000
MAX_CONNS_PER_CLIENT = 64  # connections open at once from one address (behind a reverse proxy: the proxy's)
# The page's script and style, served as /page.js and /page.css: the page holds no inline script or style, so its
# Content-Security-Policy (CSP) can allow only files from this origin.
_SCRIPT = """
var g = function (id) { return document.getElementById(id); };
g("f").onsubmit = async function (e) {
  e.preventDefault();
  var out = g("out"), body, headers = {"Content-Type": "application/json"};
  try {
    body = {claim: g("claim").value, evidence: JSON.parse(g("evidence").value)};
  } catch (x) {
    out.textContent = "evidence is not JSON";
    return;
  }
  if (g("kind").value) body.kind = g("kind").value;
  if (g("tok").value) headers.Authorization = "Bearer " + g("tok").value;
  var r = await fetch("/verify", {method: "POST", headers: headers, body: JSON.stringify(body)});
  out.textContent = "HTTP " + r.status + "\\n" + JSON.stringify(await r.json(), null, 2);
};
"""
_STYLE = """
body { font: 15px/1.5 sans-serif; max-width: 62rem; margin: 2rem auto; padding: 0 1rem }
textarea, input, select { width: 100%; font: 13px monospace }
td, th { border: 1px solid #ccc; padding: .2rem .4rem; text-align: left }
pre { white-space: pre-wrap; overflow-wrap: anywhere }
"""
_PAGE = """<!doctype html>
<html lang=en>
<head>
<meta charset=utf-8>
<meta name=viewport content='width=device-width'>
<title>verify_action.py</title>
<link rel=stylesheet href=/page.css>
<script src=/page.js defer></script>
</head>
<body>
<h1>verify_action.py %(version)s</h1>
<p>Checks whether an AI agent's <b>claim</b> about an action is consistent with the <b>evidence</b> it supplies,
with deterministic rules (no model), and signs a <b>receipt</b> of what it judged.</p>
<h2>What a receipt proves</h2>
<p>%(proves)s</p>
<h2>What it does not prove</h2>
<p>%(not_proves)s</p>
<h2>Try it</h2>
<form id=f>
<p><label>kind <select id=kind><option value=''>(from the evidence shape)</option>%(kinds)s</select></label></p>
<p><label>claim<textarea id=claim rows=2>Added a check that `user.email` is set in src/user.py</textarea></label></p>
<p><label>evidence (a JSON object)<textarea id=evidence rows=8>%(example)s</textarea></label></p>
<p><label>bearer token (only if the service requires one)<input id=tok type=password autocomplete=off></label></p>
<p><button>Verify</button></p>
</form>
<pre id=out></pre>
<h2>Verdicts</h2>
<p>%(decision)s %(confidence)s</p>
<h2>Rules: the reason codes</h2>
<table>
<tr><th>code<th>kind<th>effect<th>meaning</tr>
%(rows)s
</table>
<p>Machine-readable: <a href=/rules>/rules</a>, <a href=/spec>/spec</a>.</p>
</body>
</html>
"""
_EXAMPLE_DIFF = (
    "diff --git a/src/user.py b/src/user.py\n--- a/src/user.py\n+++ b/src/user.py\n@@ -10,2 +10,4 @@\n"
    " def save(user):\n+    if user.email is None:\n+        raise ValueError(\"no email\")\n"
    "     db.write(user)\n"
)


CSP = (  # only the page's own script and style files, from this origin, run; it may only POST to this origin
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; form-action 'none'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
_PAGE_TYPES = {  # the page and its own files: path -> content type
    "/": "text/html; charset=utf-8",
    "/page.js": "text/javascript; charset=utf-8",
    "/page.css": "text/css; charset=utf-8",
}


_RULES_ROW = "<tr><td><code>%s</code></td><td>%s</td><td>%s</td><td>%s</td></tr>"
_ESCAPED = ("proves", "not_proves", "example", "decision", "confidence")  # the page's fields of text, not HTML


def _rules_row(code, reason):
    """One row of the page's rules table: a reason code, its kinds, effect and meaning."""
    kinds = html.escape(reason["kind"])
    meaning = html.escape(reason["meaning"])
    return _RULES_ROW % (code, kinds, reason["effect"], meaning)


def _by_kind(item):
    """The order of the page's rules table: by kinds, then by code."""
    code, reason = item
    return reason["kind"], code


def _rules_rows(codes):
    """The rows of the page's rules table, for rules_document's reason codes."""
    ordered = sorted(codes.items(), key=_by_kind)
    return "\n".join(itertools.starmap(_rules_row, ordered))


def render_page():
    """GET /: what a receipt proves and does not, a form to try a request (its script /page.js), the rules table
    (from rules_document: each reason code's kinds, effect and meaning)."""
    rules = rules_document()
    rows = _rules_rows(rules["reason_codes"])
    kinds = "".join("<option>%s</option>" % kind for kind in KINDS)
    example = json.dumps({"diff": _EXAMPLE_DIFF}, indent=1)
    decision = rules["decision"] + " " + rules["signals"]
    confidence_text = rules["confidence"]
    fields = {
        "version": VERSION,
        "proves": PROVES,
        "not_proves": NOT_PROVES,
        "kinds": kinds,
        "example": example,
        "decision": decision,
        "confidence": confidence_text,
        "rows": rows,
    }
    for name in _ESCAPED:
        fields[name] = html.escape(fields[name])
    return _PAGE % fields


def _is_loopback(host):
    """Whether a --host value names a loopback address (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_DEFAULT_PORTS = (("https:", ":443"), ("http:", ":80"))  # (scheme, its default port as an origin ends with it)


def _norm_origin(value):
    """An Origin header's value in lower case, without its scheme's default port (https://x:443 is https://x)."""
    if not value:
        return value
    origin = value.lower()
    for scheme, port in _DEFAULT_PORTS:
        if origin.startswith(scheme) and origin.endswith(port):
            return origin[: -len(port)]
    return origin


def _parse_head(lines):
    """(method, path, headers, keep_alive, version) from the lines of a request head; RequestError if malformed."""
    method, _, rest = lines[0].rstrip("\r").partition(" ")
    target, _, version = rest.partition(" ")
    if not (method.isalpha() and method.isupper() and target[:1] in ("/", "*")):
        raise RequestError("bad_request_line", "malformed request line")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise RequestError("unsupported_http_version", "use HTTP/1.1")
    headers = _parse_headers(lines[1:])
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.1":  # HTTP/1.1 keeps the connection unless told; 1.0 only if told
        keep_alive = "close" not in connection
    else:
        keep_alive = "keep-alive" in connection
    path = target.split("?", 1)[0]
    return method, path, headers, keep_alive, version


def _parse_headers(lines):
    """{lower-case name: value} of a head's header lines, a repeated header's values joined by ', '; RequestError
    for a malformed or folded line, a repeat of a header in _SINGLE, or more than 100 headers."""
    headers = {}
    for line in lines:
        name, colon, value = line.rstrip("\r").partition(":")
        if not (name or colon):
            continue  # the empty line that ends the head
        name = name.lower()
        repeated = name in headers and name in _SINGLE
        if repeated or not colon or not name or name != name.strip() or len(headers) > 99:
            raise RequestError("bad_header", "a malformed, folded or repeated header line")
        value = value.strip()
        if name in headers:
            value = headers[name] + ", " + value
        headers[name] = value
    return headers


def _head_end(buf):
    """Where the request head at the start of buf ends (just after its empty line), or -1 if it has not ended."""
    crlf = buf.find(b"\n\r\n")
    lf = buf.find(b"\n\n")
    if crlf < 0 and lf < 0:
        return -1
    if lf < 0 or 0 <= crlf < lf:
        return crlf + 3
    return lf + 2


def _is_json_utf8(content_type):
    """Whether a Content-Type header says application/json, with no charset or a UTF-8 one."""
    mime, *params = content_type.lower().split(";")
    charsets = set()
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "charset":
            charsets.add(value.strip().strip('"'))
    return mime.strip() == "application/json" and charsets <= {"utf-8", "utf8"}


def _response(status, body, close, ctype="application/json", extra=(), head_only=False, keep10=False):
    """The bytes of an HTTP/1.1 response; keep10 tells an HTTP/1.0 client that the connection stays open."""
    lines = ["HTTP/1.1 %d %s" % (status, _PHRASES[status]), "Cache-Control: no-store"]
    lines.append("X-Content-Type-Options: nosniff")
    if close:
        lines.append("Connection: close")
    if keep10:
        lines.append("Connection: keep-alive")
    if status != 204:
        lines += ["Content-Type: " + ctype, "Content-Length: %d" % len(body)]
    lines += ["%s: %s" % header for header in extra]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if head_only or status == 204:
        return head
    return head + body


_PAGE_HEADERS = [("Content-Security-Policy", CSP), ("X-Frame-Options", "DENY")]  # for / and its script and style
# (status, body, content type, extra headers) when answering fails: a bug still gets an answer
_INTERNAL_ERROR = (500, b'{"error":"internal_error","message":"the request could not be handled"}', "application/json",
                   [])


class _Conn(object):
    """A client connection: the selector thread's, except while a worker answers its request."""

    def __init__(self, sock, peer, now):
        self.sock = sock
        self.peer = peer  # the client's address: connections are counted by it
        self.buf = bytearray()  # input received, not yet parsed
        self.out = b""  # the part of a response not yet written (a memoryview)
        self.since = now  # when the current phase began: waiting for a request, reading it, writing, lingering
        self.head = None  # a parsed head whose body is still arriving: (method, path, headers, keep, version, length)
        self.events = 0  # what the selector watches it for
        self.closing = False  # the connection closes once its response is written
        self.done = False  # answered for the last time: input is discarded until the client closes


class Server(object):
    """HTTP/1.1 keep-alive without a thread per client. One selector thread accepts connections, reads heads and
    bodies, and writes what a response leaves unwritten, never waiting on a client: it refuses what a head shows,
    answers 408 after read_deadline and 503 after queue_wait, and closes a connection whose response is not
    written within write_deadline, or that is idle for idle_timeout. A fixed pool of workers gets only whole
    requests and never waits to write, so a client that sends slowly or does not read holds its own connection,
    never a worker. At most max_conns connections are open, and at most max_conns_per_client from one address
    (behind a reverse proxy every client is the proxy); beyond either a new connection gets 503 and is closed."""

    def __init__(
        self,
        service,
        host="127.0.0.1",
        port=8092,
        workers=16,
        max_body=MAX_BODY,
        token=None,
        origins=(),
        read_deadline=10.0,
        idle_timeout=15.0,
        queue_wait=5.0,
        max_conns=MAX_CONNS,
        max_conns_per_client=MAX_CONNS_PER_CLIENT,
        write_deadline=WRITE_DEADLINE,
    ):
        self.service = service
        self.workers = workers
        self.max_body = max_body
        self.token = token
        self.read_deadline = read_deadline
        self.idle_timeout = idle_timeout
        self.queue_wait = queue_wait
        self.write_deadline = write_deadline
        self.max_conns = max_conns
        self.max_conns_per_client = max_conns_per_client
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=512)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        # the origins whose POSTs are accepted: the service's own (so that the form on / works), the --allow-origin
        # ones, and None (no Origin header: not a browser)
        named = self._own_origins(host) + list(origins)
        self.origins = {_norm_origin(origin) for origin in named} | {None}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # workers wake the selector through it
        self._ready = collections.deque()  # (conn, request, queued at) for the workers, under _cv
        self._returned = collections.deque()  # connections the workers hand back to the selector
        self._cv = threading.Condition()
        self._open = 0
        self._peers = collections.Counter()  # open connections by client address
        self._stop = False

    def _own_origins(self, host):
        # The service's own origins: the loopback names, for a loopback or wildcard bind, and the host it binds.
        loopback = _is_loopback(host)
        names = []
        if loopback or host in ("0.0.0.0", "::"):
            names += ["127.0.0.1", "localhost", "[::1]"]
        if not loopback:
            names.append("[%s]" % host if ":" in host else host)
        return ["http://%s:%d" % (name, self.port) for name in names]

    # ---- the selector thread ---------------------------------------------------------------------------------

    def serve_forever(self):
        """Serve until shutdown(): this thread becomes the selector thread."""
        self._docs = self._documents()
        for i in range(self.workers):
            threading.Thread(target=self._work, name="va-worker-%d" % i, daemon=True).start()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self.sock, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        swept = time.monotonic()
        while not self._stop:
            for key, events in self._sel.select(0.25):
                self._on_event(key.data, events)
            now = time.monotonic()
            if now - swept >= 0.25:
                swept = now
                self._sweep(now)
        self._close_everything()

    def shutdown(self):
        """Stop serve_forever (from another thread)."""
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # its buffer is full, so the selector wakes anyway; or it has stopped already
            pass

    def _documents(self):
        # The documents made once, when serving starts, so that /spec says what the sandbox enforces.
        return {
            "/": render_page().encode("utf-8"),
            "/page.js": _SCRIPT.encode("utf-8"),
            "/page.css": _STYLE.encode("utf-8"),
            "/spec": _json_text(spec_document(self.service.sandbox)).encode("utf-8"),
            "/rules": _json_text(rules_document()).encode("utf-8"),
        }

    def _on_event(self, data, events):
        # One selector event: connections to accept, workers handing connections back, or a client's socket ready.
        if data == "accept":
            self._accept()
        elif data == "wake":
            self._resume_returned()
        elif events & selectors.EVENT_WRITE:
            self._write(data)
        else:
            self._receive(data)

    def _accept(self):
        # Accept every pending connection, or turn it away if the table or its client's share is full.
        while True:
            try:
                sock, address = self.sock.accept()
            except BlockingIOError:
                return
            except OSError:  # no descriptor left (EMFILE): pause accepting until the next sweep, do not spin
                self._sel.unregister(self.sock)
                return
            peer = address[0]
            if self._open >= self.max_conns:
                self._turn_away(sock, "too many connections")
            elif self._peers[peer] >= self.max_conns_per_client:
                self._turn_away(sock, "too many connections from this address")
            else:
                self._admit(sock, peer)

    def _admit(self, sock, peer):
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._open += 1
        self._peers[peer] += 1
        self._advance(_Conn(sock, peer, time.monotonic()))

    def _turn_away(self, sock, message):
        # 503 at once, and close: a connection turned away never takes a slot. What the client has sent already is
        # read first, so that closing does not reset the connection before the client reads the answer.
        self.service.count("errors_by_status", "503")
        body = _json_text({"error": "service_unavailable", "message": message}).encode("utf-8")
        try:
            sock.setblocking(False)
            sock.send(_response(503, body, True))  # into an empty buffer: all of it
            sock.shutdown(socket.SHUT_WR)
            sock.recv(MAX_HEAD)
        except OSError:  # nothing has arrived, or the client has gone
            pass
        sock.close()

    def _resume_returned(self):
        # Take back the connections the workers have answered on, and move each on.
        try:
            self._wake_r.recv(65536)
        except BlockingIOError:  # woken for nothing (select may do that): there may still be connections
            pass
        while self._returned:
            self._advance(self._returned.popleft())

    def _sweep(self, now):
        # Every 0.25 s: the connections past their phase's deadline, the requests queued too long, and accepting
        # again after running out of descriptors.
        if self.sock not in self._sel.get_map():
            self._sel.register(self.sock, selectors.EVENT_READ, "accept")
        watched = [key.data for key in self._sel.get_map().values() if isinstance(key.data, _Conn)]
        for conn in watched:
            if now - conn.since > self._deadline(conn):
                self._expire(conn)
        for conn in self._late(now):
            self._refuse(conn, RequestError("service_unavailable", "busy; retry", 503))
            self._advance(conn)

    def _deadline(self, conn):
        # The seconds conn's current phase may last: writing, lingering, reading a request, or waiting for one.
        if conn.out:
            return self.write_deadline
        if conn.done:
            return LINGER
        if conn.buf or conn.head is not None:
            return self.read_deadline
        return self.idle_timeout

    def _expire(self, conn):
        # 408 for a request not read in time; any other phase past its deadline ends the connection.
        reading = conn.buf or conn.head is not None
        if reading and not (conn.out or conn.done):
            self._refuse(conn, RequestError("request_timeout", "not received in %gs" % self.read_deadline, 408))
            self._advance(conn)
        else:
            self._close(conn)

    def _late(self, now):
        # The connections whose requests have waited longer than queue_wait for a worker, taken off the queue.
        late = []
        with self._cv:
            while self._ready and now - self._ready[0][2] > self.queue_wait:
                late.append(self._ready.popleft()[0])
        return late

    def _watch(self, conn, events):
        # Have the selector watch conn for events (EVENT_READ or EVENT_WRITE), or not at all (0).
        if events == conn.events:
            return
        if not conn.events:
            self._sel.register(conn.sock, events, conn)
        elif not events:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn):
        self._watch(conn, 0)
        conn.sock.close()
        self._open -= 1
        self._peers[conn.peer] -= 1
        if not self._peers[conn.peer]:
            del self._peers[conn.peer]

    def _receive(self, conn):
        # Input on conn: part of a request, the client closing, or input discarded while conn lingers.
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client
            data = None
        reading = conn.buf or conn.head is not None  # never while conn lingers
        if data is None or not (data or reading):
            self._close(conn)  # the client has gone, or closed between requests
        elif conn.done:
            pass  # lingering: input is discarded until the client closes
        elif not data:  # half-closed inside a request: say so before closing
            code = "truncated_body" if conn.head else "truncated_request"
            self._refuse(conn, RequestError(code, "the connection closed inside the request"))
            self._advance(conn)
        else:
            if not reading:
                conn.since = time.monotonic()  # a request starts
            conn.buf += data
            self._advance(conn)

    def _write(self, conn):
        # The socket has room: write more of conn's response, and once it is all written move conn on.
        self._flush(conn)
        if not conn.out:
            self._advance(conn)

    def _advance(self, conn):
        # Move conn on, in the selector thread: write the rest of its response, queue its next whole request for a
        # worker, or wait for input (more of a request, the next one, or the end of a lingering connection).
        request = None
        if not conn.out and not conn.done:
            request = self._parse_or_refuse(conn)
        if request is not None:
            self._queue(conn, request)
        elif conn.out:
            self._watch(conn, selectors.EVENT_WRITE)
        else:
            self._watch(conn, selectors.EVENT_READ)

    def _queue(self, conn, request):
        # Hand a whole request to the workers; the selector does not watch conn meanwhile.
        self._watch(conn, 0)
        with self._cv:
            self._ready.append((conn, request, time.monotonic()))
            self._cv.notify()

    def _close_everything(self):
        # After shutdown(): close the selector, the sockets and every connection, and stop the workers (a worker
        # still busy closes its own connection when it finds the selector gone).
        conns = [key.data for key in self._sel.get_map().values() if isinstance(key.data, _Conn)]
        for closable in (self._sel, self.sock, self._wake_r, self._wake_w):
            closable.close()
        with self._cv:
            conns += [entry[0] for entry in self._ready]
            self._ready.clear()
            self._ready.extend([(None, None, 0)] * self.workers)  # one stop sign per worker
            self._cv.notify_all()
        for conn in conns + list(self._returned):
            conn.sock.close()

    # ---- the workers -----------------------------------------------------------------------------------------

    def _work(self):
        # A worker: answer whole requests until a stop sign comes.
        while True:
            with self._cv:
                while not self._ready:
                    self._cv.wait()
                conn, request, _ = self._ready.popleft()
            if conn is None:
                return
            self._serve(conn, request)
            self._hand_back(conn)

    def _serve(self, conn, request):
        # Answer request on conn, then the next ones while each response is written at once and the service is quiet.
        while request is not None:
            data, close = self._reply(*request)
            self._send(conn, data, close)
            request = None
            if not conn.out and not conn.closing:
                request = self._next(conn)

    def _hand_back(self, conn):
        # Give conn back to the selector, which writes what is left of its response or reads its next request.
        self._returned.append(conn)
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:  # the selector has wake-ups waiting already
            pass
        except OSError:  # shut down meanwhile
            conn.sock.close()

    def _next(self, conn):
        # The keep-alive fast path when the service is quiet: a whole next request that arrives within GRACE stays
        # with this worker; otherwise None, and the connection goes back to the selector, so that requests are
        # served in arrival order.
        if self._ready or self._open > 2:
            return None
        if not conn.buf:
            self._wait_for_input(conn)
        try:
            return self._parse(conn)
        except RequestError as e:
            self._refuse(conn, e)
        return None

    def _wait_for_input(self, conn):
        # Up to GRACE for more input on conn (the client closing leaves it to the selector).
        conn.sock.settimeout(GRACE)
        try:
            conn.buf += conn.sock.recv(65536)
        except OSError:  # nothing came within GRACE (socket.timeout), or the client has gone
            pass
        finally:
            conn.sock.setblocking(False)

    def _reply(self, method, path, headers, keep, version, body):
        # (the response to a whole request, whether to close the connection after it).
        unread_body = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("0", "")
        close = not keep or unread_body and method != "POST"  # only a POST's body is read
        try:
            status, data, ctype, extra = self._answer(method, path, headers, body)
        except Exception:  # a bug must still answer, never drop the connection or print a traceback
            status, data, ctype, extra = _INTERNAL_ERROR
            close = True
        if status >= 400:
            self.service.count("errors_by_status", str(status))
        keep10 = keep and not close and version == "HTTP/1.0"
        return _response(status, data, close, ctype, extra, method == "HEAD", keep10), close

    def _answer(self, method, path, headers, body):
        # (status, body, content type, extra headers) for a request that passed _check.
        if method == "OPTIONS":
            return 204, b"", "application/json", [("Allow", _ALLOW[ROUTES.get(path, "*")])]
        if path in _PAGE_TYPES:
            return 200, self._docs[path], _PAGE_TYPES[path], _PAGE_HEADERS
        if method != "POST":
            return 200, self._get(path), "application/json", []
        status, obj = self.service.post(path, body, headers)
        data = b"" if obj is None else _json_text(obj).encode("utf-8")
        return status, data, "application/json", []

    def _get(self, path):
        # The JSON body of GET path: /spec and /rules were made when serving started; /healthcheck and /stats now.
        if path in self._docs:
            return self._docs[path]
        if path == "/healthcheck":
            doc = {"status": "ok", "version": VERSION, "sandbox": self.service.sandbox}
        elif path == "/keys":
            doc = self.service.keys_document()
        else:
            doc = self.service.stats()
        return _json_text(doc).encode("utf-8")

    # ---- both: writing, refusing, parsing ----------------------------------------------------------------------

    def _send(self, conn, data, close):
        # Start writing a response on conn (close: then close the connection); the selector writes what the socket
        # does not take now.
        conn.out = memoryview(data)
        conn.closing = close
        conn.since = time.monotonic()
        self._flush(conn)

    def _flush(self, conn):
        # Write as much of conn's response as its socket takes now, never waiting. Once all of it is written, the
        # connection waits for its next request, or lingers if it is closing.
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):  # the socket's buffer is full: the selector waits for room
                return
            except OSError:  # the client has gone: nothing more can be said
                sent = len(conn.out)
            conn.out = conn.out[sent:]
        conn.since = time.monotonic()
        if conn.closing and not conn.done:
            self._linger(conn)

    def _linger(self, conn):
        # After the last response: discard input until the client closes, so that it is not reset.
        conn.done = True
        conn.buf = bytearray()
        conn.head = None
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _refuse(self, conn, error):
        # Answer a RequestError, and close: the input is no longer in step with the requests.
        self.service.count("errors_by_status", str(error.status))
        body = _json_text({"error": error.code, "message": error.message}).encode("utf-8")
        head_only = conn.head is not None and conn.head[0] == "HEAD"
        self._send(conn, _response(error.status, body, True, "application/json", error.headers, head_only), True)

    def _parse_or_refuse(self, conn):
        # The next whole request in conn's input, or None: not complete yet, or refused (the refusal is under way).
        try:
            return self._parse(conn)
        except RequestError as e:
            self._refuse(conn, e)
        return None

    def _parse(self, conn):
        # The next whole request in conn.buf, (method, path, headers, keep, version, body), or None until it is
        # complete; RequestError for a refusal.
        if conn.head is None:
            conn.head = self._read_head(conn)
        if conn.head is None or len(conn.buf) < conn.head[5]:
            return None
        head, length = conn.head, conn.head[5]
        body = bytes(conn.buf[:length])
        del conn.buf[:length]
        conn.head = None
        return head[:5] + (body,)

    def _read_head(self, conn):
        # The head at the start of conn.buf, parsed and checked, with the body length it announces; None until it
        # has ended.
        buf = conn.buf
        if buf[:1] in (b"\r", b"\n"):
            del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]  # RFC 9112: empty lines before a request are ignored
        end = _head_end(buf)
        if end > MAX_HEAD or end < 0 and len(buf) > MAX_HEAD:  # a body may follow a short head in buf
            raise RequestError("headers_too_large", "the request head exceeds %d bytes" % MAX_HEAD, 431)
        if end < 0:
            return None
        lines = bytes(buf[:end]).decode("latin-1").split("\n")
        del buf[:end]
        method, path, headers, keep, version = _parse_head(lines)
        conn.head = (method,)  # so that a refusal of a HEAD request has no body
        length = self._check(conn, method, path, headers)
        return method, path, headers, keep, version, length

    def _check(self, conn, method, path, headers):
        # The body length a head announces, or its refusal: 404 405 411 400 413 403 401 415, in that order.
        route = ROUTES.get(path)
        if path == "*" and method == "OPTIONS":
            route = "*"
        if route is None:
            raise RequestError("not_found", "no such path; see GET /spec", 404)
        if method not in _ALLOW[route].split(", "):
            raise RequestError("method_not_allowed", "see Allow", 405, [("Allow", _ALLOW[route])])
        if method != "POST":
            return 0
        length = self._body_length(headers)
        self._check_sender(headers)
        if not _is_json_utf8(headers.get("content-type", "")):
            raise RequestError("unsupported_media_type", "Content-Type must be application/json (UTF-8)", 415)
        if headers.get("expect", "").lower() == "100-continue" and len(conn.buf) < length:
            self._continue(conn)
        return length

    def _body_length(self, headers):
        # A POST's Content-Length, or its refusal: 411, 400, 413.
        length = headers.get("content-length")
        if "transfer-encoding" in headers or length is None:
            raise RequestError("length_required", "send the body with Content-Length (chunked is not accepted)", 411)
        if not (length.isascii() and length.isdigit() and len(length) <= 15):
            raise RequestError("bad_content_length", "Content-Length must be a decimal number")
        if int(length) > self.max_body:
            raise RequestError("body_too_large", "over %d bytes" % self.max_body, 413)
        return int(length)

    def _check_sender(self, headers):
        # A POST's Origin (DNS-rebinding protection) and bearer token, or their refusal: 403, 401.
        if _norm_origin(headers.get("origin")) not in self.origins:
            raise RequestError("forbidden_origin", "this Origin is not allowed (see --allow-origin)", 403)
        if self.token is None:
            return
        scheme, _, given = headers.get("authorization", "").partition(" ")
        token = given.strip().encode("latin-1")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(token, self.token)):
            raise RequestError("unauthorized", "a bearer token is required", 401, [("WWW-Authenticate", "Bearer")])

    def _continue(self, conn):
        # 100 Continue, for a client that waits for it before sending the body (into an empty socket buffer).
        try:
            conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        except OSError:
            pass


# ============================================================================================================
# §8b Sandbox: applied once, after the port is bound and the key ring and token are read, before any thread starts
# ============================================================================================================

SANDBOX_MODES = ("auto", "on", "off")
# Machines whose Linux syscall table numbers Landlock 444 (create_ruleset), 445 (add_rule), 446 (restrict_self).
LANDLOCK_MACHINES = ("x86_64", "i386", "i486", "i586", "i686", "aarch64", "armv7l", "armv8l", "riscv64", "ppc64le",
                     "s390x", "loongarch64")
LANDLOCK_FILESYSTEM_RIGHTS = ((1, 13), (2, 1), (3, 1), (5, 1), (9, 1))  # (from ABI, filesystem rights it adds)
# Audit events (prefixes) refused once the sandbox is on: files opened by name or listed, imports, processes,
# signals, sockets (but those accept() makes), native code, changes on disk.
REFUSED_EVENTS = ("open", "os.listdir", "os.scandir", "import", "subprocess.", "_posixsubprocess.", "_winapi.",
                  "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.startfile", "os.kill",
                  "signal.pthread_kill", "pty.", "socket.", "ctypes.", "mmap.", "winreg.", "os.ch", "os.link",
                  "os.mkdir", "os.putenv", "os.unsetenv", "os.remove", "os.rename", "os.rmdir", "os.setxattr",
                  "os.symlink", "os.truncate", "os.utime")
# every codec json.detect_encoding names (UTF-16 also orders canonical keys): loaded before the sandbox starts
SANDBOX_CODECS = ("utf-8-sig", "utf-16", "utf-16-be", "utf-16-le", "utf-32", "utf-32-be", "utf-32-le")
# socket.accept makes its socket object through socket.__new__ as socket() does: only its code is let through
_ACCEPT = socket.socket.accept.__code__


def landlock_rights(abi):
    """Every right Landlock ABI abi knows -> (filesystem, network, scope) masks to handle; no rule grants any:
    filesystem 13 rights from ABI 1, REFER 2, TRUNCATE 3, IOCTL_DEV 5, RESOLVE_UNIX 9; network TCP bind and
    connect from 4; scope abstract Unix sockets and signals from 6."""
    filesystem = 0
    for since, rights in LANDLOCK_FILESYSTEM_RIGHTS:
        if abi >= since:
            filesystem += rights
    network = 3 if abi >= 4 else 0
    scope = 3 if abi >= 6 else 0
    return (1 << filesystem) - 1, network, scope


def landlock():
    """Deny this thread, and the threads and processes it starts later, every filesystem access, TCP bind and
    connect, abstract Unix sockets and signals outside -> (Landlock ABI, None), or (None, why not) where the
    kernel offers no Landlock (best effort: nothing is restricted then). Open descriptors keep working: the bound
    socket keeps accepting, stdio keeps flowing."""
    machine = sys.platform
    if machine.startswith("linux"):
        machine = os.uname().machine
    if machine not in LANDLOCK_MACHINES:
        return None, "no Landlock on %s" % machine
    import ctypes  # looked up only here, before the audit hook refuses ctypes
    try:  # glibc opens its thread unwinder when a thread ends by pthread_exit, as a daemon worker does when the
        ctypes.CDLL("libgcc_s.so.1")  # interpreter exits under it: load it while files can be read, or it aborts
    except OSError:  # no such library: nothing needs it
        pass
    try:
        abi = _landlock_restrict_self(ctypes)
    except OSError as e:
        return None, "Landlock unavailable: %s" % (e.strerror or e)
    return abi, None


def _landlock_restrict_self(ctypes):
    """Landlock's ABI version, once this thread is restricted by a ruleset that handles every right the ABI knows
    and grants none; OSError if the kernel refuses. System calls take every argument typed (they are variadic in
    C) and structures as bytes."""
    libc = ctypes.CDLL(None, use_errno=True)
    c_long = ctypes.c_long
    c_u32 = ctypes.c_uint32

    def call(function, *args):
        result = function(*args)
        if result < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return result
    abi = call(libc.syscall, c_long(444), None, ctypes.c_size_t(0), c_u32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    masks = landlock_rights(abi)
    handled = b"".join(mask.to_bytes(8, sys.byteorder) for mask in masks)
    ruleset = call(libc.syscall, c_long(444), handled, ctypes.c_size_t(24), c_u32(0))  # older kernels: zero tail
    try:
        call(libc.prctl, ctypes.c_int(38), c_long(1), c_long(0), c_long(0), c_long(0))  # PR_SET_NO_NEW_PRIVS
        call(libc.syscall, c_long(446), ctypes.c_int(ruleset), c_u32(0))  # restrict_self, with no rule added
    finally:
        os.close(ruleset)
    return abi


def audit_hook(event, args):
    """An audit hook (for sys.addaudithook) that refuses, on every OS, opening or listing files by name, new imports,
    processes, signals, sockets other than those accept() makes, ctypes and changes on disk. It stops Python code,
    not native code: Landlock is the kernel's boundary where it exists."""
    if not event.startswith(REFUSED_EVENTS):
        return
    if event == "open" and isinstance(args[0], int):
        return  # an open descriptor, such as stdio
    if event == "socket.__new__" and sys._getframe(2).f_code is _ACCEPT:  # this hook, socket.__init__, accept
        return
    what = event
    if args:
        what = "%s %.200r" % (event, args[0])
    refusal = ImportError if event == "import" else PermissionError
    raise refusal("verify_action.py sandbox: %s refused after startup" % what)


def _load_what_serving_needs():
    """Load, while files can still be read, what serving may need later: the codecs, and on Python 3.13 the code
    that formats tracebacks (it reads source lines lazily; earlier versions format them in C)."""
    for codec in SANDBOX_CODECS:
        "".encode(codec)
    if sys.version_info >= (3, 13):
        import traceback
        try:
            raise RuntimeError("warm-up")
        except RuntimeError:
            traceback.format_exc()


def apply_sandbox(mode):
    """Apply --sandbox mode (auto, on or off) -> what is enforced, also said on stderr: "landlock ABI N", "audit hook
    only" or "off". Call it once, after the port is bound and the key ring and token are read, before any thread
    starts (Landlock binds only the calling thread and those it starts later). ValueError when on finds no Landlock."""
    status = "off"
    reason = None
    if mode != "off":
        _load_what_serving_needs()
        abi, reason = landlock()
        if abi is None and mode == "on":
            raise ValueError("--sandbox=on needs Landlock (%s); use --sandbox=auto for the audit hook alone" % reason)
        sys.addaudithook(audit_hook)
        status = "audit hook only" if abi is None else "landlock ABI %d" % abi
    because = " (%s)" % reason if reason else ""
    sys.stderr.write("verify_action.py: sandbox: %s%s\n" % (status, because))
    return status


# ============================================================================================================
# §9 Command line
# ============================================================================================================


def _origin(value):
    """An --allow-origin value (argparse type): scheme://host[:port] and nothing more."""
    parts = urllib.parse.urlsplit(value)
    more = parts.path or parts.query or parts.fragment
    if parts.scheme not in ("http", "https") or not parts.netloc or more:
        raise argparse.ArgumentTypeError("expected scheme://host[:port]")
    return value


def _sandbox_mode(value):
    """A --sandbox value (argparse type); empty, or a launcher's ${...} left unexpanded, means auto."""
    if not value or value.startswith("${"):
        return "auto"
    return value


def _fail(message):
    sys.stderr.write("verify_action.py: error: %s\n" % message)
    return 2


def _read_receipt(path, member="receipt"):
    """(member, document) of a file, which holds a bare receipt, a credential (an object with a proof) or a whole
    /verify response (strict JSON); of a response, its member ("receipt" or "credential")."""
    with open(path, "rb") as f:
        doc = strict_loads(f.read(MAX_BODY + 1))
    if not isinstance(doc, dict):
        return "receipt", doc
    if "aar_verdict" in doc:
        return member, doc.get(member)
    if "proof" in doc:
        return "credential", doc
    return "receipt", doc


def _keygen_command(args):
    """keygen: print the new key's kid, and for an Ed25519 key its did:key on a second line."""
    kid = keygen(args.key_file, args.alg)
    print(kid)
    if args.alg == ED25519_ALG:
        public = load_keyring(args.key_file).public_keys[kid]
        print(did_key(public))
    return 0


def _check_command(args):
    """verify-receipt: check the file's receipt or credential; print {valid, reason, kid}; exit 0 when valid."""
    if args.key_file:
        service = Service(load_keyring(args.key_file))
        member, doc = _read_receipt(args.file)
        result = service.check(member, doc)
    else:
        public_keys = load_public_keys(args.public_keys)
        member, doc = _read_receipt(args.file, "credential")
        result = _public_key_check(member, doc, public_keys)
    print(json.dumps(result))
    return 0 if result["valid"] else 1


def _public_key_check(member, doc, public_keys):
    """{valid, reason, kid} of a credential under public keys alone (kid: its did:key); a receipt cannot be."""
    if member != "credential":
        raise ValueError("--public-keys checks credentials; an HMAC receipt needs --key-file")
    valid, reason, kid = verify_credential(doc, public_keys)
    return {"valid": valid, "reason": reason, "kid": kid}


def _receipt_command(argv):
    """keygen --key-file F [--alg hmac|ed25519] (prints the new kid) | verify-receipt FILE (--key-file F |
    --public-keys F) (exit 0 when valid, 1 when not, 2 for an error)."""
    parser = argparse.ArgumentParser(prog="verify_action.py " + argv[0])
    keys = parser
    if argv[0] == "verify-receipt":
        parser.add_argument("file")
        keys = parser.add_mutually_exclusive_group(required=True)
        keys.add_argument("--public-keys", metavar="FILE", help="did:keys, one a line: check a credential with them")
    else:
        parser.add_argument("--alg", choices=KEY_ALGS, default="hmac", help="the new key's kind (default hmac)")
    keys.add_argument("--key-file", required=argv[0] == "keygen")
    args = parser.parse_args(argv[1:])
    try:
        if argv[0] == "keygen":
            return _keygen_command(args)
        return _check_command(args)
    except (OSError, ValueError) as e:
        return _fail(getattr(e, "message", None) or e)


FLAGS = (  # the service's command-line flags: (flag, argparse keywords)
    ("--host", {"default": "127.0.0.1", "help": "bind address; non-loopback is an explicit opt-in"}),
    ("--port", {"type": int, "default": 8092, "help": "0 picks a free port (printed on stderr)"}),
    ("--key-file", {"help": "key ring (see keygen); without it an ephemeral key is used"}),
    ("--max-body", {"type": int, "default": MAX_BODY, "help": "bytes of a POST body (default %(default)s)"}),
    ("--workers", {"type": int, "default": 16, "help": "threads that answer requests (default %(default)s)"}),
    ("--max-conns-per-client", {"type": int, "default": MAX_CONNS_PER_CLIENT, "metavar": "N",
                                "help": "connections open at once from one address (default %(default)s); beyond "
                                "it a new one gets 503. Behind a reverse proxy every client is the proxy"}),
    ("--token-file", {"help": "every POST then needs Authorization: Bearer <token>"}),
    ("--issuer", {"default": "verify_action.py", "help": "issued_by in receipts"}),
    ("--allow-origin", {"action": "append", "default": [], "type": _origin, "metavar": "ORIGIN"}),
    ("--stdio", {"action": "store_true", "help": "serve MCP over stdin/stdout instead of HTTP"}),
    ("--sandbox", {"default": "auto", "choices": SANDBOX_MODES, "type": _sandbox_mode,
                   "help": "after startup: no files, no new sockets, no processes (default auto; on: Landlock or "
                   "refuse to start; empty or ${...}: auto)"}),
)
FLAG_RANGES = (  # (flag, its argparse name, least, most)
    ("--port", "port", 0, 65535),
    ("--workers", "workers", 1, 256),
    ("--max-body", "max_body", 1024, 67108864),
    ("--max-conns-per-client", "max_conns_per_client", 1, MAX_CONNS),
)


def _flag_problem(args):
    """What is wrong with the flags' values, said for an error message; None when nothing is."""
    for flag, name, least, most in FLAG_RANGES:
        if not least <= getattr(args, name) <= most:
            return "%s must be %d-%d" % (flag, least, most)
    if not 0 < len(args.issuer) < 99:
        return "--issuer must be 1-98 characters"
    return None


def _load_secrets(args):
    """(key ring, bearer token or None) from the files the flags name; OSError or ValueError."""
    ring = KeyRing.generate()
    if args.key_file:
        ring = load_keyring(args.key_file)
    if not args.token_file:
        return ring, None
    token = read_private_file(args.token_file).strip().encode("utf-8")
    if len(token) < 16 or b"\n" in token:
        raise ValueError("--token-file: one token, >= 16 chars")
    return ring, token


def _serve_stdio(service):
    """MCP over stdin and stdout until the client closes them."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    serve_stdio(service, sys.stdin.buffer, out)
    return 0


def _serve_http(server, args, token, kid):
    """HTTP until the process is stopped; a warning first if anyone who can reach the port can get receipts."""
    if not _is_loopback(args.host) and token is None:
        sys.stderr.write(
            "verify_action.py: WARNING: bound to non-loopback %s without --token-file: anyone who can "
            "reach this port can obtain signed receipts\n" % args.host
        )
    host = args.host
    if ":" in host:
        host = "[%s]" % host
    url = "http://%s:%d" % (host, server.port)
    print("verify_action.py %s listening on %s (kid %s)" % (VERSION, url, kid), file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


def main(argv=None):
    """The command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["keygen"], ["verify-receipt"]):
        return _receipt_command(argv)
    parser = argparse.ArgumentParser(prog="verify_action.py", description=__doc__.split("\n\n")[0])
    for flag, keywords in FLAGS:
        parser.add_argument(flag, **keywords)
    args = parser.parse_args(argv)
    problem = _flag_problem(args)
    if problem:
        return _fail(problem)
    try:
        ring, token = _load_secrets(args)
    except (OSError, ValueError) as e:
        return _fail(e)
    if ring.ephemeral:
        sys.stderr.write(
            "verify_action.py: no --key-file: an ephemeral key (kid %s) signs, so receipts "
            "cannot be verified after a restart (see keygen)\n" % ring.kid
        )
    service = Service(ring, args.issuer)
    server = None
    try:
        if not args.stdio:
            server = Server(service, args.host, args.port, args.workers, args.max_body, token, args.allow_origin,
                            max_conns_per_client=args.max_conns_per_client)
    except OSError as e:
        return _fail("cannot listen on %s:%d: %s" % (args.host, args.port, e.strerror or e))
    try:  # the port is bound and the files read; no thread has started
        service.sandbox = apply_sandbox(args.sandbox)
    except ValueError as e:
        return _fail(e)
    if args.stdio:
        return _serve_stdio(service)
    return _serve_http(server, args, token, ring.kid)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C ends the service quietly
        sys.exit(0)
