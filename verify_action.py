#!/usr/bin/env python3
"""verify_action.py: check an AI agent's claim about an action against the evidence it supplies,
and sign a receipt of what was judged.

One file, Python standard library only (CPython 3.9+); vendor it by copying it.

  python3 verify_action.py [--host H] [--port P] [--key-file F] ...   HTTP on 127.0.0.1:8092
  python3 verify_action.py --stdio [--key-file F]                     MCP over stdio
  python3 verify_action.py keygen --key-file F                        create a key ring, or add a key
  python3 verify_action.py verify-receipt FILE --key-file F           check a receipt offline (exit 0/1)

The rules are deterministic and never reach a database, repository or API: a verdict says whether the
evidence supplied is consistent with the claim. A receipt (HMAC-SHA256 over RFC 8785 canonical JSON)
proves which service judged which exact request, when, and with what result; never that the claim is true.
"""
import argparse
import base64
import collections
import hashlib
import hmac
import html
import ipaddress
import json
import os
import re
import secrets
import selectors
import socket
import stat
import sys
import threading
import time
import urllib.parse

# ---------------------------------------------------------------------------------------------------
# §1 Constants, verdicts, reason codes
# ---------------------------------------------------------------------------------------------------
VERSION = "1.0.0"
SCHEMA = "verify_action_receipt.v0"
VERDICTS = ("verified", "contradicted", "insufficient_evidence", "unsafe_to_verify")
LEGACY = dict(zip(VERDICTS, ("ok", "mismatch", "uncertain", "rejected")))
KINDS = ("code_diff", "db_op", "file_op", "api_call", "generic")
MAX_CLAIM, MAX_CONTEXT, MAX_DEPTH, MAX_BODY = 8192, 8192, 32, 1 << 20
MAX_CALLER_KEYS, MAX_CALLER_STR = 8, 64
REQUEST_FIELDS = ("claim", "evidence", "kind", "context", "caller_context")
BOUNDS = {"diff_chars": 4 << 20, "diff_files": 5000, "operation_chars": 65536, "path_chars": 4096,
          "request_chars": 4 << 20, "count_max": 2 ** 53}
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
PROVES = ("Which service (key id kid) judged which exact request (SHA-256 of the claim, of the evidence and "
          "of the whole request in RFC 8785 canonical form), when, and with what verdict and reason codes.")
NOT_PROVES = ("That the claim is true. The service never reaches into databases, repositories or APIs; it "
              "only judges whether the evidence supplied is consistent with the claim, and evidence can be "
              "fabricated or incomplete.")

# Every reason code: (kind, signal, meaning). Signals: + positive, - negative, ! critical negative,
# unsafe (the evidence could not be examined), 0 neutral. The vocabulary is closed: nothing else is emitted.
REASONS = {
    "no_signal": ("any", "0", "No rule found anything in the evidence to compare with the claim."),
    "evidence_missing_fields": ("any", "-", "The evidence lacks the fields this kind needs."),
    "evidence_invalid": ("any", "unsafe", "A field this kind reads has the wrong type or shape."),
    "evidence_too_large": ("any", "unsafe", "A field exceeds this kind's bound (see bounds)."),
    "verifier_error": ("any", "unsafe", "A rule failed unexpectedly; nothing was judged."),
    "conflicting_verbs": ("any", "-", "The claim names actions that contradict each other."),
    "diff_no_changes": ("code_diff", "-", "The diff contains no file changes."),
    "path_in_diff": ("code_diff", "+", "Every file the claim names is changed in the diff."),
    "path_partly_in_diff": ("code_diff", "-", "Some files the claim names are not in the diff."),
    "path_not_in_diff": ("code_diff", "!", "None of the files the claim names is in the diff."),
    "identifier_in_changed_lines": ("code_diff", "+", "Every identifier the claim names is in added or removed lines."),
    "identifier_not_in_changed_lines": ("code_diff", "-", "An identifier the claim names is in no added or removed line."),
    "content_words_absent": ("code_diff", "-", "The claim names no identifier and none of its content words is in the changed lines."),
    "action_matches_lines": ("code_diff", "+", "The claimed action matches the line movement in the named files."),
    "action_mismatch_lines": ("code_diff", "-", "The claimed action does not match the line movement in the named files."),
    "file_deleted": ("code_diff", "+", "The file the claim says was deleted is deleted in the diff."),
    "file_not_deleted": ("code_diff", "-", "The claim says a file was deleted but the diff does not delete it."),
    "unnamed_files_changed": ("code_diff", "-", "The diff also changes files the claim does not name."),
    "changes_mostly_elsewhere": ("code_diff", "!", "More than half of the changed lines are in files the claim does not name."),
    "sql_kind_matches": ("db_op", "+", "The SQL statement's kind matches the claimed action."),
    "sql_kind_mismatch": ("db_op", "-", "The SQL statement's kind differs from the claimed action."),
    "sql_kind_conflicts": ("db_op", "!", "A write is claimed but the SQL statement is a SELECT."),
    "row_delta_matches": ("db_op", "+", "The sign of after_count - before_count fits the claimed action."),
    "row_delta_mismatch": ("db_op", "-", "The sign of after_count - before_count does not fit the claimed action."),
    "affected_rows_consistent": ("db_op", "+", "affected_rows fits the claimed action and the row delta."),
    "affected_rows_zero": ("db_op", "-", "A write is claimed but affected_rows is 0."),
    "affected_rows_mismatch": ("db_op", "-", "affected_rows differs from the size of the row delta."),
    "count_matches": ("db_op", "+", "The count in the claim equals affected_rows or the row delta."),
    "count_mismatch": ("db_op", "!", "The count in the claim differs from affected_rows and the row delta."),
    "sql_identifier_matches": ("db_op", "+", "The identifiers the claim names are those in the SQL's WHERE comparisons."),
    "sql_identifier_mismatch": ("db_op", "!", "An identifier the claim names differs from those in the SQL's WHERE comparisons."),
    "existence_matches": ("file_op", "+", "exists_before and exists_after fit the claimed action."),
    "start_state_mismatch": ("file_op", "-", "exists_before does not fit the claimed action."),
    "end_state_mismatch": ("file_op", "!", "exists_after contradicts the claimed action."),
    "path_matches": ("file_op", "+", "Every path the claim names is path (or new_path)."),
    "path_mismatch": ("file_op", "!", "A path the claim names differs from path and new_path."),
    "new_path_missing": ("file_op", "-", "A rename or move is claimed but the evidence has no new_path."),
    "line_count_matches": ("file_op", "+", "The claimed line count equals line_count."),
    "line_count_off": ("file_op", "-", "The claimed line count is near line_count but not equal."),
    "line_count_mismatch": ("file_op", "!", "The claimed line count is off by more than 10% or more than 50 lines."),
    "size_matches": ("file_op", "+", "The claimed size is within 1% of size_bytes."),
    "size_off": ("file_op", "-", "The claimed size is off by 1% to 50%."),
    "size_mismatch": ("file_op", "!", "The claimed size is off by more than 50%."),
    "status_matches_claim": ("api_call", "+", "The HTTP status class fits the claimed success or failure."),
    "status_failure": ("api_call", "!", "Success is claimed but the HTTP status is 4xx or 5xx."),
    "status_contradicts_failure_claim": ("api_call", "-", "Failure is claimed but the HTTP status is 2xx."),
    "body_matches_claim": ("api_call", "+", "The response body's outcome fits the claimed success or failure."),
    "body_failure": ("api_call", "!", "Success is claimed but the response body reports a failure."),
    "body_contradicts_failure_claim": ("api_call", "-", "Failure is claimed but the response body reports success."),
    "target_matches": ("api_call", "+", "Every target the claim names (email, URL, ID) is in the request."),
    "target_mismatch": ("api_call", "!", "The request names a different target (email, URL host or path, ID) than the claim."),
    "target_not_in_request": ("api_call", "-", "A target the claim names is not in the request."),
    "entities_match": ("generic", "+", "One of at least 3 distinct entities (numbers, URLs, emails, identifiers) of the claim found in the evidence."),
    "explicit_value_match": ("generic", "+", "A value the claim states for a key (KEY is VALUE, KEY: VALUE) equals the evidence's."),
    "explicit_value_conflict": ("generic", "!", "A value the claim states for a key differs from the evidence's value for that key."),
}
_SIGNAL_NAMES = {"+": "positive", "-": "negative", "!": "critical", "unsafe": "unsafe", "0": "neutral"}
DECISION = ("any unsafe code -> unsafe_to_verify; any critical -> contradicted; no negatives and >= 2 positives "
            "-> verified; >= 2 negatives and no positives -> contradicted; otherwise insufficient_evidence.")
CONFIDENCE = ("confidence in the stated verdict: verified 0.6 + 0.1*(P-2), at most 0.95; contradicted 0.9 with a "
              "critical signal, else 0.6 + 0.1*(N-2), at most 0.9; insufficient_evidence 0.5; unsafe_to_verify 0.0.")


def decide(codes):
    """Apply the fixed decision rule to a list of reason codes (repeats count); return (verdict, confidence)."""
    signals = [REASONS[c][1] for c in codes]
    pos, neg = signals.count("+"), signals.count("-")
    if "unsafe" in signals:
        return "unsafe_to_verify", 0.0
    if "!" in signals:
        return "contradicted", 0.9
    if not neg and pos >= 2:
        return "verified", round(min(0.95, 0.6 + 0.1 * (pos - 2)), 3)
    if neg >= 2 and not pos:
        return "contradicted", round(min(0.9, 0.6 + 0.1 * (neg - 2)), 3)
    return "insufficient_evidence", 0.5


# ---------------------------------------------------------------------------------------------------
# §2 Canonical JSON (RFC 8785) and hashing
# ---------------------------------------------------------------------------------------------------
_encode_str = json.encoder.encode_basestring  # JCS string form: only " \ and controls escaped, \u00xx lowercase


def _es_number(x):
    """A number in ECMAScript Number.prototype.toString form, as RFC 8785 requires."""
    if isinstance(x, int) and -2 ** 53 < x < 2 ** 53:
        return str(x)
    f = float(x)
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError("NaN and Infinity have no canonical JSON form")
    if f == 0:
        return "0"
    mant, _, exp = repr(abs(f)).partition("e")
    ip, _, fp = mant.partition(".")
    raw = ip + fp
    digits = raw.lstrip("0")
    n = len(ip) + int(exp or 0) - (len(raw) - len(digits))  # decimal point position in digits
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * -n + digits
    else:
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if n > 0 else "-") + str(abs(n - 1))
    return ("-" if f < 0 else "") + out


def _utf16(key):
    return key.encode("utf-16-be")


def _jcs(v):
    if isinstance(v, str):
        return _encode_str(v)
    if v is None or v is True or v is False:
        return "null" if v is None else "true" if v else "false"
    if isinstance(v, (int, float)):
        return _es_number(v)
    if isinstance(v, dict):
        return "{" + ",".join(_encode_str(k) + ":" + _jcs(v[k]) for k in sorted(v, key=_utf16)) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_jcs(i) for i in v) + "]"
    raise TypeError("not a JSON value: %s" % type(v).__name__)


