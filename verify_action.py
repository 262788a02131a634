#!/usr/bin/env python3
"""verify_action.py: check an AI agent's claim about an action against the evidence it supplies, and sign a
receipt of what was judged. One file, Python standard library only (CPython 3.9+); vendor it by copying it.

  python3 verify_action.py [--host H] [--port P] [--key-file F] ...   HTTP on 127.0.0.1:8092
  python3 verify_action.py --stdio [--key-file F]                     MCP over stdio
  python3 verify_action.py keygen --key-file F                        create a key ring, or add a key
  python3 verify_action.py verify-receipt FILE --key-file F           check a receipt offline (exit 0/1)
Deterministic rules that fetch nothing judge whether the evidence is consistent with the claim; a receipt (HMAC-SHA256
over RFC 8785 canonical JSON) proves which service judged which request, when, with what result: never the claim.
"""

import argparse, base64, collections, gc, hashlib, hmac, html, http, ipaddress, itertools, json, operator, os, re
import secrets, selectors, socket, stat, sys, threading, time, urllib.parse

# ============================================================================================================
# §1 Constants, verdicts, reason codes
# ============================================================================================================

VERSION, SCHEMA = "1.0.0", "verify_action_receipt.v0"
VERDICTS = ("verified", "contradicted", "insufficient_evidence", "unsafe_to_verify")
LEGACY = dict(zip(VERDICTS, ("ok", "mismatch", "uncertain", "rejected")))  # the peer's verdict names, kept as aliases
KINDS = ("code_diff", "db_op", "file_op", "api_call", "generic")
# characters (code points) of claim and context; JSON nesting (the request object is level 1); bytes of a POST
# body (--max-body); caller_context keys and characters
MAX_CLAIM, MAX_CONTEXT, MAX_DEPTH, MAX_BODY, MAX_CALLER_KEYS, MAX_CALLER_STR = 8192, 8192, 32, 1 << 20, 8, 64
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
PROVES, NOT_PROVES = (
    "Which service (key id kid) judged which exact request (SHA-256 of the claim, of the evidence and "
    "of the whole request in RFC 8785 canonical form), when, and with what verdict and reason codes.",
    "That the claim is true. The service never reaches into databases, repositories or APIs; it only "
    "judges whether the evidence is consistent with the claim, and evidence can be fabricated or incomplete.",
)
REASONS = {  # code: (kind, signal: + - ! (critical) unsafe 0 (neutral), meaning); closed: nothing else is emitted
    "no_signal": ("any", "0", "No rule found anything in the evidence to compare with the claim."),
    "evidence_missing_fields": ("any", "-", "The evidence lacks the fields this kind needs."),
    "evidence_invalid": ("any", "unsafe", "A field this kind reads has the wrong type or shape."),
    "evidence_too_large": ("any", "unsafe", "A field exceeds this kind's bound (see bounds)."),
    "verifier_error": ("any", "unsafe", "A rule failed unexpectedly; nothing was judged."),
    "conflicting_verbs": ("any", "-", "The claim names actions that contradict each other."),
    "claim_negated": ("any", "-", "The claim negates its action (did not, never, no ... were): never verified."),
    "diff_no_changes": ("code_diff", "-", "The diff contains no file changes."),
    "path_in_diff": ("code_diff", "+", "Every file the claim names is changed in the diff."),
    "path_partly_in_diff": ("code_diff", "-", "Some files the claim names are not in the diff."),
    "path_not_in_diff": ("code_diff", "!", "None of the files the claim names is in the diff."),
    "identifier_in_changed_lines": ("code_diff", "+", "Every named identifier is in the lines the action needs."),
    "identifier_not_in_changed_lines": ("code_diff", "-", "A named identifier is not there (add: + lines, remove: -)."),
    "content_words_absent": ("code_diff", "-", "No identifier named; no content word (-s -ed -ing ok) is changed."),
    "action_matches_lines": ("code_diff", "+", "Lines moved as claimed in the named files (add, check: added)."),
    "action_mismatch_lines": ("code_diff", "-", "The claimed action does not match the line movement there."),
    "file_deleted": ("code_diff", "+", "The file a remove verb names (Removed x.py) is deleted in the diff."),
    "file_not_deleted": ("code_diff", "-", "A remove verb names a file but the diff does not delete that file."),
    "unnamed_files_changed": ("code_diff", "-", "The diff also changes files the claim does not name."),
    "changes_mostly_elsewhere": ("code_diff", "!", "Most changed lines are in files the claim does not name."),
    "sql_kind_matches": ("db_op", "+", "The SQL statement's kind matches the claimed action."),
    "sql_kind_mismatch": ("db_op", "-", "The SQL statement's kind differs from the claimed action."),
    "sql_kind_conflicts": ("db_op", "!", "A write is claimed but the SQL statement is a SELECT."),
    "sql_multiple_statements": ("db_op", "-", "The operation holds more than one statement; only the first is judged."),
    "row_delta_matches": ("db_op", "+", "The sign of after_count - before_count fits the claimed action."),
    "row_delta_mismatch": ("db_op", "-", "The sign of after_count - before_count does not fit the claimed action."),
    "affected_rows_consistent": ("db_op", "+", "affected_rows fits the claimed action and the row delta."),
    "affected_rows_zero": ("db_op", "-", "A write is claimed but affected_rows is 0."),
    "affected_rows_mismatch": ("db_op", "-", "affected_rows differs from the size of the row delta."),
    "count_matches": ("db_op", "+", "The count after the verb (deleted 10 rows) is affected_rows or |delta|."),
    "count_mismatch": ("db_op", "!", "The count in the claim differs from affected_rows and the row delta."),
    "sql_identifier_matches": ("db_op", "+", "Claimed ids (id=N, id N, #N, user N) are in WHERE id comparisons."),
    "sql_identifier_mismatch": ("db_op", "!", "An identifier the claim names is not in the SQL's WHERE comparisons."),
    "sql_identifier_unchecked": ("db_op", "-", "The SQL pins no claimed id: no id = N, IN (N); or OR, NOT, <>, !=."),
    "existence_matches": ("file_op", "+", "exists_before and exists_after fit the claimed action."),
    "start_state_mismatch": ("file_op", "-", "exists_before does not fit the claimed action."),
    "end_state_mismatch": ("file_op", "!", "exists_after contradicts the claimed action."),
    "path_matches": ("file_op", "+", "Every path the claim names is path (or new_path)."),
    "path_mismatch": ("file_op", "!", "A named path is neither path nor new_path, or a rename names them reversed."),
    "path_not_named": ("file_op", "-", "The claim names no file that is path or new_path: the target is unconfirmed."),
    "new_path_missing": ("file_op", "-", "A rename or move is claimed but the evidence has no new_path."),
    "line_count_matches": ("file_op", "+", "The claimed line count equals line_count."),
    "line_count_off": ("file_op", "-", "The claimed line count is near line_count but not equal."),
    "line_count_mismatch": ("file_op", "!", "The claimed line count is off by more than 10% or more than 50 lines."),
    "size_matches": ("file_op", "+", "The claimed size (KB, MB: powers of 1000; KiB, MiB: 1024) is within 1%."),
    "size_off": ("file_op", "-", "The claimed size is off by 1% to 50%."),
    "size_mismatch": ("file_op", "!", "The claimed size is off by more than 50%."),
    "status_matches_claim": ("api_call", "+", "The HTTP status class fits the claimed success or failure."),
    "status_failure": ("api_call", "!", "Success is claimed but the HTTP status is 4xx or 5xx."),
    "status_contradicts_failure_claim": ("api_call", "-", "Failure is claimed but the HTTP status is 2xx."),
    "body_matches_claim": ("api_call", "+", "The response body's outcome fits the claimed success or failure."),
    "body_failure": ("api_call", "!", "Success is claimed but the response body reports a failure."),
    "body_contradicts_failure_claim": ("api_call", "-", "Failure is claimed but the response body reports success."),
    "target_matches": ("api_call", "+", "Every email, URL, ID the claim names is in the request's target fields."),
    "target_mismatch": ("api_call", "!", "A target field (to, url, path, NAME_id, /noun/N) names a different one."),
    "target_not_in_request": ("api_call", "-", "The request has no target field of the kind the claim names."),
    "entities_match": ("generic", "+", "One of >= 3 distinct claimed numbers >= 10, URLs, emails, identifiers found."),
    "explicit_value_match": ("generic", "+", "The value the claim states for a key (KEY is VALUE) equals evidence's."),
    "explicit_value_conflict": ("generic", "!", "A value the claim states for a key differs from the evidence's."),
    "evidence_reports_failure": ("generic", "-", "The claim states no outcome; a status value reports a failure."),
    "state_matches": ("generic", "+", "A key the claim says is on (enabled, true, active) or off holds that state."),
    "state_conflict": ("generic", "!", "A key the claim says is on or off (did not enable: off) holds the other."),
    "outcome_matches": ("generic", "+", "The claim's outcome (passed, failed...) agrees with every status value."),
    "outcome_conflict": ("generic", "!", "A status, state, result, outcome, conclusion, ok or success value at any "
                         "depth reports the outcome opposite to the claim's (did not pass: failure)."),
}
_SIGNAL_NAMES = {"+": "positive", "-": "negative", "!": "critical", "unsafe": "unsafe", "0": "neutral"}
DECISION, CONFIDENCE = (
    "any unsafe code -> unsafe_to_verify; any critical -> contradicted; no negatives and >= 2 positives "
    "-> verified; >= 2 negatives and no positives -> contradicted; otherwise insufficient_evidence.",
    "confidence in the stated verdict: verified 0.6 + 0.1*(P-2), at most 0.95; contradicted 0.9 with a "
    "critical signal, else 0.6 + 0.1*(N-2), at most 0.9; insufficient_evidence 0.5; unsafe_to_verify 0.0.",
)


def decide(codes):
    """(verdict, confidence) by the fixed rule (DECISION, CONFIDENCE) over reason codes; repeats count."""
    signals = [REASONS[code][1] for code in codes]
    positives, negatives = signals.count("+"), signals.count("-")
    if "unsafe" in signals or "!" in signals:
        return ("unsafe_to_verify", 0.0) if "unsafe" in signals else ("contradicted", 0.9)
    if not negatives and positives >= 2:
        return "verified", round(min(0.95, 0.6 + 0.1 * (positives - 2)), 3)
    if negatives >= 2 and not positives:
        return "contradicted", round(min(0.9, 0.6 + 0.1 * (negatives - 2)), 3)
    return "insufficient_evidence", 0.5


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