def canonical_json(value):
    """RFC 8785 (JCS) canonical form of a parsed JSON value, as UTF-8 bytes."""
    return _jcs(value).encode("utf-8")


def sha256_tag(data):
    """'sha256:' + lowercase hex SHA-256 of bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def b64url(data):
    """Unpadded base64url."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


# ---------------------------------------------------------------------------------------------------
# §3 Rules per kind (pure). Every rule tokenises its input once with single-class patterns and
# set look-ups, so time is linear in the input; no pattern has nested or adjacent overlapping quantifiers.
# ---------------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"[^\s`'\"();<>\[\]{}|]+")
_CODE_TOKEN = re.compile(r"[A-Za-z0-9_.]+")
_CODE_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
_ALPHA = re.compile(r"[a-z]+")
_SQL_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*|[0-9]+|<>|!=|<=|>=|\S")
_SQL_SKIP = re.compile(r"['\"`]|--|/\*")
EXTENSIONS = frozenset("""py pyi js mjs cjs ts tsx jsx go rs c h cc cpp cxx hpp hh java kt kts rb php cs swift m mm sh
    bash zsh ps1 md rst txt json jsonl yaml yml toml ini cfg conf html htm css scss sass less sql xml csv tsv lock log env
    gradle mk cmake r scala lua pl pm proto dart vue svelte ex exs erl hs ml elm clj tf hcl dockerfile gitignore pdf png jpg
    jpeg gif svg zip gz tar tgz bin so dll exe wasm ipynb bat tex vim el nix zig jl sol cfg properties""".split())
_STOP = frozenset("""a an the and or but if then than that this these those with without from into onto for to of in on
    at by as is are was were be been being it its they them their there here which what when where while who whom whose
    why how not no nor so too very can could should would will shall may might must do does did done have has had having
    also just only still some any all each every both either neither more most less least other such same own via per over
    under after before about above below between through during again further once now new old file files code line lines
    function functions method methods class classes module modules test tests value values variable variables logic
    handling support issue issues bug bugs case cases call calls return returns using used use make made sure properly
    correctly correct small minor simple basic proper instead within""".split())
_NOT_ID = frozenset("""version versions step steps phase page pages line lines port attempt attempts retry retries level
    day days hour hours minute minutes second seconds week weeks month months year years http https status code codes
    error errors times item items row rows record records percent top last first least most least""".split())
_NEGATION = frozenset("not never no didn wasn isn couldn cannot weren hasn haven".split())


def _verb_table(classes):
    return {w: cls for cls, words in classes.items() for w in words.split()}


_CODE_VERBS = _verb_table({
    "add": "add added adds adding introduce introduced introduces create created creates implement implemented implements write wrote writes",
    "modify": "fix fixed fixes change changed changes update updated updates modify modified modifies refactor refactored refactors rename renamed renames set edit edited edits replace replaced replaces tweak tweaked tweaks",
    "check": "check checked checks validate validated validates guard guarded guards ensure ensured ensures verify verified verifies",
    "remove": "remove removed removes delete deleted deletes drop dropped drops"})
_DB_VERBS = _verb_table({
    "delete": "delete deleted deletes remove removed removes purge purged purges drop dropped truncate truncated clear cleared",
    "insert": "insert inserted inserts add added adds create created creates append appended import imported",
    "update": "update updated updates modify modified change changed set mark marked edit edited",
    "read": "read reads select selected query queried fetch fetched count counted list listed retrieve retrieved"})
_FILE_VERBS = _verb_table({
    "create": "create created creates add added adds make made generate generated touch touched",
    "write": "write wrote writes written save saved saves",
    "delete": "delete deleted deletes remove removed removes erase erased unlink unlinked rm",
    "modify": "modify modified modifies update updated updates edit edited edits append appended appends change changed overwrite overwrote overwritten truncate truncated",
    "rename": "rename renamed renames move moved moves mv"})
_FILE_STATES = {"create": (False, True), "write": (None, True), "delete": (True, False), "modify": (True, True),
                "rename": (True, True)}
_ALL_VERBS = frozenset(_CODE_VERBS) | frozenset(_DB_VERBS) | frozenset(_FILE_VERBS)
_OK_WORDS = frozenset("sent delivered posted created succeeded ok success successful successfully accepted".split())
_FAIL_WORDS = frozenset("failed fail fails failure error errored rejected bounced denied unsuccessful unable timeout".split())
_STATUS_OK = frozenset("ok success succeeded successful sent delivered accepted created completed complete done".split())
_STATUS_FAIL = frozenset("error failed failure fail rejected bounced denied invalid".split())
_SIZE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 1000, "kib": 1024, "mb": 10 ** 6, "mib": 1 << 20,
               "gb": 10 ** 9, "gib": 1 << 30}


def _tokens(text):
    """Claim text split once into tokens, sentence punctuation trimmed from their ends."""
    out = []
    for t in _TOKEN.findall(text):
        t = t.rstrip(".,:!?*").lstrip(",*:!?")
        if t:
            out.append(t)
    return out


def _variants(word):
    """The word and the word without one of the suffixes -s, -es, -ed, -ing (the only inflections allowed)."""
    out = [word]
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out.append(word[:-len(suffix)])
    return out


def _digits(s):
    return s.isascii() and s.isdigit()


def _number(tok):
    """A plain or comma-grouped decimal number ('1,000', '2.5') as int or float, else None."""
    if len(tok) > 24:
        return None
    parts = tok.split(",")
    if len(parts) > 1 and not (1 <= len(parts[0]) <= 3 and all(len(p) == 3 for p in parts[1:])):
        return None
    t = "".join(parts)
    ip, dot, fp = t.partition(".")
    if not _digits(ip) or (dot and not _digits(fp)):
        return None
    return float(t) if dot else int(t)


def _ident_part(p):
    return bool(p) and p.isascii() and (p[0].isalpha() or p[0] == "_") and p.replace("_", "a").isalnum()


def _identifier(tok, explicit=False):
    """A code identifier (dotted, snake_case, camelCase; any word when backticked), else None."""
    parts = tok.split(".")
    if not all(_ident_part(p) for p in parts):
        return None
    if len(parts) > 1:
        return tok if max(len(p) for p in parts) > 1 else None
    if explicit or "_" in tok.strip("_") or any(a.islower() and b.isupper() for a, b in zip(tok, tok[1:])):
        return tok
    return None


def _email(tok):
    local, at, domain = tok.partition("@")
    if not at or not local or "." not in domain or domain.startswith(".") or domain.endswith("."):
        return None
    if not domain.replace(".", "a").replace("-", "a").isalnum():
        return None
    if not local.replace(".", "a").replace("_", "a").replace("+", "a").replace("-", "a").replace("%", "a").isalnum():
        return None
    return tok.lower()


def _url(tok):
    """(host, path without trailing '/') of an http(s) URL token, else None."""
    if not tok.lower().startswith(("http://", "https://")):
        return None
    try:
        parts = urllib.parse.urlsplit(tok)
        host = parts.hostname
    except ValueError:
        return None
    return (host, parts.path.rstrip("/")) if host else None


def _pathish(tok):
    """A token that names a file: has a known extension, or is clearly a path (./x, /x, ~/x, a/b/c)."""
    if "://" in tok or "@" in tok or len(tok) > BOUNDS["path_chars"]:
        return False
    base = tok.rsplit("/", 1)[-1]
    name, dot, ext = base.rpartition(".")
    if dot and ext.lower() in EXTENSIONS and (name or base.startswith(".")) and not _digits(name):
        return True
    return "/" in tok and bool(base) and (tok.startswith(("/", "./", "~/")) or tok.count("/") >= 2)


def _suffix_of(claimed, path):
    """True when claimed equals path or is a whole-component suffix of it (a.py never matches data.py)."""
    return bool(claimed) and (path == claimed or path.endswith("/" + claimed))


def _claim_ids(low):
    """Explicit identifiers: id=N, id N, #N, NAME_id N, and a noun followed by a number (user 12345)."""
    ids = set()
    for i, t in enumerate(low):
        nxt = low[i + 1] if i + 1 < len(low) else ""
        if t.startswith("#") and _digits(t[1:]) and len(t) <= 19:
            ids.add(str(int(t[1:])))
        elif t.startswith(("id=", "id:")) and _digits(t[3:]) and len(t) <= 21:
            ids.add(str(int(t[3:])))
        elif _digits(nxt) and len(nxt) <= 18 and (t == "id" or t.endswith("_id") or (
                t.isalpha() and len(t) >= 3 and t not in _STOP and t not in _NOT_ID and t not in _ALL_VERBS)):
            ids.add(str(int(nxt)))
    return ids


def _claim_count(low, verbs):
    """The number right after an action verb ('deleted 10 sessions'), else None."""
    for i, t in enumerate(low):
        if t in verbs:
            j = i + 1
            while j < len(low) and low[j] in ("the", "all", "exactly", "only"):
                j += 1
            n = _number(low[j]) if j < len(low) else None
            if isinstance(n, int):
                return n
    return None


def _head_paths(rest):
    """(old, new) from the rest of a 'diff --git' line, with or without a/ b/ prefixes."""
    rest = rest.strip()
    if rest.startswith("a/") and " b/" in rest:
        i = rest.find(" b/")
        return rest[2:i], rest[i + 3:]
    half = len(rest) // 2
    if len(rest) % 2 == 1 and rest[:half] == rest[half + 1:]:
        return rest[:half], rest[:half]
    old, _, new = rest.partition(" ")
    return old, new or old


def _header_path(value):
    value = value.split("\t", 1)[0].rstrip()  # diff -u appends a tab and a timestamp
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value