def _jcs(v):
    """The RFC 8785 text of a JSON value, in pure Python."""
    if isinstance(v, str):
        return _encode_str(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _es_number(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(map(_jcs, v)) + "]"
    if not isinstance(v, dict):
        raise TypeError("not a JSON value: %s" % type(v).__name__)
    keys = sorted(v, key=_utf16_order)
    members = [_encode_str(key) + ":" + _jcs(v[key]) for key in keys]
    return "{" + ",".join(members) + "}"


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
# Inputs are tokenised once with single-class patterns and judged with set look-ups and str methods: time is
# linear, and no pattern has nested or adjacent overlapping quantifiers (the peer froze on "a." * 4000).

# ---- §3.1 Words, tokens and the things a claim names -------------------------------------------------------

# a token: a run of characters other than spaces, quotes and brackets. ASCII text is split by str methods instead,
# several times faster than the pattern and with the same tokens (str.split's whitespace is the pattern's \s).
_TOKEN, _UNQUOTED = re.compile(r"[^\s`'\"();<>\[\]{}|]+"), str.maketrans("`'\"();<>[]{}|", " " * 13)
# An http(s) URL's host and path. The netloc ends at / ? # or a space, and its user info at its last @. After it, an
# IPv6 host is what follows '[' up to the first ']' (with no ']', up to the netloc's last character, which is left
# out), and any other host is what comes before a port's ':'. Each quantifier backtracks over one run at most.
# At a token's start (_URL_AT), and anywhere in a text (_URLS): that pattern starts at '://' and looks behind it for
# the scheme, as a literal start lets the search skip text without URLs (1 MiB of words: 50 times fewer steps).
_URL_REST = (
    r"(?:[^/?#\s\"'<>]*@)?\[?((?<=\[)(?:[^/?#\s\"'<>@\]]*(?=[^/?#\s\"'<>@]))?|(?<!\[)[^/?#\s\"'<>:]*)"
    r"[^/?#\s\"'<>]*(/[^?#\s\"'<>]*)?"
)
_URL_AT, _URLS = (
    re.compile(r"(?i:\bhttps?)://" + _URL_REST),
    re.compile(r"://(?:(?<=(?i:\bhttp)://)|(?<=(?i:\bhttps)://))" + _URL_REST),
)
# An email address: a local part of letters, digits and ._+-%, then a domain of letters, digits, '.' and '-' that
# holds a '.' and neither starts nor ends with one. Alone (a token), and within text as a whole token, which may
# carry the sentence punctuation _tokens strips.
_EMAIL_SHAPE = (
    r"[\w.+%-]+@(?=(?:[^\W_]|-)+\.(?:[^\W_]|[.-])*(?:[^\W_]|-))(?:[^\W_]|-)(?:[^\W_]|[.-])*(?:[^\W_]|-)"
)
_EMAIL, _EMAILS = (
    re.compile(_EMAIL_SHAPE),
    re.compile(r"(?<![^\s`'\"();<>\[\]{}|])[,*:!?]*(%s)[.,:!?*]*(?![^\s`'\"();<>\[\]{}|])" % _EMAIL_SHAPE),
)
# words of code, camelCase and CAPS split (it backtracks one character at most)
_CODE_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
_SQL_TOKEN, _SQL_SKIP = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*|[0-9]+|<>|!=|<=|>=|\S"), re.compile(r"['\"`]|--|/\*")
EXTENSIONS = frozenset("""py js ts tsx jsx go rs c h cc cpp hpp java kt rb php cs swift m sh bash md txt json yaml
    yml toml ini cfg conf html htm css scss sql xml csv tsv lock log env gradle mk r scala lua pl proto dart vue
    svelte ex hs ml tf dockerfile gitignore pdf png jpg jpeg gif svg zip gz tar bin so ipynb db sqlite""".split())
_STOP = frozenset("""a an the and or but if then than that this these those with without from into for to of in on
    at by as is are was were be been being it its they them their there here which what when where while who why how
    not no so too very can could should would will may might must do does did done have has had having also just
    only still some any all each every both either more most less least other such same via per over under after
    before about above below between through during again now new old file files code line lines function functions
    method methods class classes module modules test tests value values variable variables logic handling support
    issue issues bug bugs case cases call calls return returns using used use make made sure properly correctly
    correct small minor simple basic proper instead within across onto among until since around against toward
    towards upon beyond inside outside past near along amid except unlike versus""".split())
_NOT_ID = frozenset("""version versions step steps phase page pages port attempt attempts retry retries level day
    days hour hours minute minutes second seconds week weeks month months year years http https status code codes
    error errors times item items row rows record records percent top""".split())
_NOT = frozenset("not never didn wasn isn couldn cannot weren hasn haven doesn don won unable".split())
_NEGATION = _NOT | frozenset("no nothing none neither nor without failed".split())  # before a verb: 'no rows were'


def _verbs(**classes):
    # word -> class for the base words of each class and their -s -es -d -ed -ing -ied -ies forms.
    table = {word: cls for cls, words in classes.items() for word in words.split()}
    forms = {
        form: cls
        for word, cls in table.items()
        for form in (word + "s", word + "es", word + "d", word + "ed", word + "ing", word[:-1] + "ied",
                     word[:-1] + "ies")
    }
    return dict(forms, **table)  # a base word keeps its own class when it is also another's form


VERB_CLASSES = {  # base words; each also matches its -s -es -d -ed -ing forms
    "code_diff": dict(
        add="add introduce create implement write wrote",
        check="check validate guard ensure verify",
        modify="fix change update modify refactor rename set edit replace tweak",
        remove="remove delete drop dropped",
    ),
    "db_op": dict(
        delete="delete remove purge drop dropped truncate clear",
        insert="insert add create append import",
        update="update modify change set mark edit",
        read="read select query fetch count list retrieve",
    ),
    "file_op": dict(
        create="create add make made generate touch",
        write="write wrote written save",
        delete="delete remove erase unlink rm",
        rename="rename move mv",
        modify="modify update edit append change overwrite overwrote overwritten truncate",
    ),
}
_CODE_VERBS, _DB_VERBS, _FILE_VERBS = (_verbs(**VERB_CLASSES[k]) for k in ("code_diff", "db_op", "file_op"))
_FILE_STATES = {  # (exists_before, exists_after) each file_op verb needs; None: either
    "create": (False, True),
    "write": (None, True),
    "delete": (True, False),
    "modify": (True, True),
    "rename": (True, True),
}
_ALL_VERBS = frozenset(_CODE_VERBS) | frozenset(_DB_VERBS) | frozenset(_FILE_VERBS)
# api_call: a claim's success and failure words, and a response body's status words
_OK_WORDS, _FAIL_WORDS = (frozenset(words.split()) for words in (
    "sent delivered posted created succeeded ok success successful successfully accepted",
    "failed fail fails failure error errored rejected bounced denied unsuccessful unable"))
_STATUS_OK, _STATUS_FAIL = (frozenset(words.split()) for words in (
    "ok success succeeded successful sent delivered accepted created completed done",
    "error failed failure fail rejected bounced denied invalid"))
_STATUS_KEYS, _ARTICLES = frozenset("status state result outcome conclusion".split()), ("the", "a", "an", "file")
# one of those status words as a whole word of lower-case text (a run of a-z): a search stops at the first
_STATUS_OK_WORD, _STATUS_FAIL_WORD = (re.compile(r"(?<![a-z])(?:%s)(?![a-z])" % "|".join(sorted(words)))
                                      for words in (_STATUS_OK, _STATUS_FAIL))
_NOT_NOUN = _STOP | _NOT_ID | _ALL_VERBS | _OK_WORDS | _FAIL_WORDS | _STATUS_OK  # never the noun of 'user 5'
# bytes a size unit means
_SIZE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 1000, "kib": 1024, "mb": 10**6, "mib": 1 << 20, "gb": 10**9,
               "gib": 1 << 30}


# Small pure helpers, one expression each.
_strip = lambda token: token.rstrip(".,:!?*").lstrip(",*:!?")  # sentence punctuation around a token
_digits = lambda s: s.isascii() and s.isdigit()
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_raw_tokens = lambda text: text.translate(_UNQUOTED).split() if text.isascii() else _TOKEN.findall(text)
_tokens = lambda text: list(  # split once, punctuation trimmed (as _strip does), in C
    filter(None, map(str.lstrip, map(str.rstrip, _raw_tokens(text), itertools.repeat(".,:!?*")),
                     itertools.repeat(",*:!?")))
)
_words = lambda text: ((tokens := _tokens(text)), [t.lower() for t in tokens])  # (tokens, the same in lower case)
# a word and its stems without -ing -ed -es -s (a stem keeps at least 3 letters)
_variants = lambda w: [w] + [w[: -len(s)] for s in ("ing", "ed", "es", "s") if w.endswith(s) and len(w) - len(s) >= 3]


def _number(tok):
    # A plain or comma-grouped decimal number ('1,000', '2.5') as int or float, else None.
    parts = tok.split(",") if len(tok) <= 24 else ["x"]
    if len(parts) > 1 and not (1 <= len(parts[0]) <= 3 and all(len(p) == 3 for p in parts[1:])):
        return None
    whole, dot, fraction = "".join(parts).partition(".")
    if not _digits(whole) or (dot and not _digits(fraction)):
        return None
    return float(whole + "." + fraction) if dot else int(whole)


def _identifier(tok, explicit=False):
    # tok if it is a dotted, snake_case or camelCase identifier (any word when explicit: backticked), else None.
    parts = tok.split(".")
    if not all(p and p.isascii() and (p[0].isalpha() or p[0] == "_") and p.replace("_", "a").isalnum() for p in parts):
        return None
    if len(parts) > 1:
        return tok if max(len(p) for p in parts) > 1 else None
    camel = not tok[1:].islower() and any(a.islower() and b.isupper() for a, b in zip(tok, tok[1:]))  # 'Added' no
    return tok if explicit or camel or "_" in tok.strip("_") else None


# the address in lower case if tok is an email address, else None
_email = lambda tok: tok.lower() if _EMAIL.fullmatch(tok) else None
# the email addresses among text's tokens, in lower case: one C pass, however many tokens
_emails_in = lambda text: set(map(str.lower, _EMAILS.findall(text))) if "@" in text else set()


def _url(tok):
    # (host in lower case, path without a trailing '/') if tok starts with an http(s) URL that has a host, else None.
    match = _URL_AT.match(tok)
    return (match.group(1).lower(), (match.group(2) or "").rstrip("/")) if match and match.group(1) else None


def _urls_in(text):
    # {(host, path)} of every http(s) URL in text that has a host, each read as _url reads one: C passes over the
    # matches, however many URLs.
    # a URL never spans a space: each run between spaces is read once (a request that repeats one URL 116,000
    # times costs one match), then each URL once; text without '://' holds none
    found = _URLS.findall(" ".join(set(text.split()))) if "://" in text else []
    hosts, paths = list(map(str.lower, map(_FIRST, found))), map(str.rstrip, map(_SECOND, found), itertools.repeat("/"))
    return set(itertools.compress(zip(hosts, paths), hosts))


def _pathish(tok):
    # Whether tok names a file: a known extension, or clearly a path (./x, /x, ~/x, a/b/c).
    if "://" in tok or "@" in tok or len(tok) > BOUNDS["path_chars"]:
        return False
    base = tok.rsplit("/", 1)[-1]
    name, dot, ext = base.rpartition(".")
    if dot and ext.lower() in EXTENSIONS and (name or base.startswith(".")) and not _digits(name):
        return True
    return "/" in tok and bool(base) and (tok.startswith(("/", "./", "~/")) or tok.count("/") >= 2)


# the claimed path is path or a whole-component suffix of it (a.py never matches data.py)
_suffix_of = lambda claimed, path: bool(claimed) and (path == claimed or path.endswith("/" + claimed))
_singular = lambda n: n[:-3] + "y" if n.endswith("ies") else n[:-1] if n.endswith("s") and n[-2:] != "ss" else n
# Explicit ids in tokens joined one a line and lower-cased, as (name, N): '#N', 'id=N' and 'id:N' (name ''), or a token
# and the number token after it (name: that token), N of 1 to 18 digits and written without leading zeros. A name
# is kept when it is 'id', ends in _id, or is a noun of at least 3 letters (never a stopword, verb or past
# participle: 'user 5' yes, 'added 5' no).
_ID_ROWS, _ID_NAME, _NOUN_LENGTH = (
    re.compile(r"\n(?:#|id[=:]|([^\n]*)\n)(?=[0-9]{1,18}\n)0*([0-9]+)"),
    re.compile(r"((?:.*_)?id)?"),
    re.compile(r".{3,4}|.{5,}(?<!ed)"),
)


def _id_rows(toks):
    # {(name, N)} of the explicit ids among the tokens: one pattern over them all, then the names judged once each by
    # C calls (a request can hold 100,000 tokens). Lower-cased once joined: a line break ends a word as a token's
    # end does, so even a final sigma comes out as str.lower gives it token by token.
    rows = set(_ID_ROWS.findall(("\n%s\n" % "\n".join(toks)).lower()))
    names = set(map(_FIRST, rows))
    nouns = filter(str.isalpha, filter(_NOUN_LENGTH.fullmatch, names - _NOT_NOUN))
    kept = set(filter(_ID_NAME.fullmatch, names)).union(nouns)
    return set(itertools.compress(rows, map(kept.__contains__, map(_FIRST, rows))))


def _claim_ids(low):
    # Explicit ids the lower-cased tokens name, as (noun, N): id=N, id N, #N, NAME_id N, user 12345.
    stem = lambda name: name[:-3] if name.endswith("_id") else "" if name == "id" else name  # 'users_id': 'users'
    return {(_singular(stem(name)), n) for name, n in _id_rows(low)}


# a negation ('did not delete', 'no rows were') within three tokens before token i
_negated_at = lambda low, i: not _NEGATION.isdisjoint(low[max(0, i - 3) : i])


def _verb_classes(low, table):
    # (classes of the verbs not negated, whether any verb is negated).
    found = [(table[w], _negated_at(low, i)) for i, w in enumerate(low) if w in table]
    return {cls for cls, negated in found if not negated}, any(negated for _, negated in found)


def _claim_count(low, verbs):
    # The integer right after an action verb ('deleted 10 rows', 'removed all 3'), else None.
    after = (low[i + 1 : i + 4] for i, t in enumerate(low) if t in verbs)
    numbers = (next((_number(w) for w in words if w not in ("the", "all", "exactly", "only")), None) for words in after)
    return next((n for n in numbers if isinstance(n, int)), None)


# (key, value text) of every member, at any depth, valued a scalar or a flat list in json.dumps text: one C pass
_MEMBER = re.compile(r'(?<!\\)"([^"\\]{1,64})": ("[^"\\]*(?:\\.[^"\\]*)*"|\[[^\[\]{}]*\]|[^,{}\[\]"]*)')


# ---- §3.2 code_diff ----------------------------------------------------------------------------------------


def _head_paths(rest):
    # (old, new) from the rest of a 'diff --git' line, with or without a/ b/ prefixes.
    rest = rest.strip()
    half = len(rest) // 2
    if rest.startswith("a/") and " b/" in rest:
        return rest[2 : rest.find(" b/")], rest[rest.find(" b/") + 3 :]
    if len(rest) % 2 == 1 and rest[:half] == rest[half + 1 :]:  # --no-prefix: the same path twice
        return rest[:half], rest[:half]
    old, _, new = rest.partition(" ")
    return old, new or old


def _header_path(value):
    # The path of a ---/+++ line: diff -u appends a tab and a timestamp; git quotes unusual names.
    value = value.split("\t", 1)[0].rstrip()
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value


def _unprefix(old, new):
    # The paths without git's a/ b/ prefixes, when both sides have them (or are /dev/null).
    if (old.startswith("a/") or old == "/dev/null") and (new.startswith("b/") or new == "/dev/null"):
        return tuple(p[2:] if p[1:2] == "/" else p for p in (old, new))
    return old, new


def _new_file(files, old, new):
    # Append a file entry to files and return it.
    files.append({"old": old, "new": new, "status": "modified", "added": 0, "removed": 0, "binary": False})
    return files[-1]


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
# never overlap: linear. What a hunk body starts with; an @@ line in the usual form, its counts read in C (any other
# form is read leniently, in Python); an added or removed line, after its newline.
_HUNK_END, _HUNK_START, _HUNK_COUNTS, _CHANGED_LINE = (
    re.compile(r"\n(?![-+ \\\n]|\r\n|\r$)"),
    ("-", "+", " ", "\\", "\n", "\r\n"),
    re.compile(r"@@ -[0-9]+(?:,([0-9]{1,9}))? \+[0-9]+(?:,([0-9]{1,9}))?(?: |$)"),
    re.compile(r"\n([-+][^\n]*)"),
)


def _hunk_body(text, start, header, file, changed):
    # Where the hunk body at start ends: the longest run of hunk lines whose removed and context lines fit the old
    # count of its @@ line (header) and whose added and context lines fit the new. Its + and - lines are counted into
    # file and appended to changed. Mostly the whole run fits, which counts of its line starts tell, in C; else a
    # binary search over str.count of its marks (one character a line) finds the end, also in C.
    if not text.startswith(_HUNK_START, start):
        return start
    # the old and new line counts of '@@ -a,b +c,d @@' (a missing count is 1, a malformed one 0)
    usual = _HUNK_COUNTS.match(header)
    old, new = map(int, usual.groups("1")) if usual else [
        int(n) if n.isdigit() and n.isascii() and len(n) < 10 else 0
        for n in ([p[1:].partition(",")[2] or "1" for p in header.split(" ")[1:3]] + ["0", "0"])[:2]
    ]
    stop = _HUNK_END.search(text, start)
    body = "\n" + text[start : stop.start() if stop else len(text)]  # the run, a newline before each line
    # The old count covers the removed and context lines: every line but the added and the notes (\). The new count
    # covers the added and context lines: every line but the removed and the notes.
    lines, notes, added, removed = body.count("\n"), body.count("\n\\"), body.count("\n+"), body.count("\n-")
    if lines - added - notes > old or lines - removed - notes > new:
        run = body[1:].split("\n")
        marks = "".join([line[:1] or " " for line in run]).replace("\r", " ")
        low, high = 0, len(run)
        while low < high:  # the largest k whose first k lines fit
            middle = (low + high + 1) // 2
            fits = (
                marks.count("-", 0, middle) + marks.count(" ", 0, middle) <= old
                and marks.count("+", 0, middle) + marks.count(" ", 0, middle) <= new
            )
            low, high = (middle, high) if fits else (low, middle - 1)
        body, lines, added, removed = (  # the run's first low lines
            "\n" + "\n".join(run[:low]), low, marks.count("+", 0, low), marks.count("-", 0, low)
        )
    file["added"] += added
    file["removed"] += removed
    changed += (  # when every line is a change, a split is cheaper than matching each
        body[1:].split("\n") if lines and added + removed == lines else _CHANGED_LINE.findall(body)
    )
    return start + len(body) if lines else start


def parse_diff(text):
    """Unified diff (git, diff -u, --no-prefix) -> ([{old, new, status, added, removed, binary}], +/- lines).
    Raises EvidenceTooLarge beyond BOUNDS' diff_files files or diff_headers structure lines."""
    files, changed = [], []
    current = None  # the file whose headers or hunks are being read
    git_header = False  # current came from a 'diff --git' line and has not had its '+++ ' line yet
    minus = None  # the path of a '--- ' line, waiting for its '+++ '
    at = 0  # where the next line starts
    for _ in range(BOUNDS["diff_headers"] + 1):
        match = _DIFF_HEADER.search(text, at)
        if match is None:
            return files, changed
        line, at = match.group().rstrip("\r"), match.end() + 1
        if line.startswith("diff --git "):
            current, git_header = _new_file(files, *_head_paths(line[11:])), True
        elif line.startswith("--- "):
            minus = _header_path(line[4:])
        elif line.startswith("+++ ") and minus is not None:
            old, new = _unprefix(minus, _header_path(line[4:]))
            current = current if git_header else _new_file(files, old, new)
            current["old"], current["new"], git_header, minus = old, new, False, None
            if "/dev/null" in (old, new):  # created or deleted
                created = old == "/dev/null"
                status = ("added", new, new) if created else ("deleted", old, old)
                current["status"], current["old"], current["new"] = status
        elif line.startswith("@@ "):
            current = current if current is not None else _new_file(files, "", "")
            git_header = False
            at = _hunk_body(text, at, line, current, changed)
        elif current is not None and line.startswith(("new file mode", "deleted file mode")):
            current["status"] = "added" if line[0] == "n" else "deleted"
        elif current is not None and line.startswith("rename from "):
            current["status"], current["old"] = "renamed", line[12:]
        elif current is not None and line.startswith("rename to "):
            current["status"], current["new"] = "renamed", line[10:]
        elif current is not None and line.startswith("GIT binary patch"):
            current["binary"] = True
        elif line.startswith("Binary files ") and line.endswith(" differ"):
            paths = _unprefix(*line[13:-7].partition(" and ")[::2])
            current = current if git_header else _new_file(files, *paths)
            current["binary"], git_header = True, False
        if len(files) > BOUNDS["diff_files"]:
            break
    raise EvidenceTooLarge()


def _code_tokens(text):
    # The identifier-like tokens of code ([A-Za-z0-9_.]+, split in C over the UTF-8 bytes), with every sub-chain of
    # dotted ones of up to 8 parts.
    out = set()
    for t in set(text.encode("utf-8").translate(_NOT_CODE_CHARS).decode("ascii", "replace").split()):
        parts = t.strip(".").split(".")
        out.add(t.strip("."))
        out.update(parts if len(parts) > 8 else (
            ".".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)))
    return out


def _claim_terms(claim, toks, index):
    # (named paths, identifiers, content words) of a code_diff claim. Paths are taken first, so old_api.py is a path,
    # never an identifier; any backticked word is an identifier.
    backticked = {t for span in claim.split("`")[1::2] for t in _tokens(span)} if claim.count("`") >= 2 else set()
    paths, idents, words = [], set(), []
    for t in toks:
        c = t[2:] if t.startswith("./") else t
        if c in index or not t.isalpha() and _pathish(c):  # letters alone are no path, email or URL
            paths.append(c)
        elif (t.isalpha() or not (_email(t) or _url(t))) and _identifier(t, t in backticked):
            idents.add(t)
        elif t.isalpha() and len(t) >= 4 and t.lower() not in _STOP and t.lower() not in _ALL_VERBS:
            words.append(t.lower())
    return paths, idents, words


# bytes that are no part of a code token ([A-Za-z0-9_.]+) -> ' '; the lines of one sign
_NOT_CODE_CHARS, _SIGNED_LINES = (
    bytes(c if chr(c) in "_." or chr(c).isascii() and chr(c).isalnum() else 32 for c in range(256)),
    {"+": re.compile(r"^\+[^\n]*", re.M), "-": re.compile(r"^-[^\n]*", re.M)},
)


def _identifier_code(idents, words, lines):
    # Named identifiers must all be in the lines the action needs. Content words matter only when the claim names no
    # identifier: then one of them (or its stem) must be there ("rate limiting" is not a print).
    if idents:
        return "identifier_in_changed_lines" if idents <= _code_tokens(lines) else "identifier_not_in_changed_lines"
    have = {v for w in set(_CODE_WORD.findall(lines)) for v in _variants(w.lower())} if words else ()
    return "content_words_absent" if words and not any(v in have for w in words for v in _variants(w)) else None


def _deleted_files_code(toks, low, index, files):
    # For the files a remove verb names as its object ('Removed old_api.py', 'Deleted the file x.py'): whether the diff
    # deletes each of them.
    gone = set()  # file numbers; -1 stands for a named file the diff does not have
    for i in (i for i, w in enumerate(low) if _CODE_VERBS.get(w) == "remove" and not _negated_at(low, i)):
        obj = next((t[2:] if t.startswith("./") else t for t in toks[i + 1 : i + 4] if t.lower() not in _ARTICLES), "")
        gone |= index.get(obj, {-1}) if obj and (obj in index or _pathish(obj)) else set()
    deleted = all(k >= 0 and files[k]["status"] == "deleted" for k in gone)
    return None if not gone else "file_deleted" if deleted else "file_not_deleted"


def judge_code_diff(claim, ev, ev_json=None):
    """{diff}: the paths, identifiers and action the claim names, against the parsed diff."""
    files, changed = parse_diff(ev["diff"])
    index = {}  # every whole-component suffix (of up to 16 components) of every path in the diff -> file numbers
    for i, comps in ((i, p.split("/")) for i, f in enumerate(files) for p in {f["old"], f["new"]} - {"", "/dev/null"}):
        for k in range(max(0, len(comps) - 16), len(comps)):
            index.setdefault("/".join(comps[k:]), set()).add(i)
    details = {
        "files": files[:100],
        "files_changed": len(files),
        "lines_added": sum(f["added"] for f in files),
        "lines_removed": sum(f["removed"] for f in files),
    }
    if not files:
        return ["diff_no_changes"], details
    toks, low = _words(claim)
    classes, negated = _verb_classes(low, _CODE_VERBS)
    claimed, idents, words = _claim_terms(claim, toks, index)
    # 1. the paths the claim names: all, some or none in the diff
    hits = [c for c in claimed if c in index]
    named = set().union(*(index[c] for c in hits))  # the numbers of the named files
    path_code = (
        "path_not_in_diff" if not hits else "path_partly_in_diff" if len(hits) < len(claimed) else "path_in_diff"
    )
    # 2. identifiers (else content words) in the lines the action needs: added for add and check, removed for
    # remove, either for anything else
    signs = "+" if classes and classes <= {"add", "check"} else "-" if classes == {"remove"} else "+-"
    needed = "\n".join(changed)  # their signs are no part of any token
    other = "-" if signs == "+" else "+"  # keep only one sign's lines, if the other sign has any
    one_sign = signs in _SIGNED_LINES and (needed.startswith(other) or "\n" + other in needed)
    needed = "\n".join(_SIGNED_LINES[signs].findall(needed)) if one_sign else needed
    identifier_code = _identifier_code(idents, words, needed)
    # 3. the action against the lines moved in the named files (all files when none is named)
    scope = [files[i] for i in sorted(named)] if named else files
    added, removed = sum(f["added"] for f in scope), sum(f["removed"] for f in scope)
    moved = {
        "add": added > 0,
        "check": added > 0,
        "remove": removed or any(f["status"] == "deleted" for f in scope),
        "modify": added + removed > 0 or any(f["binary"] or f["status"] != "modified" for f in scope),
    }
    # 4. when the claim names files and the diff changes others too: most changed lines elsewhere is critical
    total = sum(f["added"] + f["removed"] for f in files)
    elsewhere = total - added - removed
    codes = [
        path_code if claimed else None,
        identifier_code,
        None if not classes else "action_matches_lines" if all(moved[c] for c in classes) else "action_mismatch_lines",
        _deleted_files_code(toks, low, index, files),
        "claim_negated" if negated else None,
        None if not named or len(named) >= len(files)
        else "changes_mostly_elsewhere" if elsewhere * 2 > total else "unnamed_files_changed",
    ]
    details.update(claimed_paths=claimed[:50], identifiers=sorted(idents)[:50], actions=sorted(classes))
    return [c for c in codes if c], details


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


def _strip_sql(sql):
    # SQL with string literals, quoted names and comments blanked, in one forward pass (linear).
    out, i = [], 0
    while True:
        m = _SQL_SKIP.search(sql, i)
        out.append(sql[i : m.start() if m else len(sql)])
        end = {"--": "\n", "/*": "*/"}.get(m.group(), m.group()) if m else ""
        j = sql.find(end, m.end()) if m else -1
        if j < 0:
            return " ".join(out)
        i = j + len(end)


def _where_ids(toks, start, end):
    # (ids, broad) of the WHERE clause in toks[start:end]: the numbers compared with an id column (id = N, N = id, id IN
    # (N, ...)), and whether the clause may reach other rows (OR, NOT, <>, !=, a subquery).

    number = lambda j: str(int(toks[j])) if start <= j < end and _digits(toks[j]) and len(toks[j]) <= 18 else None
    ids, where, broad, i = set(), False, False, start
    while i < end:  # each token is looked at a bounded number of times: linear
        up, column, following = toks[i].upper(), toks[i].rsplit(".", 1)[-1].lower(), "".join(toks[i + 1 : i + 2])
        where = where or up == "WHERE"
        broad = broad or where and (up in ("OR", "<>", "!=") or up == "NOT" and following.upper() != "NULL")
        if where and (column == "id" or column.endswith("_id") or toks[i].endswith("Id")):
            if [t.upper() for t in toks[i + 1 : i + 3]] == ["IN", "("]:  # id IN (1, 2, 3): at most 1000 tokens
                stop = next((j for j in range(i + 3, min(end, i + 1003)) if toks[j] == ")"), min(end, i + 1003))
                inner = range(i + 3, stop)
                if all(toks[j] == "," or number(j) for j in inner):
                    ids.update(filter(None, map(number, inner)))
                else:
                    broad = True  # a subquery or an expression
                i = stop
                continue
            right, left = toks[i + 1 : i + 2] == ["="], toks[i - 1 : i] == ["="]  # id = 5, 5 = id
            ids.update(n for n in (number(i + 2) if right else None, number(i - 2) if left else None) if n)
        i += 1
    return ids, broad


def sql_facts(sql):
    """(kind, ids in the first statement's WHERE, WHERE broad: OR/NOT/<>/!=/subquery, more statements)."""
    toks = _SQL_TOKEN.findall(_strip_sql(sql))
    # the first statement: its kind, its keyword at start, and its end at the first ';' outside parentheses (after
    # WITH, the kind is that of the first statement keyword outside parentheses)
    kind, depth, start, end, first = None, 0, 0, len(toks), toks[0].upper() if toks else ""
    for i, t in enumerate(toks):
        depth += (t == "(") - (t == ")")
        if t == ";" and depth <= 0:
            end = i
            break
        if kind is None and depth <= 0 and (first == "WITH" or i == 0) and t.upper() in _SQL_KINDS:
            kind, start = _SQL_KINDS[t.upper()], i
    upsert = kind == "insert" and any(t.upper() in ("CONFLICT", "DUPLICATE") for t in toks[start:end])  # ON CONFLICT
    return ("merge" if upsert else kind,) + _where_ids(toks, start, end) + (any(t != ";" for t in toks[end + 1 :]),)


def judge_db_op(claim, ev, ev_json=None):
    """{before_count, after_count, operation, affected_rows}: the claimed action against the SQL statement's kind,
    the sign of the row delta and affected_rows; claimed ids against the ids the WHERE clause compares."""
    low = [t.lower() for t in _tokens(claim)]
    classes, negated = _verb_classes(low, _DB_VERBS)
    writes = classes - {"read"}
    before, after, affected, operation = (
        ev.get(k) for k in ("before_count", "after_count", "affected_rows", "operation")
    )
    delta = after - before if before is not None and after is not None else None
    sql_kind, sql_ids, broad, several = sql_facts(operation) if operation is not None else (None, set(), False, False)
    claimed = next(iter(writes)) if len(writes) == 1 else "read" if classes == {"read"} else None
    count = _claim_count(low, _DB_VERBS)
    details = {
        "claimed_action": claimed,
        "sql_kind": sql_kind,
        "row_delta": delta,
        "affected_rows": affected,
        "sql_identifiers": sorted(sql_ids)[:50],
        "claimed_count": count,
    }
    if len(writes) > 1:
        return ["conflicting_verbs"], details
    # the sign of the row delta each action needs
    fits = (
        {"delete": delta < 0, "insert": delta > 0, "update": delta == 0, "read": delta == 0}
        if delta is not None
        else {}
    )
    known = {affected, abs(delta) if delta is not None and claimed != "update" else None} - {None}  # counts to meet
    ids = {n for _, n in _claim_ids(low)}
    codes = [
        "claim_negated" if negated else None,
        # the SQL statement's kind (MERGE, UPSERT, REPLACE give no direction)
        None if not claimed or not sql_kind or sql_kind == "merge"
        else "sql_kind_matches" if sql_kind == claimed
        else "sql_kind_conflicts" if sql_kind == "read" else "sql_kind_mismatch",
        "sql_multiple_statements" if several else None,
        None if not claimed or delta is None else "row_delta_matches" if fits[claimed] else "row_delta_mismatch",
        # affected_rows against the claimed write; consistency needs the row delta too (an update moves none)
        "affected_rows_zero" if writes and affected == 0
        else ("affected_rows_consistent" if affected == abs(delta) else "affected_rows_mismatch")
        if writes and affected is not None and delta is not None and claimed != "update"
        else "affected_rows_consistent" if claimed == "update" and affected is not None and delta == 0 else None,
        # the count in the claim ('deleted 10 rows') against affected_rows and the size of the row delta
        None if count is None or not known else "count_matches" if count in known else "count_mismatch",
        None if not ids
        else "sql_identifier_mismatch" if sql_ids and not ids <= sql_ids
        else "sql_identifier_unchecked" if broad or not sql_ids else "sql_identifier_matches",
    ]
    return [c for c in codes if c], details


# ---- §3.4 file_op ------------------------------------------------------------------------------------------


def _quantities(low):
    # [(token index, 'lines' or 'bytes', value)]: '120 lines', '1.5 MB', '12KiB', '1,000 bytes'.
    out = []
    for i, t in enumerate(low):
        j = len(t) - len(t.lstrip("0123456789.,")) if len(t) <= 32 else 0  # the length of a leading number
        n, unit = _number(t[:j]) if j else None, t[j:] or (low[i + 1] if i + 1 < len(low) else "")
        if n is not None and unit in ("line", "lines") and isinstance(n, int):
            out.append((i, "lines", n))
        elif n is not None and unit in _SIZE_UNITS:
            out.append((i, "bytes", n * _SIZE_UNITS[unit]))
    return out


def _file_path_code(toks, verb, path, new):
    # (code, claimed paths): every path the claim names must be path or new_path, and a rename names path (the old name)
    # first.

    known = lambda c: _suffix_of(c, path) or bool(new and _suffix_of(c, new))
    claimed = [c for c in (t[2:] if t.startswith("./") else t for t in toks) if _pathish(c) or known(c)]
    unknown = [c for c in claimed if not known(c)]
    if verb == "rename" and not new and len(unknown) == 1 < len(claimed):
        unknown = []  # the destination, which the evidence does not give (new_path_missing says so)
    order = [not _suffix_of(c, path) for c in claimed]
    if verb == "rename" and new and order != sorted(order):
        unknown = claimed
    return "path_mismatch" if unknown else "path_matches" if claimed else "path_not_named", claimed


def judge_file_op(claim, ev, ev_json=None):
    """{path, exists_before, exists_after, line_count?, size_bytes?, new_path?}: verb vs existence, named paths vs
    path and new_path, stated totals vs line_count and size_bytes."""
    (toks, low), path, new = _words(claim), ev["path"], ev.get("new_path")
    quantities = _quantities(low)
    # 'Removed 3 lines', 'appended 2 KB': a verb before a quantity changes content (modify), and its number is a
    # change, not a total
    edits = {i - 1 for i, _, _ in quantities if i and _FILE_VERBS.get(low[i - 1]) not in (None, "write", "rename")}
    classes, negated = _verb_classes(["modify" if i in edits else w for i, w in enumerate(low)], _FILE_VERBS)
    classes -= {"write"} if len(classes) > 1 else set()  # 'created x and wrote 3 lines' is one action
    verb = next(iter(classes)) if len(classes) == 1 else None
    details = {"claimed_action": verb, "path": path, "new_path": new}
    if len(classes) > 1:
        return ["conflicting_verbs"], details
    path_code, claimed = _file_path_code(toks, verb, path, new)
    lines, sizes = ([v for i, u, v in quantities if u == unit and i - 1 not in edits] for unit in ("lines", "bytes"))
    want_before, want_after = _FILE_STATES.get(verb, (None, None))  # for a rename they describe path, new_path
    line_count, size_bytes = ev.get("line_count"), ev.get("size_bytes")
    off = abs(lines[0] - line_count) if lines and line_count is not None else None
    relative = abs(sizes[0] - size_bytes) / (size_bytes or 1) if sizes and size_bytes is not None else None
    relative = float(sizes[0] != 0) if relative is not None and not size_bytes else relative
    codes = [
        "claim_negated" if negated else None,
        path_code,
        # exists_before and exists_after against what the verb needs
        "new_path_missing" if verb == "rename" and not new
        else None if not verb
        else "end_state_mismatch" if ev["exists_after"] != want_after
        else "start_state_mismatch" if want_before is not None and ev["exists_before"] != want_before
        else "existence_matches",
        # stated totals. Lines: equal is positive, off by more than 10% or 50 lines critical, in between negative
        None if off is None
        else "line_count_matches" if off == 0
        else "line_count_mismatch" if off > 50 or off > 0.1 * line_count else "line_count_off",
        # sizes: within 1% positive, off by more than 50% critical, in between negative
        None if relative is None
        else "size_matches" if relative <= 0.01 else "size_mismatch" if relative > 0.5 else "size_off",
    ]
    details.update(claimed_paths=claimed[:50], claimed_lines=lines[:1], claimed_bytes=sizes[:1])
    return [c for c in codes if c], details


# ---- §3.5 api_call -----------------------------------------------------------------------------------------

# target fields; a path's segment and the next, when that is a number (paths one a line). A segment is tried only
# where one starts: tried inside one too, a segment with no '/' after it took time quadratic in its length (a 32 KB
# path: 9.5 s), and such a try never matches where the try at its start did not.
_URL_KEYS, _EMAIL_KEYS, _PATH_ID, _ID_NUMBER = (
    {"url", "uri", "endpoint", "href"},
    {"to", "recipient", "recipients", "email", "cc"},
    re.compile(r"(?<![^/\n])([^/\n]*)/(?=([0-9]{1,18})(?:[/\n]|\Z))"),
    re.compile(r"[0-9]{1,18}"),
)


# 'success' or 'failure' when exactly one side has a vote, else None
_outcome = lambda ok, fail: "success" if ok and not fail else "failure" if fail and not ok else None


def _body_outcome(body):
    # 'success', 'failure' or None: judged structurally for JSON (an object, or a string holding one) and by whole words
    # for other text.
    if isinstance(body, str):
        try:  # its structure is all that is read, so json.loads (strict_loads would also canonicalise it)
            body = json.loads(body)
        except (ValueError, RecursionError):
            low = body.lower()
            return _outcome(_STATUS_OK_WORD.search(low), _STATUS_FAIL_WORD.search(low))
    if not isinstance(body, dict):
        return None
    votes = {("success" if body[k] else "failure") for k in ("ok", "success") if isinstance(body.get(k), bool)}
    status = body.get("status").strip().lower() if isinstance(body.get("status"), str) else ""
    votes |= {"success"} if status in _STATUS_OK else {"failure"} if status in _STATUS_FAIL else set()
    errors = isinstance(body.get("errors"), (list, dict)) and body["errors"]  # a non-empty errors, or an error
    votes |= {"failure"} if body.get("error") not in (None, False) or errors else set()
    return votes.pop() if len(votes) == 1 else None


def _request_targets(request, wanted):
    # (emails, URLs as {(host, path)}, id rows as for _id_rows) in the request's target fields: emails in to,
    # recipient...; URLs in url, uri...; ids in id-like keys and in those URLs' paths. A string request is all target.
    # Only the kinds the claim names (wanted: its emails, URLs, ids) are looked for, and each by C passes over the
    # whole request (a request can hold 70,000 URLs or 100,000 tokens).
    want_emails, want_urls, want_ids = map(bool, wanted)
    if isinstance(request, str):
        emails_text = urls_text = request
        rows = _id_rows(_tokens(request)) if want_ids else set()
    else:
        members = _MEMBER.findall(json.dumps(request, ensure_ascii=False))
        keys, texts = (
            list(map(str.lower, map(_FIRST, members))),
            list(map(str.strip, map(_SECOND, members), itertools.repeat('"'))),
        )
        # the values of the email fields ('Eve <eve@x.com>') and of the URL fields, joined by spaces (which no email
        # or URL spans)
        emails_text, urls_text = (
            " ".join(itertools.compress(texts, map(fields.__contains__, keys))) for fields in (_EMAIL_KEYS, _URL_KEYS)
        )
        # an id-like key ('id', 'user_id', 'userId') valued a number: the row of 'NAME_id N'
        numbered = itertools.compress(zip(map(_FIRST, members), keys, texts), map(_ID_NUMBER.fullmatch, texts))
        rows = {
            (low[:-2].rstrip("_") + "_id", str(int(text)))
            for key, low, text in numbered
            if low == "id" or low.endswith("_id") or key.endswith("Id")
        }
    urls = _urls_in(urls_text) if want_urls or want_ids else set()
    if want_ids:  # in those URLs' paths, /customers/78: the row ('customers_id', '78'), all the paths at once
        # lower-cased once joined: a line break, like '/', ends a word as the path's end does, so each segment comes
        # out as str.lower gives it alone (even a final sigma)
        pairs = _PATH_ID.findall("\n".join(map(_SECOND, urls)).lower())
        rows |= set(zip(map(operator.add, map(_FIRST, pairs), itertools.repeat("_id")), map(_SECOND, pairs)))
    return _emails_in(emails_text) if want_emails else set(), urls, rows


def _id_names(noun):
    # The names of the id rows whose noun is noun: each stem whose singular it is, alone and before _id ('customer':
    # customer, customers, customer_id, customers_id); '' for the noun ''. Claimed ids meet a request's by look-ups.
    stems = {stem for stem in (noun, noun + "s", noun[:-1] + "ies") if _singular(stem) == noun}
    return {name for stem in stems for name in (stem, stem + "_id")} | ({"id"} if not noun else set())


def _target_code(wanted, targets):
    # The emails, URLs and ids the claim names (wanted) against the request's targets; the worst result is the code.
    (claimed_emails, claimed_urls, claimed_ids), (emails, urls, rows) = wanted, targets
    code = lambda hit, others: "target_matches" if hit else "target_mismatch" if others else "target_not_in_request"
    results = {code(e in emails, emails) for e in claimed_emails}
    # the request's hosts, id names and id numbers, each only when a claimed target needs it (they can be 100,000)
    nouns = set(map(_FIRST, claimed_ids))
    hosts, names, numbers = (
        set(map(_FIRST, urls)) if not all(map(_SECOND, claimed_urls)) else set(),  # for a claimed bare host
        set(map(_FIRST, rows)) if nouns - {""} else set(),
        set(map(_SECOND, rows)) if "" in nouns else set(),
    )
    results |= {code((h, p) in urls or not p and h in hosts, urls) for h, p in claimed_urls}
    for noun, n in claimed_ids:  # compared with the request's ids whose noun agrees ('' agrees with any)
        agreeing = _id_names(noun) | _id_names("")
        hit = any((name, n) in rows for name in agreeing) if noun else n in numbers
        results.add(code(hit, not names.isdisjoint(agreeing) if noun else rows))
    return next((c for c in ("target_mismatch", "target_not_in_request", "target_matches") if c in results), None)


def judge_api_call(claim, ev, ev_json=None):
    """{request, response_status, response_body}: the claimed success or failure against the status class and the
    body; the emails, URLs and ids the claim names against the request's targets."""
    toks, low = _words(claim)
    ok, negated = _verb_classes(low, dict.fromkeys(_OK_WORDS, "ok"))  # 'was not sent' is a failure
    intent = _outcome(ok, negated or not _FAIL_WORDS.isdisjoint(low))
    status, body = ev["response_status"], _body_outcome(ev.get("response_body"))
    details = {"claimed_outcome": intent, "status_class": "%dxx" % (status // 100), "body_outcome": body}
    wanted = _emails_in(claim), set(filter(None, map(_url, toks))), _claim_ids(low)
    targets = _request_targets(ev.get("request") or {}, wanted)
    codes = [
        # the status class against the claimed outcome (1xx and 3xx say nothing)
        None if not intent or 300 <= status < 400 or status < 200
        else "status_matches_claim" if (status < 400) == (intent == "success")
        else "status_failure" if intent == "success" else "status_contradicts_failure_claim",
        None if not intent or not body
        else "body_matches_claim" if body == intent
        else "body_failure" if body == "failure" else "body_contradicts_failure_claim",
        _target_code(wanted, targets),
    ]
    return [c for c in codes if c], details


# ---- §3.6 generic ------------------------------------------------------------------------------------------

# a string or other scalar (a value's text); in masked text (_values_text), a key with its ':', and a string that is
# not a key (kept, as group 1) or a key
_SCALAR, _MASKED_KEY, _STRING_OR_KEY = (
    re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^,{}\[\]"]*'),
    re.compile(r'"[^"]*":'),
    re.compile(r'("[^"]*")(?!:)|"[^"]*":'),
)
_FILLERS = frozenset("not no now still also the a an being set already currently".split())  # never a stated value
# States: what the claim says a key is (a negation before the word flips it), and how the evidence writes them.
_CLAIM_STATES = dict(
    dict.fromkeys("on enabled enable enables activated activate active true".split(), True),
    **dict.fromkeys("off disabled disable disables deactivated deactivate inactive false".split(), False),
)
_VALUE_STATES = dict(dict.fromkeys("true on enabled active yes".split(), True),
                     **dict.fromkeys("false off disabled inactive no".split(), False))
# Outcomes (True: success): the claim's words, and the words of status values in the evidence. 'completed' and
# 'done' claim success, but in evidence they say only that something finished (GitHub: status completed,
# conclusion failure).
_CLAIM_OUTCOMES = dict(dict.fromkeys("pass passed passes succeed succeeded succeeds success successful successfully "
                                     "complete completed ok green".split(), True),
                       **dict.fromkeys("fail failed fails failing errored timed cancelled canceled aborted "
                                       "crashed".split(), False))
_VALUE_OUTCOMES = dict(dict.fromkeys("ok success succeeded successful passed pass green".split(), True),
                       **dict.fromkeys("failed failure fail error errored timeout timed_out cancelled canceled aborted "
                                       "rejected denied invalid bounced".split(), False))
_FLAG_KEYS = ("ok", "success")  # booleans that report an outcome
# what a stated value means, so that 'dark_mode is on' meets true and 'status: passed' meets "success"
_MEANINGS = dict([(w, ("state", v)) for w, v in list(_CLAIM_STATES.items()) + list(_VALUE_STATES.items())]
                 + [(w, ("outcome", v)) for w, v in _VALUE_OUTCOMES.items()])


def _stated_values(raw, toks):
    # key -> the values the claim states for it ('KEY is/was/are/were/= VALUE', 'KEY: VALUE', 'KEY=VALUE'), keys in
    # lower case; at most 32 keys, so the work is bounded however long the claim.
    stated = {}
    for i, t in enumerate(raw[:-1]):
        key, val = (
            (t[:-1], toks[i + 1]) if t.endswith(":") and len(t) > 1
            else (toks[i], toks[i + 2]) if i + 2 < len(raw) and raw[i + 1].lower() in ("is", "was", "=", "are", "were")
            else (t.partition("=")[0], _strip(t.partition("=")[2])) if "=" in t.strip("=")
            else (None, None)
        )
        name = key.lower()[:64] if key and val and val.lower() not in _FILLERS else ""
        if name.replace("_", "a").replace("-", "a").isalnum() and (name in stated or len(stated) < 32):
            stated.setdefault(name, set()).add(val.lower())
    return stated


def _claimed_states(low, text, stated):
    # key -> the state (True: on) the claim gives it: each key of the evidence named within 6 tokens of a state word
    # ('enabled dark_mode', 'auto_save is off') takes the nearest one's state, flipped by a negation before it
    # ('did not enable x': off). Keys the claim states a value for are judged by that value instead. At most 32
    # look-ups in the evidence text, so the work is bounded however long the claim.
    words = [(i, _CLAIM_STATES[w] != _negated_at(low, i)) for i, w in enumerate(low) if w in _CLAIM_STATES]
    near = sorted({j for i, _ in words for j in range(max(0, i - 6), min(len(low), i + 7))})
    candidates = [low[j] for j in near if low[j] not in _CLAIM_STATES and low[j] not in _STOP and low[j] not in stated]
    candidates = [w for w in dict.fromkeys(candidates) if w.replace("_", "a").replace("-", "a").isalnum()][:32]
    keys = [w for w in candidates if '"%s":' % w in text]
    nearest = lambda key: min(words, key=lambda word, at=low.index(key): abs(word[0] - at))[1]  # key found once
    return {key: nearest(key) for key in keys}


def _evidence_values(text, keys):
    # key -> the first 100 scalar values (texts) that canonical JSON text in lower case has for each of keys, at any
    # depth. str.find scans, in C: the work is bounded by the keys and the cap, not by the members of the evidence.
    # Inside a JSON string a quote is always escaped, so '"key":' matches members only.
    values = {}
    for key, needle in ((key, '"%s":' % key) for key in keys):
        at = text.find(needle)
        while at >= 0 and len(values.get(key, ())) < 100:
            value = _SCALAR.match(text, at + len(needle)).group()  # empty for an object or a list
            values.setdefault(key, []).extend([value.strip('"')] if value else [])
            at = text.find(needle, at + len(needle))
    return values


def _value_code(claimed, found):
    # One code for a key, however often the claim states it: numbers meet numbers (in ECMAScript form), words meet
    # strings and literals, alike or of the same meaning. The found values (at most 100) are read once: a claim can
    # state one key 1,300 times, and each against every found value took 0.37 s.
    found_numbers = {_es_number(n) for n in map(_number, found) if n is not None}
    found_words = {v for v in found if _number(v) is None}
    found_meanings = set(map(_MEANINGS.get, found_words)) - {None}
    same = set()
    for val, num in zip(claimed, map(_number, claimed)):  # a value meets only found values of its type, if any
        if num is not None and found_numbers:
            same.add(_es_number(num) in found_numbers)
        elif num is None and found_words:
            same.add(val in found_words or _MEANINGS.get(val) in found_meanings)
    return None if not same else "explicit_value_conflict" if False in same else "explicit_value_match"


def _outcome_code(low, values, stated):
    # The claim's outcome words (a negation flips them: 'did not pass') against the outcomes the evidence's status
    # values and ok/success flags report at any depth; keys the claim states a value for are judged by that value.
    claimed = {_CLAIM_OUTCOMES[w] != _negated_at(low, i) for i, w in enumerate(low) if w in _CLAIM_OUTCOMES}
    reported = {_VALUE_OUTCOMES.get(v.strip()) for k in _STATUS_KEYS - set(stated) for v in values.get(k, ())}
    reported |= {_VALUE_STATES.get(v) for k in _FLAG_KEYS if k not in stated for v in values.get(k, ())}
    intent = claimed.pop() if len(claimed) == 1 else None  # none, or both: the claim states no outcome
    if intent is None:
        return "evidence_reports_failure" if False in reported else None
    return "outcome_conflict" if (not intent) in reported else "outcome_matches" if intent in reported else None


def _values_text(text):
    # Canonical JSON text without its keys, its values apart from each other. Once escaped backslashes and quotes are
    # masked (as in _es_floats), every quote left delimits a string. Keys are then found by a plain pattern, tried at
    # every quote: from a closing quote it spans the gap to the next string, so it can take '",":' for a key only
    # where a string starts with ':'. There, one pass takes every string whole from the first quote on instead (a
    # key goes with its ':', any other string stays), a few times slower where values are many strings. Each
    # character is read at most twice either way. Before, a pattern that paired escapes itself ran there, and its
    # tries from every quote took time quadratic in a string's escaped quotes (32 KB of them after a ':': 28 s).
    masked = text.replace("\\\\", "\x01").replace('\\"', "\x02")
    if any(start in text for start in ('{":', '[":', ',":', ':":')) or text.startswith('":'):
        masked = _STRING_OR_KEY.sub(r"\1 ", masked)
    else:
        masked = _MASKED_KEY.sub(" ", masked)
    return masked.replace("\x02", '\\"').replace("\x01", "\\\\").replace(",", ", ")


def judge_generic(claim, ev, ev_json=None):
    """Any object, judged conservatively: at least 3 distinct entities among the evidence's values (a key that
    matches is not support), values the claim states for keys (KEY is VALUE), states it gives keys (enabled X),
    and its outcome (passed, failed) against every status value."""
    text = (ev_json if ev_json is not None else _canonical_text(ev)).lower()
    raw = _raw_tokens(claim)
    toks = [_strip(t) for t in raw]
    # distinct normalised entities: numbers of 10 or more (smaller ones match by chance: '3 databases', '0 errors'),
    # emails, URLs, paths and identifiers; never true, false or null
    entities = {_es_number(n) for n in map(_number, toks) if n is not None and n >= 10} | {
        t.lower() for t in toks if _number(t) is None and t.lower() not in ("true", "false", "null")
        and (_email(t) or _url(t) or _pathish(t) or _identifier(t))
    }
    low, matched = [t.lower() for t in toks], []
    if len(entities) >= 3:  # fewer cannot support a verdict: the evidence is not tokenised for them
        have = set(_raw_tokens(_values_text(text)))
        endings = ("", ".", ",", ":", "/", "!", "?")  # what may follow a value in JSON text or prose
        matched = [e for e in entities if any(e + s in have for s in endings)]
    codes = ["entities_match"] * len(matched) if len(matched) >= 3 else []
    stated = _stated_values(raw, toks)
    states = _claimed_states(low, text, stated)
    values = _evidence_values(text, set(stated) | set(states) | _STATUS_KEYS | set(_FLAG_KEYS))
    codes += [_value_code(claimed, values.get(key, [])[:100]) for key, claimed in stated.items()]
    for key, state in states.items():  # one code a key: any value of the other state conflicts
        found = {_VALUE_STATES.get(v) for v in values.get(key, ())} - {None}
        codes.append(None if not found else "state_conflict" if (not state) in found else "state_matches")
    codes += [_outcome_code(low, values, stated), "claim_negated" if not _NOT.isdisjoint(low) else None]
    return [c for c in codes if c], {"entities_matched": len(matched)}


# ---- §3.7 Evidence checks, dispatch, judgement -------------------------------------------------------------


# type checks of evidence fields
_count = lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= BOUNDS["count_max"]
_nonempty_str = lambda v: isinstance(v, str) and v != ""
_bool = lambda v: isinstance(v, bool)
EVIDENCE = {  # kind -> ({field: (type check, length bound)}, groups of fields: the evidence needs one complete group)
    "code_diff": ({"diff": (lambda v: isinstance(v, str), "diff_chars")}, [("diff",)]),
    "db_op": (
        {
            "before_count": (_count, None),
            "after_count": (_count, None),
            "affected_rows": (_count, None),
            "operation": (_nonempty_str, "operation_chars"),
        },
        [("before_count", "after_count"), ("affected_rows",), ("operation",)],
    ),
    "file_op": (
        {
            "path": (_nonempty_str, "path_chars"),
            "new_path": (_nonempty_str, "path_chars"),
            "exists_before": (_bool, None),
            "exists_after": (_bool, None),
            "line_count": (_count, None),
            "size_bytes": (_count, None),
        },
        [("path", "exists_before", "exists_after")],
    ),
    "api_call": (
        {
            "response_status": (lambda v: _count(v) and 100 <= v <= 599, None),
            "request": (lambda v: isinstance(v, (str, dict)), "request_chars"),
        },
        [("response_status",)],
    ),
    "generic": ({}, [()]),
}


def check_evidence(kind, ev):
    """A code when the evidence cannot be judged as kind (wrong type, too large, fields missing), else None.
    A null field is absent."""
    fields, groups = EVIDENCE[kind]
    for name, (type_ok, bound) in fields.items():
        v = ev.get(name)
        if v is not None and not type_ok(v):
            return "evidence_invalid"
        if bound and isinstance(v, str) and len(v) > BOUNDS[bound]:
            return "evidence_too_large"
    return None if any(all(ev.get(f) is not None for f in group) for group in groups) else "evidence_missing_fields"


_JUDGES = {  # kind -> judge(claim, evidence, the evidence's canonical JSON text or None) -> (codes, details)
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
DISPATCH = (
    ["the kind field, case-insensitive"]
    + ["any of %s -> %s" % (", ".join(fields), kind) for kind, fields in _SHAPES]
    + ["otherwise generic (operation alone never selects db_op)"]
)


def dispatch_kind(evidence, kind=None):
    """The requested kind (case-insensitive), else by evidence shape (null is absent, as for checks)."""
    shaped = (k for k, fields in _SHAPES if any(evidence.get(f) is not None for f in fields))
    return kind.lower() if kind else next(shaped, "generic")


def judge(kind, claim, evidence, evidence_json=None):
    """(codes, details, verdict, confidence); never raises: a rule failure is unsafe_to_verify (verifier_error).
    evidence_json: the evidence's canonical text, if the caller has it (generic reads it instead of re-encoding)."""
    try:
        bad = check_evidence(kind, evidence)
        codes, details = ([bad], {}) if bad else _JUDGES[kind](claim, evidence, evidence_json)
        codes = codes or ["no_signal"]
        return (codes, details) + decide(codes)
    except EvidenceTooLarge:
        return ["evidence_too_large"], {}, "unsafe_to_verify", 0.0
    except Exception:  # a misspelt code (the vocabulary is closed) or any bug: answered and signed, never dropped
        return ["verifier_error"], {}, "unsafe_to_verify", 0.0


# ============================================================================================================
# §4 Receipts (pure given a key ring)
# ============================================================================================================

RECEIPT_FIELDS = collections.OrderedDict(  # field -> what it holds (GET /spec documents each)
    [
        ("schema", "\"verify_action_receipt.v0\"."),
        ("claim_hash", "\"sha256:\" + hex SHA-256 of the claim's UTF-8."),
        ("evidence_manifest_hash", "\"sha256:\" + hex SHA-256 of the RFC 8785 canonical JSON of evidence."),
        (
            "request_hash",
            "The same over the whole request as received (MCP: the arguments): kind and contexts are bound.",
        ),
        ("verifier_id", "\"verify_action.py@<version>\"."),
        ("verifier_method", "\"rule_based.<kind>\"."),
        ("verdict", "The aar_verdict."),
        ("confidence", "In the verdict, 0..1."),
        ("reason_codes", "never input"),
        ("policy_or_oracle_refs", "[]: no oracle is used."),
        ("caller_context", "As received; {} when absent."),
        ("issued_at", "RFC 3339 UTC time."),
        ("issued_by", "--issuer."),
        ("kid", "Key id in the operator's key ring."),
        (
            "signature",
            "\"hmac-sha256:\" + unpadded base64url HMAC-SHA256 under the kid's key of the canonical JSON of "
            "the receipt without signature.",
        ),
    ]
)
_KID_PUNCTUATION = {ord(c): "a" for c in "-_."}  # allowed in a kid besides letters and digits


class KeyRing(object):
    """HMAC keys by kid: the last key signs new receipts, every key verifies."""

    def __init__(self, pairs, ephemeral=False):
        if not pairs:
            raise ValueError("the key ring has no keys")
        self.keys, self.kid, self.ephemeral = collections.OrderedDict(pairs), pairs[-1][0], ephemeral

    @classmethod
    def parse(cls, text, allow_empty=False):
        # Parse 'kid key' lines (key: >= 32 bytes, base64url); '#' starts a comment. Raises ValueError.
        pairs = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            kid = fields[0]
            try:  # base64url, padding optional
                key = base64.urlsafe_b64decode(fields[1] + "=" * (-len(fields[1]) % 4)) if len(fields) == 2 else b""
            except (ValueError, TypeError):
                key = b""
            kid_ok = kid.isascii() and kid.translate(_KID_PUNCTUATION).isalnum() and len(kid) <= 64
            if len(key) < 32 or not kid_ok or kid in dict(pairs):
                raise ValueError("line %d: expected 'kid key' (a new kid; a base64url key of >= 32 bytes)" % number)
            pairs.append((kid, key))
        return cls(pairs) if pairs or not allow_empty else None

    @classmethod
    def generate(cls):
        # A one-process key ring: its receipts cannot be verified after a restart.
        return cls([("ephemeral-" + secrets.token_hex(4), secrets.token_bytes(32))], ephemeral=True)

    def mac(self, kid, body):
        # The signature field of a receipt body (without signature) under key kid.
        # a receipt body is small, and carries a version string json.dumps text could be misread by: _jcs directly
        return "hmac-sha256:" + _b64url(hmac.new(self.keys[kid], _jcs(body).encode("utf-8"), hashlib.sha256).digest())


def issue_receipt(request, kind, verdict, confidence, codes, keyring, issuer, now, members=None):
    """A signed receipt for one judged request (request: the object as received, already validated; members: its
    canonical_members, when the caller has them)."""
    members = members or canonical_members(request)
    body = {
        "schema": SCHEMA,
        "claim_hash": _sha(request["claim"].encode("utf-8")),
        "evidence_manifest_hash": _sha(members["evidence"].encode("utf-8")),
        "request_hash": _sha(members[None].encode("utf-8")),
        "verifier_id": "verify_action.py@" + VERSION,
        "verifier_method": "rule_based." + kind,
        "verdict": verdict,
        "confidence": confidence,
        "reason_codes": list(codes),
        "policy_or_oracle_refs": [],
        "caller_context": request.get("caller_context", {}),
        "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "issued_by": issuer,
        "kid": keyring.kid,
    }
    return dict(body, signature=keyring.mac(keyring.kid, body))


def verify_receipt(receipt, keyring):
    """(valid, reason, kid): reason is ok, malformed, unsupported_schema, unknown_kid or bad_signature."""
    if not isinstance(receipt, dict) or set(receipt) != set(RECEIPT_FIELDS):
        return False, "malformed", None
    kid, signature = receipt["kid"], receipt["signature"]
    if not isinstance(kid, str) or not isinstance(signature, str) or not signature.startswith("hmac-sha256:"):
        return False, "malformed", None
    if receipt["schema"] != SCHEMA or kid not in keyring.keys:
        return False, "unsupported_schema" if receipt["schema"] != SCHEMA else "unknown_kid", kid
    try:
        expected = keyring.mac(kid, {k: v for k, v in receipt.items() if k != "signature"})
    except (TypeError, ValueError):  # a field that is not JSON (NaN...)
        return False, "malformed", kid
    valid = hmac.compare_digest(expected.encode("utf-8"), signature.encode("utf-8", "replace"))
    return valid, "ok" if valid else "bad_signature", kid


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
_KEY_RING_HEADER = "# verify_action.py key ring: 'kid key' per line; the last key signs, every key verifies.\n"


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


def keygen(path):
    """Create the key ring (O_CREAT|O_EXCL, 0600) or append through one checked O_NOFOLLOW descriptor; the kid."""
    day = time.strftime("%Y%m%d", time.gmtime())
    kid = "k%s-%s" % (day, secrets.token_hex(3))
    key = _b64url(secrets.token_bytes(32))
    line = "%s %s\n" % (kid, key)
    try:  # a new file never exists with a wider mode
        fd = os.open(path, _CREATE_FLAGS, 0o600)
        prefix = _KEY_RING_HEADER
    except FileExistsError:
        fd = os.open(path, _APPEND_FLAGS)
        prefix = None
    try:
        if prefix is None:
            prefix = _before_new_key(path, fd)
        written = prefix + line
        os.write(fd, written.encode("ascii"))
    finally:
        os.close(fd)
    return kid


def _before_new_key(path, fd):
    """What goes before a new key line in the key ring open at fd: a line break if its last line lacks one.
    ValueError if the ring does not load: a key is never appended to a file that does not load."""
    old = read_private_file(path, fd=fd)  # the file written is the file checked
    KeyRing.parse(old, allow_empty=True)
    if old and not old.endswith("\n"):
        return "\n"
    return ""


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
_STRING, _OBJECT, _TITLE = {"type": "string"}, {"type": "object"}, "Verify an agent's claimed action"
_RESPONSE_SCHEMA = collections.OrderedDict(  # the /verify response: field -> JSON schema
    [
        ("aar_verdict", dict(_STRING, enum=list(VERDICTS))),
        ("verdict", dict(_STRING, enum=list(LEGACY.values()))),
        ("confidence", {"type": "number", "minimum": 0, "maximum": 1}),
        ("reason_codes", {"type": "array", "items": _STRING}),
        ("reasoning", _STRING),
        ("kind_dispatched", dict(_STRING, enum=list(KINDS))),
        ("verifier_used", _STRING),
        ("details", _OBJECT),
        ("receipt", _OBJECT),
    ]
)
TOOL = {
    "name": "verify_action",
    "title": _TITLE,
    "annotations": {"title": _TITLE, "readOnlyHint": True, "idempotentHint": False, "openWorldHint": False},
    "description": (
        "Check whether a claim about an action (code change, database operation, file operation, API call, or "
        "anything else) is consistent with the evidence supplied, using deterministic rules; returns a verdict, "
        "reason codes and a signed receipt. It fetches nothing, so a receipt never proves the claim true."
    ),
    "inputSchema": {
        "type": "object",
        "required": ["claim", "evidence"],
        "additionalProperties": False,
        "properties": {
            "claim": dict(_STRING, minLength=1, maxLength=MAX_CLAIM),
            "evidence": dict(_OBJECT, description=_EVIDENCE_DOC),
            "kind": dict(_STRING, enum=list(KINDS)),
            "context": dict(_STRING, maxLength=MAX_CONTEXT),
            "caller_context": dict(_OBJECT, description="At most 8 scalar values; keys and strings <= 64 characters."),
        },
    },
    "outputSchema": dict(_OBJECT, required=list(_RESPONSE_SCHEMA), properties=dict(_RESPONSE_SCHEMA)),
}


def rules_document():
    """GET /rules: the decision, dispatch order, evidence fields, verbs, bounds and every reason code."""
    return {
        "decision": DECISION,
        "confidence": CONFIDENCE,
        "bounds": BOUNDS,
        "dispatch_order": DISPATCH,
        "evidence": {k: {"fields": sorted(f), "needs_one_of": g} for k, (f, g) in EVIDENCE.items()},
        "verbs": dict(VERB_CLASSES, api_call={"success": sorted(_OK_WORDS), "failure": sorted(_FAIL_WORDS)}),
        "reason_codes": {c: dict(kind=k, signal=_SIGNAL_NAMES[s], meaning=m) for c, (k, s, m) in REASONS.items()},
    }


def spec_document(sandbox):
    """GET /spec: tool schema, kinds, verdicts, receipt fields, the canonical form, limits, endpoints, and what the
    sandbox enforces."""
    return {
        "name": "verify_action.py",
        "version": VERSION,
        "sandbox": sandbox,
        "proves": PROVES,
        "does_not_prove": NOT_PROVES,
        "tool": TOOL,
        "kinds": KINDS,
        "evidence": _EVIDENCE_DOC,
        "verdicts": {"aar_verdict": VERDICTS, "legacy_verdict": LEGACY},
        "receipt": {
            "schema": SCHEMA,
            "fields": RECEIPT_FIELDS,
            "verify": "POST /receipts/verify {\"receipt\": {}} or verify_action.py verify-receipt FILE --key-file F",
            "canonicalization": (
                "RFC 8785 (JCS): keys sorted by UTF-16 code units, no whitespace, ECMAScript numbers, minimal "
                "escapes, UTF-8. Numbers are doubles, so a request with an integer beyond +-(2^53 - 1) is refused "
                "(400, I-JSON, RFC 7493): two such integers could otherwise hash alike."
            ),
        },
        "limits": {
            "claim_chars": MAX_CLAIM,
            "context_chars": MAX_CONTEXT,
            "json_depth": MAX_DEPTH,
            "integer_magnitude_max": MAX_INT,
        },
        "endpoints": ["%s %s" % (method, path) for path, method in ROUTES.items()],
        "mcp": {"protocol_versions": PROTOCOL_VERSIONS, "transports": ["POST /mcp (JSON responses)", "--stdio"]},
    }


_rpc_error = lambda msg_id, code, message: {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}
_text_content = lambda text: {"type": "text", "text": text}
_json_text = lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
_MCP_ALONG = ("params", "arguments", "evidence")  # where a tools/call's evidence is (see canonical_members)


class Service(object):
    """What HTTP and stdio share: the key ring, the issuer, the counters and every handler."""

    sandbox = "off"  # what apply_sandbox enforces (GET /healthcheck and /spec say it)

    def __init__(self, keyring, issuer="verify_action.py", clock=time.time):
        self.keyring, self.issuer, self.clock, self.started = keyring, issuer, clock, clock()
        self._lock = threading.Lock()
        self.counts = {
            "verifications": 0,
            "by_kind": dict.fromkeys(KINDS, 0),
            "by_verdict": dict.fromkeys(VERDICTS, 0),
            "receipt_checks": 0,
            "mcp_messages": 0,
            "errors_by_status": {},
        }

    def count(self, key, sub=None):
        # One more in a GET /stats counter (never request content).
        with self._lock:
            table, name = (self.counts, key) if sub is None else (self.counts[key], sub)
            table[name] = table.get(name, 0) + 1

    def stats(self):
        # GET /stats: a copy of the counters and the uptime.
        with self._lock:
            return dict(json.loads(json.dumps(self.counts)), uptime_s=round(self.clock() - self.started, 3))

    def verify(self, request, members=None):
        # Judge a validated request and sign the result: the /verify response. members: the request's
        # canonical_members, made once (by strict_parse, or here) for the rules and the receipt.
        members = members or canonical_members(request)
        kind = dispatch_kind(request["evidence"], request.get("kind"))
        codes, details, verdict, confidence = judge(kind, request["claim"], request["evidence"], members["evidence"])
        unique = list(dict.fromkeys(codes))
        receipt = issue_receipt(
            request, kind, verdict, confidence, unique, self.keyring, self.issuer, self.clock(), members
        )
        for key, sub in (("verifications", None), ("by_kind", kind), ("by_verdict", verdict)):
            self.count(key, sub)
        return {
            "aar_verdict": verdict,
            "verdict": LEGACY[verdict],
            "confidence": confidence,
            "reason_codes": unique,
            "reasoning": "%s (%s): %s" % (verdict, kind, " ".join(REASONS[c][2] for c in unique)),
            "kind_dispatched": kind,
            "verifier_used": kind + "_v1",
            "details": details,
            "receipt": receipt,
        }

    def post(self, path, raw, headers):
        """(status, JSON object, or None for an empty 202) for a POST body to path."""
        with _REQUEST:  # the garbage collector waits, and what the request made is freed before it resumes
            return self._post(path, raw, headers)

    def _post(self, path, raw, headers):
        if path == "/mcp" and headers.get("mcp-protocol-version", PROTOCOL_VERSIONS[0]) not in PROTOCOL_VERSIONS:
            return 400, {"error": "unsupported_protocol_version", "message": "use " + ", ".join(PROTOCOL_VERSIONS)}
        try:
            obj, members = strict_parse(raw, along=_MCP_ALONG if path == "/mcp" else ("evidence",))
            if path == "/mcp":  # mcp() answers every message itself
                reply = self.mcp(obj, members)
                return (202, None) if reply is None else (200, reply)
            if path == "/verify":
                return 200, self.verify(validate_request(obj), members)
            if not isinstance(obj, dict) or set(obj) != {"receipt"} or not isinstance(obj["receipt"], dict):
                raise RequestError("invalid_request", "the body must be {\"receipt\": {...}}")
        except RequestError as e:
            if path == "/mcp":  # over MCP a parse error is a JSON-RPC error, not an HTTP 400
                return 200, _rpc_error(None, -32700, "Parse error: " + e.message)
            return 400, {"error": e.code, "message": e.message}
        self.count("receipt_checks")
        return 200, dict(zip(("valid", "reason", "kid"), verify_receipt(obj["receipt"], self.keyring)))

    def mcp(self, msg, members=None, session=None):
        # The JSON-RPC reply to a message, or None; session is None over HTTP (stateless), a dict over stdio.
        if isinstance(msg, list):
            if session is None or session.get("version") != "2025-03-26" or not msg:
                return _rpc_error(None, -32600, "Invalid Request: batches are not supported")
            return [r for r in (self.mcp(m, None, session) for m in msg) if r is not None] or None
        self.count("mcp_messages")
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return _rpc_error(None, -32600, "Invalid Request")
        msg_id, has_id = msg.get("id"), "id" in msg
        if "method" not in msg:
            return None  # a response from the client: a tools-only server sends no requests
        if has_id and (isinstance(msg_id, bool) or not isinstance(msg_id, (str, int))):
            return _rpc_error(None, -32600, "Invalid Request: id must be a string or an integer")
        if not isinstance(msg["method"], str):
            return _rpc_error(msg_id, -32600, "Invalid Request: method")
        if not has_id:
            return None  # notifications are never answered
        try:
            params_members = (members or {}).get("params")  # canonical_members of the message, along _MCP_ALONG
            result = self._method(msg["method"], msg.get("params", {}), session, params_members)
            return dict(jsonrpc="2.0", id=msg_id, result=result)
        except RequestError as e:
            return _rpc_error(msg_id, e.code, e.message)
        except Exception:
            return _rpc_error(msg_id, -32603, "Internal error")

    def _method(self, method, params, session, members):
        need(isinstance(params, dict), -32602, "Invalid params: params must be an object")
        if method == "ping":
            return {}
        if method != "initialize":
            need(method in ("tools/list", "tools/call"), -32601, "Method not found")
            need(session is None or session.get("version"), -32600, "Invalid Request: not initialized")
            if method == "tools/list":
                return {"tools": [TOOL]}
            name, args = params.get("name"), params.get("arguments", {})
            need(isinstance(name, str) and isinstance(args, dict), -32602, "Invalid params: name and arguments")
            need(name == TOOL["name"], -32602, "Unknown tool")
            try:  # with the canonical text of the arguments made by strict_parse, if it has them
                args_members = members.get("arguments") if isinstance(members, dict) else None
                result = self.verify(validate_request(args), args_members if isinstance(args_members, dict) else None)
            except RequestError as e:  # a tool execution error, so the model can correct its arguments
                return {"content": [_text_content("invalid arguments: %s: %s" % (e.code, e.message))], "isError": True}
            return {"content": [_text_content(_json_text(result))], "structuredContent": result, "isError": False}
        # initialize negotiates the protocol version: the client's if supported, else our newest
        asked = params.get("protocolVersion")
        need(isinstance(asked, str), -32602, "Invalid params: protocolVersion must be a string")
        need(session is None or not session.get("version"), -32600, "Invalid Request: already initialized")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        if session is not None:
            session["version"] = version
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "verify_action", "title": "verify_action.py", "version": VERSION},
            "instructions": "Call verify_action with a claim and its evidence before acting on the claim. "
            "A receipt proves what was judged, never that the claim is true.",
        }

def serve_stdio(service, inp, out, max_line=4 << 20):
    """MCP over stdio: newline-delimited JSON-RPC from inp, replies to out, until EOF or the client goes."""
    session = {}
    for line in iter(lambda: inp.readline(max_line + 1), b""):
        try:
            if len(line) > max_line and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of an oversized message
                    line = inp.readline(max_line)
                _bad_json("message too large")
            with _REQUEST:
                reply = service.mcp(*strict_parse(line, along=_MCP_ALONG), session=session) if line.strip() else None
        except RequestError as e:
            reply = _rpc_error(None, -32700, "Parse error: " + e.message)
        try:
            if reply is not None:
                out.write(_json_text(reply).encode("utf-8") + b"\n")
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
<tr><th>code<th>kind<th>signal<th>meaning</tr>
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


def render_page():
    """GET /: what a receipt proves and does not, a form to try a request (its script /page.js), the rules table."""
    rows = "\n".join(
        "<tr><td><code>%s</code></td><td>%s</td><td>%s</td><td>%s</td></tr>" % (c, k, _SIGNAL_NAMES[s], html.escape(m))
        for c, (k, s, m) in sorted(REASONS.items(), key=lambda item: (item[1][0], item[0]))
    )
    return _PAGE % {
        "version": VERSION,
        "proves": html.escape(PROVES),
        "not_proves": html.escape(NOT_PROVES),
        "kinds": "".join("<option>%s</option>" % k for k in KINDS),
        "example": html.escape(json.dumps({"diff": _EXAMPLE_DIFF}, indent=1)),
        "decision": html.escape(DECISION),
        "confidence": html.escape(CONFIDENCE),
        "rows": rows,
    }


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


def _read_receipt(path):
    """The receipt in a file, which holds a bare receipt or a whole /verify response (strict JSON)."""
    with open(path, "rb") as f:
        doc = strict_loads(f.read(MAX_BODY + 1))
    if isinstance(doc, dict) and "aar_verdict" in doc:
        doc = doc.get("receipt")
    return doc


def _receipt_command(argv):
    """keygen --key-file F (prints the new kid) | verify-receipt FILE --key-file F (exit 0 when valid, else 1)."""
    parser = argparse.ArgumentParser(prog="verify_action.py " + argv[0])
    if argv[0] == "verify-receipt":
        parser.add_argument("file")
    parser.add_argument("--key-file", required=True)
    args = parser.parse_args(argv[1:])
    try:
        if argv[0] == "keygen":
            print(keygen(args.key_file))
            return 0
        ring = load_keyring(args.key_file)
        doc = _read_receipt(args.file)
    except (OSError, ValueError) as e:
        return _fail(getattr(e, "message", None) or e)
    valid, reason, kid = verify_receipt(doc, ring)
    print(json.dumps({"valid": valid, "reason": reason, "kid": kid}))
    return 0 if valid else 1


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