def parse_diff(text):
    """Parse unified diff text (git, plain diff -u, --no-prefix). Returns (files, changed_lines): each file
    {old, new, status, added, removed, binary}; changed_lines are the added and removed lines' text."""
    files, changed, cur = [], [], None
    old_left = new_left = 0
    pending_minus = None
    for line in text.split("\n"):
        if old_left > 0 or new_left > 0:
            c = line[:1]
            if c == "+":
                cur["added"] += 1
                new_left -= 1
                changed.append(line[1:])
                continue
            if c == "-":
                cur["removed"] += 1
                old_left -= 1
                changed.append(line[1:])
                continue
            if c == " " or line in ("", "\r"):
                old_left -= 1
                new_left -= 1
                continue
            if c == "\\":
                continue
            old_left = new_left = 0  # a short hunk: read the line as a header
        line = line.rstrip("\r")
        if line.startswith("diff --git "):
            old, new = _head_paths(line[11:])
            cur = {"old": old, "new": new, "status": "modified", "added": 0, "removed": 0, "binary": False, "git": True}
            files.append(cur)
        elif line.startswith("--- "):
            pending_minus = _header_path(line[4:])
        elif line.startswith("+++ ") and pending_minus is not None:
            old, new = pending_minus, _header_path(line[4:])
            pending_minus = None
            if (old.startswith("a/") or old == "/dev/null") and (new.startswith("b/") or new == "/dev/null"):
                old, new = (p[2:] if p[1:2] == "/" else p for p in (old, new))  # git's a/ b/ prefixes
            if cur is None or not cur.pop("git", False):
                cur = {"old": old, "new": new, "status": "modified", "added": 0, "removed": 0, "binary": False}
                files.append(cur)
            else:
                cur["old"], cur["new"] = old, new
            if old == "/dev/null":
                cur["status"], cur["old"] = "added", cur["new"]
            elif new == "/dev/null":
                cur["status"], cur["new"] = "deleted", cur["old"]
        elif line.startswith("@@ "):
            parts = line.split(" ")
            if cur is None:
                cur = {"old": "", "new": "", "status": "modified", "added": 0, "removed": 0, "binary": False}
                files.append(cur)
            cur.pop("git", None)
            try:
                o, n = parts[1][1:].partition(",")[2] or "1", parts[2][1:].partition(",")[2] or "1"
                old_left, new_left = (int(o), int(n)) if len(o) < 10 and len(n) < 10 else (0, 0)
            except (IndexError, ValueError):
                old_left = new_left = 0
        elif cur is not None and line.startswith(("new file mode", "deleted file mode", "rename from ",
                                                  "rename to ", "GIT binary patch")):
            if line.startswith("new"):
                cur["status"] = "added"
            elif line.startswith("deleted"):
                cur["status"] = "deleted"
            elif line.startswith("GIT"):
                cur["binary"] = True
            elif line.startswith("rename from "):
                cur["status"], cur["old"] = "renamed", line[12:]
            else:
                cur["status"], cur["new"] = "renamed", line[10:]
        elif line.startswith("Binary files ") and line.endswith(" differ"):
            old, _, new = line[13:-7].partition(" and ")
            if cur is None or not cur.pop("git", False):
                cur = {"old": old[2:] if old.startswith("a/") else old, "new": new[2:] if new.startswith("b/") else new,
                       "status": "modified", "added": 0, "removed": 0, "binary": True}
                files.append(cur)
            cur["binary"] = True
    for f in files:
        f.pop("git", None)
    return files, changed


def _code_tokens(lines):
    """Every identifier-like token of code lines, with the dotted sub-chains of short chains (a.b.c -> a.b, b.c)."""
    out = set()
    for t in set(_CODE_TOKEN.findall("\n".join(lines))):
        t = t.strip(".")
        out.add(t)
        parts = t.split(".")
        if len(parts) <= 8:
            for i in range(len(parts)):
                for j in range(i + 1, len(parts) + 1):
                    out.add(".".join(parts[i:j]))
        else:
            out.update(parts)
    return out


def _code_words(lines):
    out = set()
    for w in set(_CODE_WORD.findall("\n".join(lines))):
        out.update(_variants(w.lower()))
    return out


def judge_code_diff(claim, ev):
    """Rules for {diff}: claimed paths, identifiers and action against the parsed diff."""
    files, changed = parse_diff(ev["diff"])
    if len(files) > BOUNDS["diff_files"]:
        return ["evidence_too_large"], {}
    index = {}  # every whole-component suffix of every diff path -> file numbers
    for i, f in enumerate(files):
        for p in {f["old"], f["new"]} - {"", "/dev/null"}:
            comps = p.split("/")
            for k in range(max(0, len(comps) - 16), len(comps)):
                index.setdefault("/".join(comps[k:]), set()).add(i)
    details = {"files": [{"path": f["new"], "old_path": f["old"], "status": f["status"], "added": f["added"],
                          "removed": f["removed"], "binary": f["binary"]} for f in files[:100]],
               "files_changed": len(files), "lines_added": sum(f["added"] for f in files),
               "lines_removed": sum(f["removed"] for f in files)}
    if not files:
        return ["diff_no_changes"], details
    backticked = {t for span in claim.split("`")[1::2] for t in _tokens(span)} if claim.count("`") >= 2 else set()
    claimed, idents, words = [], set(), []
    toks = _tokens(claim)
    for t in toks:
        c = t[2:] if t.startswith("./") else t
        if c in index or _pathish(c):
            claimed.append(c)
        elif _email(t) or _url(t):
            continue
        elif _identifier(t, t in backticked):
            idents.add(t)
        elif t.isalpha() and len(t) >= 4 and t.lower() not in _STOP and t.lower() not in _ALL_VERBS:
            words.append(t.lower())
    codes, named = [], set()
    if claimed:
        hits = [c for c in claimed if c in index]
        for c in hits:
            named |= index[c]
        codes.append("path_not_in_diff" if not hits else "path_partly_in_diff" if len(hits) < len(claimed)
                     else "path_in_diff")
    if idents:
        have = _code_tokens(changed)
        codes.append("identifier_in_changed_lines" if all(i in have for i in idents)
                     else "identifier_not_in_changed_lines")
    elif words:
        have = _code_words(changed)
        if not any(v in have for w in words for v in _variants(w)):
            codes.append("content_words_absent")
    low = [t.lower() for t in toks]
    classes = {_CODE_VERBS[w] for w in low if w in _CODE_VERBS}
    scope = [files[i] for i in sorted(named)] if named else files
    added, removed = sum(f["added"] for f in scope), sum(f["removed"] for f in scope)
    if classes:
        need = {"add": added > 0, "check": added > 0, "remove": removed > 0 or any(f["status"] == "deleted" for f in scope),
                "modify": added + removed > 0 or any(f["binary"] or f["status"] != "modified" for f in scope)}
        codes.append("action_matches_lines" if all(need[c] for c in classes) else "action_mismatch_lines")
        deletes_file = any(w in _CODE_VERBS and _CODE_VERBS[w] == "remove" and "file" in low[i + 1:i + 3]
                           for i, w in enumerate(low))
        if deletes_file and named:
            codes.append("file_deleted" if all(f["status"] == "deleted" for f in scope) else "file_not_deleted")
    if named and len(named) < len(files):
        total = sum(f["added"] + f["removed"] for f in files)
        elsewhere = total - added - removed
        codes.append("changes_mostly_elsewhere" if elsewhere * 2 > total else "unnamed_files_changed")
    details.update(claimed_paths=claimed[:50], identifiers=sorted(idents)[:50], actions=sorted(classes))
    return codes, details


def _strip_sql(sql):
    """SQL with string literals, quoted names and comments blanked (one pass of str.find: linear)."""
    out, i = [], 0
    while True:
        m = _SQL_SKIP.search(sql, i)
        if not m:
            out.append(sql[i:])
            return " ".join(out)
        out.append(sql[i:m.start()])
        tok = m.group()
        if tok == "--":
            end = sql.find("\n", m.end())
        elif tok == "/*":
            end = sql.find("*/", m.end())
            end = end + 1 if end >= 0 else -1
        else:
            end = sql.find(tok, m.end())
        if end < 0:
            return " ".join(out)
        i = end + 1


def sql_facts(sql):
    """(statement class, identifiers compared in WHERE) of the first SQL statement. Classes: read, insert,
    update, delete (TRUNCATE too), merge (MERGE, REPLACE, UPSERT, INSERT ... ON CONFLICT), or None."""
    toks = _SQL_TOKEN.findall(_strip_sql(sql))
    kinds = {"SELECT": "read", "INSERT": "insert", "UPDATE": "update", "DELETE": "delete", "TRUNCATE": "delete",
             "MERGE": "merge", "REPLACE": "merge", "UPSERT": "merge"}
    kind, depth, start, end = None, 0, 0, len(toks)
    first = toks[0].upper() if toks else ""
    for i, t in enumerate(toks):
        if t == "(":
            depth += 1
        elif t == ")":
            depth -= 1
        elif t == ";" and depth <= 0:
            end = i
            break
        elif kind is None and depth <= 0 and (first == "WITH" or i == 0) and t.upper() in kinds:
            kind, start = kinds[t.upper()], i
    if kind == "insert" and any(t.upper() in ("CONFLICT", "DUPLICATE") for t in toks[start:end]):
        kind = "merge"
    ids, where = set(), False
    for i in range(start, end):
        t = toks[i]
        if not where:
            where = t.upper() == "WHERE"
            continue
        col = t.rsplit(".", 1)[-1]
        if not (col.lower() == "id" or col.lower().endswith("_id") or col.endswith("Id")):
            continue
        if toks[i + 1:i + 2] == ["="] and i + 2 < end and _digits(toks[i + 2]) and len(toks[i + 2]) <= 18:
            ids.add(str(int(toks[i + 2])))
        elif i >= 2 and toks[i - 1] == "=" and _digits(toks[i - 2]) and len(toks[i - 2]) <= 18:
            ids.add(str(int(toks[i - 2])))
        elif i + 2 < end and toks[i + 1].upper() == "IN" and toks[i + 2] == "(":
            j = i + 3
            while j < end and toks[j] != ")" and len(ids) < 1000:
                if _digits(toks[j]) and len(toks[j]) <= 18:
                    ids.add(str(int(toks[j])))
                j += 1
    return kind, ids


def judge_db_op(claim, ev):
    """Rules for {before_count, after_count, operation, affected_rows}: verb vs SQL kind vs row delta."""
    low = [t.lower() for t in _tokens(claim)]
    classes = {_DB_VERBS[w] for w in low if w in _DB_VERBS}
    writes = classes - {"read"}
    before, after, aff, op = (ev.get(k) for k in ("before_count", "after_count", "affected_rows", "operation"))
    delta = after - before if before is not None and after is not None else None
    skind, sql_ids = sql_facts(op) if op is not None else (None, set())
    claimed = min(writes) if len(writes) == 1 else "read" if classes == {"read"} else None
    details = {"claimed_action": claimed, "sql_kind": skind, "row_delta": delta, "affected_rows": aff,
               "sql_identifiers": sorted(sql_ids)[:50]}
    if len(writes) > 1:
        return ["conflicting_verbs"], details
    codes = []
    if claimed and skind and skind != "merge":
        codes.append("sql_kind_matches" if skind == claimed else "sql_kind_conflicts" if skind == "read"
                     else "sql_kind_mismatch")
    if claimed and delta is not None:
        fits = {"delete": delta < 0, "insert": delta > 0, "update": delta == 0, "read": delta == 0}[claimed]
        codes.append("row_delta_matches" if fits else "row_delta_mismatch")
    if writes and aff is not None:  # consistency needs a second field: the row delta
        if aff == 0:
            codes.append("affected_rows_zero")
        elif delta is not None and claimed in ("delete", "insert"):
            codes.append("affected_rows_consistent" if aff == abs(delta) else "affected_rows_mismatch")
        elif delta == 0 and claimed == "update":
            codes.append("affected_rows_consistent")
    count = _claim_count(low, _DB_VERBS)
    known = {aff} if aff is not None else set()
    if delta is not None and claimed in ("delete", "insert"):
        known.add(abs(delta))
    if count is not None and known:
        codes.append("count_matches" if count in known else "count_mismatch")
    ids = _claim_ids(low)
    if ids and sql_ids:
        codes.append("sql_identifier_matches" if ids <= sql_ids else "sql_identifier_mismatch")
    details["claimed_count"] = count
    return codes, details


def _quantities(toks):
    """(line counts, sizes in bytes) stated in the claim: '120 lines', '1.5 MB', '12KiB', '1,000 bytes'."""
    lines, sizes = [], []
    for i, t in enumerate(toks):
        if len(t) > 32:
            continue
        j = 0
        while j < len(t) and (t[j].isdigit() or t[j] in ".,"):
            j += 1
        n = _number(t[:j]) if j else None
        if n is None:
            continue
        unit = t[j:].lower() or (toks[i + 1].lower() if i + 1 < len(toks) else "")
        if unit in ("line", "lines") and isinstance(n, int):
            lines.append(n)
        elif unit in _SIZE_UNITS:
            sizes.append(n * _SIZE_UNITS[unit])
    return lines, sizes


def judge_file_op(claim, ev):
    """Rules for {path, exists_before, exists_after, line_count?, size_bytes?, new_path?}."""
    toks = _tokens(claim)
    low = [t.lower() for t in toks]
    path, new = ev["path"], ev.get("new_path")
    classes = {_FILE_VERBS[w] for w in low if w in _FILE_VERBS}
    if len(classes) > 1:
        classes.discard("write")
    verb = min(classes) if len(classes) == 1 else None
    details = {"claimed_action": verb, "path": path, "new_path": new}
    if len(classes) > 1:
        return ["conflicting_verbs"], details
    codes, claimed = [], []
    for t in toks:
        c = t[2:] if t.startswith("./") else t
        if _pathish(c) or _suffix_of(c, path) or (new and _suffix_of(c, new)):
            claimed.append(c)
    bad = [c for c in claimed if not (_suffix_of(c, path) or (new and _suffix_of(c, new)))]
    if verb == "rename" and not new and len(bad) == 1 < len(claimed):
        bad = []  # the one unmatched path is the destination, which the evidence does not give
    if claimed:
        codes.append("path_mismatch" if bad else "path_matches")
    if verb == "rename" and not new:
        codes.append("new_path_missing")
    elif verb:
        want_before, want_after = _FILE_STATES[verb]
        if ev["exists_after"] != want_after:
            codes.append("end_state_mismatch")
        elif want_before is not None and ev["exists_before"] != want_before:
            codes.append("start_state_mismatch")
        else:
            codes.append("existence_matches")
    lines, sizes = _quantities(toks)
    if lines and ev.get("line_count") is not None:
        actual, off = ev["line_count"], abs(lines[0] - ev["line_count"])
        codes.append("line_count_matches" if off == 0 else "line_count_mismatch" if off > 50 or off > 0.1 * actual
                     else "line_count_off")
    if sizes and ev.get("size_bytes") is not None:
        actual = ev["size_bytes"]
        rel = abs(sizes[0] - actual) / actual if actual else (0 if sizes[0] == 0 else 1)
        codes.append("size_matches" if rel <= 0.01 else "size_mismatch" if rel > 0.5 else "size_off")
    details.update(claimed_paths=claimed[:50], claimed_lines=lines[:1], claimed_bytes=sizes[:1])
    return codes, details


def _intent(low):
    """'success', 'failure' or None from the claim's words; 'was not sent' is a failure."""
    ok = fail = False
    for i, w in enumerate(low):
        if w in _OK_WORDS:
            if _NEGATION & set(low[max(0, i - 2):i]):
                fail = True
            else:
                ok = True
        elif w in _FAIL_WORDS:
            fail = True
    return "success" if ok and not fail else "failure" if fail and not ok else None


def _body_outcome(body):
    """'success', 'failure' or None, judged structurally for JSON and by whole words for other text."""
    if isinstance(body, str):
        try:
            body = strict_loads(body.encode("utf-8"))
        except (ValueError, UnicodeError):
            words = set(_ALPHA.findall(body.lower()))
            ok, fail = bool(words & _STATUS_OK), bool(words & _STATUS_FAIL)
            return "success" if ok and not fail else "failure" if fail and not ok else None
    if not isinstance(body, dict):
        return None
    votes = set()
    for key in ("ok", "success"):
        if isinstance(body.get(key), bool):
            votes.add("success" if body[key] else "failure")
    status = body.get("status")
    if isinstance(status, str):
        s = status.strip().lower()
        votes.add("success" if s in _STATUS_OK else "failure" if s in _STATUS_FAIL else "")
    if body.get("error") not in (None, False):
        votes.add("failure")
    if isinstance(body.get("errors"), (list, dict)) and body["errors"]:
        votes.add("failure")
    votes.discard("")
    return votes.pop() if len(votes) == 1 else None


def _targets(toks, low):
    emails = {e for e in map(_email, toks) if e}
    urls = {u for u in map(_url, toks) if u}
    return emails, urls, _claim_ids(low)


def judge_api_call(claim, ev):
    """Rules for {request, response_status, response_body}: intent vs status class and body; targets vs request."""
    toks = _tokens(claim)
    low = [t.lower() for t in toks]
    intent, status = _intent(low), ev["response_status"]
    body = _body_outcome(ev.get("response_body"))
    details = {"claimed_outcome": intent, "status_class": "%dxx" % (status // 100), "body_outcome": body}
    codes = []
    if intent and status >= 400:
        codes.append("status_matches_claim" if intent == "failure" else "status_failure")
    elif intent and 200 <= status < 300:
        codes.append("status_matches_claim" if intent == "success" else "status_contradicts_failure_claim")
    if intent and body:
        codes.append("body_matches_claim" if body == intent else "body_failure" if body == "failure"
                     else "body_contradicts_failure_claim")
    req = ev.get("request")
    rtext = req if isinstance(req, str) else json.dumps(req, ensure_ascii=False) if req is not None else ""
    rtoks = _tokens(rtext)
    r_emails, r_urls, r_ids = _targets(rtoks, [t.lower() for t in rtoks])
    r_ids |= {seg for _, p in r_urls for seg in p.split("/") if _digits(seg) and len(seg) <= 18}
    c_emails, c_urls, c_ids = _targets(toks, low)
    results = []
    for claimed, have, same in ((c_emails, r_emails, None), (c_ids, r_ids, None), (c_urls, r_urls, "url")):
        for c in claimed:
            if same:
                hit = any(h == c[0] and (not c[1] or p == c[1]) for h, p in have)
            else:
                hit = c in have
            results.append("target_matches" if hit else "target_mismatch" if have else "target_not_in_request")
    for code in ("target_mismatch", "target_not_in_request", "target_matches"):
        if code in results:
            codes.append(code)
            break
    return codes, details


def _json_values(text, key):
    """Scalar values (as JSON text) of every member named key in JSON text from json.dumps."""
    out, needle, i = [], _encode_str(key) + ": ", 0
    while len(out) < 100:
        i = text.find(needle, i)
        if i < 0:
            break
        i += len(needle)
        if text[i - len(needle) - 1:i - len(needle)] == "\\":
            continue
        if text[i:i + 1] == '"':
            j = i + 1
            while True:
                j = text.find('"', j)
                if j < 0 or text[j - 1] != "\\":
                    break
                j += 1
            if j > 0:
                out.append(text[i + 1:j])
        elif text[i:i + 1] not in ("{", "["):
            j = i
            while j < len(text) and text[j] not in ",}]":
                j += 1
            out.append(text[i:j])
    return out


def judge_generic(claim, ev):
    """Conservative rules for any evidence: distinct entity matches, and explicit KEY is/was/=/: VALUE conflicts."""
    text = json.dumps(ev, ensure_ascii=False).lower()  # ": " keeps values apart from their keys
    have = set(_TOKEN.findall(text))
    raw = _TOKEN.findall(claim)
    toks = [t.rstrip(".,:!?*").lstrip(",*:!?") for t in raw]
    ents = set()
    for t in toks:
        n = _number(t)
        if n is not None:
            ents.add(_es_number(n))
        elif t and t.lower() not in ("true", "false", "null") and (
                _email(t) or _url(t) or _pathish(t) or _identifier(t, False)):
            ents.add(t.lower())
    matched = sorted(e for e in ents if any(e + s in have for s in ("", ".", ",", ":", "/", "!", "?")))
    codes = ["entities_match"] * len(matched) if len(matched) >= 3 else []
    fillers = {"not", "no", "now", "still", "also", "the", "a", "an", "being", "set", "already", "very", "currently"}
    for i, t in enumerate(raw[:-1]):
        key, val = None, None
        if t.endswith(":") and len(t) > 1:
            key, val = t[:-1], toks[i + 1]
        elif i + 2 < len(raw) and raw[i + 1].lower() in ("is", "was", "=", "are", "were"):
            key, val = toks[i], toks[i + 2]
        elif "=" in t.strip("="):
            key, _, val = t.partition("=")
            val = val.rstrip(".,:!?*")
        if not key or not val or val.lower() in fillers or not key.replace("_", "a").replace("-", "a").isalnum():
            continue
        found = _json_values(text, key.lower()[:64])
        val = val.lower()
        num = _number(val)
        comparable = [v for v in found if (_number(v) is not None) == (num is not None)]
        if comparable:
            same = any(v == val or (num is not None and _es_number(_number(v)) == _es_number(num)) for v in comparable)
            codes.append("explicit_value_match" if same else "explicit_value_conflict")
    return codes, {"entities_matched": len(matched)}


def _count_ok(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= BOUNDS["count_max"]


def check_evidence(kind, ev):
    """A reason code when evidence cannot be judged as this kind (missing, wrong type, too large), else None."""
    if kind == "code_diff":
        d = ev.get("diff")
        return ("evidence_missing_fields" if d is None else "evidence_invalid" if not isinstance(d, str)
                else "evidence_too_large" if len(d) > BOUNDS["diff_chars"] else None)
    if kind == "db_op":
        for k in ("before_count", "after_count", "affected_rows"):
            if ev.get(k) is not None and not _count_ok(ev[k]):
                return "evidence_invalid"
        op = ev.get("operation")
        if op is not None and not isinstance(op, str):
            return "evidence_invalid"
        if op is not None and len(op) > BOUNDS["operation_chars"]:
            return "evidence_too_large"
        has_counts = ev.get("before_count") is not None and ev.get("after_count") is not None
        return None if has_counts or ev.get("affected_rows") is not None or op is not None else "evidence_missing_fields"
    if kind == "file_op":
        for k in ("path", "new_path"):
            v = ev.get(k)
            if v is not None and (not isinstance(v, str) or not v):
                return "evidence_invalid"
            if v is not None and len(v) > BOUNDS["path_chars"]:
                return "evidence_too_large"
        for k in ("exists_before", "exists_after"):
            if ev.get(k) is not None and not isinstance(ev[k], bool):
                return "evidence_invalid"
        for k in ("line_count", "size_bytes"):
            if ev.get(k) is not None and not _count_ok(ev[k]):
                return "evidence_invalid"
        return None if all(ev.get(k) is not None for k in ("path", "exists_before", "exists_after")) \
            else "evidence_missing_fields"
    if kind == "api_call":
        s, req = ev.get("response_status"), ev.get("request")
        if s is not None and not (isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599):
            return "evidence_invalid"
        if req is not None and not isinstance(req, (str, dict)):
            return "evidence_invalid"
        if isinstance(req, str) and len(req) > BOUNDS["request_chars"]:
            return "evidence_too_large"
        return None if s is not None else "evidence_missing_fields"
    return None


_JUDGES = {"code_diff": judge_code_diff, "db_op": judge_db_op, "file_op": judge_file_op,
           "api_call": judge_api_call, "generic": judge_generic}


def dispatch_kind(evidence, kind=None):
    """The kind to judge: the requested one (case-insensitive), else by evidence shape in a fixed order."""
    if kind:
        return kind.lower()
    if "diff" in evidence:
        return "code_diff"
    for k, fields in (("db_op", ("before_count", "after_count", "affected_rows")),
                      ("file_op", ("exists_before", "exists_after", "line_count", "size_bytes")),
                      ("api_call", ("request", "response_status", "response_body"))):
        if any(f in evidence for f in fields):
            return k
    return "generic"


def judge(kind, claim, evidence):
    """Run one kind's rules; return (reason codes, details). Never raises: a rule failure is unsafe_to_verify."""
    try:
        bad = check_evidence(kind, evidence)
        codes, details = ([bad], {}) if bad else _JUDGES[kind](claim, evidence)
    except Exception:  # a rule bug still gets a signed answer, never a dropped connection
        codes, details = ["verifier_error"], {}
    return codes or ["no_signal"], details


# ---------------------------------------------------------------------------------------------------
# §4 Receipts (pure given a key ring)
# ---------------------------------------------------------------------------------------------------
RECEIPT_FIELDS = collections.OrderedDict([
    ("schema", "Always \"verify_action_receipt.v0\"."),
    ("claim_hash", "\"sha256:\" + hex SHA-256 of the claim's UTF-8 bytes."),
    ("evidence_manifest_hash", "\"sha256:\" + hex SHA-256 of the RFC 8785 canonical JSON of evidence."),
    ("request_hash", "\"sha256:\" + hex SHA-256 of the canonical JSON of the whole request object as received "
                     "(for MCP, the tools/call arguments), binding kind, context and caller_context."),
    ("verifier_id", "\"verify_action.py@<version>\"."),
    ("verifier_method", "\"rule_based.<kind>\"."),
    ("verdict", "The aar_verdict."),
    ("confidence", "Confidence in the verdict, 0..1, 3 decimals."),
    ("reason_codes", "Codes from GET /rules; never raw input."),
    ("policy_or_oracle_refs", "List of strings; [] (no kind consults an oracle)."),
    ("caller_context", "As received and validated; {} when absent."),
    ("issued_at", "RFC 3339 UTC time, Z suffix."),
    ("issued_by", "Set by the operator (--issuer); default verify_action.py."),
    ("kid", "Key id of the signing key in the operator's key ring."),
    ("signature", "\"hmac-sha256:\" + unpadded base64url HMAC-SHA256 (key = the kid's key bytes) over the "
                  "canonical JSON of the receipt without signature."),
])


class KeyRing(object):
    """HMAC keys by kid; the last key signs new receipts, every key verifies."""

    def __init__(self, pairs, ephemeral=False):
        if not pairs:
            raise ValueError("the key ring has no keys")
        self.keys = collections.OrderedDict(pairs)
        self.kid = pairs[-1][0]
        self.ephemeral = ephemeral

    @classmethod
    def parse(cls, text):
        """Parse 'kid key' lines (key: >= 32 bytes, base64url); '#' starts a comment. Raises ValueError."""
        pairs, seen = [], set()
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or not (0 < len(parts[0]) <= 64 and parts[0].replace("-", "a").replace(
                    "_", "a").replace(".", "a").isalnum() and parts[0].isascii()):
                raise ValueError("line %d: expected 'kid key'" % n)
            try:
                key = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
            except (ValueError, TypeError):
                raise ValueError("line %d: the key is not base64url" % n)
            if len(key) < 32:
                raise ValueError("line %d: the key is shorter than 32 bytes" % n)
            if parts[0] in seen:
                raise ValueError("line %d: duplicate kid" % n)
            seen.add(parts[0])
            pairs.append((parts[0], key))
        return cls(pairs)

    @classmethod
    def generate(cls):
        """A one-process key ring; its receipts cannot be verified after a restart."""
        return cls([("ephemeral-" + secrets.token_hex(4), secrets.token_bytes(32))], ephemeral=True)

    def mac(self, kid, body):
        return "hmac-sha256:" + b64url(hmac.new(self.keys[kid], canonical_json(body), hashlib.sha256).digest())


def issue_receipt(request, kind, verdict, confidence, codes, keyring, issuer, now):
    """A signed receipt for one judged request (request: the object as received, already validated)."""
    body = {
        "schema": SCHEMA,
        "claim_hash": sha256_tag(request["claim"].encode("utf-8")),
        "evidence_manifest_hash": sha256_tag(canonical_json(request["evidence"])),
        "request_hash": sha256_tag(canonical_json(request)),
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
    body["signature"] = keyring.mac(keyring.kid, body)
    return body


def verify_receipt(receipt, keyring):
    """Check a receipt: returns (valid, reason, kid) with reason one of ok, malformed, unsupported_schema,
    unknown_kid, bad_signature. The signature is compared in constant time."""
    if not isinstance(receipt, dict) or set(receipt) != set(RECEIPT_FIELDS):
        return False, "malformed", None
    kid, sig = receipt["kid"], receipt["signature"]
    if not isinstance(kid, str) or not isinstance(sig, str) or not sig.startswith("hmac-sha256:"):
        return False, "malformed", None
    if receipt["schema"] != SCHEMA:
        return False, "unsupported_schema", kid
    if kid not in keyring.keys:
        return False, "unknown_kid", kid
    body = {k: v for k, v in receipt.items() if k != "signature"}
    try:
        expected = keyring.mac(kid, body)
    except (TypeError, ValueError):
        return False, "malformed", kid
    if not hmac.compare_digest(expected.encode("utf-8"), sig.encode("utf-8", "replace")):
        return False, "bad_signature", kid
    return True, "ok", kid


# ---------------------------------------------------------------------------------------------------
# §5 Key-ring and token files (I/O)
# ---------------------------------------------------------------------------------------------------
def read_private_file(path, limit=65536):
    """Text of a regular file that group and others cannot access; refuses anything else (ValueError)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("%s is not a regular file" % path)
        if st.st_mode & 0o077:
            raise ValueError("%s is accessible by group or others (mode %03o); run chmod 600 on it"
                             % (path, st.st_mode & 0o777))
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError("%s is larger than %d bytes" % (path, limit))
    return data.decode("utf-8")


def load_keyring(path):
    """Load a key-ring file (see KeyRing.parse), refusing a file group or others can read."""
    return KeyRing.parse(read_private_file(path))


def keygen(path):
    """Create the key-ring file (O_CREAT|O_EXCL, mode 0600 from the start) or append a new key; returns the kid."""
    kid = "k" + time.strftime("%Y%m%d", time.gmtime()) + "-" + secrets.token_hex(3)
    line = "%s %s\n" % (kid, b64url(secrets.token_bytes(32)))
    flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        text = "# verify_action.py key ring: 'kid key' per line; the last key signs, every key verifies.\n" + line
    except FileExistsError:
        old = read_private_file(path)
        KeyRing.parse(old)  # never append to a file that does not load
        fd = os.open(path, flags | os.O_APPEND)
        text = ("" if old.endswith("\n") or not old else "\n") + line
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    return kid


# ---------------------------------------------------------------------------------------------------
# §6 Request validation and strict JSON
# ---------------------------------------------------------------------------------------------------
class RequestError(ValueError):
    """A refused request: code (stable snake_case) and message (never containing input)."""

    def __init__(self, code, message):
        ValueError.__init__(self, message)
        self.code, self.message = code, message


_LONG_DIGITS = re.compile(r"[0-9]{300}")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_PAIR = re.compile(r"\[\]|\{\}")


def _no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        raise RequestError("invalid_json", "duplicate object key")
    return d


def _no_constant(name):
    raise RequestError("invalid_json", "NaN and Infinity are not JSON")


def _double_int(s):
    v = int(s)
    if abs(v) > 1.7976931348623157e308:
        raise RequestError("invalid_json", "a number does not fit a double")
    return v


def strict_loads(raw):
    """Parse UTF-8 JSON strictly: no NaN/Infinity, duplicate keys, lone surrogates, numbers beyond a double,
    or nesting deeper than 32 (the outermost value counts 1). Raises RequestError('invalid_json', ...)."""
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                           parse_int=_double_int if _LONG_DIGITS.search(text) else None)
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")  # 1e400 -> inf; lone surrogates
    except RequestError:
        raise
    except UnicodeError:
        raise RequestError("invalid_json", "not UTF-8, or a string holds a lone surrogate")
    except RecursionError:
        raise RequestError("invalid_json", "nesting deeper than %d" % MAX_DEPTH)
    except ValueError as e:
        reason = "a number does not fit a double" if "Out of range" in str(e) else getattr(e, "msg", "invalid JSON")
        raise RequestError("invalid_json", "%s (at character %s)" % (reason, getattr(e, "pos", "?")))
    if text.count("[") + text.count("{") > MAX_DEPTH:
        brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
        for _ in range(MAX_DEPTH):  # each round removes the innermost level
            brackets = _BRACKET_PAIR.sub("", brackets)
        if brackets:
            raise RequestError("invalid_json", "nesting deeper than %d" % MAX_DEPTH)
    return value


def validate_request(obj):
    """Check a /verify body (or MCP arguments) field by field; raises RequestError, never truncates."""
    if not isinstance(obj, dict):
        raise RequestError("invalid_request", "the request must be a JSON object")
    if set(obj) - set(REQUEST_FIELDS):
        raise RequestError("unknown_field", "unknown top-level field; allowed: " + ", ".join(REQUEST_FIELDS))
    claim = obj.get("claim")
    if not isinstance(claim, str) or not claim.strip():
        raise RequestError("invalid_claim", "claim must be a non-empty string")
    if len(claim) > MAX_CLAIM:
        raise RequestError("claim_too_long", "claim is longer than %d characters" % MAX_CLAIM)
    if not isinstance(obj.get("evidence"), dict):
        raise RequestError("invalid_evidence", "evidence must be a JSON object")
    kind = obj.get("kind")
    if kind is not None and (not isinstance(kind, str) or kind.lower() not in KINDS):
        raise RequestError("unknown_kind", "kind must be one of " + ", ".join(KINDS))
    ctx = obj.get("context")
    if ctx is not None and not isinstance(ctx, str):
        raise RequestError("invalid_context", "context must be a string")
    if ctx is not None and len(ctx) > MAX_CONTEXT:
        raise RequestError("context_too_long", "context is longer than %d characters" % MAX_CONTEXT)
    cc = obj.get("caller_context")
    if cc is not None:
        if not isinstance(cc, dict) or len(cc) > MAX_CALLER_KEYS:
            raise RequestError("invalid_caller_context", "caller_context must be an object of at most 8 keys")
        for k, v in cc.items():
            if not 0 < len(k) <= MAX_CALLER_STR or not (v is None or isinstance(v, (bool, int, float)) or (
                    isinstance(v, str) and len(v) <= MAX_CALLER_STR)):
                raise RequestError("invalid_caller_context", "caller_context keys and string values are 1-64 "
                                   "characters; values are strings, numbers, booleans or null")
    return obj


# ---------------------------------------------------------------------------------------------------
# §7 The service: /verify, receipts and MCP handlers, shared by HTTP and stdio
# ---------------------------------------------------------------------------------------------------
_EVIDENCE_DOC = ("code_diff {diff}; db_op {before_count, after_count, operation, affected_rows}; file_op {path, "
                 "exists_before, exists_after, line_count?, size_bytes?, new_path?}; api_call {request, "
                 "response_status, response_body}; generic: any object.")
TOOL = {
    "name": "verify_action",
    "title": "Verify an agent's claimed action",
    "description": ("Check whether a claim about an action (code change, database operation, file operation, API "
                    "call, or anything else) is consistent with the evidence supplied, using deterministic rules. "
                    "Returns a verdict (verified, contradicted, insufficient_evidence, unsafe_to_verify), reason "
                    "codes and a signed receipt. It fetches nothing: it judges only the evidence given, so a "
                    "receipt never proves the claim true."),
    "inputSchema": {"type": "object", "additionalProperties": False, "required": ["claim", "evidence"], "properties": {
        "claim": {"type": "string", "minLength": 1, "maxLength": MAX_CLAIM, "description": "What the agent says it did."},
        "evidence": {"type": "object", "description": _EVIDENCE_DOC},
        "kind": {"type": "string", "enum": list(KINDS), "description": "Optional; else chosen by evidence shape."},
        "context": {"type": "string", "maxLength": MAX_CONTEXT, "description": "Optional free text, bound into the receipt."},
        "caller_context": {"type": "object", "description": "Optional: at most 8 scalar values, keys and strings <= 64 characters."}}},
    "outputSchema": {"type": "object", "required": ["aar_verdict", "verdict", "confidence", "reason_codes", "reasoning",
                                                    "kind_dispatched", "verifier_used", "details", "receipt"],
                     "properties": {
                         "aar_verdict": {"type": "string", "enum": list(VERDICTS)},
                         "verdict": {"type": "string", "enum": list(LEGACY.values())},
                         "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                         "reason_codes": {"type": "array", "items": {"type": "string"}},
                         "reasoning": {"type": "string"}, "kind_dispatched": {"type": "string", "enum": list(KINDS)},
                         "verifier_used": {"type": "string"}, "details": {"type": "object"},
                         "receipt": {"type": "object"}}},
    "annotations": {"title": "Verify an agent's claimed action", "readOnlyHint": True, "idempotentHint": False,
                    "openWorldHint": False},
}
RULES_DOC = {
    "code_diff": "Parses unified diffs (git, diff -u with or without a/ b/ and timestamps, --no-prefix, /dev/null, "
                 "renames, binary files). Claimed paths match a diff path when equal or a whole-component suffix. "
                 "Identifiers (backticked, dotted, snake_case, camelCase; paths removed first) must be in changed "
                 "lines. Without identifiers, content words (>= 4 letters, not verbs or stopwords; -s -es -ed -ing "
                 "allowed) absent from changed lines are a negative. Verbs: add/check need added lines in the named "
                 "files, modify any changed line, remove removed lines; 'deleted file X' needs X deleted. When the "
                 "claim names files, other changed files are a negative, critical above half of changed lines.",
    "db_op": "Claim verb class (delete, insert, update, read) vs SQL kind (SELECT, INSERT, UPDATE, DELETE, WITH..., "
             "TRUNCATE = delete; MERGE/REPLACE/UPSERT/ON CONFLICT give no direction) vs sign of after-before vs "
             "affected_rows. A number right after the verb is a count, compared with affected_rows and |delta|. "
             "id=N, id N, #N and noun N are identifiers, compared with WHERE id comparisons; literals never are.",
    "file_op": "Verb class vs existence transition (for rename/move exists_after describes new_path). Claimed "
               "paths must equal path/new_path or be a whole-component suffix. Lines: equal +, off > 10% or > 50 "
               "critical, else negative. Sizes (KB/MB powers of 1000, KiB/MiB of 1024): within 1% +, > 50% "
               "critical, else negative.",
    "api_call": "Claimed success (sent, delivered, posted, created, succeeded, ok, success, accepted) or failure "
                "vs status class; response_body judged structurally (ok/success booleans, status words, non-null "
                "error, non-empty errors), whole words only for non-JSON text. Emails, URLs (host and path) and "
                "IDs in the claim must be in the request; a different one is critical.",
    "generic": "Entities (numbers, URLs, emails, code identifiers) support verified only with >= 3 distinct "
               "matches; missing words are never negative; contradicted only for KEY is/was/=/: VALUE against a "
               "different scalar value of that key.",
}
DISPATCH = ["kind field, case-insensitive", "diff -> code_diff", "before_count/after_count/affected_rows -> db_op "
            "(operation alone never)", "exists_before/exists_after/line_count/size_bytes -> file_op",
            "request/response_status/response_body -> api_call", "otherwise generic"]


def rules_document():
    """The GET /rules document: decision rule, dispatch order, rules per kind, bounds, every reason code."""
    return {"decision": DECISION, "confidence": CONFIDENCE, "dispatch_order": DISPATCH, "kinds": RULES_DOC,
            "bounds": BOUNDS, "reason_codes": {c: {"kind": k, "signal": _SIGNAL_NAMES[s], "meaning": m}
                                               for c, (k, s, m) in sorted(REASONS.items())}}


def spec_document():
    """The GET /spec document: tool schema, kinds, verdicts, receipt fields, canonicalisation, version."""
    return {"name": "verify_action.py", "version": VERSION, "proves": PROVES, "does_not_prove": NOT_PROVES,
            "tool": TOOL, "kinds": list(KINDS), "evidence": _EVIDENCE_DOC,
            "verdicts": {"aar_verdict": list(VERDICTS), "legacy_verdict": LEGACY},
            "receipt": {"schema": SCHEMA, "fields": RECEIPT_FIELDS, "canonicalization": (
                "RFC 8785 JSON Canonicalization Scheme: object keys sorted by UTF-16 code units, no whitespace, "
                "numbers in ECMAScript form, strings minimally escaped, UTF-8."),
                "verify": "POST /receipts/verify {\"receipt\": {...}} or verify_action.py verify-receipt FILE"},
            "limits": {"claim_chars": MAX_CLAIM, "context_chars": MAX_CONTEXT, "json_depth": MAX_DEPTH,
                       "caller_context_keys": MAX_CALLER_KEYS, "caller_context_chars": MAX_CALLER_STR},
            "endpoints": ["GET /", "GET /healthcheck", "GET /spec", "GET /rules", "GET /stats", "POST /verify",
                          "POST /receipts/verify", "POST /mcp"],
            "mcp": {"protocol_versions": list(PROTOCOL_VERSIONS), "transports": ["POST /mcp (JSON responses)", "--stdio"]}}


class RpcError(Exception):
    """A JSON-RPC error answer: code and message."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code, self.message = code, message


def _rpc_error(msg_id, code, message):
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


class Service(object):
    """What HTTP and stdio share: the key ring, the issuer, counters and every handler."""

    def __init__(self, keyring, issuer="verify_action.py", clock=time.time):
        self.keyring, self.issuer, self.clock = keyring, issuer, clock
        self.started = clock()
        self._lock = threading.Lock()
        self.counts = {"verifications": 0, "by_kind": dict.fromkeys(KINDS, 0),
                       "by_verdict": dict.fromkeys(VERDICTS, 0), "receipt_checks": 0, "mcp_messages": 0,
                       "errors_by_status": {}}

    def count(self, key, sub=None):
        with self._lock:
            if sub is None:
                self.counts[key] += 1
            else:
                self.counts[key][sub] = self.counts[key].get(sub, 0) + 1

    def stats(self):
        with self._lock:
            return dict(json.loads(json.dumps(self.counts)), uptime_s=round(self.clock() - self.started, 3),
                        version=VERSION)

    def verify(self, request):
        """Judge a validated request and sign the result: the /verify response object."""
        kind = dispatch_kind(request["evidence"], request.get("kind"))
        codes, details = judge(kind, request["claim"], request["evidence"])
        verdict, confidence = decide(codes)
        unique = list(dict.fromkeys(codes))
        receipt = issue_receipt(request, kind, verdict, confidence, unique, self.keyring, self.issuer, self.clock())
        with self._lock:
            self.counts["verifications"] += 1
            self.counts["by_kind"][kind] += 1
            self.counts["by_verdict"][verdict] += 1
        reasoning = "%s (%s): %s" % (verdict, kind, " ".join(REASONS[c][2] for c in unique))
        return {"aar_verdict": verdict, "verdict": LEGACY[verdict], "confidence": confidence, "reason_codes": unique,
                "reasoning": reasoning, "kind_dispatched": kind, "verifier_used": kind + "_v1", "details": details,
                "receipt": receipt}

    def post(self, path, raw, headers):
        """Handle a POST body; returns (status, JSON-able object or None for an empty 202)."""
        if path == "/mcp":
            version = headers.get("mcp-protocol-version")
            if version is not None and version not in PROTOCOL_VERSIONS:
                return 400, {"error": "unsupported_protocol_version",
                             "message": "MCP-Protocol-Version must be one of " + ", ".join(PROTOCOL_VERSIONS)}
            try:
                msg = strict_loads(raw)
            except RequestError as e:
                return 200, _rpc_error(None, -32700, "Parse error: " + e.message)
            reply = self.mcp(msg, None)
            return (202, None) if reply is None else (200, reply)
        try:
            obj = strict_loads(raw)
            if path == "/verify":
                return 200, self.verify(validate_request(obj))
            if not isinstance(obj, dict) or set(obj) != {"receipt"} or not isinstance(obj["receipt"], dict):
                raise RequestError("invalid_request", "the body must be {\"receipt\": {...}}")
        except RequestError as e:
            return 400, {"error": e.code, "message": e.message}
        self.count("receipt_checks")
        valid, reason, kid = verify_receipt(obj["receipt"], self.keyring)
        return 200, {"valid": valid, "reason": reason, "kid": kid}

    def mcp(self, msg, session):
        """Answer one JSON-RPC message; None for notifications and responses. session is None over HTTP
        (stateless) or a dict for stdio (initialize first; batches only under 2025-03-26)."""
        if isinstance(msg, list):
            if session is None or session.get("version") != "2025-03-26" or not msg:
                return _rpc_error(None, -32600, "Invalid Request: batches are not supported")
            replies = [r for r in (self.mcp(m, session) for m in msg) if r is not None]
            return replies or None
        self.count("mcp_messages")
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return _rpc_error(None, -32600, "Invalid Request")
        if "method" not in msg:
            return None  # a response from the client: a tools-only server sends no requests
        msg_id, method, params = msg.get("id"), msg.get("method"), msg.get("params", {})
        if "id" in msg and (isinstance(msg_id, bool) or not isinstance(msg_id, (str, int))):
            return _rpc_error(None, -32600, "Invalid Request: id must be a string or an integer")
        if not isinstance(method, str):
            return _rpc_error(msg_id if "id" in msg else None, -32600, "Invalid Request: method must be a string")
        if "id" not in msg:
            return None  # notifications are never answered
        try:
            return {"jsonrpc": "2.0", "id": msg_id, "result": self._method(method, params, session)}
        except RpcError as e:
            return _rpc_error(msg_id, e.code, e.message)
        except Exception:
            return _rpc_error(msg_id, -32603, "Internal error")

    def _method(self, method, params, session):
        if not isinstance(params, dict):
            raise RpcError(-32602, "Invalid params: params must be an object")
        if method == "ping":
            return {}
        if method == "initialize":
            asked = params.get("protocolVersion")
            if not isinstance(asked, str):
                raise RpcError(-32602, "Invalid params: protocolVersion must be a string")
            if session is not None and session.get("version"):
                raise RpcError(-32600, "Invalid Request: already initialized")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            if session is not None:
                session["version"] = version
            return {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "verify_action", "title": "verify_action.py", "version": VERSION},
                    "instructions": "Call verify_action with a claim and its evidence before acting on the claim. "
                                    "A receipt proves what was judged, never that the claim is true."}
        if method not in ("tools/list", "tools/call"):
            raise RpcError(-32601, "Method not found")
        if session is not None and not session.get("version"):
            raise RpcError(-32600, "Invalid Request: not initialized")
        if method == "tools/list":
            return {"tools": [TOOL]}
        name, args = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise RpcError(-32602, "Invalid params: name must be a string and arguments an object")
        if name != TOOL["name"]:
            raise RpcError(-32602, "Unknown tool")
        try:
            result = self.verify(validate_request(args))
        except RequestError as e:
            return {"content": [{"type": "text", "text": "invalid arguments: %s: %s" % (e.code, e.message)}],
                    "isError": True}
        text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
        return {"content": [{"type": "text", "text": text}], "structuredContent": result, "isError": False}


def serve_stdio(service, inp, out, max_line=4 << 20):
    """MCP over stdio: newline-delimited JSON-RPC on binary streams, until EOF on inp."""
    session = {}
    while True:
        line = inp.readline(max_line + 1)
        if not line:
            return
        if len(line) > max_line and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = inp.readline(max_line)
            reply = _rpc_error(None, -32700, "Parse error: message too large")
        else:
            line = line.strip()
            if not line:
                continue
            try:
                reply = service.mcp(strict_loads(line), session)
            except RequestError as e:
                reply = _rpc_error(None, -32700, "Parse error: " + e.message)
        if reply is not None:
            try:
                out.write(json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n")
                out.flush()
            except (BrokenPipeError, ValueError):
                return


# ---------------------------------------------------------------------------------------------------
# §8 HTTP server: selector for idle connections, a fixed worker pool, deadlines, routes, the page
# ---------------------------------------------------------------------------------------------------
_PHRASES = {200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
ROUTES = {"/": "GET", "/healthcheck": "GET", "/spec": "GET", "/rules": "GET", "/stats": "GET",
          "/verify": "POST", "/receipts/verify": "POST", "/mcp": "POST"}
_ALLOW = {"GET": "GET, HEAD, OPTIONS", "POST": "POST, OPTIONS", "*": "GET, HEAD, POST, OPTIONS"}
MAX_HEAD = 16384
GRACE = 0.05  # how long a worker waits for the next request on a connection before parking it
_SCRIPT = """document.getElementById("f").onsubmit=async function(e){e.preventDefault();
var g=function(i){return document.getElementById(i)},o=g("out"),b,h={"Content-Type":"application/json"};
try{b={claim:g("claim").value,evidence:JSON.parse(g("evidence").value)}}catch(x){o.textContent="evidence is not JSON";return}
if(g("kind").value)b.kind=g("kind").value;if(g("tok").value)h.Authorization="Bearer "+g("tok").value;
var r=await fetch("/verify",{method:"POST",headers:h,body:JSON.stringify(b)});
o.textContent="HTTP "+r.status+"\\n"+JSON.stringify(await r.json(),null,2)};"""
_STYLE = ("body{font:15px/1.5 system-ui,sans-serif;max-width:62rem;margin:2rem auto;padding:0 1rem}"
          "textarea,input,select{width:100%;font:13px monospace;box-sizing:border-box}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:.2rem .4rem;text-align:left;vertical-align:top}"
          "pre{background:#f4f4f4;padding:.6rem;overflow:auto}")
_EXAMPLE_DIFF = ("diff --git a/src/user.py b/src/user.py\n--- a/src/user.py\n+++ b/src/user.py\n@@ -10,2 +10,4 @@\n"
                 " def save(user):\n+    if user.email is None:\n+        raise ValueError(\"email required\")\n"
                 "     db.write(user)\n")


def _csp_hash(text):
    return "'sha256-%s'" % base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


CSP = ("default-src 'none'; script-src %s; style-src %s; connect-src 'self'; form-action 'none'; "
       "base-uri 'none'; frame-ancestors 'none'" % (_csp_hash(_SCRIPT), _csp_hash(_STYLE)))


def render_page():
    """The HTML page at GET /: what a receipt proves and does not prove, the rules table, a form."""
    e = html.escape
    rows = "".join("<tr><td><code>%s</code></td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
        e(c), e(k), _SIGNAL_NAMES[s], e(m)) for c, (k, s, m) in sorted(REASONS.items(), key=lambda i: (i[1][0], i[0])))
    kinds = "".join("<tr><td><code>%s</code></td><td>%s</td></tr>" % (k, e(RULES_DOC[k])) for k in KINDS)
    evidence = json.dumps({"diff": _EXAMPLE_DIFF}, indent=1)
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width'>"
            "<title>verify_action.py</title><style>%s</style></head><body><h1>verify_action.py %s</h1>"
            "<p>Checks whether an AI agent's <b>claim</b> about an action is consistent with the <b>evidence</b> it "
            "supplies, with deterministic rules (no model), and signs a <b>receipt</b> of what it judged.</p>"
            "<h2>What a receipt proves</h2><p>%s</p><h2>What it does not prove</h2><p>%s</p>"
            "<h2>Try it</h2><form id=f><p><label>kind <select id=kind><option value=''>(from the evidence shape)"
            "</option>%s</select></label></p><p><label>claim<textarea id=claim rows=2>Added a check that "
            "`user.email` is set in src/user.py</textarea></label></p><p><label>evidence (a JSON object)"
            "<textarea id=evidence rows=8>%s</textarea></label></p><p><label>bearer token (only if the service "
            "requires one)<input id=tok type=password autocomplete=off></label></p><p><button>Verify</button></p>"
            "</form><pre id=out></pre><h2>Verdicts</h2><p>%s %s</p><h2>Rules</h2><table>%s</table>"
            "<h2>Reason codes</h2><table><tr><th>code</th><th>kind</th><th>signal</th><th>meaning</th></tr>%s"
            "</table><p>Machine-readable: <a href=/rules>/rules</a>, <a href=/spec>/spec</a>.</p>"
            "<script>%s</script></body></html>") % (
        _STYLE, VERSION, e(PROVES), e(NOT_PROVES), "".join("<option>%s</option>" % k for k in KINDS), e(evidence),
        e(DECISION), e(CONFIDENCE), kinds, rows, _SCRIPT)


class HttpError(Exception):
    """An error answered with a JSON body {"error": code, "message": text}."""

    def __init__(self, status, code, message, headers=()):
        Exception.__init__(self, message)
        self.status, self.code, self.message, self.headers = status, code, message, list(headers)


class _Gone(Exception):
    """The peer closed or reset the connection: nothing more can be said."""


class _Conn(object):
    __slots__ = ("sock", "buf", "since")

    def __init__(self, sock):
        self.sock, self.buf, self.since = sock, bytearray(), time.monotonic()


def _json_bytes(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _is_loopback(host):
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Server(object):
    """HTTP/1.1 with keep-alive. One selector thread accepts and parks idle connections; a fixed pool of
    workers serves ready ones, so threads never grow with clients. A connection that waits longer than
    queue_wait for a worker gets 503; a request not read within read_deadline gets 408."""

    def __init__(self, service, host="127.0.0.1", port=8092, workers=16, max_body=MAX_BODY, token=None,
                 origins=(), read_deadline=10.0, idle_timeout=15.0, queue_wait=5.0, max_conns=1000):
        self.service, self.workers, self.max_body, self.token = service, workers, max_body, token
        self.read_deadline, self.idle_timeout, self.queue_wait, self.max_conns = (
            read_deadline, idle_timeout, queue_wait, max_conns)
        family, _, _, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(addr)
        self.sock.listen(512)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        names = ("127.0.0.1", "localhost", "[::1]") if _is_loopback(host) else ("[%s]" % host if ":" in host else host,)
        self.origins = {"http://%s:%d" % (h, self.port) for h in names} | set(origins)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._ready = collections.deque()
        self._cv = threading.Condition()
        self._parked, self._returned, self._open, self._open_lock = {}, collections.deque(), 0, threading.Lock()
        self._stop = False
        self._page = render_page().encode("utf-8")
        self._docs = {"/spec": _json_bytes(spec_document()), "/rules": _json_bytes(rules_document())}

    # -- selector thread ------------------------------------------------------------------------------
    def serve_forever(self):
        """Run until shutdown(): the calling thread becomes the selector thread."""
        threads = [threading.Thread(target=self._work, name="va-worker-%d" % i, daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        last_sweep = time.monotonic()
        while not self._stop:
            for key, _ in self._sel.select(0.25):
                if key.fileobj is self.sock:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    self._take_returned()
                else:
                    self._sel.unregister(key.fileobj)
                    del self._parked[key.data]
                    self._dispatch(key.data)
            if time.monotonic() - last_sweep > 0.25:
                last_sweep = time.monotonic()
                self._sweep(last_sweep)
        for conn in list(self._parked):
            self._abort(conn, None)
        with self._cv:
            self._ready.extend((None, 0) for _ in threads)
            self._cv.notify_all()
        self._sel.close()
        for s in (self.sock, self._wake_r, self._wake_w):
            s.close()

    def shutdown(self):
        """Stop serve_forever (from another thread)."""
        self._stop = True
        self._wake_w.send(b"x")

    def _accept(self):
        while True:
            try:
                s, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            s.setblocking(True)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(s)
            with self._open_lock:
                self._open += 1
                full = self._open > self.max_conns
            if full:
                self._abort(conn, 503)
            else:
                self._park(conn)

    def _park(self, conn):
        conn.since = time.monotonic()
        self._parked[conn] = conn.since
        self._sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _take_returned(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._returned:
            self._park(self._returned.popleft())

    def _dispatch(self, conn):
        with self._cv:
            self._ready.append((conn, time.monotonic()))
            self._cv.notify()

    def _sweep(self, now):
        for conn, since in list(self._parked.items()):
            if now - since > self.idle_timeout:
                self._sel.unregister(conn.sock)
                del self._parked[conn]
                self._abort(conn, None)
        with self._cv:
            while self._ready and self._ready[0][0] is not None and now - self._ready[0][1] > self.queue_wait:
                self._abort(self._ready.popleft()[0], 503)

    def _abort(self, conn, status):
        """Close a connection the pool cannot serve, answering 503 first when it sent a request."""
        s = conn.sock
        try:
            if status:
                s.settimeout(0.2)
                s.sendall(self._response(status, _json_bytes({
                    "error": "service_unavailable", "message": "all workers are busy; retry later"}), True))
            s.setblocking(False)
            while s.recv(65536):  # drain what arrived so closing does not reset the connection
                pass
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn):
        with self._open_lock:
            self._open -= 1
        try:
            conn.sock.close()
        except OSError:
            pass

    # -- workers --------------------------------------------------------------------------------------
    def _work(self):
        while True:
            with self._cv:
                while not self._ready:
                    self._cv.wait()
                conn, _ = self._ready.popleft()
            if conn is None:
                return
            if self._serve(conn):
                self._returned.append(conn)
                try:
                    self._wake_w.send(b"x")
                except OSError:
                    self._close(conn)

    def _serve(self, conn):
        """Serve requests on one connection while they keep coming; True means park it again."""
        wait = self.read_deadline
        while True:
            head_only, close = False, True
            try:
                req = self._read_head(conn, wait)
                if req is None:
                    if self._stop:
                        self._close(conn)
                    return not self._stop
                head_only = req[0] == "HEAD"
                status, extra, ctype, body, close = self._handle(conn, *req)
            except _Gone:
                self._close(conn)
                return False
            except HttpError as e:
                status, extra, ctype, body = e.status, e.headers, "application/json", _json_bytes(
                    {"error": e.code, "message": e.message})
            except Exception:  # a bug must still answer, never drop the connection or print a traceback
                status, extra, ctype, body = 500, [], "application/json", _json_bytes(
                    {"error": "internal_error", "message": "the server failed to handle the request"})
            if status >= 400:
                self.service.count("errors_by_status", str(status))
            try:
                conn.sock.settimeout(self.read_deadline)
                conn.sock.sendall(self._response(status, body, close, ctype, extra, head_only))
            except OSError:
                self._close(conn)
                return False
            if close:
                self._linger(conn)
                return False
            wait = GRACE

    def _response(self, status, body, close, ctype="application/json", extra=(), head_only=False):
        lines = ["HTTP/1.1 %d %s" % (status, _PHRASES[status])]
        if status != 204:
            lines.append("Content-Type: " + ctype)
            lines.append("Content-Length: %d" % len(body))
        lines.append("Cache-Control: no-store\r\nX-Content-Type-Options: nosniff")
        if close:
            lines.append("Connection: close")
        lines.extend("%s: %s" % h for h in extra)
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only or status == 204 else head + body

    def _linger(self, conn):
        """Close after an error without resetting the connection: stop sending, discard input for up to 2 s."""
        s = conn.sock
        try:
            s.shutdown(socket.SHUT_WR)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                s.settimeout(0.2)  # a client that goes quiet is done
                if not s.recv(65536):
                    break
        except OSError:
            pass
        self._close(conn)

    def _recv(self, conn, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError(408, "request_timeout", "the request was not received within %gs" % self.read_deadline)
        conn.sock.settimeout(left)
        try:
            data = conn.sock.recv(65536)
        except socket.timeout:
            raise HttpError(408, "request_timeout", "the request was not received within %gs" % self.read_deadline)
        except OSError:
            raise _Gone()
        return data

    def _read_head(self, conn, wait):
        """Read and parse one request head; None when no byte arrives within wait."""
        buf = conn.buf
        if not buf:
            conn.sock.settimeout(wait)
            try:
                data = conn.sock.recv(65536)
            except socket.timeout:
                return None
            except OSError:
                raise _Gone()
            if not data:
                raise _Gone()
            buf += data
        deadline = time.monotonic() + self.read_deadline
        while True:
            i, j = buf.find(b"\n\r\n"), buf.find(b"\n\n")
            end = -1 if i < 0 and j < 0 else i + 3 if j < 0 or 0 <= i < j else j + 2
            if (end if end >= 0 else len(buf)) > MAX_HEAD:  # a body may follow a short head in buf
                raise HttpError(431, "headers_too_large", "the request head exceeds %d bytes" % MAX_HEAD)
            if end >= 0:
                break
            data = self._recv(conn, deadline)
            if not data:
                raise HttpError(400, "truncated_request", "the connection closed inside the request head")
            buf += data
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:end]
        lines = head.split("\n")
        parts = lines[0].rstrip("\r").split(" ")
        if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper() or not (
                parts[1].startswith("/") or parts[1] == "*"):
            raise HttpError(400, "bad_request_line", "malformed request line")
        if parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            raise HttpError(400, "unsupported_http_version", "only HTTP/1.1 and HTTP/1.0 are supported")
        headers = {}
        for line in lines[1:]:
            line = line.rstrip("\r")
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or line[0] in " \t" or len(headers) >= 100:
                raise HttpError(400, "bad_header", "malformed header line")
            name, value = name.lower(), value.strip()
            if name in headers:
                if name in ("content-length", "transfer-encoding", "authorization", "origin", "content-type"):
                    raise HttpError(400, "duplicate_header", "a header that must be single is repeated")
                value = headers[name] + ", " + value
            headers[name] = value
        conn_hdr = headers.get("connection", "").lower()
        keep = "close" not in conn_hdr if parts[2] == "HTTP/1.1" else "keep-alive" in conn_hdr
        return parts[0], parts[1].split("?", 1)[0], headers, keep, deadline

    def _handle(self, conn, method, path, headers, keep, deadline):
        """Route one request; returns (status, extra headers, content type, body, close)."""
        unread = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("0", "")
        close = not keep or unread
        if path == "*" and method == "OPTIONS":
            return 204, [("Allow", _ALLOW["*"])], "", b"", close
        route = ROUTES.get(path)
        if route is None:
            raise HttpError(404, "not_found", "no such path; see GET /spec")
        allow = [("Allow", _ALLOW[route])]
        if method == "OPTIONS":
            return 204, allow, "", b"", close
        if method not in _ALLOW[route].split(", "):
            raise HttpError(405, "method_not_allowed", "use " + _ALLOW[route], allow)
        if route == "GET":
            if path == "/":
                return 200, [("Content-Security-Policy", CSP), ("X-Frame-Options", "DENY")], \
                    "text/html; charset=utf-8", self._page, close
            if path in self._docs:
                return 200, [], "application/json", self._docs[path], close
            obj = {"status": "ok", "version": VERSION} if path == "/healthcheck" else self.service.stats()
            return 200, [], "application/json", _json_bytes(obj), close
        if "transfer-encoding" in headers:
            raise HttpError(411, "length_required", "chunked bodies are not accepted; send Content-Length")
        length = headers.get("content-length")
        if length is None:
            raise HttpError(411, "length_required", "a POST needs Content-Length")
        if not (length.isascii() and length.isdigit() and len(length) <= 15):
            raise HttpError(400, "bad_content_length", "Content-Length must be a decimal number")
        if int(length) > self.max_body:
            raise HttpError(413, "body_too_large", "the body exceeds %d bytes" % self.max_body)
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            raise HttpError(403, "forbidden_origin", "this Origin is not allowed (see --allow-origin)")
        if self.token is not None:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if not (scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1"), self.token)):
                raise HttpError(401, "unauthorized", "send Authorization: Bearer <token>",
                                [("WWW-Authenticate", "Bearer")])
        if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise HttpError(415, "unsupported_media_type", "Content-Type must be application/json")
        if headers.get("expect", "").lower() == "100-continue":
            conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        need, buf = int(length), conn.buf
        while len(buf) < need:
            data = self._recv(conn, deadline)
            if not data:
                raise HttpError(400, "truncated_body", "the connection closed before Content-Length bytes arrived")
            buf += data
        body = bytes(buf[:need])
        del buf[:need]
        status, obj = self.service.post(path, body, headers)
        return status, [], "application/json", b"" if obj is None else _json_bytes(obj), not keep


# ---------------------------------------------------------------------------------------------------
# §9 Command line
# ---------------------------------------------------------------------------------------------------
def _fail(message):
    sys.stderr.write("verify_action.py: error: %s\n" % message)
    return 2


def _origin(value):
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError("expected scheme://host[:port]")
    return value


def main(argv=None):
    """Command-line entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["keygen"], ["verify-receipt"]):
        p = argparse.ArgumentParser(prog="verify_action.py " + argv[0])
        if argv[0] == "verify-receipt":
            p.add_argument("file", help="a receipt, or a whole /verify response, as JSON")
        p.add_argument("--key-file", required=True)
        a = p.parse_args(argv[1:])
        try:
            if argv[0] == "keygen":
                print(keygen(a.key_file))
                return 0
            ring = load_keyring(a.key_file)
            with open(a.file, "rb") as f:
                doc = strict_loads(f.read(MAX_BODY + 1))
        except (OSError, ValueError) as e:
            return _fail(e.message if isinstance(e, RequestError) else str(e))
        if isinstance(doc, dict) and isinstance(doc.get("receipt"), dict) and "aar_verdict" in doc:
            doc = doc["receipt"]
        valid, reason, kid = verify_receipt(doc, ring)
        print(json.dumps({"valid": valid, "reason": reason, "kid": kid}))
        return 0 if valid else 1
    p = argparse.ArgumentParser(prog="verify_action.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="bind address; a non-loopback one is an explicit opt-in")
    p.add_argument("--port", type=int, default=8092, help="0 picks a free port (printed on stderr)")
    p.add_argument("--key-file", help="key ring (see keygen); without it an ephemeral key is used")
    p.add_argument("--max-body", type=int, default=MAX_BODY)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--token-file", help="every POST then needs Authorization: Bearer <token>")
    p.add_argument("--issuer", default="verify_action.py", help="issued_by in receipts")
    p.add_argument("--allow-origin", action="append", default=[], type=_origin, metavar="ORIGIN")
    p.add_argument("--stdio", action="store_true", help="serve MCP over stdin/stdout instead of HTTP")
    a = p.parse_args(argv)
    if not 0 <= a.port <= 65535 or not 1 <= a.workers <= 256 or not 1024 <= a.max_body <= 64 << 20:
        return _fail("--port 0-65535, --workers 1-256, --max-body 1024-67108864")
    if not 0 < len(a.issuer) <= 128:
        return _fail("--issuer must be 1-128 characters")
    token = None
    try:
        ring = load_keyring(a.key_file) if a.key_file else KeyRing.generate()
        if a.token_file:
            token = (read_private_file(a.token_file).strip().splitlines() or [""])[0].strip().encode("utf-8")
            if len(token) < 16:
                return _fail("the token in --token-file must be at least 16 characters")
    except (OSError, ValueError) as e:
        return _fail(str(e))
    if ring.ephemeral:
        sys.stderr.write("verify_action.py: no --key-file: using an ephemeral key (kid %s); its receipts cannot be "
                         "verified after a restart. Create a key ring with: verify_action.py keygen --key-file F\n"
                         % ring.kid)
    service = Service(ring, a.issuer)
    if a.stdio:
        out = sys.stdout.buffer
        sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
        try:
            serve_stdio(service, sys.stdin.buffer, out)
        except KeyboardInterrupt:
            pass
        return 0
    try:
        server = Server(service, a.host, a.port, a.workers, a.max_body, token, a.allow_origin)
    except OSError as e:
        return _fail("cannot listen on %s:%d: %s" % (a.host, a.port, e.strerror or e))
    if not _is_loopback(a.host) and token is None:
        sys.stderr.write("verify_action.py: WARNING: bound to non-loopback %s without --token-file: anyone who "
                         "can reach this port can obtain signed receipts\n" % a.host)
    host = "[%s]" % a.host if ":" in a.host else a.host
    sys.stderr.write("verify_action.py %s listening on http://%s:%d (kid %s)\n" % (VERSION, host, server.port, ring.kid))
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
