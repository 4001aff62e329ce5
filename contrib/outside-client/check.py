#!/usr/bin/env python3
"""Checks Coffer's native wire protocol against WireProtocol.md, with a client written from that
document alone (coffer_wire_client.py).

    check.py [--spec PATH] [--socket PATH [--passcode-fd FD]] [--part vectors,e2e,malformed]

Three parts, one line per check (PASS, FAIL, XFAIL: a known disagreement, XPASS: a known disagreement
that no longer shows, which fails so that the list stays honest), then a summary line
`vectors P/N, e2e P/N, malformed P/N`. The exit status is 1 when any check failed.

- vectors: every ```vector block of the spec, encoded and decoded byte for byte by the client's codec.
- e2e: against a live agent (--socket), the behaviour the spec states with MUST wording that a client
  can observe. The agent must be a fresh one of the default configuration, the caller unsigned (as a
  test starts it); the passcode (the user's login password, which PAM accepts) is read from the
  descriptor --passcode-fd (default 0, standard input), never from the command line or environment.
- malformed: frames the spec calls malformed (the agent answers ERROR -50, or closes), sent to the
  live agent.

Each check names the spec section it comes from. The checks that disagree with the agent are listed
in KNOWN_DISAGREEMENTS with the sentence of the spec they rest on.
"""

import argparse
import hashlib
import os
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from coffer_wire_client import (  # noqa: E402
    AGENT_VERSIONS, B, CERT, D, GENP, I, INET, KEYS, LIMIT_ALL, LIMIT_COUNT, LIMIT_ONE, MAX_FRAME_LARGE,
    MAX_FRAME_SMALL, MAX_SECRET, NAMES, R_ACCESS, R_ATTRS, R_DATA, R_LOCKED, R_REF, R_SKIP, REPLIES,
    REQUESTS, S, T, Closed, Connection, FramingError, Malformed, blob, check_length, decode_frame,
    encode_attributes, encode_frame, encode_query, encode_value, errSecAllocate, errSecAuthFailed,
    errSecDuplicateItem, errSecInteractionNotAllowed, errSecItemNotFound, errSecMissingEntitlement,
    errSecNotAvailable, errSecParam, errSecUserCanceled, errSecDecode, frame_bytes, i64, query, sstr,
    u16, u32, u64, u8, Reader,
)

DEFAULT_SPEC = os.path.normpath(os.path.join(
    HERE, "..", "..", "Sources", "CofferProtocol", "CofferProtocol.docc", "WireProtocol.md"))

# ---------------------------------------------------------------------------------------------------
# Where the spec and the agent disagree. Each key is a check's "Section: description"; the value quotes
# the sentence of WireProtocol.md the check rests on, and says what the agent does instead. A check
# listed here that fails is XFAIL; one that passes is XPASS and fails the run (the entry must go).

KNOWN_DISAGREEMENTS = {
}

# How long a reply may take after a touch the agent took before the touch counts as lost: long enough
# for a slow, loaded machine (a lost touch never brings a reply; a slow one does).
LOST_TOUCH_SECONDS = 10.0

# Known disagreements that show only sometimes (a race): passing is not reported as an XPASS failure.
FLAKY = {
}


# ---------------------------------------------------------------------------------------------------
# Results

class Results:
    def __init__(self, verbose=True):
        self.counts = {}
        self.failures = []
        self.verbose = verbose
        self.lock = threading.Lock()
        self.seen = set()

    def check(self, part, section, desc, cond, detail=""):
        key = "%s: %s" % (section, desc)
        with self.lock:
            n = 2
            base = key
            while key in self.seen:       # a description repeated in a loop keeps each line distinct
                key = "%s (%d)" % (base, n)
                n += 1
            self.seen.add(key)
            known = KNOWN_DISAGREEMENTS.get(base)
            cond = bool(cond)
            if cond:
                status = "XPASS" if known and base not in FLAKY else "PASS"
            else:
                status = "XFAIL" if known else "FAIL"
            ok = status in ("PASS", "XFAIL")
            p, t = self.counts.get(part, (0, 0))
            self.counts[part] = (p + (1 if ok else 0), t + 1)
            line = "%-5s %-9s [%s] %s" % (status, part, section, desc)
            if status != "PASS" and detail:
                line += " -- " + str(detail)[:400]
            if status == "XPASS":
                line += " -- listed in KNOWN_DISAGREEMENTS but passes now: remove it"
            if status == "XFAIL":
                line += " -- KNOWN DISAGREEMENT: " + known
            if not ok:
                self.failures.append(line)
            if self.verbose or not ok or status == "XFAIL":
                print(line, flush=True)
            return cond

    def summary(self):
        parts = []
        for part in ("vectors", "e2e", "malformed"):
            if part in self.counts:
                p, t = self.counts[part]
                parts.append("%s %d/%d" % (part, p, t))
        return ", ".join(parts)


# ---------------------------------------------------------------------------------------------------
# Part 1: the spec's test vectors

def spec_vectors(path):
    """Test vectors: each ```vector block as its `key: value` lines (unknown lines ignored)."""
    out, cur = [], None
    with open(path, encoding="utf-8") as f:
        for line in f.read().split("\n"):
            if line == "```vector":
                cur = {}
                continue
            if cur is None:
                continue
            if line == "```":
                out.append(cur)
                cur = None
                continue
            k, sep, v = line.partition(":")
            if sep:
                cur[k.strip()] = v.strip()
    return out


def run_vectors(R, vectors):
    sec = "Test vectors"
    for v in vectors:
        name, outcome, direction = v.get("name", "?"), v.get("outcome", ""), v.get("direction", "")
        frame = bytes.fromhex(v["frame"])
        desc = "%s (%s, %s)" % (name, direction, outcome)
        if outcome == "ok":
            # MUST decode, and re-encode to the same bytes.
            try:
                t, rid, m = decode_frame(frame, direction, version=3)
                again = encode_frame(t, rid, m)
                R.check("vectors", sec, desc, again == frame, "re-encoded %s" % again.hex())
            except Malformed as e:
                R.check("vectors", sec, desc, False, "refused: %s" % e)
        elif outcome.startswith("error"):
            # a complete frame (its length prefix is right) whose body is malformed
            length = struct.unpack(">I", frame[:4])[0]
            try:
                check_length(length)
                complete = len(frame) == 4 + length
                decode_frame(frame, direction, version=3)
                R.check("vectors", sec, desc, False, "decoded although malformed")
            except FramingError as e:
                R.check("vectors", sec, desc, False, "framing error: %s" % e)
            except Malformed as e:
                R.check("vectors", sec, desc, complete, "refused (%s) but the frame is not complete" % e)
        elif outcome == "close":
            # the length prefix is outside 5...MAX_FRAME: refused after 4 bytes, whatever follows
            try:
                check_length(struct.unpack(">I", frame[:4])[0], MAX_FRAME_SMALL)
                R.check("vectors", sec, desc, False, "the length was accepted")
            except FramingError:
                R.check("vectors", sec, desc, True)
        else:
            R.check("vectors", sec, desc, False, "unknown outcome %r" % outcome)


# ---------------------------------------------------------------------------------------------------
# Live checks: shared helpers

def attr_raw(name, value_bytes):
    """One attribute as it goes on the wire (name bytes as given, value already encoded)."""
    nb = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    return u16(len(nb)) + nb + value_bytes


def attrs_raw(pairs):
    return u16(len(pairs)) + b"".join(attr_raw(n, v) for n, v in pairs)


def sv(s):
    """An encoded string value."""
    raw = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return u8(1) + u32(len(raw)) + raw


def q_raw(cls=GENP, attrs=None, limit=LIMIT_ALL, count=0, flags=0, pref=b"", raw_attrs=None):
    a = raw_attrs if raw_attrs is not None else encode_attributes(attrs if attrs is not None else {"svce": S("m")})
    return u8(cls) + a + u8(limit) + u32(count) + u8(flags) + blob(pref)


def accc(factors, combination=1, operations=7, domain=b""):
    """Attributes, accc: u8 version 1 || u8 combination || u8 n || n x factor || u8 operations || u8 m || m bytes."""
    return bytes([1, combination, len(factors)] + list(factors) + [operations, len(domain)]) + bytes(domain)


class Live:
    def __init__(self, R, path, passcode, args):
        self.R = R
        self.path = path
        self.pw = passcode
        self.args = args
        self.tag = "oc%08x" % int.from_bytes(os.urandom(4), "big")
        self.failures_in_a_row = 0
        self.default_group = "unsigned"
        self.whole_keychain = True
        self.fresh = False

    # -- connections
    def conn(self, lo=1, hi=4, timeout=30.0):
        c = Connection(self.path, timeout)
        rep = c.hello(lo, hi)
        if rep.name != "HELLO_REPLY":
            raise RuntimeError("HELLO refused: %r" % rep)
        return c

    def raw(self, timeout=30.0):
        return Connection(self.path, timeout)

    # -- reporting
    def E(self, section, desc, cond, detail=""):
        return self.R.check("e2e", section, desc, cond, detail)

    def M(self, section, desc, cond, detail=""):
        return self.R.check("malformed", section, desc, cond, detail)

    @staticmethod
    def is_err(rep, status):
        return rep is not None and rep.name == "ERROR" and rep["status"] == status

    def err(self, section, desc, rep, status, part="e2e"):
        return self.R.check(part, section, desc, self.is_err(rep, status), repr(rep))

    def kind(self, section, desc, rep, name, part="e2e"):
        return self.R.check(part, section, desc, rep is not None and rep.name == name, repr(rep))

    @staticmethod
    def answers(c, timeout=10.0):
        """True when the connection still serves a request."""
        try:
            rep = c.request("STATUS", timeout=timeout)
            return rep.name == "STATUS_REPLY"
        except (Closed, OSError, TimeoutError, Malformed):
            return False

    def svc(self, s):
        return "%s-%s" % (self.tag, s)

    # -- passcode bookkeeping (Timeouts a client must allow: 4 failures in a row start a wait)
    def unlock(self, c=None):
        own = c is None
        c = c or self.conn()
        try:
            rep = c.request("UNLOCK", {"passcode": self.pw}, timeout=120)
            if rep.name == "OK":
                self.failures_in_a_row = 0
            return rep
        finally:
            if own:
                c.close()

    def failed_attempt(self):
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= 3:
            self.unlock()

    def status(self):
        with self.conn() as c:
            return c.status()

    def item_count(self):
        return self.status()["items"]


# ---------------------------------------------------------------------------------------------------
# Part 3: malformed frames and refused requests against the live agent

def malformed_cases(version):
    """(section, description, type code, payload) of bodies the spec's grammar refuses after HELLO."""
    L = []

    def add(section, desc, t, payload):
        L.append((section, desc, REQUESTS[t] if isinstance(t, str) else t, payload))

    F, A, GA = "Fields", "Attributes", "General attributes"
    good = q_raw()
    # query fields
    add(F, "query with item class 5", "COPY_MATCHING", q_raw(cls=5))
    add(F, "query with item class 255", "COPY_MATCHING", q_raw(cls=255))
    add(F, "query with limit kind 3", "COPY_MATCHING", q_raw(limit=3))
    add(F, "query limit one with count 1", "COPY_MATCHING", q_raw(limit=LIMIT_ONE, count=1))
    add(F, "query limit all with count 5", "COPY_MATCHING", q_raw(limit=LIMIT_ALL, count=5))
    add(F, "query limit count with count 0", "COPY_MATCHING", q_raw(limit=LIMIT_COUNT, count=0))
    add(F, "query with return flag bit 6", "COPY_MATCHING", q_raw(flags=0x40))
    add(F, "query with return flag bit 7", "COPY_MATCHING", q_raw(flags=0x80))
    add("Checking the keychain", "COPY_MATCHING with skipUnreadable (bit 3)", "COPY_MATCHING", q_raw(flags=R_SKIP | R_ATTRS))
    add("Checking the keychain", "COPY_MATCHING with accessState but no attributes", "COPY_MATCHING", q_raw(flags=R_ACCESS | R_DATA))
    add("Checking the keychain", "COPY_MATCHING_PAGE with accessState but no attributes", "COPY_MATCHING_PAGE",
        q_raw(flags=R_ACCESS) + u64(0))
    for n in (1, 15, 17, 33, 47):
        add(F, "query with a %d-byte persistent reference" % n, "COPY_MATCHING", q_raw(pref=bytes(range(n))))
    add(F, "query naming one persistent reference twice", "COPY_MATCHING", q_raw(pref=bytes(range(16)) * 2))
    add(F, "query naming 257 persistent references", "COPY_MATCHING",
        q_raw(pref=b"".join(i.to_bytes(16, "big") for i in range(257))))
    add(F, "query cut short (no persistent reference blob)", "COPY_MATCHING", good[:-4])
    add(F, "query with a trailing byte", "COPY_MATCHING", good + b"\0")
    add(F, "query whose persistent reference length runs past the body", "COPY_MATCHING", good[:-4] + u32(16) + b"\1" * 8)
    # attributes
    sv_m = sv("m")
    add(A, "attributes out of order", "COPY_MATCHING", q_raw(raw_attrs=attrs_raw([("svce", sv_m), ("acct", sv_m)])))
    add(A, "a repeated attribute name", "COPY_MATCHING", q_raw(raw_attrs=attrs_raw([("acct", sv_m), ("acct", sv_m)])))
    add(A, "an empty attribute name", "COPY_MATCHING", q_raw(cls=0, raw_attrs=attrs_raw([("", sv_m)])))
    short_name, short_count = (33, 129) if version < 4 else (257, 257)
    add(A, "an attribute name of %d bytes at version %d" % (short_name, version), "COPY_MATCHING",
        q_raw(cls=0, raw_attrs=attrs_raw([("@" + "n" * (short_name - 1), sv_m)])))
    many = sorted(("@g%04d" % i, sv("v")) for i in range(short_count))
    add(A, "%d attributes at version %d" % (short_count, version), "COPY_MATCHING", q_raw(cls=0, raw_attrs=attrs_raw(many)))
    for tag in (0, 6, 0xFF):
        add(A, "value tag %d" % tag, "COPY_MATCHING", q_raw(raw_attrs=attrs_raw([("svce", u8(tag) + u32(0))])))
    for b in (2, 0xFF):
        add(A, "bool value %d" % b, "COPY_MATCHING", q_raw(raw_attrs=attrs_raw([("invi", u8(4) + u8(b))])))
    for label, bits in (("NaN", 0x7FF8000000000000), ("+infinity", 0x7FF0000000000000),
                        ("-infinity", 0xFFF0000000000000), ("a signalling NaN", 0x7FF0000000000001)):
        add("Encodings", "a %s date" % label, "COPY_MATCHING",
            q_raw(cls=0, raw_attrs=attrs_raw([("cdat", u8(5) + u64(bits))])))
    add(F, "a string value of 65537 bytes", "COPY_MATCHING",
        q_raw(raw_attrs=attrs_raw([("svce", u8(1) + u32(65537) + b"a" * 65537)])))
    add(F, "a data value of 65537 bytes", "COPY_MATCHING",
        q_raw(raw_attrs=attrs_raw([("gena", u8(3) + u32(65537) + b"a" * 65537)])))
    add(A, "a string value whose length runs past the body", "COPY_MATCHING",
        u8(GENP) + u16(1) + sstr("svce") + u8(1) + u32(1000) + b"abc")
    add(A, "an attribute count above the attributes given", "COPY_MATCHING",
        q_raw(raw_attrs=u16(2) + attr_raw("svce", sv_m)))
    bad_utf8 = [("an overlong form (c0 af)", b"\xc0\xaf"), ("a surrogate (ed a0 80)", b"\xed\xa0\x80"),
                ("a code point above U+10FFFF (f4 90 80 80)", b"\xf4\x90\x80\x80"),
                ("a lone continuation byte (80)", b"\x80"), ("a cut sequence (e2 82)", b"\xe2\x82"),
                ("an overlong NUL (c0 80)", b"\xc0\x80"), ("byte ff", b"\xff")]
    for label, raw in bad_utf8:
        add("Encodings", "a string value with %s" % label, "COPY_MATCHING",
            q_raw(raw_attrs=attrs_raw([("svce", u8(1) + u32(len(raw)) + raw)])))
        add("Encodings", "an attribute name with %s" % label, "COPY_MATCHING",
            q_raw(cls=0, raw_attrs=attrs_raw([(b"@" + raw, sv_m)])))
    nfd, nfc = "@e\u0301", "@\u00e9"
    pairs = sorted([(nfd, sv("1")), (nfc, sv("2"))], key=lambda p: p[0].encode())
    add(GA, "ADD with two spellings of one general attribute name", "ADD",
        u8(GENP) + attrs_raw(pairs) + blob(b"x") + u8(0))
    # ADD
    add_body = u8(GENP) + encode_attributes({"svce": S("m")}) + blob(b"pw")
    add(F, "ADD with item class 0", "ADD", u8(0) + add_body[1:] + u8(0))
    add(F, "ADD with item class 5", "ADD", u8(5) + add_body[1:] + u8(0))
    for fl in (0x08, 0x10, 0x20, 0x40, 0x80):
        add(F, "ADD with return flag 0x%02x" % fl, "ADD", add_body + u8(fl))
    add(F, "ADD without its return flags", "ADD", add_body)
    add(F, "ADD with a trailing byte", "ADD", add_body + u8(0) + u8(0))
    add(F, "ADD whose secret length runs past the body", "ADD", add_body[:-6] + u32(100) + b"pw" + u8(0))
    # UPDATE / DELETE
    upd_q = q_raw(attrs={"svce": S("nothing-%d" % version)})
    chg = encode_attributes({"labl": S("x")})
    add(F, "UPDATE with limit one", "UPDATE", q_raw(attrs={"svce": S("n")}, limit=LIMIT_ONE) + chg + u8(0))
    add(F, "UPDATE with limit count 1", "UPDATE", q_raw(attrs={"svce": S("n")}, limit=LIMIT_COUNT, count=1) + chg + u8(0))
    for fl in (R_DATA, R_ATTRS, R_REF, R_LOCKED):
        add(F, "UPDATE with return flag 0x%02x" % fl, "UPDATE", q_raw(attrs={"svce": S("n")}, flags=fl) + chg + u8(0))
    add(F, "UPDATE with hasSecret 2", "UPDATE", upd_q + chg + u8(2))
    add(F, "UPDATE with hasSecret 1 and no secret", "UPDATE", upd_q + chg + u8(1))
    add(F, "UPDATE without hasSecret", "UPDATE", upd_q + chg)
    add(F, "UPDATE with a byte after its secret", "UPDATE", upd_q + chg + u8(1) + blob(b"s") + b"\0")
    add(F, "DELETE with limit one", "DELETE", q_raw(limit=LIMIT_ONE))
    add(F, "DELETE with limit count 2", "DELETE", q_raw(limit=LIMIT_COUNT, count=2))
    for fl in (R_DATA, R_ATTRS, R_REF, R_SKIP, R_LOCKED):
        add(F, "DELETE with return flag 0x%02x" % fl, "DELETE", q_raw(flags=fl))
    add(F, "DELETE with a trailing byte", "DELETE", q_raw() + b"\0")
    add("Paging", "COPY_MATCHING_PAGE whose cursor is cut short", "COPY_MATCHING_PAGE", good + b"\0" * 7)
    add("Paging", "COPY_MATCHING_PAGE with a trailing byte", "COPY_MATCHING_PAGE", good + u64(0) + b"\0")
    add("Paging", "COPY_MATCHING_PAGE without a cursor", "COPY_MATCHING_PAGE", good)
    add("Prompting for a front end", "PROMPT_READ with skipUnreadable", "PROMPT_READ", q_raw(flags=R_DATA | R_SKIP))
    add("Prompting for a front end", "PROMPT_READ with the locked flag", "PROMPT_READ", q_raw(flags=R_DATA | R_REF | R_LOCKED))
    add("Prompting for a front end", "PROMPT_READ with the access-state flag", "PROMPT_READ",
        q_raw(flags=R_DATA | R_ATTRS | R_ACCESS))
    # empty-bodied requests with a byte
    for t in ("STATUS", "LOCK", "SUBSCRIBE", "WHOAMI", "PROTECTIONS", "PROMPT_UNLOCK", "PROMPTER", "COUNTERS"):
        add("Messages", "%s with a trailing byte" % t, t, b"\0")
    # passcodes
    add("Messages", "UNLOCK without a body", "UNLOCK", b"")
    add("Messages", "UNLOCK whose passcode is cut short", "UNLOCK", u32(4) + b"12")
    add("Messages", "UNLOCK with a trailing byte", "UNLOCK", blob(b"x") + b"\0")
    add("Messages", "SET_PASSCODE with one blob", "SET_PASSCODE", blob(b""))
    add("Messages", "SET_PASSCODE with a trailing byte", "SET_PASSCODE", blob(b"") + blob(b"x") + b"\0")
    add("Messages", "REMOVE_PASSCODE without a body", "REMOVE_PASSCODE", b"")
    add("Messages", "REMOVE_PASSCODE with a trailing byte", "REMOVE_PASSCODE", blob(b"x") + b"\0")
    # AUTHORIZE
    add("Access groups", "AUTHORIZE with an empty access group", "AUTHORIZE", sstr("") + blob(b"x"))
    add("Access groups", "AUTHORIZE without a passcode", "AUTHORIZE", sstr("g"))
    add("Access groups", "AUTHORIZE whose group is not UTF-8", "AUTHORIZE", u16(2) + b"\xc3\x28" + blob(b"x"))
    add("Access groups", "AUTHORIZE with a trailing byte", "AUTHORIZE", sstr("g") + blob(b"x") + b"\0")
    # AUTH_OPTIONS
    AU = "Authentication"
    add(AU, "AUTH_OPTIONS with flag bit 2", "AUTH_OPTIONS", u8(4) + sstr("") + u32(0) + u8(0) + u8(0))
    add(AU, "AUTH_OPTIONS keeping for the connection with a reuse of 60 s", "AUTH_OPTIONS", u8(2) + sstr("") + u32(60) + u8(0) + u8(0))
    add(AU, "AUTH_OPTIONS with flag bit 7", "AUTH_OPTIONS", u8(0x80) + sstr("") + u32(0) + u8(0) + u8(0))
    add(AU, "AUTH_OPTIONS with a 513-byte prompt", "AUTH_OPTIONS", u8(0) + sstr("p" * 513) + u32(0) + u8(0) + u8(0))
    add(AU, "AUTH_OPTIONS with reuse 301 s", "AUTH_OPTIONS", u8(0) + sstr("") + u32(301) + u8(0) + u8(0))
    add(AU, "AUTH_OPTIONS with reuse 2^32-1 s", "AUTH_OPTIONS", u8(0) + sstr("") + u32(0xFFFFFFFF) + u8(0) + u8(0))
    add(AU, "AUTH_OPTIONS with hasPasscode 2", "AUTH_OPTIONS", u8(0) + sstr("") + u32(0) + u8(2) + u8(0))
    add(AU, "AUTH_OPTIONS with hasApplicationPassword 2", "AUTH_OPTIONS", u8(0) + sstr("") + u32(0) + u8(0) + u8(2))
    add(AU, "AUTH_OPTIONS with hasPasscode 1 and no passcode", "AUTH_OPTIONS", u8(0) + sstr("") + u32(0) + u8(1))
    add(AU, "AUTH_OPTIONS without hasApplicationPassword", "AUTH_OPTIONS", u8(0) + sstr("") + u32(0) + u8(0))
    add(AU, "AUTH_OPTIONS with a trailing byte", "AUTH_OPTIONS", u8(0) + sstr("") + u32(0) + u8(0) + u8(0) + b"\0")
    add(AU, "AUTH_RESPONSE with kind 5", "AUTH_RESPONSE", u8(5))
    add(AU, "AUTH_RESPONSE passcode without a passcode", "AUTH_RESPONSE", u8(1))
    add(AU, "AUTH_RESPONSE application password without one", "AUTH_RESPONSE", u8(4))
    add(AU, "AUTH_RESPONSE cancel with a trailing byte", "AUTH_RESPONSE", u8(0) + b"\0")
    add(AU, "AUTH_RESPONSE without a kind", "AUTH_RESPONSE", b"")
    add(AU, "LA_EVALUATE with policy 0", "LA_EVALUATE", u8(0) + sstr("why"))
    add(AU, "LA_EVALUATE with policy 3", "LA_EVALUATE", u8(3) + sstr("why"))
    add(AU, "LA_EVALUATE with a 513-byte reason", "LA_EVALUATE", u8(2) + sstr("r" * 513))
    add(AU, "LA_EVALUATE with an empty reason", "LA_EVALUATE", u8(2) + sstr(""))
    add(AU, "LA_EVALUATE whose reason is not UTF-8", "LA_EVALUATE", u8(2) + u16(1) + b"\xff")
    add(AU, "LA_EVALUATE with a trailing byte", "LA_EVALUATE", u8(2) + sstr("why") + b"\0")
    add(AU, "LA_CAN_EVALUATE with policy 0", "LA_CAN_EVALUATE", u8(0))
    add(AU, "LA_CAN_EVALUATE with policy 3", "LA_CAN_EVALUATE", u8(3))
    add(AU, "LA_CAN_EVALUATE without a policy", "LA_CAN_EVALUATE", b"")
    add(AU, "LA_CAN_EVALUATE with a trailing byte", "LA_CAN_EVALUATE", u8(2) + b"\0")
    # BIO
    BI = "Messages"
    add(BI, "BIO with operation 0", "BIO", u8(0) + sstr(""))
    add(BI, "BIO with operation 6", "BIO", u8(6) + sstr(""))
    add(BI, "BIO enroll with an empty name", "BIO", u8(1) + sstr(""))
    add(BI, "BIO enroll with a 65-byte name", "BIO", u8(1) + sstr("f" * 65))
    add(BI, "BIO enroll with a tab in the name", "BIO", u8(1) + sstr("a\tb"))
    add(BI, "BIO enroll with a non-ASCII name", "BIO", u8(1) + sstr("d\u00e9"))
    add(BI, "BIO remove with a space in the name", "BIO", u8(2) + sstr("a b"))
    add(BI, "BIO present an unknown finger with a name", "BIO", u8(4) + sstr("x"))
    add(BI, "BIO status with a trailing byte", "BIO", u8(5) + sstr("") + b"\0")
    # PASSCODE_SYNC, ESCROW, BACKUP
    add("Passcode sync", "PASSCODE_SYNC with operation 2", "PASSCODE_SYNC", u8(2))
    add("Passcode sync", "PASSCODE_SYNC sync without the previous passcode", "PASSCODE_SYNC", u8(1))
    add("Passcode sync", "PASSCODE_SYNC query with a trailing byte", "PASSCODE_SYNC", u8(0) + b"\0")
    add("Escrow", "ESCROW with operation 0", "ESCROW", u8(0))
    add("Escrow", "ESCROW with operation 4", "ESCROW", u8(4))
    add("Escrow", "ESCROW unlock without a secret", "ESCROW", u8(2))
    add("Escrow", "ESCROW revoke without a passcode", "ESCROW", u8(3))
    add("Escrow", "ESCROW create with a trailing byte", "ESCROW", u8(1) + b"\0")
    add("Backups", "BACKUP with operation 0", "BACKUP", u8(0) + sstr("/tmp/x") + blob(b"p"))
    add("Backups", "BACKUP with operation 4", "BACKUP", u8(4) + sstr("/tmp/x") + blob(b"p"))
    add("Backups", "BACKUP with a relative path", "BACKUP", u8(1) + sstr("x.cfbu") + blob(b"p"))
    add("Backups", "BACKUP with an empty path", "BACKUP", u8(3) + sstr("") + blob(b"p"))
    add("Backups", "BACKUP without a password", "BACKUP", u8(1) + sstr("/tmp/x"))
    # CHECK
    CK = "Checking the keychain"
    add(CK, "CHECK with operation 0", "CHECK", u8(0) + blob(b""))
    add(CK, "CHECK with operation 5", "CHECK", u8(5) + blob(b""))
    add(CK, "CHECK restore with a 15-byte reference", "CHECK", u8(4) + blob(b"r" * 15))
    add(CK, "CHECK restore without a reference", "CHECK", u8(4) + blob(b""))
    add(CK, "CHECK list with a reference", "CHECK", u8(3) + blob(b"r" * 16))
    add(CK, "CHECK quarantine with a reference", "CHECK", u8(2) + blob(b"r" * 16))
    add(CK, "CHECK with a trailing byte", "CHECK", u8(1) + blob(b"") + b"\0")
    add(CK, "CHECK without a reference blob", "CHECK", u8(1))
    add(CK, "CHECK_PAGE with operation 0", "CHECK_PAGE", u8(0) + u64(0))
    add(CK, "CHECK_PAGE with operation 4", "CHECK_PAGE", u8(4) + u64(0))
    add(CK, "CHECK_PAGE with a trailing byte", "CHECK_PAGE", u8(1) + u64(0) + b"\0")
    add(CK, "CHECK_PAGE whose cursor is cut short", "CHECK_PAGE", u8(1) + b"\0" * 4)
    # KEY_CREATE
    KC = "Keys"
    kattrs = encode_attributes({"labl": S("k"), "type": I(2100)})
    add(KC, "KEY_CREATE with operation 0", "KEY_CREATE", u8(0) + kattrs + blob(b"") + u8(0))
    add(KC, "KEY_CREATE with operation 3", "KEY_CREATE", u8(3) + kattrs + blob(b"") + u8(0))
    add(KC, "KEY_CREATE asking for the private half", "KEY_CREATE", u8(1) + kattrs + blob(b"") + u8(R_DATA | R_ATTRS))
    add(KC, "KEY_CREATE with return flag 0x08", "KEY_CREATE", u8(1) + kattrs + blob(b"") + u8(0x08))
    add(KC, "KEY_CREATE generate given a key", "KEY_CREATE", u8(1) + kattrs + blob(b"k") + u8(0))
    add(KC, "KEY_CREATE import without a key", "KEY_CREATE", u8(2) + kattrs + blob(b"") + u8(0))
    add(KC, "KEY_CREATE with a trailing byte", "KEY_CREATE", u8(1) + kattrs + blob(b"") + u8(0) + b"\0")
    # PORTAL_SECRET
    PS = "Portal secrets"
    for label, app in (("two elements", "org.example"), ("an element starting with a digit", "org.1example.App"),
                       ("an empty element", "org..App"), ("a space", "org.ex ample.App"),
                       ("a trailing dot", "org.example.App."), ("a slash", "org.example/x.App"),
                       ("256 bytes", "org.example." + "a" * 244), ("no text", "")):
        add(PS, "PORTAL_SECRET for an app id with %s" % label, "PORTAL_SECRET", sstr(app))
    add(PS, "PORTAL_SECRET with a trailing byte", "PORTAL_SECRET", sstr("org.example.App") + b"\0")
    # SYNC_*
    SY = "Sync"
    add(SY, "SYNC_SETUP with operation 0", "SYNC_SETUP", u8(0) + sstr("/srv/k.git") + sstr("laptop"))
    add(SY, "SYNC_SETUP with an empty remote", "SYNC_SETUP", u8(1) + sstr("") + sstr("laptop"))
    add(SY, "SYNC_SETUP with a 4097-byte remote", "SYNC_SETUP", u8(1) + sstr("/" + "r" * 4096) + sstr("laptop"))
    add(SY, "SYNC_SETUP with a 65-byte device name", "SYNC_SETUP", u8(1) + sstr("/srv/k.git") + sstr("d" * 65))
    add(SY, "SYNC_SETUP with DEL in the device name", "SYNC_SETUP", u8(1) + sstr("/srv/k.git") + sstr("lap\x7ftop"))
    add(SY, "SYNC_SETUP with a tab in the remote", "SYNC_SETUP", u8(2) + sstr("/srv/\tk.git") + sstr("laptop"))
    add(SY, "SYNC_SETUP with a trailing byte", "SYNC_SETUP", u8(1) + sstr("/srv/k.git") + sstr("laptop") + b"\0")
    add(SY, "SYNC_CIRCLE with operation 0", "SYNC_CIRCLE", u8(0) + sstr(""))
    add(SY, "SYNC_CIRCLE with operation 5", "SYNC_CIRCLE", u8(5) + sstr(""))
    add(SY, "SYNC_CIRCLE remove without a device", "SYNC_CIRCLE", u8(2) + sstr(""))
    add(SY, "SYNC_CIRCLE remove with a 65-byte argument", "SYNC_CIRCLE", u8(2) + sstr("d" * 65))
    add(SY, "SYNC_CIRCLE circle with an argument", "SYNC_CIRCLE", u8(4) + sstr("x"))
    add(SY, "SYNC_CIRCLE approve with a newline in the code", "SYNC_CIRCLE", u8(1) + sstr("AB\nCD"))
    add(SY, "SYNC_STATUS with operation 3", "SYNC_STATUS", u8(3))
    add(SY, "SYNC_STATUS without an operation", "SYNC_STATUS", b"")
    add(SY, "SYNC_STATUS with a trailing byte", "SYNC_STATUS", u8(1) + b"\0")
    add(SY, "SYNC_CONFLICTS with operation 0", "SYNC_CONFLICTS", u8(0))
    add(SY, "SYNC_CONFLICTS restore with a 65-byte id", "SYNC_CONFLICTS", u8(2) + sstr("c" * 65))
    add(SY, "SYNC_CONFLICTS list with an id", "SYNC_CONFLICTS", u8(1) + sstr("x"))
    # SUBSCRIBE_EVENTS
    for t in (0, 8, 0x10, 0x80, 0xFF):
        add("Events", "SUBSCRIBE_EVENTS with topics 0x%02x" % t, "SUBSCRIBE_EVENTS", u8(t))
    add("Events", "SUBSCRIBE_EVENTS without topics", "SUBSCRIBE_EVENTS", b"")
    add("Events", "SUBSCRIBE_EVENTS with two bytes", "SUBSCRIBE_EVENTS", u8(1) + u8(1))
    # FILES
    FI = "Protected directories"
    add(FI, "FILES with operation 0", "FILES", u8(0))
    add(FI, "SESSION with event 0", "SESSION", u8(0))
    add(FI, "SESSION with event 3", "SESSION", u8(3))
    add(FI, "SESSION without its event", "SESSION", b"")
    DI = "Delegated identity"
    for op in (0, 6, 0xFF):
        add(DI, "NOTE_ACCESS with operation %d" % op, "NOTE_ACCESS", u8(op))
    add(DI, "NOTE_ACCESS without its operation", "NOTE_ACCESS", b"")
    add(DI, "NOTE_ACCESS with two bytes", "NOTE_ACCESS", u8(2) + u8(0))
    add(FI, "FILES with operation 6", "FILES", u8(6))
    add(FI, "FILES drop part without its fields", "FILES", u8(5))
    for label, path in (("a relative path", "d"), ("a trailing slash", "/d/"), ("an empty component", "/a//d"),
                        ("a . component", "/a/./d"), ("a .. component", "/a/../d"), ("a NUL", "/a\0d"),
                        ("4096 bytes", "/" + "p" * 4095), ("an empty path", "")):
        add(FI, "FILES protect with %s" % label, "FILES", u8(1) + sstr(path) + u8(1))
    add(FI, "FILES status with a relative path", "FILES", u8(2) + sstr("d"))
    add(FI, "FILES protect with class 0", "FILES", u8(1) + sstr("/d") + u8(0))
    add(FI, "FILES protect with class 5", "FILES", u8(1) + sstr("/d") + u8(5))
    add(FI, "FILES lock all with a trailing byte", "FILES", u8(3) + b"\0")
    for label, name in (("a slash", "a/b"), (".", "."), ("..", ".."), ("an empty name", ""),
                        ("256 bytes", "f" * 256), ("a NUL", "a\0b")):
        add(FI, "FILES drop with a file name of %s" % label, "FILES", u8(4) + sstr("/d") + sstr(name) + blob(b"hi"))
    add(FI, "FILES drop with 196097 bytes", "FILES", u8(4) + sstr("/d") + sstr("n") + blob(b"c" * 196097))
    part = lambda final, contents: u8(5) + sstr("/d") + sstr("n") + bytes(range(16)) + u32(0) + u8(final) + blob(contents)
    add(FI, "FILES drop part with final 2", "FILES", part(2, b"hi"))
    add(FI, "FILES drop part with 196097 bytes", "FILES", part(1, b"c" * 196097))
    add(FI, "FILES drop part with a 15-byte drop id", "FILES", u8(5) + sstr("/d") + sstr("n") + bytes(15))
    for label, name in (("a slash", "a/b"), ("an empty name", "")):
        add(FI, "FILES drop part with a file name of %s" % label, "FILES",
            u8(5) + sstr("/d") + sstr(name) + bytes(range(16)) + u32(0) + u8(1) + blob(b"hi"))
    # HELLO
    add("Connection lifecycle", "a second HELLO", "HELLO", u16(1) + u16(4) + sstr("again"))
    return L


def run_malformed(L):
    R = L.R
    LC = "Connection lifecycle"
    before = L.item_count()
    for version in (3, 4):
        c = L.conn(1, version)
        rid = 0x5000 + version * 0x1000
        for section, desc, code, payload in malformed_cases(version):
            rid += 1
            frame = frame_bytes(code, rid, payload)
            if len(frame) - 4 > c.max_frame:
                continue
            try:
                c.send_raw(frame + frame_bytes(REQUESTS["STATUS"], rid + 0x800, b""))
                r1 = c.read_reply(timeout=10)
                r2 = c.read_reply(timeout=10)
                ok = (r1.name == "ERROR" and r1["status"] == errSecParam and r1.rid == rid and r1["message"] != ""
                      and r2.name == "STATUS_REPLY" and r2.rid == rid + 0x800)
                L.M(section, "%s (v%d): ERROR -50 with its id, a message, and the connection stays" % (desc, version), ok,
                    "%r then %r" % (r1, r2))
            except (Closed, OSError, TimeoutError, Malformed) as e:
                L.M(section, "%s (v%d): ERROR -50 with its id, a message, and the connection stays" % (desc, version), False,
                    "%s: %s" % (type(e).__name__, e))
                c.close()
                c = L.conn(1, version)
        c.close()
    # Messages: undefined type values and reply types are malformed.
    c = L.conn()
    codes = [t for t in range(256) if t not in REQUESTS.values()]
    for i in range(0, len(codes), 16):
        batch = codes[i:i + 16]
        c.send_raw(b"".join(frame_bytes(t, 0x7000 + t, b"") for t in batch))
        for t in batch:
            try:
                rep = c.read_reply(timeout=10)
                kind = "reply type" if t in REPLIES.values() else "undefined type"
                L.M("Messages", "%s 0x%02x as a request: ERROR -50 with its id" % (kind, t),
                    rep.name == "ERROR" and rep["status"] == errSecParam and rep.rid == 0x7000 + t, repr(rep))
            except (Closed, OSError, TimeoutError, Malformed) as e:
                L.M("Messages", "type 0x%02x as a request: ERROR -50 with its id" % t, False, str(e))
                c.close()
                c = L.conn()
    L.M("Messages", "the connection stays open after every undefined type", L.answers(c))
    c.close()
    L.M("Connection lifecycle", "malformed requests changed nothing (the item count)", L.item_count() == before)

    # Test vectors: the request vectors with outcome error -50, sent after HELLO and as a first frame.
    for v in spec_vectors(L.args.spec):
        if v.get("direction") != "request":
            continue
        frame = bytes.fromhex(v["frame"])
        name = v["name"]
        if len(frame) < 9:
            continue
        code = frame[4]
        rid = struct.unpack(">I", frame[5:9])[0]
        if v["outcome"].startswith("error"):
            delegate = code == REQUESTS["DELEGATE"]
            c = L.conn(1, 3)
            try:
                c.send_raw(frame)
                rep = c.read_reply(timeout=10)
                good = rep.name == "ERROR" and rep["status"] == errSecParam and rep.rid == rid
                if delegate:
                    # Delegated identity: a DELEGATE whose body does not decode gets -50, then the agent closes.
                    L.M("Delegated identity", "vector %r after HELLO: ERROR -50, then the agent closes" % name,
                        good and c.is_closed(3), repr(rep))
                else:
                    L.M(LC, "vector %r after HELLO: ERROR -50 with its id and the connection stays" % name,
                        good and L.answers(c), repr(rep))
            except (Closed, OSError, TimeoutError, Malformed) as e:
                L.M(LC, "vector %r after HELLO: ERROR -50" % name, False, str(e))
            c.close()
        # Connection lifecycle rule 1: any first frame but an acceptable HELLO gets ERROR -50, then a close.
        if v["outcome"] == "close":
            continue
        if code == REQUESTS["HELLO"] and v["outcome"] == "ok" and "min 2 above max 1" not in name:
            continue
        c = L.raw()
        try:
            c.send_raw(frame)
            rep = c.read_frame(timeout=10)
            L.M(LC, "vector %r as the first frame: ERROR -50 with its id, then the agent closes" % name,
                rep.name == "ERROR" and rep["status"] == errSecParam and rep.rid == rid and c.is_closed(3), repr(rep))
        except (Closed, OSError, TimeoutError, Malformed) as e:
            L.M(LC, "vector %r as the first frame: ERROR -50 with its id, then the agent closes" % name, False, str(e))
        c.close()
    run_framing_errors(L)
    run_refused_but_open(L)


def closes_without_reply(c, timeout):
    """Frames: the receiver closes at once, no reply."""
    try:
        rep = c.read_frame(timeout=timeout)
        return False, "got %r" % rep
    except Closed:
        return True, ""
    except TimeoutError:
        return False, "still open after %.1f s" % timeout
    except Malformed as e:
        return False, str(e)


def run_framing_errors(L):
    FR = "Frames"
    quick = min(1.0, L.args.frame_deadline / 2.0)
    for version, lengths in ((3, (0, 1, 4, MAX_FRAME_SMALL + 1, 0xFFFFFFFF)),
                             (4, (0, 3, MAX_FRAME_LARGE + 1, 0x7FFFFFFF, 0xFFFFFFFF))):
        for n in lengths:
            c = L.conn(1, version)
            c.send_raw(u32(n))      # only the length: the agent must not wait for a body
            ok, why = closes_without_reply(c, quick)
            L.M(FR, "length %d at version %d: closed at once without a reply, before any body" % (n, version), ok, why)
            c.close()
    # before HELLO the limit is 256 KiB
    c = L.raw()
    c.send_raw(u32(MAX_FRAME_SMALL + 1))
    ok, why = closes_without_reply(c, quick)
    L.M(FR, "a first frame of length 262145: closed at once without a reply", ok, why)
    c.close()
    # the vectors whose outcome is close, whole and by their length prefix only
    for v in spec_vectors(L.args.spec):
        if v.get("outcome") != "close":
            continue
        frame = bytes.fromhex(v["frame"])
        for label, data in (("whole", frame), ("its length only", frame[:4])):
            c = L.conn(1, 3)
            c.send_raw(data)
            ok, why = closes_without_reply(c, quick)
            L.M("Test vectors", "vector %r (%s) after HELLO: closed without a reply" % (v["name"], label), ok, why)
            c.close()
    # a version-3 HELLO with a larger frame right behind it in one write
    c = L.raw()
    c.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 3, "client": "x"}) + u32(MAX_FRAME_SMALL + 1))
    rep = c.read_frame(timeout=10)
    ok, why = closes_without_reply(c, quick)
    L.M(FR, "HELLO 1...3 then a 262145-byte length: HELLO_REPLY, then a close without a reply",
        rep.name == "HELLO_REPLY" and rep["version"] == 3 and ok, "%r %s" % (rep, why))
    c.close()


def run_refused_but_open(L):
    """Connection lifecycle, rule 3's table: a well-formed request that fails gets ERROR and stays open."""
    LC = "Connection lifecycle"
    cases = [
        ("COPY_MATCHING", {"query": query(GENP, {"svce": S(L.svc("none"))}, flags=R_ATTRS)}, errSecItemNotFound,
         "a search that finds nothing"),
        ("PORTAL_SECRET", {"app": "org.example.App"}, errSecMissingEntitlement, "PORTAL_SECRET from an unentitled caller"),
        ("SUBSCRIBE_EVENTS", {"topics": 2}, errSecMissingEntitlement, "SUBSCRIBE_EVENTS to item changes, unentitled"),
        ("PROMPT_UNLOCK", {}, errSecMissingEntitlement, "PROMPT_UNLOCK on a connection that was not delegated"),
        ("PROMPT_READ", {"query": query(GENP, {"svce": S("m")}, limit=LIMIT_ONE, flags=R_DATA)}, errSecMissingEntitlement,
         "PROMPT_READ on a connection that was not delegated"),
        ("AUTHORIZE", {"group": "mail", "passcode": b"x"}, errSecMissingEntitlement, "AUTHORIZE from a caller that is not the shell helper"),
        ("ADD", {"cls": INET, "attrs": {"svce": S("x")}, "secret": b"s", "flags": 0}, errSecParam,
         "ADD of an attribute of another class"),
        ("COPY_MATCHING", {"query": query(0, {"@port": I(443)}, flags=R_ATTRS)}, errSecParam,
         "a general attribute with an integer value"),
        ("DELETE", {"query": query(GENP, {"svce": S(L.svc("none"))})}, errSecItemNotFound, "DELETE that matches nothing"),
        ("UPDATE", {"query": query(GENP, {"svce": S(L.svc("none"))}), "changes": {"labl": S("x")}}, errSecItemNotFound,
         "UPDATE that matches nothing"),
        ("COPY_MATCHING", {"query": query(GENP, {"agrp": S("org.example.other")}, flags=R_ATTRS)}, errSecMissingEntitlement,
         "a query naming another access group"),
    ]
    for version in (1, 4):
        c = L.conn(1, version)
        for name, m, status, desc in cases:
            rep = c.request(name, m)
            L.M(LC, "%s (v%d): ERROR %d and the connection stays" % (desc, version, status),
                rep.name == "ERROR" and rep["status"] == status and L.answers(c), repr(rep))
        # an AUTH_RESPONSE that answers nothing: no reply; stays open
        c.send_raw(encode_frame("AUTH_RESPONSE", 77, {"kind": 0}) + encode_frame("STATUS", 78))
        rep = c.read_reply(timeout=10)
        L.M(LC, "an AUTH_RESPONSE that answers nothing (v%d): no reply, and the next request is answered" % version,
            rep.name == "STATUS_REPLY" and rep.rid == 78, repr(rep))
        c.close()



# ---------------------------------------------------------------------------------------------------
# Part 2: end to end

FEEDBACK = ("AUTH_FEEDBACK", "AUTH_FEEDBACK_KIND")


def talk(c, name, m=None, answers=(), query_flags=None, timeout=60):
    """Sends one request and answers its Authentication conversation: each AUTH_NEEDED, AUTH_FEEDBACK
    (version 1) and AUTH_FEEDBACK_KIND kind 1 takes the next answer of `answers` (AUTH_RESPONSE
    fields; none left: no answer). Returns (the frames of the conversation, the final reply)."""
    seen = []
    todo = list(answers)

    def cb(conn, rid, rep):
        seen.append(rep)
        due = rep.name in ("AUTH_NEEDED", "AUTH_FEEDBACK") or (rep.name == "AUTH_FEEDBACK_KIND" and rep["kind"] == 1)
        if due and todo:
            return todo.pop(0)
        return None
    final = c.request(name, m, auth=cb, query_flags=query_flags, timeout=timeout)
    return seen, final


def PW(pw):
    return {"kind": 1, "secret": pw}


def AP(pw):
    return {"kind": 4, "secret": pw}


CANCEL = {"kind": 0}
WAIT_BIO = {"kind": 2}
FALLBACK = {"kind": 3}


def vector_frame(L, name):
    """The frame of the spec's vector called `name`."""
    for v in spec_vectors(L.args.spec):
        if v.get("name") == name:
            return bytes.fromhex(v["frame"])
    raise KeyError("no vector named %r" % name)


def replay(L, c, name, timeout=30):
    """Sends the vector's frame on `c` and returns the reply (events kept aside)."""
    c.send_raw(vector_frame(L, name))
    return c.read_reply(timeout=timeout)


def e2e_vectors_live(L):
    """Test vectors: the request vectors replayed on a live agent, in the order a client would send them."""
    TV = "Test vectors"
    c = L.conn(1, 3)
    r = replay(L, c, "add genp svce=mail acct=alice secret \"pw\", no return flags")
    L.E(TV, "live 'add genp svce=mail acct=alice': ITEMS with no item (or -25299 if it exists)",
        (r.name == "ITEMS" and r["items"] == []) or L.is_err(r, errSecDuplicateItem), repr(r))
    r = replay(L, c, "copy-matching genp svce=mail acct=alice, limit one, return data")
    L.E(TV, "live 'copy-matching ... limit one, return data': ITEMS with the secret pw and the vector's id",
        r.name == "ITEMS" and r.rid == 5 and [i.get("data") for i in r["items"]] == [b"pw"], repr(r))
    r = replay(L, c, "copy-matching-page genp svce=mail acct=alice, limit all, return attributes, first page")
    L.E(TV, "live 'copy-matching-page ... first page': ITEMS_PAGE with alice's attributes, nextCursor 0",
        r.name == "ITEMS_PAGE" and r["next"] == 0 and [i["attrs"].get("acct") for i in r["items"]] == [S("alice")], repr(r))
    r = replay(L, c, "copy-matching-page, the same query, next page after cursor 42")
    L.kind(TV, "live 'copy-matching-page ... after cursor 42': ITEMS_PAGE (any cursor is accepted)", r, "ITEMS_PAGE")
    r = replay(L, c, "copy-matching genp svce=mail, limit all, return flags 0")
    L.E(TV, "live 'copy-matching genp svce=mail, return flags 0': one bare item per match",
        r.name == "ITEMS" and r["items"] and all(i["present"] == 0 and i["cls"] == GENP for i in r["items"]), repr(r))
    r = replay(L, c, "copy-matching genp svce=mail, limit count 3, return attributes")
    L.E(TV, "live 'copy-matching ... limit count 3': ITEMS with at most 3", r.name == "ITEMS" and 1 <= len(r["items"]) <= 3, repr(r))
    r = replay(L, c, "update genp svce=mail, limit all: set labl=work and secret \"new\"")
    L.E(TV, "live 'update genp svce=mail: labl=work, secret new': COUNT of the matches", r.name == "COUNT" and r["n"] >= 1, repr(r))
    r = replay(L, c, "update genp svce=mail, limit all: set pdmn=ck, keep the secret")
    L.E(TV, "live 'update genp svce=mail: pdmn=ck': COUNT", r.name == "COUNT" and r["n"] >= 1, repr(r))
    r = c.copy(query(GENP, {"svce": S("mail"), "acct": S("alice")}, limit=LIMIT_ONE, flags=R_DATA | R_ATTRS))
    L.E(TV, "... alice's item now has labl work, pdmn ck and the secret new",
        r.name == "ITEMS" and r["items"][0]["data"] == b"new" and r["items"][0]["attrs"].get("labl") == S("work") and
        r["items"][0]["attrs"].get("pdmn") == S("ck"), repr(r))
    r = replay(L, c, "delete genp svce=mail, limit all")
    L.E(TV, "live 'delete genp svce=mail': COUNT", r.name == "COUNT" and r["n"] >= 1, repr(r))
    L.err(TV, "live 'delete any class svce=mail' after it: -25300", replay(L, c, "delete any class svce=mail, limit all"),
          errSecItemNotFound)
    r = replay(L, c, "add genp svce=web with general attributes xdg:schema=org.example.Password and user=alice, secret \"pw\", no return flags")
    L.E(TV, "live 'add genp svce=web with general attributes': ITEMS (or -25299 if it exists)",
        r.name == "ITEMS" or L.is_err(r, errSecDuplicateItem), repr(r))
    r = replay(L, c, "copy-matching any class by two general attributes (xdg:schema, user), limit all, return data and attributes")
    L.E(TV, "live 'copy-matching any class by two general attributes': ITEMS with that item, its data pw",
        r.name == "ITEMS" and any(i["data"] == b"pw" and i["attrs"].get("svce") == S("web") for i in r["items"]), repr(r))
    r = replay(L, c, "update genp svce=web, limit all: general attributes none (@ alone, the empty string)")
    after = c.copy(query(GENP, {"svce": S("web")}, flags=R_ATTRS))
    L.E(TV, "live 'update genp svce=web: general attributes none': COUNT, and the items keep no general attribute",
        r.name == "COUNT" and after.name == "ITEMS" and not any(n.startswith("@") for i in after["items"] for n in i["attrs"]),
        "%r %r" % (r, after))
    r = replay(L, c, "add keys item with attributes of every type (atag data, kcls integer, klbl data, labl string \"kéy\", perm bool, sdat date 1700000000.5), secret \"k\", return attributes and persistent reference")
    ok = r.name == "ITEMS" and len(r["items"]) == 1
    a = r["items"][0]["attrs"] if ok else {}
    L.E(TV, "live 'add keys item with attributes of every type': the attributes of the reply vector (agrp unsigned, "
        "pdmn ak, sync false, the given ones) and a 16-byte reference",
        ok and a.get("agrp") == S(L.default_group) and a.get("pdmn") == S("ak") and a.get("sync") == B(False) and
        a.get("labl") == S("k\u00e9y") and a.get("sdat") == T(1700000000.5) and a.get("perm") == B(True) and
        a.get("kcls") == I(1) and a.get("klbl") == D(b"\xff") and a.get("atag") == D(b"\x01\x02") and
        len(r["items"][0]["pref"]) == 16 and r["items"][0]["present"] == R_ATTRS | R_REF, repr(r) + repr(a))
    if not os.path.exists("/d"):
        L.err(TV, "live 'files protect /d class complete' where /d does not exist: -25300",
              replay(L, c, "files protect /d class complete"), errSecItemNotFound)
    c.close()


def e2e_no_passcode(L):
    """The state of a fresh agent, then SET_PASSCODE (or UNLOCK when a passcode is already set)."""
    st = L.status()
    L.fresh = st["passcode_set"] == 0
    ER = "Errors"
    if not L.fresh:
        L.E("Status", "an agent with a passcode opens with it (UNLOCK)", L.unlock().name == "OK")
        return
    L.E("Status", "without a passcode the keybag is unlocked (lockState 2)", st["lock"] == 2, st.f)
    with L.conn() as c:
        L.err(ER, "UNLOCK while no passcode is set: -25291", c.request("UNLOCK", {"passcode": L.pw}), errSecNotAvailable)
        L.err(ER, "LOCK while no passcode is set: -25291", c.request("LOCK"), errSecNotAvailable)
        L.err(ER, "REMOVE_PASSCODE while no passcode is set: -25291", c.request("REMOVE_PASSCODE", {"current": L.pw}),
              errSecNotAvailable)
        L.err(ER, "PASSCODE_SYNC sync while not out of sync: -25291",
              c.request("PASSCODE_SYNC", {"op": 1, "previous": L.pw}), errSecNotAvailable)
        L.err(ER, "SET_PASSCODE with a current passcode while none is set: -50",
              c.request("SET_PASSCODE", {"current": b"x", "new": L.pw}), errSecParam)
        L.err(ER, "SET_PASSCODE with an empty new passcode: -50", c.request("SET_PASSCODE", {"current": b"", "new": b""}),
              errSecParam)
        rep = c.request("SET_PASSCODE", {"current": b"", "new": L.pw + b"-not-the-login-password"}, timeout=120)
        L.err(ER, "SET_PASSCODE whose new passcode PAM refuses: -25293", rep, errSecAuthFailed)
        L.failed_attempt()
        r = replay(L, c, "set first passcode \"pw\"", timeout=120)
        L.err("Test vectors", "live 'set first passcode \"pw\"' (PAM refuses pw): -25293", r, errSecAuthFailed)
        L.failed_attempt()
        r = replay(L, c, "set-passcode: change \"old\" to \"new\"", timeout=120)
        L.err("Test vectors", "live 'set-passcode: change old to new' while no passcode is set: -50", r, errSecParam)
        L.err(ER, "ADD with pdmn akpu while no passcode is set: -25291",
              c.add(GENP, {"svce": S(L.svc("akpu0")), "pdmn": S("akpu")}, b"s"), errSecNotAvailable)
        # the vector "add genp svce=mail pdmn=ak with an access control": -25291 while no passcode is set
        c.send_raw(bytes.fromhex("0000003c06000000130100030004616363630300000006010101040700000470646d6e0100000002616b"
                                 "00047376636501000000046d61696c00000002707700"))
        L.err("Test vectors", "vector 'add ... with an access control' while no passcode is set: -25291",
              c.read_reply(), errSecNotAvailable)
        L.err(ER, "ADD with an access control and pdmn aku while no passcode is set: -25291",
              c.add(GENP, {"svce": S(L.svc("accc0")), "accc": D(accc([4])), "pdmn": S("aku")}, b"s"), errSecNotAvailable)
        for policy in (2,):
            rep = c.request("LA_CAN_EVALUATE", {"policy": policy})
            L.E("Authentication", "LA_CAN_EVALUATE device owner without a passcode: passcodeNotSet (-5)",
                rep.name == "LA_RESULT" and rep["code"] == -5, repr(rep) + str(rep.f))
            seen, rep = talk(c, "LA_EVALUATE", {"policy": policy, "reason": "no passcode"}, [CANCEL])
            L.E("Authentication", "LA_EVALUATE device owner without a passcode: passcodeNotSet (-5), no AUTH_NEEDED",
                rep.name == "LA_RESULT" and rep["code"] == -5 and not seen, "%r %r" % (seen, rep))
        L.E("Status", "a refused SET_PASSCODE leaves no passcode", c.status()["passcode_set"] == 0)
        other = L.conn()
        L.kind("Events", "SUBSCRIBE: OK", other.request("SUBSCRIBE"), "OK")
        L.kind("Events", "SUBSCRIBE on the connection that sets the passcode: OK", c.request("SUBSCRIBE"), "OK")
        rid = c.send("SET_PASSCODE", {"current": b"", "new": L.pw})
        first = c.read_frame(timeout=120)
        second = c.read_frame(timeout=120)
        L.E("Events", "SET_PASSCODE: its own subscriber reads EVENT unlocked, then OK",
            first.name == "EVENT" and first["kind"] == 3 and second.name == "OK" and second.rid == rid,
            "%r %r" % (first, second))
        ev = other.read_frame(timeout=10)
        L.E("Events", "SET_PASSCODE: another subscriber gets EVENT unlocked (id 0, u32 0)",
            ev.name == "EVENT" and ev["kind"] == 3 and ev.rid == 0 and ev["grace"] == 0, repr(ev))
        L.failures_in_a_row = 0
        st = c.status()
        L.E("Status", "after SET_PASSCODE: passcodeSet 1 and unlocked (2)", st["passcode_set"] == 1 and st["lock"] == 2, st.f)
        rep = c.request("LA_CAN_EVALUATE", {"policy": 2})
        L.E("Authentication", "LA_CAN_EVALUATE device owner with a passcode: 0",
            rep.name == "LA_RESULT" and rep["code"] == 0 and rep["biometry"] == 0 and rep["domain"] == b"", rep.f)
        other.close()


def e2e_hello(L):
    V, LC = "Versioning", "Connection lifecycle"
    for lo, hi, want in ((1, 1, 1), (1, 2, 2), (1, 3, 3), (1, 4, 4), (2, 2, 2), (3, 3, 3), (4, 4, 4), (2, 4, 4),
                         (1, 9, 4), (3, 65535, 4), (4, 100, 4), (2, 3, 3), (0, 1, 1), (0, 65535, 4)):
        c = L.raw()
        rid = int.from_bytes(os.urandom(4), "big")
        rep = c.request("HELLO", {"min": lo, "max": hi, "client": "v"}, rid=rid)
        L.E(V, "HELLO %d...%d: HELLO_REPLY with version %d (the highest in both ranges) and the request id" % (lo, hi, want),
            rep.name == "HELLO_REPLY" and rep["version"] == want and rep.rid == rid, "%r %s" % (rep, rep.f))
        L.E(LC, "HELLO %d...%d: the connection then serves requests" % (lo, hi), L.answers(c))
        c.close()
    for lo, hi in ((5, 9), (0, 0), (2, 1), (4, 3), (65535, 65535), (5, 5), (4660, 4661)):
        c = L.raw()
        rep = c.request("HELLO", {"min": lo, "max": hi, "client": "v"}, rid=4242)
        L.E(LC, "HELLO %d...%d (no version the agent speaks): ERROR -50 with the request id, then a close" % (lo, hi),
            L.is_err(rep, errSecParam) and rep.rid == 4242 and c.is_closed(3), repr(rep))
        if lo == 4660:
            L.E(LC, "rule 4: the refusal of HELLO 4660...4661 quotes neither version number",
                "4660" not in rep["message"] and "4661" not in rep["message"], rep["message"])
        c.close()
    for name, want in (("hello", 1), ("hello announcing versions 1 to 2", 2), ("hello announcing versions 1 to 4", 4)):
        c = L.raw()
        r = replay(L, c, name)
        L.E("Test vectors", "live %r as the first frame: HELLO_REPLY version %d" % (name, want),
            r.name == "HELLO_REPLY" and r["version"] == want and r.rid == 1, repr(r))
        c.close()
    for rid in (0, 0xFFFFFFFF):
        c = L.raw()
        rep = c.request("HELLO", {"min": 1, "max": 4, "client": ""}, rid=rid)
        L.E("Frames", "HELLO with request id %d: the reply carries it" % rid, rep.name == "HELLO_REPLY" and rep.rid == rid)
        c.close()
    # names: any UTF-8, empty included
    for label, name in (("an empty client name", ""), ("a non-ASCII client name", "caf\u00e9 \U0001F510")):
        c = L.raw()
        L.kind(LC, "HELLO with %s: HELLO_REPLY" % label, c.request("HELLO", {"min": 1, "max": 4, "client": name}), "HELLO_REPLY")
        c.close()
    # Status: the agent's version string is the one HELLO_REPLY carries
    c = L.conn()
    L.E("Status", "STATUS_REPLY's agentVersion is HELLO_REPLY's", c.status()["agent"] == c.agent_version,
        "%r %r" % (c.status()["agent"], c.agent_version))
    rep = c.request("HELLO", {"min": 1, "max": 4, "client": "again"}, rid=99)
    L.E(LC, "a second HELLO: ERROR -50 with its id, and the connection stays", L.is_err(rep, errSecParam) and rep.rid == 99
        and L.answers(c), repr(rep))
    c.close()
    # Rule 2: requests right behind HELLO, answered in order
    c = L.raw()
    c.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "pipe"}) + encode_frame("STATUS", 2) +
               encode_frame("WHOAMI", 3) + encode_frame("PROTECTIONS", 4) + encode_frame("STATUS", 2))
    reps = [c.read_frame() for _ in range(5)]
    L.E(LC, "HELLO, STATUS, WHOAMI, PROTECTIONS, STATUS in one write: five replies in order with their ids",
        [(r.name, r.rid) for r in reps] == [("HELLO_REPLY", 1), ("STATUS_REPLY", 2), ("WHOAMI_REPLY", 3),
                                           ("PROTECTIONS_REPLY", 4), ("STATUS_REPLY", 2)], reps)
    c.close()
    # Rule 1: a bad first frame, and nothing sent behind it runs
    firsts = [
        ("STATUS", encode_frame("STATUS", 11)),
        ("AUTH_RESPONSE", encode_frame("AUTH_RESPONSE", 11, {"kind": 1, "secret": L.pw})),
        ("a reply type (OK)", frame_bytes(0x80, 11, b"")),
        ("an unknown type 0x42", frame_bytes(0x42, 11, b"")),
        ("a HELLO cut short", frame_bytes(1, 11, u16(1) + u16(4) + u16(5) + b"ab")),
        ("a HELLO with a trailing byte", frame_bytes(1, 11, u16(1) + u16(4) + sstr("x") + b"\0")),
        ("a HELLO whose name is not UTF-8", frame_bytes(1, 11, u16(1) + u16(4) + u16(2) + b"\xc3\x28")),
        ("a HELLO 5...9", encode_frame("HELLO", 11, {"min": 5, "max": 9, "client": "x"})),
        ("a HELLO 3...2", encode_frame("HELLO", 11, {"min": 3, "max": 2, "client": "x"})),
        ("an UNLOCK", encode_frame("UNLOCK", 11, {"passcode": L.pw})),
        ("a second-HELLO-sized frame of 262144 bytes", frame_bytes(1, 11, u16(1) + u16(4) + sstr("x") + b"\0" * (MAX_FRAME_SMALL - 12))),
    ]
    for i, (label, frame) in enumerate(firsts):
        svce = L.svc("after-bad-first-%d" % i)
        behind = encode_frame("ADD", 12, {"cls": GENP, "attrs": {"svce": S(svce)}, "secret": b"s", "flags": 0})
        c = L.raw()
        c.send_raw(frame + behind)
        try:
            rep = c.read_frame(timeout=10)
            ok = L.is_err(rep, errSecParam) and rep.rid == 11 and c.is_closed(3)
        except Closed:
            rep, ok = "closed without a reply", False
        L.E(LC, "%s as the first frame: ERROR -50 with its id, then a close" % label, ok, repr(rep))
        c.close()
        with L.conn() as d:
            L.err(LC, "%s as the first frame: the ADD behind it did not run" % label,
                  d.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS)), errSecItemNotFound)


def add_frame_exact(rid, svce, body_len, flags=0, extra_attrs=None):
    """An ADD whose body is exactly body_len bytes (its secret fills it)."""
    attrs = {"svce": S(svce)}
    attrs.update(extra_attrs or {})
    enc = encode_attributes(attrs)
    secret_len = body_len - (1 + 4 + 1 + len(enc) + 4 + 1)
    frame = encode_frame("ADD", rid, {"cls": GENP, "attrs": attrs, "secret": b"\x5a" * secret_len, "flags": flags})
    assert len(frame) == body_len + 4
    return frame, secret_len


def pattern(n, seed=7):
    return bytes((i * seed + (i >> 9)) & 0xFF for i in range(n))


def e2e_frames(L):
    FR, P = "Frames", "Paging"
    # version 3: a frame of exactly 256 KiB is read; one byte more closes (malformed part)
    c3 = L.conn(1, 3)
    frame, n = add_frame_exact(21, L.svc("exact-v3"), MAX_FRAME_SMALL)
    c3.send_raw(frame)
    rep = c3.read_reply()
    L.E(FR, "version 3: an ADD frame of exactly 262144 bytes is read and answered (ITEMS)", rep.name == "ITEMS", repr(rep))
    # ADD whose reply would not fit: -108, nothing added
    svce = L.svc("add-108")
    frame, n = add_frame_exact(22, svce, MAX_FRAME_SMALL, flags=R_DATA | R_ATTRS | R_REF)
    c3.send_raw(frame)
    L.err(P, "version 3: an ADD whose reply (data, attributes, reference) cannot fit one frame: -108",
          c3.read_reply(), errSecAllocate)
    L.err(P, "the ADD refused with -108 added nothing", c3.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS)),
          errSecItemNotFound)
    c3.close()

    c4 = L.conn(1, 4)
    L.E("Versioning", "HELLO 1...4: version 4", c4.version == 4)
    # version 4: frames above 256 KiB both ways
    frame, n = add_frame_exact(23, L.svc("v4-262145"), MAX_FRAME_SMALL + 1)
    c4.send_raw(frame)
    L.kind(FR, "version 4: an ADD frame of 262145 bytes is read and answered", c4.read_reply(), "ITEMS")
    big = pattern(MAX_SECRET)
    rep = c4.add(GENP, {"svce": S(L.svc("mib")), "acct": S("whole")}, big, R_DATA | R_ATTRS | R_REF)
    L.E(FR, "version 4: a secret of exactly 1 MiB is stored, and the ADD's reply (above 256 KiB) carries it back",
        rep.name == "ITEMS" and len(rep["items"]) == 1 and rep["items"][0].get("data") == big, repr(rep))
    rep = c4.copy(query(GENP, {"svce": S(L.svc("mib"))}, limit=LIMIT_ONE, flags=R_DATA))
    L.E(FR, "version 4: the 1 MiB secret reads back byte for byte", rep.name == "ITEMS" and rep["items"][0]["data"] == big,
        repr(rep))
    L.E(FR, "version 4: a reply frame above 256 KiB (the agent may send up to 1.5 MiB)", len(rep.raw) > MAX_FRAME_SMALL,
        len(rep.raw))
    rep = c4.add(GENP, {"svce": S(L.svc("mib")), "acct": S("over")}, big + b"!")
    L.err(FR, "version 4: a secret of 1 MiB + 1 byte: ERROR -50", rep, errSecParam)
    L.E(FR, "version 4: after the refused 1 MiB + 1 secret the connection stays", L.answers(c4))
    L.err(FR, "version 4: the 1 MiB + 1 secret was not stored",
          c4.copy(query(GENP, {"svce": S(L.svc("mib")), "acct": S("over")}, flags=R_ATTRS)), errSecItemNotFound)
    frame, n = add_frame_exact(24, L.svc("v4-max"), MAX_FRAME_LARGE)
    c4.send_raw(frame)
    rep = c4.read_reply()
    L.err(FR, "version 4: a frame of exactly 1572864 bytes is read (its secret over 1 MiB: ERROR -50)", rep, errSecParam)
    L.E(FR, "version 4: after the 1572864-byte frame the connection stays", L.answers(c4))
    # a second HELLO is refused and keeps the version (and so the frame limit)
    rep = c4.request("HELLO", {"min": 1, "max": 1, "client": "downgrade"})
    L.err("Connection lifecycle", "a second HELLO 1...1 on a version 4 connection: ERROR -50", rep, errSecParam)
    frame, n = add_frame_exact(25, L.svc("v4-after-second-hello"), MAX_FRAME_SMALL + 100)
    c4.send_raw(frame)
    L.kind(FR, "after a refused second HELLO the version stays 4 (a 262244-byte frame is read)", c4.read_reply(), "ITEMS")
    c4.close()

    # the frame after a version 4 HELLO may be large, even before HELLO_REPLY was read
    c = L.raw()
    frame, n = add_frame_exact(26, L.svc("behind-hello-4"), MAX_FRAME_SMALL + 1)
    c.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "x"}) + frame)
    r1 = c.read_frame()
    if r1.name == "HELLO_REPLY":
        c.accept_hello(r1)
    r2 = c.read_reply()
    L.E(FR, "a 262145-byte frame right behind a version 4 HELLO (the frame after it) is read",
        r1.name == "HELLO_REPLY" and r2.name == "ITEMS", "%r %r" % (r1, r2))
    c.close()

    # version 3 connections meet version 4 items: -108 when an item's turn comes
    c4 = L.conn(1, 4)
    c3 = L.conn(1, 3)
    q = query(GENP, {"svce": S(L.svc("mib"))}, flags=R_DATA)
    L.err(P, "version 3: COPY_MATCHING of a 1 MiB secret with its data: -108", c3.copy(q), errSecAllocate)
    L.err(P, "version 3: COPY_MATCHING_PAGE of a 1 MiB secret with its data: -108", c3.page(q), errSecAllocate)
    q = query(GENP, {"svce": S(L.svc("mib"))}, flags=R_ATTRS | R_REF)
    rep = c3.copy(q)
    L.E(P, "version 3: the same item without its data is listed", rep.name == "ITEMS" and len(rep["items"]) == 1, repr(rep))

    # the exact per-page limit: an item encoding of MAX_FRAME - 17 bytes fits a page, one byte more does not
    fit, over = L.svc("page-fit"), L.svc("page-over")
    room = MAX_FRAME_SMALL - 17 - 6           # item: class, present, u32 length, data
    L.kind(P, "version 4: ADD of a %d-byte secret" % room, c4.add(GENP, {"svce": S(fit)}, pattern(room)), "ITEMS")
    L.kind(P, "version 4: ADD of a %d-byte secret" % (room + 1), c4.add(GENP, {"svce": S(over)}, pattern(room + 1)), "ITEMS")
    rep = c3.page(query(GENP, {"svce": S(fit)}, flags=R_DATA))
    L.E(P, "version 3: an item whose encoding is exactly MAX_FRAME - 17 bytes fits one ITEMS_PAGE (262144-byte frame)",
        rep.name == "ITEMS_PAGE" and len(rep["items"]) == 1 and len(rep.raw) == MAX_FRAME_SMALL, repr(rep))
    rep = c3.copy(query(GENP, {"svce": S(fit)}, flags=R_DATA))
    L.E(P, "version 3: COPY_MATCHING returns the same item (both forms return the same items)",
        rep.name == "ITEMS" and rep["items"][0]["data"] == pattern(room), repr(rep))
    L.err(P, "version 3: an item one byte larger than a page can carry: COPY_MATCHING_PAGE -108",
          c3.page(query(GENP, {"svce": S(over)}, flags=R_DATA)), errSecAllocate)
    L.err(P, "version 3: COPY_MATCHING refuses that item too (-108), although ITEMS has a smaller header",
          c3.copy(query(GENP, {"svce": S(over)}, flags=R_DATA)), errSecAllocate)
    rep = c3.copy(query(GENP, {"svce": S(over)}, flags=R_REF))
    L.E(P, "version 3: asking for only the persistent reference lists it", rep.name == "ITEMS" and len(rep["items"]) == 1, repr(rep))
    # skipUnreadable's fixed part is 4 bytes longer: the item that just fits a page gets -108 there
    L.err("Checking the keychain", "version 3: with skipUnreadable, an item within 4 bytes of the page limit: -108",
          c3.page(query(GENP, {"svce": S(fit)}, flags=R_DATA | R_SKIP)), errSecAllocate)

    # the items before a too-large one are delivered first, on the pages before
    seq = L.svc("seq")
    c4.add(GENP, {"svce": S(seq), "acct": S("a")}, b"small")
    c4.add(GENP, {"svce": S(seq), "acct": S("b"), "gena": D(pattern(65536, 3))}, pattern(200 * 1024))
    c4.add(GENP, {"svce": S(seq), "acct": S("c")}, b"small")
    qd = query(GENP, {"svce": S(seq)}, flags=R_DATA | R_ATTRS)
    rep = c3.page(qd)
    ok = rep.name == "ITEMS_PAGE" and [i["attrs"]["acct"][1] for i in rep["items"]] == ["a"] and rep["next"] != 0
    L.E(P, "version 3: the item before a too-large one comes alone on the first page, with a next cursor", ok, repr(rep))
    if ok:
        L.err(P, "version 3: the too-large item's turn: -108", c3.page(qd, rep["next"]), errSecAllocate)
    L.err(P, "version 3: COPY_MATCHING of those three with data: -108", c3.copy(qd), errSecAllocate)
    rep = c3.copy(query(GENP, {"svce": S(seq)}, flags=R_ATTRS))
    L.E(P, "version 3: asking for fewer parts (attributes only) lists all three",
        rep.name == "ITEMS" and [i["attrs"]["acct"][1] for i in rep["items"]] == ["a", "b", "c"], repr(rep))
    rep = c4.copy(qd)
    L.E(P, "version 4: the three with data fit one ITEMS", rep.name == "ITEMS" and len(rep["items"]) == 3, repr(rep))

    # attribute limits by version
    A, GA = "Attributes", "General attributes"
    for ver, conn in ((3, c3), (4, c4)):
        longest = 31 if ver == 3 else 255
        svce = L.svc("names-v%d" % ver)
        rep = conn.add(GENP, {"svce": S(svce), "@" + "n" * longest: S("v")}, b"s", R_ATTRS)
        L.E(GA, "version %d: a general attribute name of %d bytes (after the @) is stored and returned" % (ver, longest),
            rep.name == "ITEMS" and ("@" + "n" * longest) in rep["items"][0]["attrs"], repr(rep))
        rep = conn.add(GENP, {"svce": S(svce + "x"), "@" + "n" * (longest + 1): S("v")}, b"s")
        L.err(GA, "version %d: a general attribute name of %d bytes: -50" % (ver, longest + 1), rep, errSecParam)
        L.err(GA, "version %d: ... and nothing was added" % ver,
              conn.copy(query(GENP, {"svce": S(svce + "x")}, flags=R_ATTRS)), errSecItemNotFound)
    wide128 = {"svce": S(L.svc("wide128"))}
    wide128.update({"@w%03d" % i: S("v") for i in range(127)})
    L.kind(A, "version 3: an ADD with 128 attributes is accepted", c3.add(GENP, wide128, b"s"), "ITEMS")
    wide129 = {"svce": S(L.svc("wide129"))}
    wide129.update({"@w%03d" % i: S("v") for i in range(128)})
    L.err(A, "version 3: an ADD with 129 attributes: -50", c3.add(GENP, wide129, b"s"), errSecParam)
    L.kind(A, "version 4: the same 129 attributes are accepted", c4.add(GENP, wide129, b"s"), "ITEMS")
    L.err(P, "version 3: an item of 129 attributes asked for with its attributes: -108",
          c3.copy(query(GENP, {"svce": S(L.svc("wide129"))}, flags=R_ATTRS)), errSecAllocate)
    rep = c3.copy(query(GENP, {"svce": S(L.svc("wide129"))}, flags=R_REF | R_DATA))
    L.E(P, "version 3: that item without its attributes is listed", rep.name == "ITEMS" and len(rep["items"]) == 1, repr(rep))
    L.err(P, "version 3: an item with a 256-byte general attribute name asked for with attributes: -108",
          c3.copy(query(GENP, {"svce": S(L.svc("names-v4"))}, flags=R_ATTRS)), errSecAllocate)
    L.err(P, "version 3: ... also through COPY_MATCHING_PAGE", c3.page(query(GENP, {"svce": S(L.svc("names-v4"))}, flags=R_ATTRS)),
          errSecAllocate)
    c3.close()
    c4.close()


def e2e_lifecycle(L):
    LC, FR = "Connection lifecycle", "Frames"
    # pipelining: many requests in one write, ids any u32, repeated, 0 included; replies in order
    c = L.conn()
    ids = [0, 0xFFFFFFFF, 7, 7, 1, 0] + list(range(100, 160))
    names = ["STATUS", "WHOAMI", "PROTECTIONS", "STATUS"]
    data = b"".join(encode_frame(names[i % 4], rid) for i, rid in enumerate(ids))
    c.send_raw(data)
    got = [c.read_reply() for _ in ids]
    want = [({"STATUS": "STATUS_REPLY", "WHOAMI": "WHOAMI_REPLY", "PROTECTIONS": "PROTECTIONS_REPLY"}[names[i % 4]], rid)
            for i, rid in enumerate(ids)]
    L.E(LC, "66 pipelined requests (ids 0, 2^32-1, repeated): one reply each, in order, each with its id",
        [(r.name, r.rid) for r in got] == want, [(r.name, r.rid) for r in got][:8])
    # a client that pipelines keeps reading while it writes: 600 requests, written in batches
    n_ok, sent, read = 0, 0, 0
    total = 600
    while read < total:
        while sent < total and sent - read < 32:
            c.send("STATUS", rid=sent)
            sent += 1
        rep = c.read_reply()
        n_ok += rep.name == "STATUS_REPLY" and rep.rid == read
        read += 1
    L.E(LC, "600 pipelined STATUS requests, read while written: all answered in order", n_ok == total, n_ok)
    c.close()

    # rule 5: a complete frame is executed even if the client closes right after it
    svce = L.svc("close-after-add")
    c = L.raw()
    c.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "x"}) +
               encode_frame("ADD", 2, {"cls": GENP, "attrs": {"svce": S(svce), "acct": S("1")}, "secret": b"s", "flags": 0}) +
               encode_frame("ADD", 3, {"cls": GENP, "attrs": {"svce": S(svce), "acct": S("2")}, "secret": b"s", "flags": 0}) +
               encode_frame("ADD", 4, {"cls": GENP, "attrs": {"svce": S(svce), "acct": S("cut")}, "secret": b"s", "flags": 0})[:-3])
    c.close()
    found = []
    deadline = time.monotonic() + 5
    with L.conn() as d:
        while time.monotonic() < deadline:
            rep = d.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS))
            found = sorted(i["attrs"]["acct"][1] for i in rep["items"]) if rep.name == "ITEMS" else []
            if len(found) >= 2:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        rep = d.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS))
        found = sorted(i["attrs"]["acct"][1] for i in rep["items"]) if rep.name == "ITEMS" else []
        L.E(LC, "HELLO, ADD, ADD and a cut frame, then an immediate close: both complete ADDs ran", found[:2] == ["1", "2"], found)
        L.E(LC, "... and the frame cut off by the close had no effect", "cut" not in found, found)
        # ... a malformed complete frame among them does not stop the ones after it
        svce2 = svce + "-m"
        c2 = L.raw()
        c2.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "x"}) +
                    encode_frame("ADD", 2, {"cls": GENP, "attrs": {"svce": S(svce2), "acct": S("1")}, "secret": b"s", "flags": 0}) +
                    frame_bytes(0x42, 3, b"") +
                    encode_frame("ADD", 4, {"cls": GENP, "attrs": {"svce": S(svce2), "acct": S("2")}, "secret": b"s", "flags": 0}))
        c2.close()
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(got) < 2:
            rep = d.copy(query(GENP, {"svce": S(svce2)}, flags=R_ATTRS))
            got = sorted(i["attrs"]["acct"][1] for i in rep["items"]) if rep.name == "ITEMS" else []
            time.sleep(0.05)
        L.E(LC, "HELLO, ADD, a malformed frame, ADD, then a close: both ADDs ran (every complete frame is executed)",
            got == ["1", "2"], got)
        # a retried ADD after a lost reply may get -25299
        L.err(LC, "the ADD retried after the lost reply: -25299", d.add(GENP, {"svce": S(svce), "acct": S("1")}, b"s"),
              errSecDuplicateItem)

    # rule 4: error texts name fields, never values
    with L.conn() as c:
        rep = c.add(GENP, {"svce": S(L.svc("e")), "zqxunknownattr": S("v")}, b"s")
        L.err("Attributes", "an unknown attribute name: -50", rep, errSecParam)
        L.E(LC, "rule 4: the refusal does not quote the unknown attribute name", "zqxunknownattr" not in rep["message"], rep["message"])
        rep = c.add(GENP, {"svce": S(L.svc("e")), "acct": I(987654321)}, b"s")
        L.E(LC, "rule 4: a wrong type's refusal does not quote the value", L.is_err(rep, errSecParam) and
            "987654321" not in rep["message"], repr(rep))
        rep = c.add(GENP, {"svce": S(L.svc("e")), "pdmn": S("bogusclassqz")}, b"s")
        L.E(LC, "rule 4: a bad pdmn's refusal does not quote it", L.is_err(rep, errSecParam) and
            "bogusclassqz" not in rep["message"], repr(rep))
        c.send_raw(frame_bytes(0x7B, 5, b""))
        rep = c.read_reply()
        L.E(LC, "rule 4: an unknown type's refusal does not quote the type byte", L.is_err(rep, errSecParam) and
            not re.search(r"0x7b|\b123\b", rep["message"], re.I), repr(rep))
        c.send_raw(frame_bytes(REQUESTS["COPY_MATCHING"], 6, q_raw(cls=0, raw_attrs=u16(0), pref=b"r" * 13)))
        rep = c.read_reply()
        L.E(LC, "rule 4: a 13-byte persistent reference's refusal does not quote its length", L.is_err(rep, errSecParam) and
            not re.search(r"\b13\b", rep["message"]), repr(rep))
        rep = c.add(GENP, {"svce": S(L.svc("e")), "@secretnamezq": S("secretvaluezq" * 400)}, b"s")
        L.E(LC, "rule 4: a general attribute over its limit: -50 naming neither its name nor its value",
            L.is_err(rep, errSecParam) and "secretnamezq" not in rep["message"] and "secretvaluezq" not in rep["message"],
            repr(rep))
        L.E("Messages", "ERROR messages are valid UTF-8 text and the status is never 0", rep["status"] != 0)


# Attributes: the catalog (type, the classes it applies to).
ALL = {GENP, INET, CERT, KEYS}
CATALOG = {
    "agrp": ("S", ALL), "sync": ("B", ALL), "pdmn": ("S", ALL), "labl": ("S", ALL), "cdat": ("T", ALL),
    "mdat": ("T", ALL), "alis": ("D", ALL), "accc": ("D", ALL), "acct": ("S", {GENP, INET}), "svce": ("S", {GENP}),
    "sdmn": ("S", {INET}), "srvr": ("S", {INET}), "ptcl": ("S", {INET}), "atyp": ("S", {INET}), "path": ("S", {INET}),
    "port": ("I", {INET}), "desc": ("S", {GENP, INET}), "icmt": ("S", {GENP, INET}), "crtr": ("I", {GENP, INET, KEYS}),
    "type": ("I", {GENP, INET, KEYS}), "gena": ("D", {GENP}), "invi": ("B", {GENP, INET}), "nega": ("B", {GENP, INET}),
    "scrp": ("B", {GENP, INET}), "ctyp": ("I", {CERT}), "cenc": ("I", {CERT}), "issr": ("D", {CERT}),
    "slnr": ("D", {CERT}), "subj": ("D", {CERT}), "skid": ("D", {CERT}), "pkhh": ("D", {CERT}), "kcls": ("I", {KEYS}),
    "bsiz": ("I", {KEYS}), "esiz": ("I", {KEYS}), "klbl": ("D", {KEYS}), "atag": ("D", {KEYS}), "sdat": ("T", {KEYS}),
    "edat": ("T", {KEYS}), "pubk": ("D", {KEYS}),
}
for _flag in ("perm", "priv", "modi", "sens", "asen", "extr", "next", "encr", "decr", "drve", "sign", "vrfy", "snrc",
              "vyrc", "wrap", "unwp"):
    CATALOG[_flag] = ("B", {KEYS})
PK = {GENP: {"agrp", "sync", "acct", "svce"},
      INET: {"agrp", "sync", "acct", "sdmn", "srvr", "ptcl", "atyp", "path", "port"},
      CERT: {"agrp", "sync", "ctyp", "issr", "slnr"},
      KEYS: {"agrp", "sync", "crtr", "type", "kcls", "bsiz", "esiz", "klbl", "atag", "sdat", "edat"}}


def sample(kind, i=0):
    return {"S": S("v%d" % i), "I": I(1000 + i), "D": D(bytes([i, 1, 2])), "B": B(i % 2 == 0),
            "T": T(1700000000.5 + i)}[kind]


def wrong(kind):
    return {"S": I(5), "I": S("5"), "D": S("d"), "B": I(1), "T": S("2023")}[kind]


def class_item(cls, tag):
    """Every attribute a client may give an item of `cls` (no read-only or agent-set one), with values."""
    attrs = {}
    for i, (name, (kind, classes)) in enumerate(sorted(CATALOG.items())):
        if cls in classes and name not in ("agrp", "sync", "pdmn", "cdat", "mdat", "accc", "pubk"):
            attrs[name] = sample(kind, i)
    unique = {GENP: "svce", INET: "srvr", CERT: "issr", KEYS: "atag"}[cls]
    attrs[unique] = S(tag) if CATALOG[unique][0] == "S" else D(tag.encode())
    if cls == KEYS:
        attrs["extr"] = B(True)
    return attrs, unique


def e2e_attributes(L):
    A = "Attributes"
    c = L.conn()
    # types: in queries too
    for name, (kind, classes) in sorted(CATALOG.items()):
        rep = c.copy(query(0, {name: wrong(kind)}, flags=R_ATTRS))
        L.err(A, "a query with %s of the wrong type: -50" % name, rep, errSecParam)
    # an attribute of another class: ADD, and a query naming its class
    for cls in (GENP, INET, CERT, KEYS):
        base, unique = class_item(cls, L.svc("cls-%d" % cls))
        base = {unique: base[unique]}
        for name, (kind, classes) in sorted(CATALOG.items()):
            if cls in classes or name in ("cdat", "mdat"):
                continue
            a = dict(base)
            a[name] = sample(kind)
            L.err(A, "ADD %s with %s (another class's attribute): -50" % (CLASS_NAMES_[cls], name),
                  c.add(cls, a, b"s"), errSecParam)
            L.err(A, "a query for class %s naming %s: -50" % (CLASS_NAMES_[cls], name),
                  c.copy(query(cls, {name: sample(kind)}, flags=R_ATTRS)), errSecParam)
    for cls, tag_attr in ((GENP, "svce"), (INET, "srvr")):
        key = L.svc("upd-cls-%d" % cls)
        c.add(cls, {tag_attr: S(key)}, b"s")
        for name in ("ctyp", "kcls", "issr", "gena" if cls == INET else "port", "pubk"):
            kind = CATALOG[name][0]
            L.err(A, "UPDATE of a %s item giving %s (another class's attribute): -50" % (CLASS_NAMES_[cls], name),
                  c.update(query(cls, {tag_attr: S(key)}), {name: sample(kind)}), errSecParam)
        for name in ("labl", "acct", "crtr", "invi", "alis"):
            kind = CATALOG[name][0]
            L.err(A, "UPDATE of a %s item giving %s of the wrong type: -50" % (CLASS_NAMES_[cls], name),
                  c.update(query(cls, {tag_attr: S(key)}), {name: wrong(kind)}), errSecParam)
        r = c.copy(query(cls, {tag_attr: S(key)}, flags=R_ATTRS))
        L.E(A, "... the refused UPDATEs changed nothing (%s)" % CLASS_NAMES_[cls],
            r.name == "ITEMS" and not ({"labl", "acct", "crtr", "invi", "alis", "gena", "port"} & set(r["items"][0]["attrs"])), r)
    for name in ("svce", "port", "ctyp", "kcls", "gena"):
        kind = CATALOG[name][0]
        L.err(A, "a query of any class (0) naming %s is valid (nothing matches: -25300)" % name,
              c.copy(query(0, {name: sample(kind, 99)}, flags=R_ATTRS)), errSecItemNotFound)
    # every attribute of each class round-trips, and a query by each finds the item
    for cls in (GENP, INET, CERT, KEYS):
        tag = L.svc("full-%d" % cls)
        attrs, unique = class_item(cls, tag)
        rep = c.add(cls, attrs, b"secret-%d" % cls, R_ATTRS | R_REF)
        if not L.kind(A, "ADD %s with every attribute of its class: ITEMS" % CLASS_NAMES_[cls], rep, "ITEMS"):
            continue
        got = rep["items"][0]["attrs"]
        for name, tv in sorted(attrs.items()):
            L.E(A, "%s %s is returned as given" % (CLASS_NAMES_[cls], name), got.get(name) == tv, "%r vs %r" % (got.get(name), tv))
        L.E(A, "%s: ADD filled in agrp with the caller's default group" % CLASS_NAMES_[cls],
            got.get("agrp") == S(L.default_group), got.get("agrp"))
        L.E(A, "%s: ADD filled in sync false" % CLASS_NAMES_[cls], got.get("sync") == B(False), got.get("sync"))
        L.E(A, "%s: ADD filled in pdmn ak" % CLASS_NAMES_[cls], got.get("pdmn") == S("ak"), got.get("pdmn"))
        L.E(A, "%s: the returned item carries cdat and mdat (dates)" % CLASS_NAMES_[cls],
            got.get("cdat", (0,))[0] == 5 and got.get("mdat", (0,))[0] == 5, (got.get("cdat"), got.get("mdat")))
        L.E(A, "%s: the reply's item is of the class added" % CLASS_NAMES_[cls], rep["items"][0]["cls"] == cls)
        for name, tv in sorted(attrs.items()):
            if name == unique:
                continue
            r = c.copy(query(cls, {unique: attrs[unique], name: tv}, flags=R_REF))
            L.E(A, "%s: a query by %s's value finds the item" % (CLASS_NAMES_[cls], name),
                r.name == "ITEMS" and len(r["items"]) == 1, repr(r))
        r = c.copy(query(cls, {unique: attrs[unique], "cdat": got["cdat"]}, flags=R_REF))
        L.E(A, "%s: queries may match on cdat" % CLASS_NAMES_[cls], r.name == "ITEMS" and len(r["items"]) == 1, repr(r))
        r = c.copy(query(cls, {unique: attrs[unique]}, limit=LIMIT_ONE, flags=R_DATA))
        L.E(A, "%s: the secret reads back" % CLASS_NAMES_[cls], r.name == "ITEMS" and r["items"][0]["data"] == b"secret-%d" % cls,
            repr(r))
    # agent-set attributes
    svce = L.svc("agent-set")
    for name in ("cdat", "mdat"):
        L.err(A, "ADD giving %s: -50" % name, c.add(GENP, {"svce": S(svce), name: T(1.0)}, b"s"), errSecParam)
    rep = c.add(GENP, {"svce": S(svce)}, b"s", R_ATTRS)
    first = rep["items"][0]["attrs"]
    for name in ("cdat", "mdat"):
        L.err(A, "UPDATE changing %s: -50" % name, c.update(query(GENP, {"svce": S(svce)}), {name: T(2.0)}), errSecParam)
    time.sleep(0.01)
    rep = c.update(query(GENP, {"svce": S(svce)}), {"labl": S("changed")})
    L.E(A, "UPDATE of one item: COUNT 1", rep.name == "COUNT" and rep["n"] == 1, repr(rep))
    after = c.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS))["items"][0]["attrs"]
    L.E(A, "UPDATE keeps cdat", after["cdat"] == first["cdat"], (after["cdat"], first["cdat"]))
    L.E(A, "UPDATE sets mdat (not earlier than before)", after["mdat"][1] >= first["mdat"][1], (after["mdat"], first["mdat"]))
    # pdmn values
    for code in ("ak", "ck", "dk", "aku", "cku", "dku", "akpu"):
        rep = c.add(GENP, {"svce": S(L.svc("pdmn")), "acct": S(code), "pdmn": S(code)}, b"s", R_ATTRS)
        L.E(A, "pdmn %s is stored and returned as given" % code,
            rep.name == "ITEMS" and rep["items"][0]["attrs"]["pdmn"] == S(code), repr(rep))
    rep = c.add(GENP, {"svce": S(L.svc("pdmn")), "acct": S("cli"), "pdmn": S("when-unlocked")}, b"s", R_ATTRS)
    L.E(A, "pdmn given as the CLI name when-unlocked is stored as ak",
        rep.name == "ITEMS" and rep["items"][0]["attrs"]["pdmn"] == S("ak"), repr(rep))
    L.err(A, "pdmn xx: -50", c.add(GENP, {"svce": S(L.svc("pdmn")), "acct": S("xx"), "pdmn": S("xx")}, b"s"), errSecParam)
    L.err(A, "pdmn AK (no case folding): -50", c.add(GENP, {"svce": S(L.svc("pdmn")), "acct": S("AK"), "pdmn": S("AK")}, b"s"),
          errSecParam)
    rep = c.update(query(GENP, {"svce": S(L.svc("pdmn")), "acct": S("ak")}), {"pdmn": S("ck")})
    r = c.copy(query(GENP, {"svce": S(L.svc("pdmn")), "acct": S("ak")}, limit=LIMIT_ONE, flags=R_ATTRS | R_DATA))
    L.E(A, "UPDATE of pdmn re-wraps the item under the new class (pdmn ck, the secret reads)",
        rep.name == "COUNT" and r.name == "ITEMS" and r["items"][0]["attrs"]["pdmn"] == S("ck") and r["items"][0]["data"] == b"s",
        "%r %r" % (rep, r))
    L.err(A, "UPDATE to pdmn xx: -50", c.update(query(GENP, {"svce": S(L.svc("pdmn")), "acct": S("ck")}), {"pdmn": S("xx")}),
          errSecParam)
    # limits of the keychain
    lim = L.svc("limits")
    L.kind(A, "a string attribute of 4096 bytes is accepted", c.add(GENP, {"svce": S(lim), "labl": S("l" * 4096)}, b"s"), "ITEMS")
    L.err(A, "a string attribute of 4097 bytes: -50", c.add(GENP, {"svce": S(lim), "acct": S("x"), "labl": S("l" * 4097)}, b"s"),
          errSecParam)
    L.err(A, "a primary-key string attribute of 4097 bytes: -50", c.add(GENP, {"svce": S(lim), "acct": S("a" * 4097)}, b"s"),
          errSecParam)
    L.kind(A, "a data attribute of 65536 bytes is accepted", c.add(GENP, {"svce": S(lim), "acct": S("gena"),
                                                                        "gena": D(pattern(65536))}, b"s"), "ITEMS")
    r = c.copy(query(GENP, {"svce": S(lim), "acct": S("gena")}, flags=R_ATTRS))
    L.E(A, "the 65536-byte data attribute reads back", r.name == "ITEMS" and r["items"][0]["attrs"]["gena"] == D(pattern(65536)))
    L.err(A, "a string value of 5000 bytes in a query: -50 (the keychain refuses more than 4096)",
          c.copy(query(GENP, {"svce": S("s" * 5000)}, flags=R_ATTRS)), errSecParam)
    # duplicates
    DU = "Attributes"
    dup = L.svc("dup")
    c.add(GENP, {"svce": S(dup), "acct": S("me"), "labl": S("one")}, b"s")
    for label, a in (("the same primary key", {"acct": S("me")}),
                     ("only pdmn differing", {"acct": S("me"), "pdmn": S("dk")}),
                     ("only labl differing", {"acct": S("me"), "labl": S("two")}),
                     ("only a general attribute differing", {"acct": S("me"), "@x": S("y")}),
                     ("only desc and gena differing", {"acct": S("me"), "desc": S("d"), "gena": D(b"g")}),
                     ("agrp given as the default group", {"acct": S("me"), "agrp": S(L.default_group)})):
        a["svce"] = S(dup)
        L.err(DU, "ADD of a duplicate (%s): -25299" % label, c.add(GENP, a, b"s"), errSecDuplicateItem)
    L.kind(DU, "ADD differing in acct is not a duplicate", c.add(GENP, {"svce": S(dup), "acct": S("you")}, b"s"), "ITEMS")
    L.kind(DU, "ADD without acct is not a duplicate of one with it (absent in one only)",
           c.add(GENP, {"svce": S(dup)}, b"s"), "ITEMS")
    L.err(DU, "... and a second one without acct is", c.add(GENP, {"svce": S(dup)}, b"t"), errSecDuplicateItem)
    rep = c.add(GENP, {"svce": S(dup), "acct": S("me"), "sync": B(True)}, b"s", R_ATTRS)
    L.E(DU, "sync true is accepted (never -50), and as part of the primary key it makes another item",
        rep.name == "ITEMS" and rep["items"][0]["attrs"]["sync"] == B(True), repr(rep))
    c.send_raw(bytes.fromhex("00000032060000000801000300046163637401000000026d650004737663650100000003776562000473796e63"
                             "040100000002707700"))
    r = c.read_reply()
    L.E("Test vectors", "vector 'add genp acct=me svce=web sync=true': ITEMS (or -25299 if it exists)",
        r.name == "ITEMS" or L.is_err(r, errSecDuplicateItem), repr(r))
    # UPDATE making a duplicate: -25299, nothing changed
    rep = c.update(query(GENP, {"svce": S(dup), "acct": S("you")}), {"acct": S("me")})
    L.err(DU, "UPDATE that would make a duplicate: -25299", rep, errSecDuplicateItem)
    r = c.copy(query(GENP, {"svce": S(dup), "acct": S("you")}, flags=R_ATTRS))
    L.E(DU, "... and nothing changed", r.name == "ITEMS" and len(r["items"]) == 1, repr(r))
    # other classes' primary keys
    inet = {"srvr": S(L.svc("host")), "acct": S("me"), "port": I(443), "path": S("/a"), "ptcl": S("htps")}
    c.add(INET, inet, b"s")
    L.err(DU, "inet: the same primary key: -25299", c.add(INET, dict(inet, labl=S("x")), b"s"), errSecDuplicateItem)
    for k, v in (("port", I(8443)), ("path", S("/b")), ("ptcl", S("http")), ("sdmn", S("realm")), ("atyp", S("dflt"))):
        L.kind(DU, "inet: differing in %s (primary key) is another item" % k, c.add(INET, dict(inet, **{k: v}), b"s"), "ITEMS")
    cert = {"ctyp": I(1), "issr": D(L.svc("issuer").encode()), "slnr": D(b"\x01")}
    c.add(CERT, cert, b"c")
    L.err(DU, "cert: differing only in subj: -25299", c.add(CERT, dict(cert, subj=D(b"s")), b"c"), errSecDuplicateItem)
    L.kind(DU, "cert: differing in slnr is another item", c.add(CERT, dict(cert, slnr=D(b"\x02")), b"c"), "ITEMS")
    key = {"atag": D(L.svc("tag").encode()), "kcls": I(1), "klbl": D(b"k"), "extr": B(True)}
    c.add(KEYS, key, b"k")
    L.err(DU, "keys: differing only in labl (not in the primary key): -25299", c.add(KEYS, dict(key, labl=S("x")), b"k"),
          errSecDuplicateItem)
    L.kind(DU, "keys: differing in klbl is another item", c.add(KEYS, dict(key, klbl=D(b"k2")), b"k"), "ITEMS")
    c.close()


CLASS_NAMES_ = {0: "any", GENP: "genp", INET: "inet", CERT: "cert", KEYS: "keys"}


def e2e_general(L):
    GA = "General attributes"
    c = L.conn()
    svce = L.svc("ga")
    # the vector's item, and searches by subsets
    base = {"svce": S(svce), "@user": S("alice"), "@xdg:schema": S("org.example.Password")}
    rep = c.add(GENP, base, b"pw", R_ATTRS | R_REF)
    L.kind(GA, "ADD with general attributes @user and @xdg:schema", rep, "ITEMS")
    got = rep["items"][0]["attrs"]
    L.E(GA, "the item carries its general attributes as given", got.get("@user") == S("alice") and
        got.get("@xdg:schema") == S("org.example.Password"), got)
    L.E(GA, "results carry them in the canonical (byte) name order", list(got) == sorted(got, key=lambda n: n.encode()), list(got))
    for label, a in (("both", {"@user": S("alice"), "@xdg:schema": S("org.example.Password")}), ("@user alone", {"@user": S("alice")}),
                     ("@xdg:schema alone", {"@xdg:schema": S("org.example.Password")}),
                     ("@user with svce", {"@user": S("alice"), "svce": S(svce)})):
        r = c.copy(query(0, a, flags=R_DATA | R_ATTRS))
        hits = [i for i in r.get("items", []) if i["attrs"].get("svce") == S(svce)]
        L.E(GA, "a search by %s finds the item" % label, r.name == "ITEMS" and len(hits) == 1 and hits[0]["data"] == b"pw", repr(r))
    for label, value in (("a prefix", "alic"), ("another case", "Alice"), ("a longer value", "alice "), ("another value", "bob")):
        r = c.copy(query(GENP, {"svce": S(svce), "@user": S(value)}, flags=R_ATTRS))
        L.err(GA, "a search by @user with %s of the value finds nothing (byte for byte)" % label, r, errSecItemNotFound)
    r = c.copy(query(GENP, {"svce": S(svce), "@user": S("alice"), "@other": S("x")}, flags=R_ATTRS))
    L.err(GA, "a search naming a general attribute the item lacks finds nothing", r, errSecItemNotFound)
    L.err(GA, "a general attribute whose value is an integer: -50", c.copy(query(0, {"@port": I(443)}, flags=R_ATTRS)), errSecParam)
    for kind, v in (("data", D(b"x")), ("bool", B(True)), ("date", T(1.0))):
        L.err(GA, "ADD with a general attribute whose value is %s: -50" % kind,
              c.add(GENP, {"svce": S(L.svc("ga-bad")), "@v": v}, b"s"), errSecParam)
    # the vector frames themselves
    c.send_raw(bytes.fromhex("000000220700000005000001000540706f72740200000000000001bb01000000000200000000"))
    L.err("Test vectors", "vector 'copy-matching by a general attribute whose value is an integer': -50", c.read_reply(), errSecParam)
    # names
    for label, name in (("U+0001", "@a\x01b"), ("U+001F", "@a\x1fb"), ("U+007F", "@a\x7fb"), ("U+0085", "@a\u0085b"),
                        ("U+009F", "@a\u009fb"), ("U+0000", "@a\x00b")):
        L.err(GA, "a general attribute name with the control character %s: -50" % label,
              c.add(GENP, {"svce": S(L.svc("ga-ctl")), name: S("v")}, b"s"), errSecParam)
        L.err(GA, "a query naming a general attribute with %s: -50" % label, c.copy(query(0, {name: S("v")}, flags=R_ATTRS)),
              errSecParam)
    L.kind(GA, "a general attribute name with U+00A0 (not a control character) is accepted",
           c.add(GENP, {"svce": S(L.svc("ga-nbsp")), "@a\u00a0b": S("v")}, b"s"), "ITEMS")
    L.err(GA, "ADD with @ alone (an empty general name): -50", c.add(GENP, {"svce": S(L.svc("ga-at")), "@": S("")}, b"s"), errSecParam)
    L.err(GA, "a query with @ alone: -50", c.copy(query(0, {"@": S("")}, flags=R_ATTRS)), errSecParam)
    L.err(GA, "UPDATE with @ alone and a non-empty value: -50",
          c.update(query(GENP, {"svce": S(svce)}), {"@": S("x")}), errSecParam)
    # values and totals
    L.kind(GA, "a general attribute value of 4096 bytes is accepted",
           c.add(GENP, {"svce": S(L.svc("ga-4096")), "@v": S("v" * 4096)}, b"s"), "ITEMS")
    L.err(GA, "a general attribute value of 4097 bytes: -50",
          c.add(GENP, {"svce": S(L.svc("ga-4097")), "@v": S("v" * 4097)}, b"s"), errSecParam)
    L.err(GA, "a query with a general attribute value of 4097 bytes: -50",
          c.copy(query(0, {"@v": S("v" * 4097)}, flags=R_ATTRS)), errSecParam)
    many = {"svce": S(L.svc("ga-160"))}
    many.update({"@g%03d" % i: S("v%d" % i) for i in range(160)})
    rep = c.add(GENP, many, b"s", R_ATTRS)
    L.E(GA, "an item with 160 general attributes is stored and returned whole",
        rep.name == "ITEMS" and sum(1 for n in rep["items"][0]["attrs"] if n.startswith("@")) == 160, repr(rep))
    many["@g160"] = S("v")
    many["svce"] = S(L.svc("ga-161"))
    L.err(GA, "an item with 161 general attributes: -50", c.add(GENP, many, b"s"), errSecParam)
    L.err(GA, "... and nothing was added", c.copy(query(GENP, {"svce": S(L.svc("ga-161"))}, flags=R_ATTRS)), errSecItemNotFound)
    q161 = {"@g%03d" % i: S("v%d" % i) for i in range(161)}
    L.err(GA, "a query with 161 general attributes: -50", c.copy(query(0, q161, flags=R_ATTRS)), errSecParam)
    exact = {"svce": S(L.svc("ga-64k"))}
    exact.update({("@%02d" % i) + "n" * 94: S("v" * 4000) for i in range(16)})      # 16 x (96 + 4000) = 65536 bytes
    L.kind(GA, "general attributes of exactly 65536 bytes of names and values are accepted", c.add(GENP, exact, b"s"), "ITEMS")
    exact["svce"] = S(L.svc("ga-64k+1"))
    exact["@00" + "n" * 94] = S("v" * 4001)
    L.err(GA, "general attributes of 65537 bytes of names and values: -50", c.add(GENP, exact, b"s"), errSecParam)
    # canonically equivalent names
    nfd, nfc = "@e\u0301", "@\u00e9"
    L.err(GA, "ADD with two canonically equivalent names (NFD and NFC): -50",
          c.add(GENP, {"svce": S(L.svc("ga-nf")), nfd: S("1"), nfc: S("2")}, b"s"), errSecParam)
    rep = c.add(GENP, {"svce": S(L.svc("ga-nfd")), nfd: S("1"), "@z": S("z"), nfc[:1] + "\u00e8": S("3")}, b"s", R_ATTRS)
    names = [n for n in rep["items"][0]["attrs"] if n.startswith("@")] if rep.name == "ITEMS" else []
    L.E(GA, "names sort by their bytes: @e+U+0301 before @z, @\u00e8 after it", names == [nfd, "@z", "@\u00e8"], names)
    r = c.copy(query(0, {nfc: S("1")}, flags=R_ATTRS))
    hit = r.name == "ITEMS" and any(i["attrs"].get("svce") == S(L.svc("ga-nfd")) for i in r["items"])
    L.E(GA, "an item named with NFD is not found by the NFC spelling (only by its bytes)", not hit, repr(r))
    r = c.copy(query(0, {nfd: S("1")}, flags=R_ATTRS))
    L.E(GA, "... and is found by its own bytes", r.name == "ITEMS" and any(i["attrs"].get("svce") == S(L.svc("ga-nfd"))
                                                                          for i in r["items"]), repr(r))
    # every class
    for cls, a in ((INET, {"srvr": S(L.svc("ga-inet"))}), (CERT, {"ctyp": I(3), "issr": D(L.svc("ga-cert").encode())}),
                   (KEYS, {"atag": D(L.svc("ga-keys").encode()), "extr": B(True)})):
        a["@app"] = S("x")
        rep = c.add(cls, a, b"s", R_ATTRS)
        L.E(GA, "general attributes apply to %s items" % CLASS_NAMES_[cls],
            rep.name == "ITEMS" and rep["items"][0]["attrs"].get("@app") == S("x"), repr(rep))
    # UPDATE replaces the set; changes naming none keep them
    us = L.svc("ga-upd")
    c.add(GENP, {"svce": S(us), "@a": S("1"), "@b": S("2"), "labl": S("L")}, b"s")
    rep = c.update(query(GENP, {"svce": S(us)}), {"labl": S("M")})
    r = c.copy(query(GENP, {"svce": S(us)}, flags=R_ATTRS))["items"][0]["attrs"]
    L.E(GA, "UPDATE whose changes name no general attribute keeps them", r.get("@a") == S("1") and r.get("@b") == S("2")
        and r.get("labl") == S("M"), r)
    rep = c.update(query(GENP, {"svce": S(us)}), {"@c": S("3")})
    r = c.copy(query(GENP, {"svce": S(us)}, flags=R_ATTRS))["items"][0]["attrs"]
    L.E(GA, "UPDATE naming general attributes replaces the set (only @c is left)",
        sorted(n for n in r if n.startswith("@")) == ["@c"] and r.get("labl") == S("M"), r)
    c.send_raw(bytes.fromhex("00000032080000000e0100010004737663650100000003776562010000000000000000000001000440656e76010000000470726f6400"))
    r0 = c.read_reply()
    L.E("Test vectors", "vector 'update genp svce=web ... env=prod': COUNT or -25300", r0.name == "COUNT" or
        L.is_err(r0, errSecItemNotFound), repr(r0))
    rep = c.update(query(GENP, {"svce": S(us)}), {"@": S("")})
    r = c.copy(query(GENP, {"svce": S(us)}, flags=R_ATTRS))["items"][0]["attrs"]
    L.E(GA, "UPDATE with @ alone and the empty string leaves the item no general attribute",
        rep.name == "COUNT" and not [n for n in r if n.startswith("@")], r)
    L.err(GA, "a search by a removed general attribute finds nothing", c.copy(query(GENP, {"svce": S(us), "@c": S("3")},
                                                                                     flags=R_ATTRS)), errSecItemNotFound)
    rep = c.update(query(GENP, {"svce": S(us)}), {"@bad\x01": S("x")})
    L.err(GA, "UPDATE with a bad general attribute name: -50", rep, errSecParam)
    # part of no primary key
    c.add(GENP, {"svce": S(L.svc("ga-pk")), "@a": S("1")}, b"s")
    L.err(GA, "two items differing only in their general attributes are duplicates",
          c.add(GENP, {"svce": S(L.svc("ga-pk")), "@a": S("2")}, b"s"), errSecDuplicateItem)
    c.close()


def e2e_access_groups(L):
    AG = "Access groups"
    c = L.conn()
    w = c.request("WHOAMI")
    L.kind(AG, "WHOAMI: WHOAMI_REPLY", w, "WHOAMI_REPLY")
    L.E(AG, "WHOAMI: this unsigned caller is kind 0 with an empty app id", w["kind"] == 0 and w["app"] == "", w.f)
    L.E(AG, "WHOAMI: the pid is this process's", w["pid"] == os.getpid(), (w["pid"], os.getpid()))
    exe = os.path.realpath("/proc/self/exe")
    L.E(AG, "WHOAMI: the executable is this process's", w["exe"] == exe, (w["exe"], exe))
    L.E(AG, "WHOAMI: an unsigned caller's groups are the one shared group unsigned", w["groups"] == ["unsigned"], w["groups"])
    L.E(AG, "WHOAMI: an unsigned caller may not AUTHORIZE", w["may_authorize"] == 0, w.f)
    L.E(AG, "WHOAMI: the note says why the caller is unsigned (not empty)", w["note"] != "", w.f)
    L.default_group = w["groups"][0] if w["groups"] else "unsigned"
    L.err(AG, "AUTHORIZE from a caller that is not the shell helper: -34018",
          c.request("AUTHORIZE", {"group": "mail", "passcode": L.pw}, timeout=120), errSecMissingEntitlement)
    other = "org.example.outside-%s" % L.tag
    svce = L.svc("ag")
    L.err(AG, "ADD naming another access group: -34018", c.add(GENP, {"svce": S(svce), "agrp": S(other)}, b"s"), errSecMissingEntitlement)
    L.err(AG, "... and nothing was added", c.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS)), errSecItemNotFound)
    L.err(AG, "a query naming another (empty) access group: -34018",
          c.copy(query(GENP, {"agrp": S(other)}, flags=R_ATTRS)), errSecMissingEntitlement)
    L.err(AG, "a paged query naming another access group: -34018",
          c.page(query(GENP, {"agrp": S(other)}, flags=R_ATTRS)), errSecMissingEntitlement)
    L.err(AG, "DELETE naming another access group: -34018", c.delete(query(GENP, {"agrp": S(other)})), errSecMissingEntitlement)
    L.err(AG, "UPDATE whose query names another access group: -34018",
          c.update(query(GENP, {"agrp": S(other)}), {"labl": S("x")}), errSecMissingEntitlement)
    rep = c.add(GENP, {"svce": S(svce), "agrp": S(L.default_group)}, b"s", R_ATTRS)
    L.E(AG, "ADD naming the caller's own group stores it there",
        rep.name == "ITEMS" and rep["items"][0]["attrs"]["agrp"] == S(L.default_group), repr(rep))
    L.err(AG, "UPDATE moving an item to another access group: -34018",
          c.update(query(GENP, {"svce": S(svce)}), {"agrp": S(other)}), errSecMissingEntitlement)
    r = c.copy(query(GENP, {"svce": S(svce), "agrp": S(L.default_group)}, flags=R_ATTRS))
    L.E(AG, "... and the item stayed in its group", r.name == "ITEMS" and len(r["items"]) == 1, repr(r))
    c.close()


def e2e_queries(L):
    F = "Fields"
    c = L.conn()
    svce = L.svc("q")
    before = c.status()["items"]
    refs = []
    for i in range(5):
        rep = c.add(GENP, {"svce": S(svce), "acct": S("a%d" % i), "labl": S("L")}, b"secret%d" % i, R_REF)
        refs.append(rep["items"][0]["pref"] if rep.name == "ITEMS" else None)
    L.E("Status", "itemCount grows by one per ADD", c.status()["items"] == before + 5, (before, c.status()["items"]))
    L.E(F, "ADD with return flag persistent reference: a 16-byte reference each, all different",
        all(r is not None and len(r) == 16 for r in refs) and len(set(refs)) == 5, refs)
    for flags in range(8):
        rep = c.add(GENP, {"svce": S(L.svc("addflags")), "acct": S("f%d" % flags)}, b"f%d" % flags, flags)
        it = rep["items"] if rep.name == "ITEMS" else None
        if flags == 0:
            ok = it == []
        else:
            ok = (it is not None and len(it) == 1 and it[0]["present"] == flags and it[0]["cls"] == GENP and
                  (not flags & R_DATA or it[0]["data"] == b"f%d" % flags) and
                  (not flags & R_ATTRS or it[0]["attrs"].get("acct") == S("f%d" % flags)) and
                  (not flags & R_REF or len(it[0]["pref"]) == 16))
        L.E("Messages", "ADD with return flags %d: ITEMS with %s" % (flags, "no item" if flags == 0 else "the requested parts"),
            ok, repr(rep))
    q = lambda **kw: query(GENP, {"svce": S(svce)}, **kw)
    for limit, count, want in ((LIMIT_ONE, 0, 1), (LIMIT_COUNT, 3, 3), (LIMIT_ALL, 0, 5), (LIMIT_COUNT, 10, 5), (LIMIT_COUNT, 1, 1)):
        r = c.copy(q(limit=limit, count=count, flags=R_ATTRS))
        L.E(F, "limit kind %d count %d over 5 matches: %d items" % (limit, count, want), r.name == "ITEMS" and len(r["items"]) == want,
            repr(r))
    r = c.copy(q(flags=R_ATTRS))
    L.E(F, "results are returned oldest first (the order added)",
        [i["attrs"]["acct"][1] for i in r["items"]] == ["a0", "a1", "a2", "a3", "a4"], r)
    r = c.copy(q(flags=0))
    L.E(F, "return flags 0: one bare item per match (its class, present 0)",
        r.name == "ITEMS" and len(r["items"]) == 5 and all(i["cls"] == GENP and i["present"] == 0 for i in r["items"]), repr(r))
    r = c.page(q(flags=0))
    L.E(F, "return flags 0 with COPY_MATCHING_PAGE: bare items too",
        r.name == "ITEMS_PAGE" and len(r["items"]) == 5 and all(i["present"] == 0 for i in r["items"]), repr(r))
    for flags in range(1, 8):
        r = c.copy(query(GENP, {"svce": S(svce), "acct": S("a2")}, limit=LIMIT_ONE, flags=flags))
        it = r["items"][0] if r.name == "ITEMS" and r["items"] else {}
        ok = it.get("present") == flags
        if flags & R_DATA:
            ok = ok and it.get("data") == b"secret2"
        if flags & R_REF:
            ok = ok and it.get("pref") == refs[2]
        if flags & R_ATTRS:
            ok = ok and it.get("attrs", {}).get("acct") == S("a2")
        L.E(F, "return flags %d: present %d and exactly those parts" % (flags, flags), ok, repr(r))
    r = c.copy(query(0, {}, limit=LIMIT_ALL, flags=R_ATTRS | R_DATA, pref=refs[3]))
    L.E("Fields", "a query by persistent reference alone finds exactly that item",
        r.name == "ITEMS" and len(r["items"]) == 1 and r["items"][0]["data"] == b"secret3", repr(r))
    r = c.copy(query(GENP, {"svce": S(svce), "acct": S("a1")}, flags=R_ATTRS, pref=refs[3]))
    L.err(F, "a persistent reference with attributes the item lacks: -25300", r, errSecItemNotFound)
    L.err(F, "an unknown persistent reference: -25300", c.copy(query(0, {}, flags=R_ATTRS, pref=os.urandom(16))), errSecItemNotFound)
    r = c.copy(query(0, {}, limit=LIMIT_ALL, flags=R_DATA | R_REF, pref=refs[3] + os.urandom(16) + refs[1]))
    L.E(F, "a query by several persistent references finds those items, oldest first, an unknown one ignored",
        r.name == "ITEMS" and [(i["pref"], i["data"]) for i in r["items"]] == [(refs[1], b"secret1"), (refs[3], b"secret3")], repr(r))
    c.send_raw(bytes.fromhex("00000022070000001100000000000000000100000010101112131415161718191a1b1c1d1e1f"))
    L.err("Test vectors", "vector 'copy-matching by persistent reference 101112…1f': -25300 (no such item)", c.read_reply(),
          errSecItemNotFound)
    L.err(F, "no case folding: svce in upper case finds nothing", c.copy(query(GENP, {"svce": S(svce.upper())}, flags=R_ATTRS)),
          errSecItemNotFound)
    L.err(F, "a query of another class finds nothing", c.copy(query(INET, {"acct": S("a1"), "labl": S("L"), "srvr": S(svce)},
                                                                     flags=R_ATTRS)), errSecItemNotFound)
    # UPDATE: secret only, attributes kept, reference kept
    rep = c.update(query(GENP, {"svce": S(svce), "acct": S("a0")}), {}, b"new0")
    r = c.copy(query(GENP, {"svce": S(svce), "acct": S("a0")}, limit=LIMIT_ONE, flags=7))
    L.E(F, "UPDATE with a secret and no attribute changes: COUNT 1, the new secret, attributes and reference kept",
        rep.name == "COUNT" and rep["n"] == 1 and r["items"][0]["data"] == b"new0" and r["items"][0]["pref"] == refs[0] and
        r["items"][0]["attrs"]["labl"] == S("L"), "%r %r" % (rep, r))
    rep = c.update(query(GENP, {"svce": S(svce), "acct": S("a0")}), {"labl": S("first")})
    r = c.copy(q(flags=R_ATTRS | R_REF))
    L.E(F, "an UPDATE does not move an item (order unchanged) and keeps its reference",
        [i["pref"] for i in r["items"]] == refs, r)
    L.err(F, "UPDATE with no changes and no secret: -50", c.update(q(), {}), errSecParam)
    # UPDATE and DELETE act on every match; malformed limits change nothing
    c.send_raw(frame_bytes(REQUESTS["UPDATE"], 31, q_raw(attrs={"svce": S(svce)}, limit=LIMIT_ONE) +
                           encode_attributes({"labl": S("one")}) + u8(0)))
    L.err(F, "UPDATE with limit one: -50", c.read_reply(), errSecParam)
    r = c.copy(q(flags=R_ATTRS))
    L.E(F, "... and nothing was changed", all(i["attrs"]["labl"] != S("one") for i in r["items"]), r)
    c.send_raw(frame_bytes(REQUESTS["DELETE"], 32, q_raw(attrs={"svce": S(svce)}, limit=LIMIT_ONE)))
    L.err(F, "DELETE with limit one: -50", c.read_reply(), errSecParam)
    c.send_raw(frame_bytes(REQUESTS["DELETE"], 33, q_raw(attrs={"svce": S(svce)}, flags=R_ATTRS)))
    L.err(F, "DELETE with a return flag: -50", c.read_reply(), errSecParam)
    L.E(F, "... and nothing was deleted", len(c.copy(q(flags=0))["items"]) == 5)
    rep = c.update(q(), {"labl": S("all")})
    L.E(F, "UPDATE acts on every match: COUNT 5", rep.name == "COUNT" and rep["n"] == 5, repr(rep))
    r = c.copy(q(flags=R_ATTRS))
    L.E(F, "... every match was changed", all(i["attrs"]["labl"] == S("all") for i in r["items"]), r)
    n_before = c.status()["items"]
    rep = c.delete(query(GENP, {"svce": S(svce), "acct": S("a4")}))
    L.E(F, "DELETE of one match: COUNT 1", rep.name == "COUNT" and rep["n"] == 1, repr(rep))
    rep = c.delete(q())
    L.E(F, "DELETE acts on every match: COUNT 4", rep.name == "COUNT" and rep["n"] == 4, repr(rep))
    L.E("Status", "itemCount drops by the items deleted", c.status()["items"] == n_before - 5)
    L.err(F, "after DELETE nothing matches: -25300", c.copy(q(flags=R_ATTRS)), errSecItemNotFound)
    L.err(F, "DELETE that matches nothing: -25300", c.delete(q()), errSecItemNotFound)
    L.err(F, "UPDATE that matches nothing: -25300", c.update(q(), {"labl": S("x")}), errSecItemNotFound)
    L.err(F, "a persistent reference is never reused: the deleted item's reference finds nothing",
          c.copy(query(0, {}, flags=R_ATTRS, pref=refs[0])), errSecItemNotFound)
    c.close()


def e2e_paging(L):
    P = "Paging"
    c4 = L.conn(1, 4)
    c3 = L.conn(1, 3)
    svce = L.svc("pages")
    refs = []
    for i in range(6):
        rep = c4.add(GENP, {"svce": S(svce), "acct": S("p%d" % i), "gena": D(pattern(60000, i + 3))}, b"s%d" % i, R_REF)
        refs.append(rep["items"][0]["pref"])
    qa = query(GENP, {"svce": S(svce)}, flags=R_ATTRS | R_REF)
    L.err(P, "version 3: COPY_MATCHING whose whole result does not fit one frame: -108", c3.copy(qa), errSecAllocate)
    r = c4.copy(qa)
    L.E(P, "version 4: the same result fits one ITEMS", r.name == "ITEMS" and len(r["items"]) == 6, repr(r))
    items, pages = c3.page_all(qa)
    L.E(P, "version 3: COPY_MATCHING_PAGE delivers every match, in order, over several pages",
        [i["pref"] for i in items] == refs and len(pages) > 1, (len(items), len(pages)))
    L.E(P, "every page but the last has a non-zero nextCursor and at least one item",
        all(p["next"] != 0 and p["items"] for p in pages[:-1]) and pages[-1]["next"] == 0, [(p["next"], len(p["items"])) for p in pages])
    L.E(P, "no page is larger than MAX_FRAME (262144 at version 3)", all(len(p.raw) <= MAX_FRAME_SMALL for p in pages),
        [len(p.raw) for p in pages])
    L.E(P, "each page holds as many as fit (the first page could not take the next item)",
        len(pages[0].raw) + 6 + 60000 + 200 > MAX_FRAME_SMALL, len(pages[0].raw))
    items, pages = c3.page_all(query(GENP, {"svce": S(svce)}, limit=LIMIT_COUNT, count=5, flags=R_ATTRS | R_REF))
    L.E(P, "limit count 5 across pages (the client reducing limitCount): the first 5 matches",
        [i["pref"] for i in items] == refs[:5], len(items))
    r = c3.page(query(GENP, {"svce": S(svce)}, limit=LIMIT_ONE, flags=R_ATTRS | R_REF))
    L.E(P, "limit one: one item and nextCursor 0 (never a next page)",
        r.name == "ITEMS_PAGE" and len(r["items"]) == 1 and r["next"] == 0 and r["items"][0]["pref"] == refs[0], repr(r))
    r = c4.page(query(GENP, {"svce": S(svce)}, flags=R_REF))
    L.E(P, "a result that fits one frame: a single page with nextCursor 0",
        r.name == "ITEMS_PAGE" and r["next"] == 0 and [i["pref"] for i in r["items"]] == refs, repr(r))
    L.err(P, "nothing matches, first page: -25300", c4.page(query(GENP, {"svce": S(L.svc("nothing"))}, flags=R_ATTRS)),
          errSecItemNotFound)
    r = c4.page(qa, 0xFFFFFFFFFFFFFFFF)
    L.E(P, "any cursor value is accepted (2^64-1: an ITEMS_PAGE, not an error)", r.name == "ITEMS_PAGE", repr(r))
    r = c4.page(qa, 0xFFFFFFFFFFFFFFFF)
    L.E(P, "a cursor past the end gives an empty last page", r.name == "ITEMS_PAGE" and not r["items"] and r["next"] == 0, repr(r))
    # not a snapshot: an updated item keeps its place, a deleted one is not returned, none twice
    first = c3.page(qa)
    c4.update(query(GENP, {"svce": S(svce), "acct": S("p5")}), {"labl": S("moved?")})
    c4.delete(query(GENP, {"svce": S(svce), "acct": S("p4")}))
    c4.add(GENP, {"svce": S(svce), "acct": S("p6")}, b"late", R_REF)
    rest, pages = [], [first]
    cursor = first["next"]
    while cursor:
        r = c3.page(qa, cursor)
        if r.name != "ITEMS_PAGE":
            break
        pages.append(r)
        rest.extend(r["items"])
        cursor = r["next"]
    got = [i["pref"] for i in first["items"]] + [i["pref"] for i in rest]
    L.E(P, "a listing is not a snapshot: the item deleted before its page is not returned", refs[4] not in got, len(got))
    L.E(P, "no item is returned twice", len(got) == len(set(got)), len(got))
    L.E(P, "an updated item keeps its place", refs[5] in got and got.index(refs[5]) > got.index(refs[3]), got.index(refs[5]) if refs[5] in got else None)
    # the items after a cursor deleted meanwhile: an empty page with nextCursor 0, not an error
    first = c3.page(qa)
    c4.delete(query(GENP, {"svce": S(svce)}))
    r = c3.page(qa, first["next"]) if first.name == "ITEMS_PAGE" and first["next"] else None
    L.E(P, "a later page whose items were deleted meanwhile: empty, nextCursor 0 (not an error)",
        r is not None and r.name == "ITEMS_PAGE" and not r["items"] and r["next"] == 0, repr(r))
    # skipUnreadable: ITEMS_PAGE_SKIPPING with the same items
    sk = L.svc("skip")
    for i in range(3):
        c4.add(GENP, {"svce": S(sk), "acct": S("s%d" % i)}, b"x")
    r = c4.page(query(GENP, {"svce": S(sk)}, flags=R_ATTRS | R_SKIP))
    L.E("Checking the keychain", "skipUnreadable: ITEMS_PAGE_SKIPPING, nothing unreadable, the same items",
        r.name == "ITEMS_PAGE_SKIPPING" and r["unreadable"] == 0 and len(r["items"]) == 3 and r["next"] == 0, repr(r))
    L.err("Checking the keychain", "skipUnreadable with nothing matching: -25300 (nothing was skipped)",
          c4.page(query(GENP, {"svce": S(L.svc("nothing"))}, flags=R_ATTRS | R_SKIP)), errSecItemNotFound)
    c3.send_raw(bytes.fromhex("0000001a0b0000004001000001000000000a000000000000000000000000"))
    r = c3.read_reply()
    L.E("Test vectors", "vector 'copy matching page skipping unreadable items': ITEMS_PAGE_SKIPPING (or -25300)",
        r.name == "ITEMS_PAGE_SKIPPING" or L.is_err(r, errSecItemNotFound), repr(r))
    c3.close()
    c4.close()


# Keys: RFC 8032's first Ed25519 key in the ssh-agent form (the spec's vector)
ED_PUB = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
ED_PRIV = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60") + ED_PUB


def ssh_string(b):
    return u32(len(b)) + b


def mpint(n):
    """RFC 4251 mpint of a non-negative integer."""
    if n == 0:
        return u32(0)
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    if b[0] & 0x80:
        b = b"\0" + b
    return ssh_string(b)


# Test RSA keys (fixed primes, made for this checker; public test data).
RSA_2048 = (int(
    "fdde2d96b81383719e87a9eb91d81074fc28d071cfc1d8ab06ff230c4df3133bbedd501419e7b9bf9d861721948aacd5"
    "fc6cbdbf2d96fae0aa6cbd44cb2a842684e3e13261bbe65ca33b8d68f2ce158d9fb644a100001a4402be23685a40c95f"
    "cb7e04f3cf0afd86a765f184b8e62e4b0bdb62768a3993b9cf457b660aece551", 16), int(
    "f52f6dd8f9006f0ff8e41732960545327ac47622d18b0422ce28095ecf86055d54bf8ea88dc097872245913cd6ebb5ef"
    "a72330970ca1bbfca5db4e9c62dff434f8fdc5ccd056f14e20022a3a193c643dccd42083bc07846093e9e1e6ebdce90e"
    "c54b3ae63667f1f47f805b3a188e59bae52c76a29fbdbc229133e66cfed2fbaf", 16))
RSA_1024 = (int(
    "d8da7fa0474911c7dab2b654f162012e7ee29d9ce2da40b7e19ae7602d7277b2ff60a8e89897796a996720822e7b5302"
    "921e4ce438cc14b52ec08a2892ba4b61", 16), int(
    "d86a57efe98b4718ae76cd24bc90cc720b48236e2f55e08668e442e044ba224d214b368761ca9a7e585ba191a0663748"
    "c05fb05588a54e66f1526f7327295517", 16))


def rsa_key(primes, e=65537, break_it=False):
    """The ssh-agent ADD_IDENTITY key fields of ssh-rsa (n, e, d, iqmp, p, q) and the public blob."""
    p, q = primes
    n = p * q
    d = pow(e, -1, (p - 1) * (q - 1))
    iqmp = pow(q, -1, p)
    if break_it:
        n += 2
    key = ssh_string(b"ssh-rsa") + mpint(n) + mpint(e) + mpint(d) + mpint(iqmp) + mpint(p) + mpint(q)
    return key, ssh_string(b"ssh-rsa") + mpint(e) + mpint(n)


# NIST P-256 (FIPS 186-4, D.1.2.3)
P256 = (0xffffffff00000001000000000000000000000000ffffffffffffffffffffffff,
        0xffffffff00000001000000000000000000000000fffffffffffffffffffffffc,
        0x6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296,
        0x4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5,
        0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551)


def p256_mul(k):
    p, a, gx, gy, _ = P256

    def add(P, Q):
        if P is None:
            return Q
        if Q is None:
            return P
        if P[0] == Q[0] and (P[1] + Q[1]) % p == 0:
            return None
        if P == Q:
            m = (3 * P[0] * P[0] + a) * pow(2 * P[1], -1, p) % p
        else:
            m = (Q[1] - P[1]) * pow(Q[0] - P[0], -1, p) % p
        x = (m * m - P[0] - Q[0]) % p
        return (x, (m * (P[0] - x) - P[1]) % p)
    R, Pt = None, (gx, gy)
    while k:
        if k & 1:
            R = add(R, Pt)
        Pt = add(Pt, Pt)
        k >>= 1
    return R


def ecdsa_key(d=0x1f2e3d4c5b6a798897a6b5c4d3e2f1000112233445566778899aabbccddeeff, break_it=False):
    x, y = p256_mul(d)
    q = b"\x04" + x.to_bytes(32, "big") + y.to_bytes(32, "big")
    if break_it:
        q = b"\x04" + x.to_bytes(32, "big") + ((y + 1) % P256[0]).to_bytes(32, "big")
    t = b"ecdsa-sha2-nistp256"
    return ssh_string(t) + ssh_string(b"nistp256") + ssh_string(q) + mpint(d), ssh_string(t) + ssh_string(b"nistp256") + ssh_string(q)


def verify_ed25519(public, data, signature):
    """True/False as OpenSSL verifies an Ed25519 signature; None when no openssl can be run."""
    import subprocess, tempfile
    spki = bytes.fromhex("302a300506032b6570032100") + public
    with tempfile.TemporaryDirectory() as d:
        for name, content in (("pub.der", spki), ("data", data), ("sig", signature)):
            with open(os.path.join(d, name), "wb") as f:
                f.write(content)
        try:
            r = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", os.path.join(d, "pub.der"), "-keyform", "DER",
                                "-rawin", "-in", os.path.join(d, "data"), "-sigfile", os.path.join(d, "sig")],
                               capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.returncode == 0


def ed_key(pub=ED_PUB, priv=ED_PRIV):
    return ssh_string(b"ssh-ed25519") + ssh_string(pub) + ssh_string(priv)


def e2e_keys(L):
    K = "Keys"
    c = L.conn()
    gen = lambda attrs, flags=R_ATTRS | R_REF: c.request("KEY_CREATE", {"op": 1, "attrs": attrs, "key": b"", "flags": flags},
                                                        timeout=120)
    imp = lambda attrs, key, flags=R_ATTRS | R_REF: c.request("KEY_CREATE", {"op": 2, "attrs": attrs, "key": key, "flags": flags})
    rep = gen({"labl": S(L.svc("ed")), "type": I(2100)})
    ok = L.kind(K, "generate an Ed25519 key: ITEMS", rep, "ITEMS")
    if ok:
        it = rep["items"][0]
        a = it["attrs"]
        pubk = a.get("pubk", (0, b""))[1]
        L.E(K, "the generated key is a keys item with a reference", it["cls"] == KEYS and len(it.get("pref", b"")) == 16, it)
        L.E(K, "kcls 1 (private)", a.get("kcls") == I(1), a.get("kcls"))
        L.E(K, "type 2100 and bsiz 256", a.get("type") == I(2100) and a.get("bsiz") == I(256), (a.get("type"), a.get("bsiz")))
        L.E(K, "pubk is an ssh-ed25519 public key blob", pubk[:15] == ssh_string(b"ssh-ed25519") and len(pubk) == 15 + 4 + 32, pubk.hex())
        L.E(K, "klbl is the SHA-256 of the public key blob", a.get("klbl") == D(hashlib.sha256(pubk).digest()), a.get("klbl"))
        L.E(K, "extr false; perm, sign and sens true", a.get("extr") == B(False) and a.get("perm") == B(True) and
            a.get("sign") == B(True) and a.get("sens") == B(True), a)
        L.E(K, "pdmn defaults to aku (ThisDeviceOnly)", a.get("pdmn") == S("aku"), a.get("pdmn"))
        L.E(K, "the caller's labl is kept", a.get("labl") == S(L.svc("ed")))
        q = query(KEYS, {"labl": S(L.svc("ed"))}, flags=R_DATA)
        L.err(K, "reading the private half (COPY_MATCHING with data): -25291", c.copy(q), errSecNotAvailable)
        L.err(K, "reading it by COPY_MATCHING_PAGE: -25291", c.page(q), errSecNotAvailable)
        r = c.copy(query(KEYS, {"labl": S(L.svc("ed"))}, flags=R_ATTRS))
        L.E(K, "its attributes are searchable", r.name == "ITEMS" and r["items"][0]["attrs"]["pubk"] == a["pubk"], repr(r))
        qk = query(KEYS, {"labl": S(L.svc("ed"))})
        L.err(K, "UPDATE giving a non-extractable key a secret: -50", c.update(qk, {}, b"x"), errSecParam)
        for name, v in (("kcls", I(2)), ("klbl", D(b"x")), ("extr", B(True)), ("pubk", D(b"x")), ("sign", B(False))):
            L.err(K, "UPDATE of %s (set by the agent) on a generated key: -50" % name, c.update(qk, {name: v}), errSecParam)
        L.err(K, "UPDATE of a generated key's pdmn to ak (not ThisDeviceOnly): -50", c.update(qk, {"pdmn": S("ak")}), errSecParam)
        r = c.update(qk, {"atag": D(b"renamed")})
        L.E(K, "UPDATE of a caller's attribute: COUNT 1", r.name == "COUNT" and r["n"] == 1, repr(r))
        # KEY_SIGN: SecKeyCreateSignature with the agent's key, checked with OpenSSL against pubk.
        sign = lambda q, data, flags=0: c.request("KEY_SIGN", {"query": q, "data": data, "flags": flags})
        r = sign(query(KEYS, {"labl": S(L.svc("ed"))}, limit=LIMIT_ONE), b"hello")
        ok = L.kind(K, "KEY_SIGN with the generated Ed25519 key: KEY_SIGNATURE", r, "KEY_SIGNATURE")
        if ok:
            sig = Reader(r["signature"])
            algorithm, raw = sig.take(sig.u32()), sig.take(sig.u32())
            L.E(K, "the signature blob is string \"ssh-ed25519\" then its 64 bytes", algorithm == b"ssh-ed25519" and len(raw) == 64,
                r["signature"].hex())
            verified = verify_ed25519(pubk[19:], b"hello", raw)
            if verified is not None:
                L.E(K, "OpenSSL verifies the signature with the key's pubk", verified, raw.hex())
        L.err(K, "KEY_SIGN whose query matches no key: -25300",
              sign(query(KEYS, {"labl": S(L.svc("no such key"))}, limit=LIMIT_ONE), b"x"), errSecItemNotFound)
        r = c.delete(query(KEYS, {"labl": S(L.svc("ed"))}))
        L.E(K, "DELETE of a generated key: COUNT 1", r.name == "COUNT" and r["n"] == 1, repr(r))
    rep = gen({"labl": S(L.svc("ed256")), "type": I(2100), "bsiz": I(256)}, 0)
    L.E(K, "generate Ed25519 with bsiz 256, return flags 0: ITEMS with no item", rep.name == "ITEMS" and rep["items"] == [], repr(rep))
    for bits in (256, 384, 521):
        rep = gen({"labl": S(L.svc("ec%d" % bits)), "type": I(73), "bsiz": I(bits)})
        L.E(K, "generate ECDSA P-%d: type 73, bsiz %d, an ecdsa-sha2-nistp%d pubk" % (bits, bits, bits),
            rep.name == "ITEMS" and rep["items"][0]["attrs"].get("bsiz") == I(bits) and
            rep["items"][0]["attrs"]["pubk"][1][4:23] == ("ecdsa-sha2-nistp%d" % bits).encode(), repr(rep))
    rep = gen({"labl": S(L.svc("ecdef")), "type": I(73)})
    L.E(K, "generate ECDSA without bsiz: 256 by default", rep.name == "ITEMS" and rep["items"][0]["attrs"].get("bsiz") == I(256), repr(rep))
    if L.args.rsa:
        rep = gen({"labl": S(L.svc("rsa")), "type": I(42), "bsiz": I(2048)})
        L.E(K, "generate RSA 2048: an ssh-rsa pubk", rep.name == "ITEMS" and rep["items"][0]["attrs"]["pubk"][1][4:11] == b"ssh-rsa",
            repr(rep))
    for label, attrs in (("Ed25519 with bsiz 255", {"type": I(2100), "bsiz": I(255)}),
                         ("ECDSA with bsiz 300", {"type": I(73), "bsiz": I(300)}),
                         ("RSA with bsiz 2047", {"type": I(42), "bsiz": I(2047)}),
                         ("RSA with bsiz 2056 (not a step of 16)", {"type": I(42), "bsiz": I(2056)}),
                         ("RSA with bsiz 8208", {"type": I(42), "bsiz": I(8208)}),
                         ("an unknown type 9999", {"type": I(9999)}),
                         ("kcls given", {"type": I(2100), "kcls": I(1)}), ("klbl given", {"type": I(2100), "klbl": D(b"k")}),
                         ("esiz given", {"type": I(2100), "esiz": I(256)}), ("extr given", {"type": I(2100), "extr": B(False)}),
                         ("perm given", {"type": I(2100), "perm": B(True)}), ("sign given", {"type": I(2100), "sign": B(True)}),
                         ("sens given", {"type": I(2100), "sens": B(True)}), ("asen given", {"type": I(2100), "asen": B(True)}),
                         ("next given", {"type": I(2100), "next": B(True)}), ("pubk given", {"type": I(2100), "pubk": D(b"p")}),
                         ("pdmn ak", {"type": I(2100), "pdmn": S("ak")}), ("pdmn ck", {"type": I(2100), "pdmn": S("ck")}),
                         ("pdmn dk", {"type": I(2100), "pdmn": S("dk")})):
        attrs = dict(attrs, labl=S(L.svc("bad-" + label)))
        L.err(K, "generate with %s: -50" % label, gen(attrs), errSecParam)
        L.err(K, "... nothing stored (%s)" % label, c.copy(query(KEYS, {"labl": attrs["labl"]}, flags=R_ATTRS)), errSecItemNotFound)
    for code in ("aku", "cku", "dku", "akpu"):
        rep = gen({"labl": S(L.svc("pd-" + code)), "type": I(2100), "pdmn": S(code)})
        L.E(K, "generate with pdmn %s (ThisDeviceOnly) is accepted" % code,
            rep.name == "ITEMS" and rep["items"][0]["attrs"]["pdmn"] == S(code), repr(rep))
    # import
    label = L.svc("imported")
    rep = imp({"labl": S(label)}, ed_key())
    ok = L.kind(K, "import RFC 8032's first Ed25519 key: ITEMS", rep, "ITEMS")
    if ok:
        a = rep["items"][0]["attrs"]
        want_pub = ssh_string(b"ssh-ed25519") + ssh_string(ED_PUB)
        L.E(K, "import: pubk is the key's public blob", a.get("pubk") == D(want_pub), a.get("pubk"))
        L.E(K, "import: klbl is its SHA-256 (the SSH fingerprint)", a.get("klbl") == D(hashlib.sha256(want_pub).digest()))
        L.E(K, "import: type 2100, bsiz 256, kcls 1, extr false", a.get("type") == I(2100) and a.get("bsiz") == I(256) and
            a.get("kcls") == I(1) and a.get("extr") == B(False), a)
    L.err(K, "the same key imported twice with the same label: -25299", imp({"labl": S(label)}, ed_key()), errSecDuplicateItem)
    L.kind(K, "the same key with another atag is another item", imp({"labl": S(label), "atag": D(b"t2")}, ed_key()), "ITEMS")
    bad_pub = bytes([ED_PUB[0] ^ 1]) + ED_PUB[1:]
    for why, key in (("a public half that is not the private half's", ed_key(pub=bad_pub, priv=ED_PRIV[:32] + bad_pub)),
                     ("a key cut short", ed_key()[:-5]), ("an unknown key type", ssh_string(b"ssh-dss") + ed_key()[15:]),
                     ("a trailing byte", ed_key() + b"\0"), ("garbage", b"\x01\x02\x03")):
        L.err(K, "import of %s: -50" % why, imp({"labl": S(L.svc("bad-import"))}, key), errSecParam)
    for label, (key, blob_, bits, typ) in (("RSA 2048", rsa_key(RSA_2048) + (2048, 42)),
                                          ("ECDSA P-256", ecdsa_key() + (256, 73))):
        r = imp({"labl": S(L.svc("import-" + label))}, key)
        a = r["items"][0]["attrs"] if r.name == "ITEMS" and r["items"] else {}
        L.E(K, "import %s: pubk is its public blob, klbl its SHA-256" % label,
            a.get("pubk") == D(blob_) and a.get("klbl") == D(hashlib.sha256(blob_).digest()), "%r %r" % (r, a.get("pubk")))
        L.E(K, "import %s: type %d, bsiz %d" % (label, typ, bits), a.get("type") == I(typ) and a.get("bsiz") == I(bits), a)
    L.err(K, "import of an RSA key below 2048 bits (1024): -50", imp({"labl": S(L.svc("rsa1024"))}, rsa_key(RSA_1024)[0]),
          errSecParam)
    L.err(K, "import of an RSA key whose modulus is not p*q: -50",
          imp({"labl": S(L.svc("rsa-broken"))}, rsa_key(RSA_2048, break_it=True)[0]), errSecParam)
    L.err(K, "import of an ECDSA key whose public point is not d*G: -50",
          imp({"labl": S(L.svc("ec-broken"))}, ecdsa_key(break_it=True)[0]), errSecParam)
    L.err(K, "import giving type: -50", imp({"labl": S(L.svc("bad-import-t")), "type": I(2100)}, ed_key()), errSecParam)
    L.err(K, "import giving bsiz: -50", imp({"labl": S(L.svc("bad-import-b")), "bsiz": I(256)}, ed_key()), errSecParam)
    L.err(K, "nothing stored by the refused imports", c.copy(query(KEYS, {"labl": S(L.svc("bad-import"))}, flags=R_ATTRS)),
          errSecItemNotFound)
    # the vectors
    c.send_raw(bytes.fromhex("0000002d190000002001000200046c61626c01000000066c6170746f700004747970650200000000000008340000000002"))
    r = c.read_reply(timeout=60)
    L.E("Test vectors", "vector 'key create: generate an Ed25519 key labelled laptop': ITEMS with its attributes",
        r.name == "ITEMS" and len(r["items"]) == 1 and r["items"][0]["present"] == R_ATTRS, repr(r))
    # an ADD of a keys item with extr false is non-extractable too
    ks = {"atag": D(L.svc("added-key").encode()), "kcls": I(1), "extr": B(False)}
    L.kind(K, "ADD of a keys item with extr false", c.add(KEYS, ks, b"private"), "ITEMS")
    L.err(K, "reading the data of a keys item with extr false: -25291", c.copy(query(KEYS, {"atag": ks["atag"]}, flags=R_DATA)),
          errSecNotAvailable)
    c.close()


def next_event(c, timeout=5.0):
    """The next EVENT on a subscribed connection (one read earlier comes first)."""
    if c.events:
        return c.events.pop(0)
    rep = c.read_frame(timeout=timeout)
    return rep


def no_frame(c, timeout=0.3):
    """Nothing arrives within `timeout`."""
    if c.events:
        return False
    try:
        c.read_frame(timeout=timeout)
        return False
    except TimeoutError:
        return True


def ev(rep, kind):
    return rep is not None and rep.name == "EVENT" and rep["kind"] == kind and rep.rid == 0


def e2e_events(L):
    EV = "Events"
    s1 = L.conn()
    s2 = L.conn()
    actor = L.conn()
    L.kind(EV, "SUBSCRIBE: OK", s1.request("SUBSCRIBE"), "OK")
    L.kind(EV, "SUBSCRIBE_EVENTS lock events (topics 1): OK", s2.request("SUBSCRIBE_EVENTS", {"topics": 1}), "OK")
    # a subscriber's own LOCK: the event first, then OK
    rid = s1.send("LOCK")
    a, b = s1.read_frame(), s1.read_frame()
    L.E(EV, "a subscriber that sends LOCK reads EVENT locked, then OK", ev(a, 2) and b.name == "OK" and b.rid == rid,
        "%r %r" % (a, b))
    L.E(EV, "EVENT locked carries graceMillis 0", a.name == "EVENT" and a.get("grace") == 0, a.f)
    L.E(EV, "the other subscriber gets EVENT locked (request id 0)", ev(next_event(s2), 2))
    st = actor.status()
    L.E("Status", "after LOCK: lockState 1 (locked)", st["lock"] == 1, st.f)
    # "no event" is checked with a sentinel: the next event a subscriber reads must be the later one
    L.kind(EV, "LOCK while already locked: OK", actor.request("LOCK"), "OK")
    actor.request("UNLOCK", {"passcode": L.pw}, timeout=120)
    L.E(EV, "LOCK while already locked sends no event (the next event is the later unlocked)",
        ev(next_event(s2), 3) and ev(next_event(s1), 3))
    actor.request("LOCK")
    next_event(s1), next_event(s2)
    rep = actor.request("UNLOCK", {"passcode": L.pw + b"x"}, timeout=120)
    L.err("Errors", "UNLOCK with a wrong passcode: -25293", rep, errSecAuthFailed)
    L.failed_attempt()
    rid = s1.send("UNLOCK", {"passcode": L.pw})
    a, b = s1.read_frame(timeout=120), s1.read_frame(timeout=120)
    L.failures_in_a_row = 0
    L.E(EV, "a subscriber that sends UNLOCK reads EVENT unlocked, then OK", ev(a, 3) and b.name == "OK" and b.rid == rid,
        "%r %r" % (a, b))
    L.E(EV, "a failed UNLOCK sends no event (the other subscriber's next event is the later unlocked)", ev(next_event(s2), 3))
    L.kind(EV, "UNLOCK while unlocked: OK", actor.request("UNLOCK", {"passcode": L.pw}, timeout=120), "OK")
    L.E(EV, "UNLOCK while already unlocked still sends unlocked", ev(next_event(s2), 3) and ev(next_event(s1), 3))
    # order
    for name in ("LOCK", "UNLOCK", "LOCK", "UNLOCK"):
        actor.request(name, {"passcode": L.pw} if name == "UNLOCK" else None, timeout=120)
    kinds = [next_event(s2).get("kind") for _ in range(4)]
    L.E(EV, "events reach a subscriber in the order they happened (locked, unlocked, locked, unlocked)", kinds == [2, 3, 2, 3], kinds)
    kinds = [next_event(s1).get("kind") for _ in range(4)]
    L.E(EV, "... on every subscriber", kinds == [2, 3, 2, 3], kinds)
    # lock-only subscribers never get item changes
    s2.add(GENP, {"svce": S(L.svc("ev-add"))}, b"s")
    actor.add(GENP, {"svce": S(L.svc("ev-add2"))}, b"s")
    actor.delete(query(GENP, {"svce": S(L.svc("ev-add2"))}))
    actor.request("LOCK")
    L.E(EV, "a connection subscribed to lock events only receives no itemsChanged (its next event is the later locked)",
        ev(next_event(s2), 2) and ev(next_event(s1), 2))
    L.unlock(actor)
    next_event(s1), next_event(s2)
    # item-change topics are for delegating front ends only
    for topics in (2, 3, 4, 5, 6, 7):
        rep = s2.request("SUBSCRIBE_EVENTS", {"topics": topics})
        L.err(EV, "SUBSCRIBE_EVENTS topics %d from a caller without delegate-identity: -34018" % topics, rep, errSecMissingEntitlement)
    L.E(EV, "the refusals leave the connection open", L.answers(s2))
    for vec in ("00000006230000000b03", "00000006230000000b07", "00000006230000000b04"):
        s2.send_raw(bytes.fromhex(vec))
        L.err("Test vectors", "vector subscribe_events %s: -34018 (no delegate-identity)" % vec[-2:], s2.read_reply(),
              errSecMissingEntitlement)
    s2.add(GENP, {"svce": S(L.svc("ev-add3"))}, b"s")
    actor.request("LOCK")
    L.E(EV, "a refused SUBSCRIBE_EVENTS changes none of the connection's topics (no itemsChanged before the later locked)",
        ev(next_event(s2), 2))
    next_event(s1)
    L.unlock(actor)
    next_event(s1), next_event(s2)
    L.kind(EV, "a SUBSCRIBE adding nothing: OK", s2.request("SUBSCRIBE"), "OK")
    L.kind(EV, "SUBSCRIBE_EVENTS 1 again: OK", s2.request("SUBSCRIBE_EVENTS", {"topics": 1}), "OK")
    s2.send_raw(bytes.fromhex("00000006230000000b01"))
    L.kind("Test vectors", "vector subscribe_events to lock events only: OK", s2.read_reply(), "OK")
    # request id 0 on a subscribed connection: told apart by type
    actor.request("LOCK")
    s2.send("STATUS", rid=0)
    a = s2.read_frame()
    b = s2.read_frame()
    L.E(EV, "a request with id 0 on a subscribed connection: the EVENT and the reply are told apart by type",
        ev(a, 2) and b.name == "STATUS_REPLY" and b.rid == 0, "%r %r" % (a, b))
    next_event(s1)
    rep = actor.request("UNLOCK", {"passcode": L.pw}, timeout=120)
    L.E(EV, "a connection that did not subscribe gets no event (its LOCKs and UNLOCKs brought none)",
        rep.name == "OK" and not actor.events, repr(actor.events))
    next_event(s1), next_event(s2)
    s1.close()
    s2.close()
    actor.close()


LOCK_CLASSES = ("ak", "ck", "dk", "aku", "cku", "dku", "akpu")
READABLE_LOCKED = {"ck", "dk", "cku", "dku"}


def e2e_locked(L):
    LS, LM = "Status", "Checking the keychain"
    c = L.conn()
    svce = L.svc("lock")
    refs = {}
    for code in LOCK_CLASSES:
        rep = c.add(GENP, {"svce": S(svce), "acct": S(code), "pdmn": S(code), "@kind": S("guarded")}, b"s-" + code.encode(), R_REF)
        refs[code] = rep["items"][0]["pref"]
    L.lock_refs = refs
    c.add(GENP, {"svce": S(L.svc("lock-acc")), "accc": D(accc([4]))}, b"acc")
    total = c.status()["items"]
    L.kind(LS, "LOCK: OK", c.request("LOCK"), "OK")
    st = c.status()
    L.E(LS, "locked: lockState 1, and itemCount still counts every item", st["lock"] == 1 and st["items"] == total, st.f)
    for code in LOCK_CLASSES:
        q = query(GENP, {"svce": S(svce), "acct": S(code)}, limit=LIMIT_ONE, flags=R_DATA)
        r = c.copy(q)
        if code in READABLE_LOCKED:
            L.E(LS, "locked: a %s item (AfterFirstUnlock or Always) is readable" % code,
                r.name == "ITEMS" and r["items"][0]["data"] == b"s-" + code.encode(), repr(r))
        else:
            L.err(LS, "locked: a %s item (WhenUnlocked) is not readable: -25308" % code, r, errSecInteractionNotAllowed)
            L.err(LS, "locked: nor are its attributes: -25308",
                  c.copy(query(GENP, {"svce": S(svce), "acct": S(code)}, flags=R_ATTRS)), errSecInteractionNotAllowed)
    L.err(LS, "locked: a search matching one locked item fails whole: -25308",
          c.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS)), errSecInteractionNotAllowed)
    L.err(LS, "locked: ... also paged", c.page(query(GENP, {"svce": S(svce)}, flags=R_ATTRS)), errSecInteractionNotAllowed)
    L.err("Errors", "locked: ADD of a WhenUnlocked (ak) item: -25308",
          c.add(GENP, {"svce": S(L.svc("lock-add")), "pdmn": S("ak")}, b"s"), errSecInteractionNotAllowed)
    for code in ("ck", "dk"):
        L.kind(LS, "locked: ADD of a %s item works" % code,
               c.add(GENP, {"svce": S(L.svc("lock-add")), "acct": S(code), "pdmn": S(code)}, b"s"), "ITEMS")
    L.err("Errors", "locked: UPDATE of a WhenUnlocked item: -25308",
          c.update(query(GENP, {"svce": S(svce), "acct": S("ak")}), {"labl": S("x")}), errSecInteractionNotAllowed)
    L.err("Test vectors", "live 'sync setup: init on /srv/keys.git as laptop' while locked: -25308",
          replay(L, c, "sync setup: init on /srv/keys.git as laptop"), errSecInteractionNotAllowed)
    L.err("Sync", "SYNC_SETUP while locked: -25308", c.request("SYNC_SETUP", {"op": 1, "remote": "/nonexistent/k.git",
                                                                              "device": "laptop"}), errSecInteractionNotAllowed)
    # locked matches by reference
    for form in ("COPY_MATCHING", "COPY_MATCHING_PAGE"):
        q = query(GENP, {"svce": S(svce)}, flags=R_ATTRS | R_REF | R_LOCKED)
        r = c.copy(q) if form == "COPY_MATCHING" else c.page(q)
        items = r.get("items", [])
        by_ref = {i.get("pref"): i for i in items}
        locked = {code for code, ref in refs.items() if by_ref.get(ref, {}).get("present") == R_LOCKED | R_REF}
        L.E(LM, "%s with the locked flag: every match is listed" % form, set(refs.values()) <= set(by_ref), repr(r))
        L.E(LM, "%s with the locked flag: the locked-away matches come as present 0x14 (reference only)" % form,
            locked == {"ak", "aku", "akpu"}, sorted(locked))
        L.E(LM, "%s with the locked flag: the readable matches come with their attributes" % form,
            all(by_ref.get(refs[code], {}).get("present") == R_ATTRS | R_REF for code in READABLE_LOCKED), items)
    r = c.copy(query(GENP, {"svce": S(L.svc("lock-acc"))}, flags=R_ATTRS | R_REF | R_LOCKED | R_ACCESS))
    L.E(LM, "a locked match with the access-state flag too: present exactly 0x14 (never bit 5)",
        r.name == "ITEMS" and [i["present"] for i in r["items"]] == [0x14], repr(r))
    q = query(GENP, {"svce": S(svce), "pdmn": S("ak")}, flags=R_REF | R_LOCKED)
    r = c.copy(q)
    L.E(LM, "the locked flag with pdmn named: only the row of that class",
        r.name == "ITEMS" and [i["pref"] for i in r["items"]] == [refs["ak"]], repr(r))
    r = c.copy(query(GENP, {"svce": S(svce), "@kind": S("guarded"), "acct": S("aku")}, flags=R_REF | R_LOCKED))
    L.E(LM, "the locked flag with a general attribute and acct: the one locked match",
        r.name == "ITEMS" and [(i["pref"], i["present"]) for i in r["items"]] == [(refs["aku"], 0x14)], repr(r))
    r = c.copy(query(GENP, {"labl": S("nobody-has-this-%s" % L.tag)}, flags=R_REF | R_LOCKED))
    L.err(LM, "the locked flag naming labl (indexed): a valid search (-25300 when nothing matches)", r, errSecItemNotFound)
    for label, q in (("without an item class", query(0, {"svce": S(svce)}, flags=R_REF | R_LOCKED)),
                     ("without the reference flag", query(GENP, {"svce": S(svce)}, flags=R_ATTRS | R_LOCKED)),
                     ("naming desc (no blind index)", query(GENP, {"svce": S(svce), "desc": S("d")}, flags=R_REF | R_LOCKED)),
                     ("naming gena", query(GENP, {"svce": S(svce), "gena": D(b"g")}, flags=R_REF | R_LOCKED))):
        L.err(LM, "the locked flag %s: -50" % label, c.copy(q), errSecParam)
    L.err(LM, "the locked flag with skipUnreadable: -50",
          c.page(query(GENP, {"svce": S(svce)}, flags=R_REF | R_LOCKED | R_SKIP)), errSecParam)
    c.send_raw(bytes.fromhex("0000004f0b000000600100020005406b696e6401000000076775617264656400047376636501000000176f72672e6672656564"
                             "65736b746f702e73656372657473010000000014000000000000000000000000"))
    L.err("Test vectors", "vector 'copy matching page naming locked matches ...': -25300 (none such)", c.read_reply(), errSecItemNotFound)
    # CHECK while locked
    if L.whole_keychain:
        r = c.request("CHECK", {"op": 1})
        n = c.status()["items"]
        L.E(LM, "CHECK verify while locked: checked + skipped is every item, skipped at least the 3 locked-away ones",
            r.name == "CHECK_REPORT" and r["checked"] + r["skipped"] == n and r["skipped"] >= 3, "%r %s %d" % (r, r.f, n))
    # the reference reads the item once unlocked
    L.unlock(c)
    r = c.copy(query(0, {}, flags=R_DATA, pref=refs["ak"]))
    L.E(LM, "once unlocked, a query by the locked match's reference reads it",
        r.name == "ITEMS" and r["items"][0]["data"] == b"s-ak", repr(r))
    r = c.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS | R_REF | R_LOCKED))
    L.E(LM, "unlocked, the locked flag changes nothing: every item with its attributes",
        r.name == "ITEMS" and all(i["present"] == R_ATTRS | R_REF for i in r["items"]) and len(r["items"]) == 7, repr(r))
    c.close()


def e2e_authentication(L):
    AU = "Authentication"
    L.unlock()
    c = L.conn()
    svce = L.svc("auth")
    rep = c.add(GENP, {"svce": S(svce), "accc": D(accc([4]))}, b"guarded", R_ATTRS | R_REF)
    ok = L.kind(AU, "ADD with an access control (devicePasscode) once a passcode is set: ITEMS", rep, "ITEMS")
    if ok:
        a = rep["items"][0]["attrs"]
        L.E("Attributes", "accc without pdmn defaults pdmn to aku", a.get("pdmn") == S("aku"), a.get("pdmn"))
        L.E("Attributes", "accc is returned as given", a.get("accc") == D(accc([4])), a.get("accc"))
    for code in ("ak", "ck", "dk"):
        L.err("Attributes", "accc with pdmn %s (not ThisDeviceOnly): -50" % code,
              c.add(GENP, {"svce": S(L.svc("auth-pd")), "acct": S(code), "pdmn": S(code), "accc": D(accc([4]))}, b"s"), errSecParam)
    for code in ("cku", "dku", "akpu"):
        L.kind("Attributes", "accc with pdmn %s: ITEMS" % code,
               c.add(GENP, {"svce": S(L.svc("auth-pd")), "acct": S(code), "pdmn": S(code), "accc": D(accc([4]))}, b"s"), "ITEMS")
    c.send_raw(bytes.fromhex("0000003c06000000130100030004616363630300000006010101040700000470646d6e0100000002616b00047376636501"
                             "000000046d61696c00000002707700"))
    L.err("Test vectors", "vector 'add ... with an access control' (pdmn ak) once a passcode is set: -50", c.read_reply(), errSecParam)
    L.err("Attributes", "accc in a query: -50", c.copy(query(GENP, {"accc": D(accc([4]))}, flags=R_ATTRS)), errSecParam)
    L.err("Attributes", "accc in UPDATE's changes: -50",
          c.update(query(GENP, {"svce": S(svce)}), {"accc": D(accc([1]))}), errSecParam)
    seen, r = talk(c, "UPDATE", {"query": query(GENP, {"svce": S(L.svc("auth-pd")), "acct": S("cku")}),
                                 "changes": {"pdmn": S("dku")}}, [PW(L.pw)])
    L.err("Attributes", "UPDATE changing an access-controlled item's pdmn: -50", r, errSecParam)
    q = query(GENP, {"svce": S(svce)}, limit=LIMIT_ONE, flags=R_DATA)
    # no authentication for attributes, references or bare matches
    for flags in (R_ATTRS, R_REF, 0, R_ATTRS | R_REF):
        seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce)}, flags=flags)}, [CANCEL])
        L.E(AU, "a search returning flags %d (no data) needs no authentication" % flags, not seen and r.name == "ITEMS", "%r %r" % (seen, r))
    # the conversation
    rid = c.send("COPY_MATCHING", {"query": q})
    need = c.read_reply()
    L.E(AU, "reading the secret: AUTH_NEEDED with the request's id", need.name == "AUTH_NEEDED" and need.rid == rid, repr(need))
    if need.name == "AUTH_NEEDED":
        L.E(AU, "AUTH_NEEDED offers the passcode alone (devicePasscode, no biometry)", need["methods"] == 1, need.f)
        L.E(AU, "AUTH_NEEDED names the app and carries a prompt", need["app"] != "" and need["prompt"] != "", need.f)
        c.send("AUTH_RESPONSE", PW(L.pw), rid=rid)
        r = c.read_reply()
        L.E(AU, "the right passcode: the final ITEMS with the secret", r.name == "ITEMS" and r.rid == rid and
            r["items"][0]["data"] == b"guarded", repr(r))
    L.failures_in_a_row = 0
    # the client's operation prompt is part of the prompt
    c2 = L.conn()
    c2.ok("AUTH_OPTIONS", {"prompt": "Pay 10 EUR zq"})
    seen, r = talk(c2, "COPY_MATCHING", {"query": q}, [PW(L.pw)])
    L.E(AU, "AUTH_OPTIONS' operation prompt appears in AUTH_NEEDED's prompt",
        seen and seen[0].name == "AUTH_NEEDED" and "Pay 10 EUR zq" in seen[0]["prompt"] and r.name == "ITEMS", seen)
    c2.close()
    # feedback by version
    for ver in (1, 2, 3, 4):
        cv = L.conn(1, ver)
        seen, r = talk(cv, "COPY_MATCHING", {"query": q}, [PW(L.pw + b"-wrong"), PW(L.pw)])
        L.failed_attempt()
        fb = seen[1] if len(seen) > 1 else None
        if ver == 1:
            L.E(AU, "version 1: a wrong passcode gets AUTH_FEEDBACK (no kind) with the request's id",
                fb is not None and fb.name == "AUTH_FEEDBACK" and fb.rid == r.rid and fb["text"] != "", seen)
        else:
            L.E(AU, "version %d: a wrong passcode gets AUTH_FEEDBACK_KIND kind 1 (wrong passcode)" % ver,
                fb is not None and fb.name == "AUTH_FEEDBACK_KIND" and fb["kind"] == 1 and fb.rid == r.rid and fb["text"] != "", seen)
        L.E(AU, "version %d: after the feedback the right passcode ends it with ITEMS" % ver,
            r.name == "ITEMS" and r["items"][0]["data"] == b"guarded", repr(r))
        L.failures_in_a_row = 0
        cv.close()
    # three wrong passcodes end the request
    L.unlock()
    seen, r = talk(c, "COPY_MATCHING", {"query": q}, [PW(b"w1"), PW(b"w2"), PW(b"w3")])
    L.failures_in_a_row = 3
    kinds = [(s.name, s.get("kind")) for s in seen]
    L.E(AU, "three wrong passcodes: AUTH_NEEDED, feedback kind 1 twice, then ERROR -25293",
        kinds == [("AUTH_NEEDED", None), ("AUTH_FEEDBACK_KIND", 1), ("AUTH_FEEDBACK_KIND", 1)] and L.is_err(r, errSecAuthFailed),
        "%r %r" % (kinds, r))
    L.unlock()
    # an AUTH_RESPONSE for a request that is no longer waiting: ignored, no reply
    seen, r = talk(c, "COPY_MATCHING", {"query": q}, [PW(L.pw)])
    c.send_raw(encode_frame("AUTH_RESPONSE", r.rid, PW(L.pw)) + encode_frame("STATUS", r.rid + 1))
    r2 = c.read_reply()
    L.E(AU, "an AUTH_RESPONSE for a request that already ended is ignored (no reply); the next request is answered",
        r.name == "ITEMS" and r2.name == "STATUS_REPLY" and r2.rid == r.rid + 1, "%r %r" % (r, r2))
    # cancel, wait for biometry without a sensor, an application password not offered
    for label, answer, want in (("cancel", CANCEL, errSecUserCanceled),
                                ("wait for biometry with no evaluation running", WAIT_BIO, errSecUserCanceled),
                                ("an application password where none was offered", AP(b"x"), errSecAuthFailed)):
        seen, r = talk(c, "COPY_MATCHING", {"query": q}, [answer])
        L.err(AU, "AUTH_RESPONSE %s ends the request: %d" % (label, want), r, want)
        L.E(AU, "... and the connection stays (%s)" % label, L.answers(c))
    # fallback: silence, then a passcode
    rid = c.send("COPY_MATCHING", {"query": q})
    need = c.read_reply()
    c.send("AUTH_RESPONSE", FALLBACK, rid=rid)
    quiet = no_frame(c, 0.5)
    c.send("AUTH_RESPONSE", PW(L.pw), rid=rid)
    r = c.read_reply()
    L.E(AU, "fallback with the passcode among the methods: no frame follows, then a passcode ends it with ITEMS",
        need.name == "AUTH_NEEDED" and quiet and r.name == "ITEMS" and r.rid == rid, "%r %s %r" % (need, quiet, r))
    # an AUTH_RESPONSE with another id is skipped
    rid = c.send("COPY_MATCHING", {"query": q})
    need = c.read_reply()
    c.send("AUTH_RESPONSE", CANCEL, rid=rid + 1000)
    quiet = no_frame(c, 0.3)
    c.send("AUTH_RESPONSE", PW(L.pw), rid=rid)
    r = c.read_reply()
    L.E(AU, "an AUTH_RESPONSE with another id is skipped (no reply), the request's own ends it",
        quiet and r.name == "ITEMS" and r.rid == rid, "%s %r" % (quiet, r))
    # another message while waiting: -128, then the agent closes
    d = L.conn()
    rid = d.send("COPY_MATCHING", {"query": q})
    need = d.read_reply()
    d.send("STATUS", rid=rid + 1)
    try:
        r = d.read_reply(timeout=10)
        closed = d.is_closed(3)
    except Closed:
        r, closed = None, True
    L.E(AU, "another message while a request waits for AUTH_RESPONSE: the request fails with -128, then the connection closes",
        L.is_err(r, errSecUserCanceled) and r.rid == rid and closed, "%r %s" % (r, closed))
    d.close()
    # AUTH_OPTIONS: no user interface
    d = L.conn()
    L.kind(AU, "AUTH_OPTIONS with the no-user-interface flag: OK", d.request("AUTH_OPTIONS", {"flags": 1}), "OK")
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [PW(L.pw)])
    L.E(AU, "no-user-interface: a request that needs the person fails at once with -25308, without AUTH_NEEDED",
        not seen and L.is_err(r, errSecInteractionNotAllowed), "%r %r" % (seen, r))
    seen, r = talk(d, "LA_EVALUATE", {"policy": 2, "reason": "check"}, [PW(L.pw)])
    L.E(AU, "no-user-interface: LA_EVALUATE gives notInteractive (-1004) at once, without AUTH_NEEDED",
        not seen and r.name == "LA_RESULT" and r["code"] == -1004, "%r %r" % (seen, r))
    d.send_raw(bytes.fromhex("0000000e0e00000030010000000000000000"))
    L.kind("Test vectors", "vector 'auth options: no user interface': OK", d.read_reply(), "OK")
    d.close()
    # a passcode given in advance
    d = L.conn()
    d.ok("AUTH_OPTIONS", {"passcode": L.pw})
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [CANCEL])
    L.E(AU, "a passcode given in advance is used instead of asking", not seen and r.name == "ITEMS", "%r %r" % (seen, r))
    d.ok("AUTH_OPTIONS", {"passcode": L.pw + b"-wrong"})
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [CANCEL])
    L.failed_attempt()
    L.E(AU, "a wrong passcode given in advance: -25293", L.is_err(r, errSecAuthFailed) and
        not any(s.name == "AUTH_NEEDED" for s in seen), "%r %r" % (seen, r))
    d.close()
    L.unlock()
    # reuse
    d = L.conn()
    L.kind(AU, "AUTH_OPTIONS with reuse 60 s: OK", d.request("AUTH_OPTIONS", {"reuse": 60}), "OK")
    seen1, r1 = talk(d, "COPY_MATCHING", {"query": q}, [PW(L.pw)])
    seen2, r2 = talk(d, "COPY_MATCHING", {"query": q}, [CANCEL])
    L.E(AU, "reuse: the first read asks, the second within the window does not",
        [s.name for s in seen1] == ["AUTH_NEEDED"] and r1.name == "ITEMS" and not seen2 and r2.name == "ITEMS",
        "%r %r %r %r" % (seen1, r1, seen2, r2))
    qa = query(GENP, {"svce": S(svce)}, flags=R_ATTRS | R_ACCESS)
    r = d.copy(qa)
    L.E("Checking the keychain", "access state inside a reuse window: bit 5 clear (the connection's window satisfies the control)",
        r.name == "ITEMS" and r["items"][0]["present"] == R_ATTRS, repr(r) + str(r.get("items")))
    e = L.conn()
    r = e.copy(qa)
    L.E("Checking the keychain", "access state on another connection: bit 5 set beside bit 1 (the secret needs the person)",
        r.name == "ITEMS" and r["items"][0]["present"] == R_ATTRS | R_ACCESS, repr(r))
    r = e.page(qa)
    L.E("Checking the keychain", "access state through COPY_MATCHING_PAGE: bit 5 set",
        r.name == "ITEMS_PAGE" and r["items"][0]["present"] == R_ATTRS | R_ACCESS, repr(r))
    plain = L.svc("auth-plain")
    e.add(GENP, {"svce": S(plain)}, b"p")
    r = e.copy(query(GENP, {"svce": S(plain)}, flags=R_ATTRS | R_ACCESS))
    L.E("Checking the keychain", "access state of an item without an access control: bit 5 clear",
        r.name == "ITEMS" and r["items"][0]["present"] == R_ATTRS, repr(r))
    v1 = L.conn(1, 1)
    r = v1.copy(qa)
    L.E("Checking the keychain", "access state is accepted on a version 1 connection too",
        r.name == "ITEMS" and r["items"][0]["present"] == R_ATTRS | R_ACCESS, repr(r))
    v1.close()
    e.send_raw(bytes.fromhex("00000021070000000701000100047376636501000000046d61696c01000000002200000000"))
    r = e.read_reply()
    L.E("Test vectors", "vector 'copy-matching ... with the access state': ITEMS or -25300", r.name == "ITEMS" or
        L.is_err(r, errSecItemNotFound), repr(r))
    e.close()
    d.request("LOCK")
    L.unlock(d)
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [PW(L.pw)])
    L.E(AU, "a lock of the keybag ends the reuse (the read asks again)", [s.name for s in seen] == ["AUTH_NEEDED"] and r.name == "ITEMS",
        "%r %r" % (seen, r))
    d.ok("AUTH_OPTIONS", {"reuse": 60})
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [PW(L.pw)])
    L.E(AU, "a new AUTH_OPTIONS ends the reuse (the read asks again)", [s.name for s in seen] == ["AUTH_NEEDED"] and r.name == "ITEMS",
        "%r %r" % (seen, r))
    d.close()
    # later pages of a paged search reuse the first page's authentication
    pg = L.svc("auth-pages")
    for i in range(3):
        c.add(GENP, {"svce": S(pg), "acct": S("p%d" % i), "accc": D(accc([4]))}, pattern(100 * 1024, i + 1))
    v3 = L.conn(1, 3)
    qp = query(GENP, {"svce": S(pg)}, flags=R_DATA | R_ATTRS)
    seen1, p1 = talk(v3, "COPY_MATCHING_PAGE", {"query": qp, "cursor": 0}, [PW(L.pw)] * 3, query_flags=qp["flags"])
    seen2, p2 = talk(v3, "COPY_MATCHING_PAGE", {"query": qp, "cursor": p1.get("next", 0)}, [PW(L.pw)] * 3,
                     query_flags=qp["flags"]) if p1.name == "ITEMS_PAGE" and p1["next"] else ([], None)
    L.E(AU, "a paged search of protected items: the first page asks (AUTH_NEEDED) and has a next cursor",
        any(x.name == "AUTH_NEEDED" for x in seen1) and p1.name == "ITEMS_PAGE" and p1["next"] != 0, "%r %r" % (seen1, p1))
    L.E(AU, "the next page with the same query and that nextCursor reuses the authentication (no AUTH_NEEDED)",
        p2 is not None and p2.name == "ITEMS_PAGE" and not seen2, "%r %r" % (seen2, p2))
    if p1.name == "ITEMS_PAGE" and p1["next"]:
        qo = query(GENP, {"svce": S(pg)}, flags=R_DATA)
        seen3, p3 = talk(v3, "COPY_MATCHING_PAGE", {"query": qo, "cursor": p1["next"]}, [PW(L.pw)] * 3, query_flags=qo["flags"])
        L.E(AU, "a page request with another query and that cursor is authenticated afresh",
            any(x.name == "AUTH_NEEDED" for x in seen3) and p3.name == "ITEMS_PAGE", "%r %r" % (seen3, p3))
        seen1, p1 = talk(v3, "COPY_MATCHING_PAGE", {"query": qp, "cursor": 0}, [PW(L.pw)] * 3, query_flags=qp["flags"])
        v3.request("LOCK")
        L.unlock(v3)
        seen4, p4 = talk(v3, "COPY_MATCHING_PAGE", {"query": qp, "cursor": p1["next"]}, [PW(L.pw)] * 3, query_flags=qp["flags"])
        L.E(AU, "after a lock between pages the next page is authenticated afresh",
            any(x.name == "AUTH_NEEDED" for x in seen4) and p4.name == "ITEMS_PAGE", "%r %r" % (seen4, p4))
    v3.close()
    L.failures_in_a_row = 0
    # UPDATE and DELETE need the authentication the control names
    up = L.svc("auth-ops")
    c.add(GENP, {"svce": S(up), "acct": S("all"), "accc": D(accc([4], operations=7))}, b"s")
    c.add(GENP, {"svce": S(up), "acct": S("use"), "accc": D(accc([4], operations=1))}, b"s")
    seen, r = talk(c, "UPDATE", {"query": query(GENP, {"svce": S(up), "acct": S("all")}), "changes": {"labl": S("x")}}, [PW(L.pw)])
    L.E(AU, "UPDATE of an item whose control covers update: AUTH_NEEDED, then COUNT 1",
        [s.name for s in seen] == ["AUTH_NEEDED"] and r.name == "COUNT" and r["n"] == 1, "%r %r" % (seen, r))
    seen, r = talk(c, "UPDATE", {"query": query(GENP, {"svce": S(up), "acct": S("all")}), "changes": {"labl": S("y")}}, [CANCEL])
    L.err(AU, "UPDATE cancelled: -128", r, errSecUserCanceled)
    r2 = c.copy(query(GENP, {"svce": S(up), "acct": S("all")}, flags=R_ATTRS))
    L.E(AU, "... and nothing changed", r2["items"][0]["attrs"].get("labl") == S("x"), r2)
    seen, r = talk(c, "UPDATE", {"query": query(GENP, {"svce": S(up), "acct": S("use")}), "changes": {"labl": S("x")}}, [CANCEL])
    L.E(AU, "UPDATE of an item whose control covers only use: no AUTH_NEEDED, COUNT 1", not seen and r.name == "COUNT",
        "%r %r" % (seen, r))
    seen, r = talk(c, "DELETE", {"query": query(GENP, {"svce": S(up), "acct": S("all")})}, [CANCEL])
    L.err(AU, "DELETE cancelled: -128", r, errSecUserCanceled)
    seen, r = talk(c, "DELETE", {"query": query(GENP, {"svce": S(up), "acct": S("all")})}, [PW(L.pw)])
    L.E(AU, "DELETE of an item whose control covers delete: AUTH_NEEDED, then COUNT 1",
        [s.name for s in seen] == ["AUTH_NEEDED"] and r.name == "COUNT" and r["n"] == 1, "%r %r" % (seen, r))
    seen, r = talk(c, "DELETE", {"query": query(GENP, {"svce": S(up), "acct": S("use")})}, [CANCEL])
    L.E(AU, "DELETE of an item whose control covers only use: no AUTH_NEEDED", not seen and r.name == "COUNT", "%r %r" % (seen, r))
    # biometry unusable: the sensor's reason comes first
    c.add(GENP, {"svce": S(L.svc("auth-bio")), "accc": D(accc([2]))}, b"b")
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(L.svc("auth-bio"))}, flags=R_DATA)}, [CANCEL])
    L.E(AU, "a biometryAny item without a biometric authenticator: -25291 without asking", not seen and
        L.is_err(r, errSecNotAvailable), "%r %r" % (seen, r))
    # userPresence without biometry takes the passcode
    c.add(GENP, {"svce": S(L.svc("auth-presence")), "accc": D(accc([1]))}, b"p")
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(L.svc("auth-presence"))}, flags=R_DATA)}, [PW(L.pw)])
    L.E(AU, "userPresence without enrolled biometry takes the passcode", seen and seen[0]["methods"] & 1 and r.name == "ITEMS",
        "%r %r" % (seen, r))
    # an and rule: one AUTH_NEEDED per factor
    c.ok("AUTH_OPTIONS", {"app_password": b"and-ap"})
    rep = c.add(GENP, {"svce": S(L.svc("auth-and")), "accc": D(accc([4, 5], combination=2))}, b"both")
    L.kind(AU, "ADD of an and rule (devicePasscode and applicationPassword) with the password given in advance", rep, "ITEMS")
    c.ok("AUTH_OPTIONS", {})
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(L.svc("auth-and"))}, flags=R_DATA)},
                   [PW(L.pw), AP(b"and-ap")])
    needs = [s for s in seen if s.name == "AUTH_NEEDED"]
    L.E(AU, "an and rule: a new AUTH_NEEDED (same id) for the next factor, then ITEMS",
        len(needs) == 2 and all(s.rid == r.rid for s in needs) and r.name == "ITEMS" and r["items"][0]["data"] == b"both",
        "%r %r" % ([(s.name, s.f) for s in seen], r))
    c.close()
    L.failures_in_a_row = 0


def e2e_app_password(L):
    AU = "Authentication"
    c = L.conn()
    svce = L.svc("ap")
    c.ok("AUTH_OPTIONS", {"app_password": b"ap-one"})
    seen, rep = talk(c, "ADD", {"cls": GENP, "attrs": {"svce": S(svce), "acct": S("one"), "accc": D(accc([5]))}, "secret": b"apsecret",
                                "flags": R_REF}, [AP(b"ap-one")])
    L.kind(AU, "ADD of an item needing an application password given in advance", rep, "ITEMS")
    seen, rep = talk(c, "ADD", {"cls": GENP, "attrs": {"svce": S(svce), "acct": S("two"), "accc": D(accc([5]))}, "secret": b"two",
                                "flags": 0}, [AP(b"ap-one")])
    c.close()
    q = query(GENP, {"svce": S(svce), "acct": S("one")}, limit=LIMIT_ONE, flags=R_DATA)
    d = L.conn()
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [AP(b"ap-one")])
    L.E(AU, "reading it on another connection: AUTH_NEEDED offering the application password (bit 2), then ITEMS",
        seen and seen[0].name == "AUTH_NEEDED" and seen[0]["methods"] & 4 and r.name == "ITEMS" and r["items"][0]["data"] == b"apsecret",
        "%r %r" % ([s.f for s in seen], r))
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [AP(b"wrong-ap")])
    L.err(AU, "a wrong application password: -25293", r, errSecAuthFailed)
    d.close()
    d = L.conn()
    d.ok("AUTH_OPTIONS", {"app_password": b"ap-one"})
    seen, r = talk(d, "COPY_MATCHING", {"query": q}, [CANCEL])
    L.E(AU, "an application password given in advance opens the item without asking",
        not seen and r.name == "ITEMS" and r["items"][0]["data"] == b"apsecret", "%r %r" % (seen, r))
    d.ok("AUTH_OPTIONS", {"app_password": b"wrong-ap"})
    seen, r = talk(d, "DELETE", {"query": query(GENP, {"svce": S(svce), "acct": S("one")})}, [CANCEL])
    L.err(AU, "DELETE with a wrong application password: -25293 (it must prove the password first)", r, errSecAuthFailed)
    seen, r = talk(d, "UPDATE", {"query": query(GENP, {"svce": S(svce), "acct": S("one")}), "changes": {}, "secret": b"new"},
                   [CANCEL])
    L.err(AU, "UPDATE replacing the secret with a wrong application password: -25293", r, errSecAuthFailed)
    d.ok("AUTH_OPTIONS", {"app_password": b"ap-one"})
    r = d.copy(q)
    L.E(AU, "... the item is unchanged, and the right password (a success) resets its count",
        r.name == "ITEMS" and r["items"][0]["data"] == b"apsecret", repr(r))
    d.ok("AUTH_OPTIONS", {"app_password": b"wrong-ap"})
    three = [d.copy(q) for _ in range(3)]
    d.ok("AUTH_OPTIONS", {"app_password": b"ap-one"})
    r = d.copy(q)
    L.E(AU, "a success reset the item's count: three more failures, and the right password still opens it",
        all(L.is_err(x, errSecAuthFailed) for x in three) and r.name == "ITEMS", "%r %r" % (three, r))
    r = d.update(query(GENP, {"svce": S(svce), "acct": S("one")}), {}, b"apsecret2")
    r2 = d.copy(q)
    L.E(AU, "UPDATE replacing the secret with the right application password: COUNT 1, and the new secret reads",
        r.name == "COUNT" and r2.name == "ITEMS" and r2["items"][0]["data"] == b"apsecret2", "%r %r" % (r, r2))
    # the attempt schedule, per item: 4 free failures, then a wait; other items are not delayed
    q2 = query(GENP, {"svce": S(svce), "acct": S("two")}, limit=LIMIT_ONE, flags=R_DATA)
    d.ok("AUTH_OPTIONS", {"app_password": b"bad"})
    codes = [d.copy(q2) for _ in range(4)]
    L.E("Authentication", "application-password attempts: 4 failures in a row each -25293",
        all(L.is_err(x, errSecAuthFailed) for x in codes), codes)
    d.ok("AUTH_OPTIONS", {"app_password": b"ap-one"})
    r = d.copy(q2)
    L.E("Authentication", "the 5th attempt, even with the right password, is refused during the item's delay: -25293",
        L.is_err(r, errSecAuthFailed), repr(r))
    r = d.copy(q)
    L.E("Authentication", "another item is not delayed", r.name == "ITEMS" and r["items"][0]["data"] == b"apsecret2", repr(r))
    d.close()


def e2e_la(L):
    AU = "Authentication"
    L.unlock()
    c = L.conn()
    r = c.request("LA_CAN_EVALUATE", {"policy": 1})
    L.E(AU, "LA_CAN_EVALUATE biometrics without a biometric authenticator: biometryNotAvailable (-6), biometryType 0",
        r.name == "LA_RESULT" and r["code"] == -6 and r["biometry"] == 0 and r["domain"] == b"", "%r %s" % (r, r.f))
    seen, r = talk(c, "LA_EVALUATE", {"policy": 1, "reason": "bio"}, [CANCEL])
    L.E(AU, "LA_EVALUATE biometrics without an authenticator: LA_RESULT biometryNotAvailable (-6) without AUTH_NEEDED",
        not seen and r.name == "LA_RESULT" and r["code"] == -6 and r["biometry"] == 0, "%r %r %s" % (seen, r, r.f))
    seen, r = talk(c, "LA_EVALUATE", {"policy": 2, "reason": "Sign in to Mail"}, [PW(L.pw)])
    L.E(AU, "LA_EVALUATE device owner: AUTH_NEEDED (passcode), the passcode, then LA_RESULT 0 with no domain state",
        [s.name for s in seen] == ["AUTH_NEEDED"] and seen[0]["methods"] == 1 and r.name == "LA_RESULT" and r["code"] == 0 and
        r["domain"] == b"" and r["biometry"] == 0, "%r %r %s" % (seen, r, r.f))
    L.E(AU, "LA_EVALUATE's AUTH_NEEDED prompt carries the reason", seen and "Sign in to Mail" in seen[0]["prompt"], seen)
    seen, r = talk(c, "LA_EVALUATE", {"policy": 2, "reason": "cancel me"}, [CANCEL])
    L.E(AU, "LA_EVALUATE cancelled: LA_RESULT userCancel (-2), not an ERROR", r.name == "LA_RESULT" and r["code"] == -2, repr(r))
    rid = c.send("LA_EVALUATE", {"policy": 2, "reason": "fallback"})
    need = c.read_reply()
    c.send("AUTH_RESPONSE", FALLBACK, rid=rid)
    quiet = no_frame(c, 0.4)
    c.send("AUTH_RESPONSE", PW(L.pw), rid=rid)
    r = c.read_reply()
    L.E(AU, "LA_EVALUATE device owner, fallback: silence, then the passcode gives LA_RESULT 0",
        quiet and r.name == "LA_RESULT" and r["code"] == 0, "%s %r" % (quiet, r))
    L.unlock()
    seen, r = talk(c, "LA_EVALUATE", {"policy": 2, "reason": "wrong"}, [PW(b"x1"), PW(b"x2"), PW(b"x3")])
    L.failures_in_a_row = 3
    L.E(AU, "LA_EVALUATE with three wrong passcodes: two feedbacks, then LA_RESULT authenticationFailed (-1)",
        [s.name for s in seen] == ["AUTH_NEEDED", "AUTH_FEEDBACK_KIND", "AUTH_FEEDBACK_KIND"] and r.name == "LA_RESULT" and
        r["code"] == -1, "%r %r" % (seen, r))
    L.unlock()
    c.send_raw(bytes.fromhex("00000006110000003301"))
    r = c.read_reply()
    L.E("Test vectors", "vector 'la can evaluate: biometrics': LA_RESULT", r.name == "LA_RESULT", repr(r))
    # an evaluation carries into the item requests of the connection (reuse)
    svce = L.svc("la-reuse")
    c.add(GENP, {"svce": S(svce), "accc": D(accc([4]))}, b"x")
    c.ok("AUTH_OPTIONS", {"reuse": 60})
    seen, r = talk(c, "LA_EVALUATE", {"policy": 2, "reason": "once"}, [PW(L.pw)])
    seen2, r2 = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce)}, flags=R_DATA)}, [CANCEL])
    L.E(AU, "a successful LA_EVALUATE within a reuse window covers a later item read (no AUTH_NEEDED)",
        r.get("code") == 0 and not seen2 and r2.name == "ITEMS", "%r %r %r" % (r, seen2, r2))
    c.close()
    L.failures_in_a_row = 0


def e2e_checking(L):
    CK = "Checking the keychain"
    if not L.whole_keychain:
        return
    c = L.conn()
    n = c.status()["items"]
    r = c.request("CHECK", {"op": 1})
    L.E(CK, "CHECK verify while unlocked: every item checked, none skipped, no finding",
        r.name == "CHECK_REPORT" and r["checked"] == n and r["skipped"] == 0 and r["findings"] == [], "%r %s n=%d" % (r, r.f, n))
    total, pages, cursor = 0, 0, 0
    while True:
        p = c.request("CHECK_PAGE", {"op": 1, "cursor": cursor})
        if p.name != "CHECK_REPORT_PAGE":
            break
        pages += 1
        total += p["checked"]
        cursor = p["next"]
        if not cursor or pages > 1000:
            break
    L.E(CK, "CHECK_PAGE verify: the pages' checked counts sum to every item", total == n and cursor == 0, (total, n, pages))
    r = c.request("CHECK", {"op": 2})
    L.E(CK, "CHECK quarantine of a sound keychain: no finding, nothing moved",
        r.name == "CHECK_REPORT" and r["findings"] == [] and c.status()["items"] == n, repr(r))
    r = c.request("CHECK", {"op": 3})
    L.E(CK, "CHECK list of an empty quarantine: checked 0, skipped 0, no entry",
        r.name == "CHECK_REPORT" and r["checked"] == 0 and r["skipped"] == 0 and r["findings"] == [], repr(r))
    r = c.request("CHECK_PAGE", {"op": 3, "cursor": 0})
    L.E(CK, "CHECK_PAGE list of an empty quarantine: nothing, nextCursor 0",
        r.name == "CHECK_REPORT_PAGE" and r["findings"] == [] and r["next"] == 0, repr(r))
    r = c.request("CHECK_PAGE", {"op": 2, "cursor": 0})
    L.E(CK, "CHECK_PAGE quarantine of a sound keychain: no finding", r.name == "CHECK_REPORT_PAGE" and r["findings"] == [], repr(r))
    L.err(CK, "CHECK restore of a reference no quarantined item has: -25300", c.request("CHECK", {"op": 4, "pref": os.urandom(16)}),
          errSecItemNotFound)
    for vec, want in (("0000000a17000000300100000000", "CHECK_REPORT"), ("0000000a17000000320300000000", "CHECK_REPORT"),
                      ("0000000e1800000050010000000000000000", "CHECK_REPORT_PAGE"),
                      ("0000000e1800000052030000000000000007", "CHECK_REPORT_PAGE")):
        c.send_raw(bytes.fromhex(vec))
        L.kind("Test vectors", "vector %s...: %s" % (vec[8:14], want), c.read_reply(), want)
    c.send_raw(bytes.fromhex("0000001a1700000033040000001000112233445566778899aabbccddeeff"))
    L.err("Test vectors", "vector 'check, restore 0011…ff': -25300 (not quarantined)", c.read_reply(), errSecItemNotFound)
    c.close()


def e2e_escrow(L):
    ES = "Escrow"
    if not L.whole_keychain:
        return
    L.unlock()
    c = L.conn()
    sub = L.conn()
    sub.ok("SUBSCRIBE")
    r = c.request("ESCROW", {"op": 2, "secret": bytes(32)})
    L.err(ES, "ESCROW unlock without a record: -25300", r, errSecItemNotFound)
    c.send_raw(bytes.fromhex("0000000f1500000074020000000573686f7274"))
    L.err("Test vectors", "vector 'escrow unlock with a 5-byte secret' without a record: -25300", c.read_reply(), errSecItemNotFound)
    seen, r = talk(c, "ESCROW", {"op": 1}, [CANCEL])
    L.E(ES, "ESCROW create asks for the person (AUTH_NEEDED, passcode); a cancel: -128",
        seen and seen[0].name == "AUTH_NEEDED" and seen[0]["methods"] & 1 and L.is_err(r, errSecUserCanceled), "%r %r" % (seen, r))
    seen, r = talk(c, "ESCROW", {"op": 1}, [PW(L.pw)])
    ok = L.E(ES, "ESCROW create with the passcode: ESCROW_SECRET of 32 bytes", r.name == "ESCROW_SECRET" and len(r["secret"]) == 32,
             repr(r))
    if not ok:
        return
    secret = r["secret"]
    c.ok("LOCK")
    next_event(sub)
    rid = c.send("ESCROW", {"op": 2, "secret": secret})
    r = c.read_reply(timeout=120)
    L.E(ES, "ESCROW unlock with the secret: OK", r.name == "OK" and r.rid == rid, repr(r))
    L.E(ES, "ESCROW unlock sends subscribers unlocked", ev(next_event(sub), 3))
    L.E(ES, "ESCROW unlock leaves the keybag unlocked", c.status()["lock"] == 2)
    L.unlock()
    r = c.request("ESCROW", {"op": 2, "secret": os.urandom(32)}, timeout=120)
    L.err(ES, "ESCROW unlock with a wrong 32-byte secret: -25293", r, errSecAuthFailed)
    L.failed_attempt()
    c.send_raw(bytes.fromhex("0000000f1500000074020000000573686f7274"))
    L.err(ES, "ESCROW unlock with a 5-byte secret (the vector) while a record exists: -25293", c.read_reply(timeout=120), errSecAuthFailed)
    L.failed_attempt()
    L.unlock()
    next_event(sub)
    # a passcode change makes the record stale
    refs = c.copy(query(GENP, {"svce": S(L.svc("lock"))}, flags=R_REF))
    rid = c.send("SET_PASSCODE", {"current": L.pw, "new": L.pw})
    r = c.read_reply(timeout=120)
    L.E("Events", "SET_PASSCODE (a passcode change): OK, and subscribers get unlocked", r.name == "OK" and ev(next_event(sub), 3), repr(r))
    L.failures_in_a_row = 0
    refs2 = c.copy(query(GENP, {"svce": S(L.svc("lock"))}, flags=R_REF))
    r = c.copy(query(GENP, {"svce": S(L.svc("lock")), "acct": S("ak")}, flags=R_DATA))
    L.E("Escrow", "after a passcode change (keys re-wrapped) the items still read",
        r.name == "ITEMS" and r["items"][0]["data"] == b"s-ak", repr(r))
    L.E("Fields", "persistent references survive a passcode change",
        refs.name == "ITEMS" and [i["pref"] for i in refs["items"]] == [i["pref"] for i in refs2.get("items", [])], (refs, refs2))
    r = c.request("ESCROW", {"op": 2, "secret": secret}, timeout=120)
    L.err(ES, "ESCROW unlock with a record made stale by a passcode change: -25293", r, errSecAuthFailed)
    L.failed_attempt()
    L.unlock()
    next_event(sub)
    L.err("Errors", "SET_PASSCODE with an empty new passcode while one is set: -50",
          c.request("SET_PASSCODE", {"current": L.pw, "new": b""}, timeout=120), errSecParam)
    r = c.request("SET_PASSCODE", {"current": b"", "new": L.pw}, timeout=120)
    L.err("Errors", "SET_PASSCODE with an empty current passcode while one is set: -25293", r, errSecAuthFailed)
    L.failed_attempt()
    r = c.request("SET_PASSCODE", {"current": L.pw + b"x", "new": L.pw}, timeout=120)
    L.err("Errors", "SET_PASSCODE with a wrong current passcode: -25293", r, errSecAuthFailed)
    L.failed_attempt()
    L.unlock()
    next_event(sub)
    seen, r = talk(c, "ESCROW", {"op": 1}, [PW(L.pw)])
    secret2 = r.get("secret")
    rep = c.request("ESCROW", {"op": 3, "secret": L.pw}, timeout=120)
    L.E(ES, "ESCROW revoke with the passcode: OK, and subscribers get unlocked", rep.name == "OK" and ev(next_event(sub), 3), repr(rep))
    r = c.request("ESCROW", {"op": 2, "secret": secret2 or bytes(32)}, timeout=120)
    L.err(ES, "ESCROW unlock after revoke: -25300 (no record)", r, errSecItemNotFound)
    sub.close()
    c.close()


def e2e_backup(L):
    BK = "Backups"
    if not L.whole_keychain:
        return
    L.unlock()
    c = L.conn()
    tmp = tempfile.mkdtemp(prefix="coffer-outside-")
    path = os.path.join(tmp, "b.cfbu")
    svce = L.svc("backup")
    c.add(GENP, {"svce": S(svce), "acct": S("restore-me")}, b"from-backup")
    c.add(GENP, {"svce": S(svce), "acct": S("device-only"), "pdmn": S("akpu")}, b"akpu")
    seen, r = talk(c, "BACKUP", {"op": 1, "path": path, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    ok = L.E(BK, "BACKUP create: AUTH_NEEDED (passcode), then BACKUP_SUMMARY with duplicates and otherDevice 0",
             seen and seen[0].name == "AUTH_NEEDED" and r.name == "BACKUP_SUMMARY" and r["duplicates"] == 0 and
             r["other_device"] == 0 and r["added"] > 0, "%r %r" % (seen, r))
    if not ok:
        return
    written = r["added"]
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else None
    L.E(BK, "the backup file is written with mode 0600", mode == 0o600, oct(mode or 0))
    if L.fresh:
        everything = c.copy(query(0, {}, flags=R_ATTRS))
        expect = 0
        for it in everything["items"]:
            a = it["attrs"]
            if a.get("pdmn") == S("akpu") or "accc" in a or (it["cls"] == KEYS and a.get("extr") == B(False)):
                continue
            expect += 1
        L.E(BK, "BACKUP create writes every item but akpu items, items with an access control and non-extractable keys",
            written == expect, (written, expect))
    seen, r = talk(c, "BACKUP", {"op": 3, "path": path, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    L.E(BK, "a dry run over the same keychain: 0 added, every item a duplicate",
        r.name == "BACKUP_SUMMARY" and r["added"] == 0 and r["duplicates"] == written and r["other_device"] == 0, repr(r) + str(r.f))
    c.delete(query(GENP, {"svce": S(svce), "acct": S("restore-me")}))
    n = c.status()["items"]
    seen, r = talk(c, "BACKUP", {"op": 3, "path": path, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    L.E(BK, "a dry run after deleting one item: 1 would be added, the rest duplicates (each item counted once)",
        r.name == "BACKUP_SUMMARY" and r["added"] == 1 and r["duplicates"] == written - 1, repr(r) + str(r.f))
    L.E(BK, "a dry run changes nothing", c.status()["items"] == n)
    seen, r = talk(c, "BACKUP", {"op": 2, "path": path, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    L.E(BK, "a restore: 1 added, the rest kept as duplicates", r.name == "BACKUP_SUMMARY" and r["added"] == 1 and
        r["duplicates"] == written - 1, repr(r) + str(r.f))
    got = c.copy(query(GENP, {"svce": S(svce), "acct": S("restore-me")}, flags=R_DATA))
    L.E(BK, "the restored item is back with its secret", got.name == "ITEMS" and got["items"][0]["data"] == b"from-backup", repr(got))
    L.E(BK, "itemCount counts it", c.status()["items"] == n + 1)
    seen, r = talk(c, "BACKUP", {"op": 3, "path": path, "password": b"wrong"}, [PW(L.pw)], timeout=120)
    L.err(BK, "a wrong backup password: -25293", r, errSecAuthFailed)
    junk = os.path.join(tmp, "junk")
    with open(junk, "wb") as f:
        f.write(b"this is not a backup\n" * 10)
    seen, r = talk(c, "BACKUP", {"op": 3, "path": junk, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    L.err(BK, "a file that is not a backup: -26275", r, errSecDecode)
    data = open(path, "rb").read()
    cut = os.path.join(tmp, "cut.cfbu")
    with open(cut, "wb") as f:
        f.write(data[:len(data) // 2])
    seen, r = talk(c, "BACKUP", {"op": 3, "path": cut, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    L.err(BK, "a truncated backup: -26275", r, errSecDecode)
    altered = os.path.join(tmp, "altered.cfbu")
    with open(altered, "wb") as f:
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    seen, r = talk(c, "BACKUP", {"op": 3, "path": altered, "password": b"bpw"}, [PW(L.pw)], timeout=120)
    L.err(BK, "an altered backup: -25293", r, errSecAuthFailed)
    L.E(BK, "the refused restores left the keychain untouched", c.status()["items"] == n + 1)
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    c.close()


def e2e_misc(L):
    c = L.conn()
    # Status, protections, prompter, counters
    r = c.request("PROTECTIONS")
    L.kind("Status", "PROTECTIONS: PROTECTIONS_REPLY", r, "PROTECTIONS_REPLY")
    L.E("Status", "PROTECTIONS: with the file device key (0) only the attempts file counts attempts (0)",
        r["device_key"] == 1 or r["attempts"] == 0, r.f)
    r = c.request("PROMPTER")
    L.kind("Status", "PROMPTER: PROMPTER_REPLY (program empty or absolute, displayKnown 0 or 1)", r, "PROMPTER_REPLY")
    for vec, want in (("000000051b00000003", "PROTECTIONS_REPLY"), ("000000052600000009", "COUNTERS_REPLY"),
                      ("000000052500000003", "PROMPTER_REPLY"), ("000000050200000002", "STATUS_REPLY"),
                      ("000000050c00000020", "WHOAMI_REPLY")):
        c.send_raw(bytes.fromhex(vec))
        r = c.read_reply()
        L.E("Test vectors", "vector %s: %s with the vector's request id" % (vec[10:12], want),
            r.name == want and r.rid == struct.unpack(">I", bytes.fromhex(vec)[5:9])[0], repr(r))
    r1 = c.request("COUNTERS")
    if L.kind("Status", "COUNTERS from an unsigned caller (who may manage the whole keychain): COUNTERS_REPLY", r1, "COUNTERS_REPLY"):
        for _ in range(3):
            L.conn().close()
        c.copy(query(GENP, {"svce": S(L.svc("counters"))}, flags=R_ATTRS))
        c.send_raw(frame_bytes(0x42, 1, b""))
        c.read_reply()
        r2 = c.request("COUNTERS")
        L.E("Status", "COUNTERS: connections grew by at least the 3 accepted HELLOs", r2["connections"] >= r1["connections"] + 3,
            (r1.f, r2.f))
        L.E("Status", "COUNTERS: requests grew by at least the 5 requests of this connection (refused ones included)",
            r2["requests"] >= r1["requests"] + 5, (r1.f, r2.f))
        # A process the agent identified before, unchanged, is not resolved again (COUNTERS_REPLY).
        L.E("Status", "COUNTERS: identifications grew by at most the 3 connections of an already identified process",
            r1["identifications"] <= r2["identifications"] <= r1["identifications"] + 3, (r1.f, r2.f))
        L.E("Status", "COUNTERS: searches grew by at least the search", r2["searches"] >= r1["searches"] + 1)
    st = c.status()
    L.E("Status", "STATUS: idleLockSeconds is the configured idle lock", st["idle_lock"] == L.args.idle_lock, st.f)
    # passcode sync
    r = c.request("PASSCODE_SYNC", {"op": 0})
    L.E("Passcode sync", "PASSCODE_SYNC query while in sync: COUNT 0", r.name == "COUNT" and r["n"] == 0, repr(r))
    c.send_raw(bytes.fromhex("00000006130000005000"))
    r = c.read_reply()
    L.E("Test vectors", "vector 'passcode sync: query': COUNT 0", r.name == "COUNT" and r["n"] == 0, repr(r))
    L.err("Passcode sync", "PASSCODE_SYNC sync while not out of sync: -25291",
          c.request("PASSCODE_SYNC", {"op": 1, "previous": L.pw}, timeout=120), errSecNotAvailable)
    # biometry: none configured
    r = c.request("BIO", {"op": 5})
    L.E("Biometry", "BIO status without an authenticator: an empty name, not available, no finger, no domain state",
        r.name == "BIO_STATUS" and r["authenticator"] == "" and r["available"] == 0 and r["enrolled"] == 0 and
        r["locked_out"] == 0 and r["domain"] == b"", "%r %s" % (r, r.get("authenticator")))
    for op, name in ((1, "right-thumb"), (2, "right-thumb"), (3, "right-thumb"), (4, "")):
        seen, r = talk(c, "BIO", {"op": op, "name": name}, [PW(L.pw)])
        L.err("Biometry", "BIO operation %d without an authenticator: -25291" % op, r, errSecNotAvailable)
    # sync: not set up
    r = c.request("SYNC_STATUS", {"op": 1})
    L.E("Sync", "SYNC_STATUS before any setup: off, not running, phase 0, counts 0, no error",
        r.name == "SYNC_STATUS_REPLY" and r["state"] == 0 and r["running"] == 0 and r["phase"] == 0 and r["done"] == 0 and
        r["total"] == 0 and r["last_error"] == "" and r["applied"] == 0 and r["sent"] == 0, "%r %s" % (r, r.f))
    L.E("Sync", "SYNC_STATUS: no sync since the start (lastSuccess and lastAttempt 0)",
        r.get("last_success") == 0 and r.get("last_attempt") == 0, r.f)
    L.err("Sync", "SYNC_CIRCLE operation 3 while sync is not set up: -25291", c.request("SYNC_CIRCLE", {"op": 3}), errSecNotAvailable)
    # Login sessions (two opened, one closed: the count stays above 0, so nothing locks here).
    for event, label in ((1, "opened"), (1, "opened again"), (2, "closed")):
        L.kind("Protected directories", "SESSION %s: OK" % label, c.request("SESSION", {"event": event}), "OK")
    # A front end's note of its own items is for a delegated connection only.
    for op in range(1, 6):
        L.err("Delegated identity", "NOTE_ACCESS %d on a connection that was not delegated: -34018" % op,
              c.request("NOTE_ACCESS", {"operation": op}), -34018)
    r = c.request("SYNC_CIRCLE", {"op": 4})
    L.E("Sync", "SYNC_CIRCLE circle (4) while sync is not set up: SYNC_CODE with an empty name and an empty fingerprint",
        r.name == "SYNC_CODE" and r.get("device") == "" and r.get("code") == "", "%r %r" % (r, r.f))
    L.err("Sync", "SYNC_CONFLICTS list while sync is not set up: -25291", c.request("SYNC_CONFLICTS", {"op": 1}), errSecNotAvailable)
    for op, label in ((2, "join"), (1, "init")):
        r = c.request("SYNC_SETUP", {"op": op, "remote": "/nonexistent-%s/keys.git" % L.tag, "device": "laptop"}, timeout=60)
        L.err("Sync", "SYNC_SETUP %s with a remote git cannot reach: -36" % label, r, -36)
        r = c.request("SYNC_STATUS", {"op": 1})
        L.E("Sync", "a failed SYNC_SETUP %s leaves nothing behind (sync still off)" % label,
            r.name == "SYNC_STATUS_REPLY" and r["state"] == 0, r.f)
    c.send_raw(bytes.fromhex("00000006200000003a01"))
    L.kind("Test vectors", "vector 'sync status': SYNC_STATUS_REPLY", c.read_reply(), "SYNC_STATUS_REPLY")
    # protected directories
    FI = "Protected directories"
    r = c.request("FILES", {"op": 2, "path": ""})
    L.kind(FI, "FILES status of every directory: FILES_REPLY", r, "FILES_REPLY")
    missing = "/nonexistent-%s/d" % L.tag
    r = c.request("FILES", {"op": 2, "path": missing})
    L.err(FI, "FILES status of a directory that is not protected: -25300", r, errSecItemNotFound)
    r = c.request("FILES", {"op": 1, "path": missing, "fclass": 1})
    L.err(FI, "FILES protect of a path that does not exist: -25300", r, errSecItemNotFound)
    L.E(FI, "an error of FILES carries [files error N] at the end of its message",
        r.name == "ERROR" and re.search(r"\[files error \d+\]$", r["message"]) is not None, r.f)
    r = c.request("FILES", {"op": 3})
    L.kind(FI, "FILES lock all: FILES_REPLY", r, "FILES_REPLY")
    # identity-bound requests from an unsigned caller
    L.err("Portal secrets", "PORTAL_SECRET from a caller without portal-secret: -34018",
          c.request("PORTAL_SECRET", {"app": "org.example.App"}), errSecMissingEntitlement)
    c.send_raw(bytes.fromhex("000000161d00000006000f6f72672e6578616d706c652e417070"))
    L.err("Test vectors", "vector 'portal secret for org.example.App': -34018 (unentitled)", c.read_reply(), errSecMissingEntitlement)
    L.err("Prompting for a front end", "PROMPT_UNLOCK on a connection that was not delegated: -34018",
          c.request("PROMPT_UNLOCK"), errSecMissingEntitlement)
    L.err("Prompting for a front end", "PROMPT_READ on a connection that was not delegated: -34018",
          c.request("PROMPT_READ", {"query": query(GENP, {"svce": S("m")}, limit=LIMIT_ONE, flags=R_DATA)}), errSecMissingEntitlement)
    for vec in ("000000051c00000003", "0000003122000000050100020004616363740100000005616c69636500047376636501000000046d61696c00000000000100000000"):
        c.send_raw(bytes.fromhex(vec))
        L.err("Test vectors", "vector %s on a connection not delegated: -34018" % ("prompt unlock" if len(vec) < 20 else "prompt read"),
              c.read_reply(), errSecMissingEntitlement)
    c.send_raw(bytes.fromhex("000000130d0000002100046d61696c0000000431323334"))
    L.err("Test vectors", "vector 'authorize group \"mail\"': -34018 (not the shell helper)", c.read_reply(timeout=120), errSecMissingEntitlement)
    c.close()
    # descriptors beside other frames are closed before the reply
    DI = "Delegated identity"
    c = L.conn()
    rfd, wfd = os.pipe()
    rid = c.send("STATUS", fds=[wfd])
    os.close(wfd)
    r = c.read_reply()
    readable, _, _ = select.select([rfd], [], [], 2.0)
    eof = bool(readable) and os.read(rfd, 1) == b""
    os.close(rfd)
    L.E(DI, "a descriptor passed beside STATUS is closed by the agent by the time its reply is read",
        r.name == "STATUS_REPLY" and r.rid == rid and eof, "%r eof=%s" % (r, eof))
    rfd, wfd = os.pipe()
    svce = L.svc("fd")
    c.add(GENP, {"svce": S(svce)}, b"s", fds=[wfd, wfd])
    os.close(wfd)
    readable, _, _ = select.select([rfd], [], [], 2.0)
    eof = bool(readable) and os.read(rfd, 1) == b""
    os.close(rfd)
    L.E(DI, "two descriptors beside ADD are closed too", eof)
    L.E(DI, "the connection is served on after passing descriptors", L.answers(c))
    c.close()
    rfd, wfd = os.pipe()
    d = L.raw()
    d.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "fd"}), fds=[wfd])
    os.close(wfd)
    r = d.read_frame()
    readable, _, _ = select.select([rfd], [], [], 2.0)
    eof = bool(readable) and os.read(rfd, 1) == b""
    os.close(rfd)
    L.E(DI, "a descriptor passed beside HELLO is closed by the time HELLO_REPLY is read", r.name == "HELLO_REPLY" and eof,
        "%r eof=%s" % (r, eof))
    d.close()
    # DELEGATE from a caller without delegate-identity
    for label, fds, pre in (("with no descriptor", [], False), ("with a pidfd of this process", "pidfd", False),
                            ("with a pipe", "pipe", False), ("not as the first request", [], True)):
        d = L.conn()
        if pre:
            d.status()
        extra = []
        if fds == "pidfd" and hasattr(os, "pidfd_open"):
            extra = [os.pidfd_open(os.getpid())]
        elif fds == "pipe":
            pr, pw_ = os.pipe()
            os.close(pr)
            extra = [pw_]
        rid = d.send("DELEGATE", {"pid": os.getpid(), "start": proc_start_time(os.getpid())}, fds=extra or None)
        for fd in extra:
            os.close(fd)
        try:
            r = d.read_reply()
            closed = d.is_closed(3)
        except Closed:
            r, closed = None, True
        want = errSecParam if pre else errSecMissingEntitlement
        L.E(DI, "DELEGATE %s from an unsigned caller: ERROR %d, then the agent closes" % (label, want),
            L.is_err(r, want) and r.rid == rid and closed, "%r closed=%s" % (r, closed))
        d.close()
    # HELLO and DELEGATE by one sendmsg: the pidfd goes to HELLO (still refused first as not entitled)
    d = L.raw()
    if hasattr(os, "pidfd_open"):
        pfd = os.pidfd_open(os.getpid())
        d.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "x"}) +
                   encode_frame("DELEGATE", 2, {"pid": os.getpid(), "start": proc_start_time(os.getpid())}), fds=[pfd])
        os.close(pfd)
        a = d.read_frame()
        b = d.read_frame()
        L.E(DI, "HELLO and DELEGATE in one sendmsg with a pidfd: HELLO_REPLY, then the DELEGATE is refused and the agent closes",
            a.name == "HELLO_REPLY" and b.name == "ERROR" and b.rid == 2 and d.is_closed(3), "%r %r" % (a, b))
    d.close()
    d = L.conn()
    d.send_raw(bytes.fromhex("000000111a0000000200001092000000000001e240"))
    r = d.read_reply()
    L.E("Test vectors", "vector 'delegate: pid 4242 ...' from an unsigned caller: -34018, then a close",
        L.is_err(r, errSecMissingEntitlement) and d.is_closed(3), repr(r))
    d.close()


def proc_start_time(pid):
    """Delegated identity: field 22 of /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def e2e_session_lock(L, grace=None):
    """Events: willLock when a session lock (SIGUSR1) starts its grace period."""
    EV = "Events"
    c = L.conn()
    sub = L.conn()
    sub.ok("SUBSCRIBE")
    pid = struct.unpack("3i", c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    grace = L.args.lock_grace if grace is None else grace
    L.unlock(c)
    next_event(sub)
    os.kill(pid, signal.SIGUSR1)
    e1 = next_event(sub, 5)
    L.E(EV, "a session lock (SIGUSR1): willLock with graceMillis of the configured grace",
        ev(e1, 1) and e1["grace"] == int(grace * 1000), "%r %s" % (e1, e1.f))
    e2 = next_event(sub, grace + 5)
    L.E(EV, "... then locked once the grace period ended", ev(e2, 2), repr(e2))
    L.E("Status", "after the session lock: lockState 1", c.status()["lock"] == 1)
    L.unlock(c)
    next_event(sub)
    os.kill(pid, signal.SIGUSR1)
    e1 = next_event(sub, 5)
    L.unlock(c)
    e2 = next_event(sub, 5)
    L.E(EV, "an UNLOCK during the grace period: subscribers get unlocked", ev(e1, 1) and ev(e2, 3), "%r %r" % (e1, e2))
    late = []
    deadline = time.monotonic() + grace + 0.5
    while time.monotonic() < deadline:
        try:
            late.append(sub.read_frame(timeout=max(0.01, deadline - time.monotonic())))
        except TimeoutError:
            break
    L.E(EV, "... and no locked follows", not [x for x in late if ev(x, 2)], late)
    L.E("Status", "... and the keybag stays unlocked", c.status()["lock"] == 2)
    c.close()
    sub.close()


def e2e_remove_passcode(L):
    RP = "Removing the passcode"
    if not L.whole_keychain:
        return
    L.unlock()
    c = L.conn()
    sub = L.conn()
    sub.ok("SUBSCRIBE")
    svce = L.svc("rp")
    c.add(GENP, {"svce": S(svce), "acct": S("akpu"), "pdmn": S("akpu")}, b"gone")
    c.add(GENP, {"svce": S(svce), "acct": S("guarded"), "accc": D(accc([4]))}, b"kept")
    c.add(GENP, {"svce": S(svce), "acct": S("plain")}, b"plain")
    r = c.request("REMOVE_PASSCODE", {"current": L.pw + b"x"}, timeout=120)
    L.err(RP, "REMOVE_PASSCODE with a wrong passcode: -25293", r, errSecAuthFailed)
    L.failed_attempt()
    L.E(RP, "... nothing changed (passcodeSet 1)", c.status()["passcode_set"] == 1)
    L.unlock()
    next_event(sub)
    r = c.request("REMOVE_PASSCODE", {"current": L.pw}, timeout=120)
    L.kind(RP, "REMOVE_PASSCODE with the passcode: OK", r, "OK")
    L.E(RP, "REMOVE_PASSCODE sends subscribers unlocked", ev(next_event(sub), 3))
    st = c.status()
    L.E(RP, "afterwards: passcodeSet 0 and unlocked (2)", st["passcode_set"] == 0 and st["lock"] == 2, st.f)
    L.err(RP, "the WhenPasscodeSetThisDeviceOnly item is deleted",
          c.copy(query(GENP, {"svce": S(svce), "acct": S("akpu")}, flags=R_ATTRS)), errSecItemNotFound)
    r = c.copy(query(GENP, {"svce": S(svce), "acct": S("plain")}, flags=R_DATA))
    L.E(RP, "other items are kept and readable", r.name == "ITEMS" and r["items"][0]["data"] == b"plain", repr(r))
    r = c.copy(query(GENP, {"svce": S(svce), "acct": S("guarded")}, flags=R_ATTRS))
    L.E(RP, "an item with an access control stays", r.name == "ITEMS" and len(r["items"]) == 1, repr(r))
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce), "acct": S("guarded")}, flags=R_DATA)}, [PW(L.pw)])
    L.err(RP, "... but cannot be opened without a passcode: -25291", r, errSecNotAvailable)
    L.err(RP, "LOCK without a passcode: -25291", c.request("LOCK"), errSecNotAvailable)
    r = c.request("SET_PASSCODE", {"current": b"", "new": L.pw}, timeout=120)
    L.E(RP, "a passcode can be set again (SET_PASSCODE with an empty current one): OK", r.name == "OK", repr(r))
    L.failures_in_a_row = 0
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce), "acct": S("guarded")}, flags=R_DATA)}, [PW(L.pw)])
    L.E(RP, "once a passcode is set again, the item with an access control opens",
        r.name == "ITEMS" and r["items"][0]["data"] == b"kept", "%r %r" % (seen, r))
    sub.close()
    c.close()


def e2e_time_limits(L, out):
    """Connection lifecycle rule 6, run in threads: the agent's hello-timeout and frame-deadline."""
    LC = "Connection lifecycle"
    ht, fd = L.args.hello_timeout, L.args.frame_deadline

    def silent():
        c = L.raw()
        t0 = time.monotonic()
        ok, why = closes_without_reply(c, ht + 3)
        dt = time.monotonic() - t0
        out.append((LC, "no first byte of HELLO within hello-timeout (%gs): closed without a reply" % ht,
                    ok and ht - 0.5 <= dt <= ht + 3, "%s after %.2fs" % (why, dt)))
        c.close()

    def partial_hello():
        c = L.raw()
        data = encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "slow"})
        c.send_raw(data[:3])
        t0 = time.monotonic()
        ok, why = closes_without_reply(c, fd + 3)
        dt = time.monotonic() - t0
        out.append((LC, "a HELLO not complete within frame-deadline (%gs) of its first byte: closed without a reply" % fd,
                    ok and fd - 0.5 <= dt <= fd + 3, "%s after %.2fs" % (why, dt)))
        c.close()

    def slow_but_in_time():
        c = L.raw()
        data = encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "slow"})
        c.send_raw(data[:3])
        time.sleep(min(ht, fd) / 2.0)
        c.send_raw(data[3:])
        try:
            rep = c.read_frame(timeout=5)
            out.append((LC, "a HELLO sent in two parts within the limits is answered", rep.name == "HELLO_REPLY", repr(rep)))
        except (Closed, TimeoutError) as e:
            out.append((LC, "a HELLO sent in two parts within the limits is answered", False, str(e)))
        c.close()

    def idle_greeted():
        c = L.conn()
        time.sleep(max(ht, fd) + 1.0)
        out.append((LC, "a greeted connection may stay idle between frames longer than both limits", L.answers(c), ""))
        c.close()

    def partial_frame():
        c = L.conn()
        c.send_raw(encode_frame("STATUS", 9)[:6])
        t0 = time.monotonic()
        ok, why = closes_without_reply(c, fd + 3)
        dt = time.monotonic() - t0
        out.append((LC, "a request not complete within frame-deadline (%gs) of its first byte: closed without a reply" % fd,
                    ok and fd - 0.5 <= dt <= fd + 3, "%s after %.2fs" % (why, dt)))
        c.close()

    threads = [threading.Thread(target=f, daemon=True) for f in (silent, partial_hello, slow_but_in_time, idle_greeted, partial_frame)]
    for t in threads:
        t.start()
    return threads


def e2e_connection_limit(L):
    """Connection lifecycle: a connection over max-connections-per-process is closed when accepted."""
    LC = "Connection lifecycle"
    limit = L.args.max_per_process
    conns = []
    try:
        for _ in range(limit):
            conns.append(L.conn(timeout=10))
        L.E(LC, "%d connections of one process are served" % limit, len(conns) == limit and L.answers(conns[-1]))
        extra = L.raw(timeout=10)
        try:
            extra.send_raw(encode_frame("HELLO", 1, {"min": 1, "max": 4, "client": "one too many"}))
            ok, why = closes_without_reply(extra, 5)
        except OSError as e:
            ok, why = True, str(e)
        L.E(LC, "connection %d of one process (over max-connections-per-process): closed without a reply" % (limit + 1), ok, why)
        extra.close()
    finally:
        for c in conns:
            c.close()
    time.sleep(0.2)
    with L.conn() as c:
        L.E(LC, "once they are closed, a new connection is served", L.answers(c))


def e2e_attempt_schedule(L):
    """Timeouts a client must allow: after the 4th failure in a row an attempt is refused untried."""
    T_ = "Errors"
    L.unlock()
    c = L.conn()
    svce = L.svc("schedule")
    c.add(GENP, {"svce": S(svce), "accc": D(accc([4]))}, b"s")
    codes = [c.request("UNLOCK", {"passcode": L.pw + b"-wrong%d" % i}, timeout=120) for i in range(2)]
    L.E(T_, "two wrong UNLOCKs in a row: -25293 each", all(L.is_err(r, errSecAuthFailed) for r in codes), codes)
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce)}, flags=R_DATA)}, [PW(b"w3"), PW(b"w4"), PW(b"w5")])
    L.E("Authentication", "then a request's 1st wrong passcode (3rd in a row) gets feedback kind 1; its 2nd (the 4th, after "
        "which the schedule makes the next attempt wait) ends the request with -25293",
        [(x.name, x.get("kind")) for x in seen] == [("AUTH_NEEDED", None), ("AUTH_FEEDBACK_KIND", 1)] and
        L.is_err(r, errSecAuthFailed), "%r %r" % ([(x.name, x.f) for x in seen], r))
    t0 = time.monotonic()
    r = c.request("UNLOCK", {"passcode": L.pw}, timeout=120)
    L.E(T_, "the fifth attempt in a row within a minute, the right passcode included, is refused at once: -25293 (not tried)",
        L.is_err(r, errSecAuthFailed) and time.monotonic() - t0 < 5, repr(r))
    L.E(T_, "... the refusal's message says how long to wait (it is not empty)", r.name == "ERROR" and r["message"] != "")
    AU = "Authentication"
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce)}, flags=R_DATA)}, [PW(L.pw)])
    L.E(AU, "a passcode answered while the schedule makes attempts wait: -25293 at once, no feedback frame before it",
        [x.name for x in seen] == ["AUTH_NEEDED"] and L.is_err(r, errSecAuthFailed), "%r %r" % (seen, r))
    seen, r = talk(c, "LA_EVALUATE", {"policy": 2, "reason": "waiting"}, [PW(L.pw)])
    L.E(AU, "LA_EVALUATE answered with a passcode while attempts wait: authenticationFailed (-1)",
        [x.name for x in seen] == ["AUTH_NEEDED"] and r.name == "LA_RESULT" and r["code"] == -1, "%r %r" % (seen, r))
    c.ok("AUTH_OPTIONS", {"passcode": L.pw})
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce)}, flags=R_DATA)}, [CANCEL])
    L.E(AU, "a passcode given in advance while attempts wait is refused the same way: -25293",
        not seen and L.is_err(r, errSecAuthFailed), "%r %r" % (seen, r))
    c.close()


E2E_GROUPS = [
    ("Connection lifecycle", e2e_no_passcode), ("Versioning", e2e_hello), ("Frames", e2e_frames),
    ("Connection lifecycle", e2e_lifecycle), ("Access groups", e2e_access_groups), ("Attributes", e2e_attributes),
    ("General attributes", e2e_general), ("Fields", e2e_queries), ("Paging", e2e_paging), ("Keys", e2e_keys),
    ("Events", e2e_events), ("Status", e2e_locked), ("Authentication", e2e_authentication),
    ("Authentication", e2e_app_password), ("Authentication", e2e_la), ("Checking the keychain", e2e_checking),
    ("Escrow", e2e_escrow), ("Backups", e2e_backup), ("Messages", e2e_misc), ("Test vectors", e2e_vectors_live),
]


def save_state(L, path):
    """What the checks after a restart of the agent need (--state-file)."""
    import json
    with L.conn() as c:
        for acct, code in (("unlocked", "ak"), ("always", "dk")):
            c.add(GENP, {"svce": S("db"), "acct": S(acct), "pdmn": S(code)}, b"db-" + code.encode())
        state = {"tag": L.tag, "items": c.status()["items"], "lock_svce": L.svc("lock"),
                 "refs": {k: v.hex() for k, v in getattr(L, "lock_refs", {}).items() if k != "akpu"},
                 "ap_svce": L.svc("ap")}
    with open(path, "w") as f:
        json.dump(state, f)


def e2e_boot(L, state):
    """Status and Checking the keychain before the first unlock (the agent restarted with a passcode set),
    what survives a restart, then the attempt schedule."""
    LS, LM = "Status", "Checking the keychain"
    c = L.conn()
    st = c.status()
    L.E(LS, "after a restart with a passcode set: lockState 0 (boot), passcodeSet 1", st["lock"] == 0 and st["passcode_set"] == 1, st.f)
    L.E(LS, "after a restart: itemCount is what it was", st["items"] == state["items"], (st["items"], state["items"]))
    svce = state["lock_svce"]
    L.err(LS, "boot: a search matching items of a non-Always class: -25308",
          c.copy(query(GENP, {"svce": S(svce)}, flags=R_ATTRS)), errSecInteractionNotAllowed)
    for code in ("dk", "dku"):
        r = c.copy(query(GENP, {"svce": S(svce), "pdmn": S(code)}, flags=R_DATA | R_ATTRS))
        L.E(LS, "boot: the Always (%s) item is readable" % code, r.name == "ITEMS" and len(r["items"]) == 1 and
            r["items"][0]["data"] == b"s-" + code.encode(), repr(r))
    for code in ("ck", "cku", "ak"):
        L.err(LS, "boot: the %s item is not readable before the first unlock: -25308" % code,
              c.copy(query(GENP, {"svce": S(svce), "acct": S(code)}, flags=R_DATA)), errSecInteractionNotAllowed)
    L.err(LM, "boot: the locked flag cannot search before the first unlock: -25308",
          c.copy(query(GENP, {"svce": S(svce)}, flags=R_REF | R_LOCKED)), errSecInteractionNotAllowed)
    L.err("Errors", "boot: ADD of an AfterFirstUnlock (ck) item: -25308",
          c.add(GENP, {"svce": S(L.svc("boot-add")), "pdmn": S("ck")}, b"s"), errSecInteractionNotAllowed)
    L.kind(LS, "boot: ADD of an Always (dk) item works", c.add(GENP, {"svce": S(L.svc("boot-add")), "pdmn": S("dk")}, b"s"), "ITEMS")
    c.send_raw(bytes.fromhex("0000001f07000000060100010004737663650100000002646201000000000200000000"))
    L.err("Test vectors", "vector 'copy-matching genp svce=db ... (before the first unlock)': -25308", c.read_reply(),
          errSecInteractionNotAllowed)
    c.send_raw(bytes.fromhex("0000002c0700000007010002000470646d6e0100000002646b0004737663650100000002646201000000000200000000"))
    r = c.read_reply()
    L.E("Test vectors", "vector 'copy-matching genp pdmn=dk svce=db ... (before the first unlock)': ITEMS with the Always match",
        r.name == "ITEMS" and [i["attrs"]["pdmn"] for i in r["items"]] == [S("dk")], repr(r))
    if L.whole_keychain:
        r = c.request("CHECK", {"op": 1})
        n = c.status()["items"]
        L.E(LM, "boot: CHECK verify counts every item as checked or skipped, the locked-away ones skipped",
            r.name == "CHECK_REPORT" and r["checked"] + r["skipped"] == n and r["skipped"] > 0, "%r %s" % (r, r.f))
    sub = L.conn()
    sub.ok("SUBSCRIBE")
    L.kind("Events", "LOCK before the first unlock: OK", c.request("LOCK"), "OK")
    L.E(LS, "... and the keybag stays in boot (lockState 0)", c.status()["lock"] == 0)
    rid = c.send("UNLOCK", {"passcode": L.pw})
    r = c.read_reply(timeout=120)
    L.E("Events", "LOCK before the first unlock sends no event (the first event is the later unlocked)",
        r.name == "OK" and ev(next_event(sub), 3), repr(r))
    L.failures_in_a_row = 0
    L.E(LS, "after the first unlock: lockState 2", c.status()["lock"] == 2)
    c.send_raw(bytes.fromhex("0000001f07000000060100010004737663650100000002646201000000000200000000"))
    r = c.read_reply()
    L.E("Test vectors", "vector 'copy-matching genp svce=db ...' once unlocked: ITEMS", r.name == "ITEMS" and len(r["items"]) == 2,
        repr(r))
    for code, ref in sorted(state["refs"].items()):
        r = c.copy(query(0, {}, flags=R_DATA, pref=bytes.fromhex(ref)))
        L.E("Fields", "a persistent reference survives a restart of the agent (%s)" % code,
            r.name == "ITEMS" and r["items"][0]["data"] == b"s-" + code.encode(), repr(r))
    c.ok("AUTH_OPTIONS", {"app_password": b"ap-one"})
    r = c.copy(query(GENP, {"svce": S(state["ap_svce"]), "acct": S("two")}, flags=R_DATA))
    L.E("Authentication", "an item's application-password delay survives a restart (the right password still refused: -25293)",
        L.is_err(r, errSecAuthFailed), repr(r))
    sub.close()
    c.close()
    e2e_attempt_schedule(L)


def e2e_restarted(L, state):
    """Timeouts a client must allow: failures in a row are kept in the state directory, across restarts."""
    c = L.conn()
    r = c.request("UNLOCK", {"passcode": L.pw}, timeout=120)
    L.err("Errors", "after a restart within the minute the schedule imposes, the right passcode is still refused: -25293", r,
          errSecAuthFailed)
    L.E("Status", "... and the keybag stays in boot (lockState 0)", c.status()["lock"] == 0)
    c.close()


def run_group(L, part, section, fn):
    t0 = time.monotonic()
    try:
        fn(L)
        if L.R.verbose:
            print("# %s: %.2f s" % (fn.__name__, time.monotonic() - t0), flush=True)
    except Exception as e:       # a group that breaks off is one failed check, with where it stopped
        tb = traceback.extract_tb(e.__traceback__)[-1]
        L.R.check(part, section, "%s ran to its end" % fn.__name__, False,
                  "%s: %s (line %d)" % (type(e).__name__, e, tb.lineno))


def run_e2e(L):
    timing = []
    threads = e2e_time_limits(L, timing) if not L.args.no_time_limits else []
    if L.args.idle_socket:
        threads.append(idle_thread(Live(L.R, L.args.idle_socket, L.pw, L.args), timing))
    if L.args.bio_socket:
        # the biometry agent is another agent: its checks run beside the main ones
        bio = Live(L.R, L.args.bio_socket, L.pw, L.args)
        bio.background = (threads, timing)
        t = threading.Thread(target=run_group, args=(bio, "e2e", "Biometry", e2e_biometry), daemon=True)
        t.start()
        threads.append(t)
    for section, fn in E2E_GROUPS:
        run_group(L, "e2e", section, fn)
    if L.args.session_lock and not L.args.idle_socket:
        run_group(L, "e2e", "Events", e2e_session_lock)
    for t in threads:
        t.join()
    for section, desc, ok, detail in timing:
        L.E(section, desc, ok, detail)
    run_group(L, "e2e", "Connection lifecycle", e2e_connection_limit)
    if L.args.passdb:
        run_group(L, "e2e", "Passcode sync", e2e_passcode_sync)
    run_group(L, "e2e", "Removing the passcode", e2e_remove_passcode)


def read_passcode(fd):
    chunks = []
    while True:
        b = os.read(fd, 4096)
        if not b:
            break
        chunks.append(b)
    data = b"".join(chunks)
    if data.endswith(b"\n"):
        data = data[:-1]
    return data


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=DEFAULT_SPEC, help="WireProtocol.md (default: the checkout's)")
    ap.add_argument("--socket", help="the agent's native socket (needed for e2e and malformed)")
    ap.add_argument("--passcode-fd", type=int, default=0, help="read the passcode from this descriptor (default 0: stdin)")
    ap.add_argument("--part", default="vectors,e2e,malformed",
                    help="vectors,e2e,malformed; or, after a restart of the agent, boot (then restarted after another)")
    ap.add_argument("--state-file", help="where e2e leaves what the boot and restarted parts need")
    ap.add_argument("--hello-timeout", type=float, default=5.0, help="the agent's hello-timeout (default 5)")
    ap.add_argument("--frame-deadline", type=float, default=10.0, help="the agent's frame-deadline (default 10)")
    ap.add_argument("--lock-grace", type=float, default=10.0, help="the agent's lock-grace (default 10)")
    ap.add_argument("--idle-lock", type=int, default=0, help="the agent's idle lock (default 0: none)")
    ap.add_argument("--max-per-process", type=int, default=128, help="the agent's max-connections-per-process (default 128)")
    ap.add_argument("--bio-socket", help="a second agent configured with biometry = biometric-emulator (Biometry checks)")
    ap.add_argument("--idle-socket", help="a third agent with a short idle lock (idle-lock, lock-grace, authentication-timeout)")
    ap.add_argument("--idle-lock-seconds", type=int, default=2, help="that agent's idle-lock (default 2)")
    ap.add_argument("--idle-lock-grace", type=float, default=1.0, help="that agent's lock-grace (default 1)")
    ap.add_argument("--auth-timeout", type=float, default=1.0, help="that agent's authentication-timeout (default 1)")
    ap.add_argument("--passdb", help="the pam_matrix passdb of the --socket agent: passcode sync changes the login password there")
    ap.add_argument("--session-lock", action="store_true", help="also send the agent SIGUSR1 to check willLock")
    ap.add_argument("--attempt-schedule", action="store_true",
                    help="finally check the attempt schedule (leaves the passcode refused for a minute)")
    ap.add_argument("--rsa", action="store_true", help="also generate an RSA key (slow in a debug build)")
    ap.add_argument("--no-time-limits", action="store_true", help="skip the hello-timeout and frame-deadline checks")
    ap.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    args = ap.parse_args(argv)
    parts = set(args.part.split(","))
    R = Results(verbose=not args.quiet)
    t0 = time.monotonic()
    if "vectors" in parts:
        run_vectors(R, spec_vectors(args.spec))
    if parts & {"e2e", "malformed", "boot", "restarted"}:
        if not args.socket:
            ap.error("--socket is needed for the e2e and malformed parts")
        L = Live(R, args.socket, read_passcode(args.passcode_fd), args)
        if "e2e" in parts:
            run_e2e(L)
        if "malformed" in parts:
            run_group(L, "malformed", "Connection lifecycle", run_malformed)
        if "e2e" in parts and args.attempt_schedule:
            run_group(L, "e2e", "Errors", e2e_attempt_schedule)
        if "e2e" in parts and args.state_file:
            save_state(L, args.state_file)
        if parts & {"boot", "restarted"}:
            import json
            with open(args.state_file) as f:
                state = json.load(f)
            L.tag = state["tag"]
            fn = e2e_boot if "boot" in parts else e2e_restarted

            def phase(L_):
                fn(L_, state)
            phase.__name__ = fn.__name__
            run_group(L, "e2e", "Status", phase)
    print("summary: %s (%.1f s)" % (R.summary(), time.monotonic() - t0), flush=True)
    if R.failures:
        print("%d failing check(s):" % len(R.failures))
        for line in R.failures:
            print("  " + line)
    return 1 if R.failures else 0




def is_notice(rep):
    """Authentication: feedback kind 0, the sensor's own message ("nothing changed")."""
    return rep.name == "AUTH_FEEDBACK_KIND" and rep["kind"] == 0


def e2e_biometry(L):
    """Biometry and the Authentication conversation with the biometric emulator (an agent configured with
    `biometry = biometric-emulator`, --bio-socket)."""
    BI, AU = "Biometry", "Authentication"
    c = L.conn()
    st = c.status()
    if st["passcode_set"] == 0:
        c.ok("SET_PASSCODE", {"current": b"", "new": L.pw}, timeout=120)
    else:
        L.unlock(c)
    # The reuse-window checks run beside these on this agent; their passcodes reset the agent-wide count
    # of failed matches (a successful passcode does, as it must), so the lockout checks below wait for them.
    reuse_thread = None
    if getattr(L, "background", None):
        threads, out = L.background
        reuse_thread = reuse_window_thread(L, out)
        threads.append(reuse_thread)
    r = c.request("BIO", {"op": 5})
    L.E(BI, "BIO status with the emulator: its name, available, no finger, not locked out, no domain state",
        r.name == "BIO_STATUS" and r["authenticator"] != "" and r["available"] == 1 and r["enrolled"] == 0 and
        r["locked_out"] == 0 and r["domain"] == b"", r.f)
    r = c.request("LA_CAN_EVALUATE", {"policy": 1})
    L.E(AU, "LA_CAN_EVALUATE biometrics with no finger enrolled: biometryNotEnrolled (-7), biometryType 1, no domain state",
        r.name == "LA_RESULT" and r["code"] == -7 and r["biometry"] == 1 and r["domain"] == b"", r.f)
    svce = L.svc("bio")
    c.add(GENP, {"svce": S(svce), "acct": S("any0"), "accc": D(accc([2]))}, b"any0")
    seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce), "acct": S("any0")}, flags=R_DATA)}, [CANCEL])
    L.E(AU, "a biometryAny item with no finger enrolled: -25291 without asking", not seen and L.is_err(r, errSecNotAvailable),
        "%r %r" % (seen, r))
    L.err(BI, "BIO present while no evaluation waits: -25291", c.request("BIO", {"op": 3, "name": "right-thumb"}), errSecNotAvailable)
    seen, r = talk(c, "BIO", {"op": 1, "name": "right-thumb"}, [CANCEL])
    L.E(BI, "BIO enroll asks for the passcode (AUTH_NEEDED, method passcode); a cancel: -128",
        seen and seen[0].name == "AUTH_NEEDED" and seen[0]["methods"] == 1 and L.is_err(r, errSecUserCanceled), "%r %r" % (seen, r))
    seen, r = talk(c, "BIO", {"op": 1, "name": "right-thumb"}, [PW(L.pw)])
    L.kind(BI, "BIO enroll right-thumb with the passcode: OK", r, "OK")
    L.failures_in_a_row = 0
    st1 = c.request("BIO", {"op": 5})
    L.E(BI, "BIO status after the enrolment: 1 finger and a domain state (at most 64 bytes)",
        st1["enrolled"] == 1 and 0 < len(st1["domain"]) <= 64, st1.f)
    for pol in (1, 2):
        r = c.request("LA_CAN_EVALUATE", {"policy": pol})
        L.E(AU, "LA_CAN_EVALUATE policy %d with a finger enrolled: 0, biometryType 1, the enrolled set's domain state" % pol,
            r.name == "LA_RESULT" and r["code"] == 0 and r["biometry"] == 1 and r["domain"] == st1["domain"], r.f)
    for acct, factors in (("any", [2]), ("current", [3]), ("presence", [1]), ("current-or-passcode", [3, 4])):
        c.add(GENP, {"svce": S(svce), "acct": S(acct), "accc": D(accc(factors))}, acct.encode())
    toucher = L.conn()

    def q(acct):
        return {"query": query(GENP, {"svce": S(svce), "acct": S(acct)}, limit=LIMIT_ONE, flags=R_DATA)}

    def touch(op, patience=3.0):
        """BIO present (3) or present an unknown finger (4); a touch is not remembered, so one the sensor
        did not take (-25291) is made again, for up to `patience` seconds. Returns (reply, refusals)."""
        refused = 0
        deadline = time.monotonic() + patience
        while True:
            t = toucher.request("BIO", {"op": op, "name": "right-thumb" if op == 3 else ""})
            if not L.is_err(t, errSecNotAvailable) or time.monotonic() > deadline:
                return t, refused
            refused += 1
            time.sleep(0.02)

    def conversation(conn, steps, name="COPY_MATCHING", m=None):
        """Sends the request; each AUTH_NEEDED and each feedback that is not a notice (kind 0) runs the
        next step: ("touch", op), ("answer", AUTH_RESPONSE fields), ("stop",): return (frames, request
        id) with the request still waiting. Returns (frames, final reply)."""
        rid = conn.send(name, m)
        frames = []
        todo = list(steps)
        last_touch, retries = None, 0
        while True:
            try:
                rep = conn.read_reply(timeout=LOST_TOUCH_SECONDS if last_touch else 30)
            except TimeoutError:
                # a touch the agent took (OK) that reached no evaluation (KNOWN_DISAGREEMENTS): touch again
                if last_touch is None or retries >= 3:
                    raise
                lost[0] += 1
                retries += 1
                touch(last_touch)
                continue
            if rep.name not in ("AUTH_NEEDED", "AUTH_FEEDBACK", "AUTH_FEEDBACK_KIND"):
                return frames, rep
            frames.append(rep)
            if is_notice(rep) or rep.name == "AUTH_FEEDBACK":
                continue
            last_touch = None
            step = todo.pop(0) if todo else ("none",)
            if step[0] == "stop":
                return frames, rid
            if step[0] == "touch":
                frames.append(touch(step[1])[0])
                last_touch = step[1]
            elif step[0] == "answer":
                conn.send("AUTH_RESPONSE", step[1], rid=rid)

    def finish(conn, op=3):
        """Touches the sensor and reads the request's final reply, touching again when a taken touch reached
        no evaluation. Returns (frames read, final reply)."""
        frames = []
        touch(op)
        retries = 0
        while True:
            try:
                rep = conn.read_reply(timeout=LOST_TOUCH_SECONDS)
            except TimeoutError:
                if retries >= 3:
                    raise
                lost[0] += 1
                retries += 1
                touch(op)
                continue
            if rep.name not in ("AUTH_NEEDED", "AUTH_FEEDBACK", "AUTH_FEEDBACK_KIND"):
                return frames, rep
            frames.append(rep)

    def meaningful(frames):
        return [f for f in frames if not is_notice(f)]

    lost = [0]
    # a touch the agent takes while a request's evaluation waits reaches that request: the request
    # before ended by a passcode while its sensor was running
    c.add(GENP, {"svce": S(svce), "acct": S("presence-probe"), "accc": D(accc([1]))}, b"probe")
    probe_lost = 0
    for _ in range(10):
        f0, r0 = conversation(c, [("answer", PW(L.pw))], m=q("presence-probe"))
        rid = c.send("COPY_MATCHING", q("presence-probe"))
        need = c.read_reply()
        time.sleep(0.1)
        touch(3)
        try:
            r = c.read_reply(timeout=LOST_TOUCH_SECONDS)
            while r.name in ("AUTH_FEEDBACK", "AUTH_FEEDBACK_KIND"):
                r = c.read_reply(timeout=LOST_TOUCH_SECONDS)
        except TimeoutError:
            probe_lost += 1
            f1, r = finish(c)
    L.E(AU, "a touch the agent takes (BIO present: OK) while a request waits for a finger reaches that request",
        probe_lost == 0, "%d of 10 touches, 0.1 s after AUTH_NEEDED and right after a request answered by the passcode, were "
        "taken (OK) and reached no evaluation: the request waited on" % probe_lost)

    # AUTH_NEEDED with biometry: "the agent is already waiting for a finger"
    refusals, trials = 0, 20
    for _ in range(trials):
        rid = c.send("COPY_MATCHING", q("any"))
        need = c.read_reply()
        t = toucher.request("BIO", {"op": 3, "name": "right-thumb"})
        if L.is_err(t, errSecNotAvailable):
            refusals += 1
            t, _ = touch(3)
        r = c.read_reply()
        while r.name != "ITEMS" and r.name != "ERROR":
            r = c.read_reply()
    L.E(AU, "a touch right after AUTH_NEEDED (biometry among the methods) is taken: the agent is already waiting",
        refusals == 0, "%d of %d touches sent right after AUTH_NEEDED were refused with -25291 (no evaluation waiting)"
        % (refusals, trials))
    frames, r = conversation(c, [("touch", 3)], m=q("any"))
    L.E(AU, "a biometryAny item: AUTH_NEEDED offering biometry alone (bit 1)",
        frames and frames[0].name == "AUTH_NEEDED" and frames[0]["methods"] == 2, frames)
    L.E(BI, "BIO present while the evaluation waits: OK, and the read ends with ITEMS",
        len(frames) > 1 and frames[1].name == "OK" and r.name == "ITEMS" and r["items"][0]["data"] == b"any", "%r %r" % (frames, r))
    frames, r = conversation(c, [("touch", 4), ("touch", 3)], m=q("any"))
    L.E(AU, "an unknown finger: AUTH_FEEDBACK_KIND kind 2 (no match), the sensor waits again; a match then ends it",
        [(f.name, f.get("kind")) for f in meaningful(frames)] == [("AUTH_NEEDED", None), ("OK", None), ("AUTH_FEEDBACK_KIND", 2),
                                                                  ("OK", None)] and r.name == "ITEMS",
        "%r %r" % ([(f.name, f.f) for f in frames], r))
    L.E(AU, "feedback frames carry the request's id", all(f.rid == r.rid for f in frames if f.name.startswith("AUTH")), frames)
    v1 = L.conn(1, 1)
    rid = v1.send("COPY_MATCHING", q("any"))
    need = v1.read_reply()
    touch(4)
    fb = v1.read_reply()
    frames, final = finish(v1)
    rest = frames + [final]
    L.E(AU, "version 1: feedback comes as AUTH_FEEDBACK (no kind), never AUTH_FEEDBACK_KIND",
        need.name == "AUTH_NEEDED" and fb.name == "AUTH_FEEDBACK" and rest[-1].name == "ITEMS" and
        all(x.name != "AUTH_FEEDBACK_KIND" for x in rest), "%r %r %r" % (need, fb, rest))
    v1.close()
    rid = c.send("COPY_MATCHING", q("any"))
    need = c.read_reply()
    c.send("AUTH_RESPONSE", WAIT_BIO, rid=rid)
    time.sleep(0.3)
    frames, r = finish(c)
    L.E(AU, "wait for biometry: the agent keeps waiting (no reply of its own); a finger then ends it",
        need.name == "AUTH_NEEDED" and all(is_notice(x) for x in frames) and r.name == "ITEMS" and r.rid == rid,
        "%r %r %r" % (need, frames, r))
    frames, r = conversation(c, [("answer", PW(L.pw))], m=q("any"))
    L.err(AU, "a passcode where only biometry is accepted ends the request as fallback does: -128", r, errSecUserCanceled)
    frames, r = conversation(c, [("answer", FALLBACK)], m=q("any"))
    L.err(AU, "fallback on a biometry-only item: -128", r, errSecUserCanceled)
    frames, r = conversation(c, [("answer", PW(L.pw))], m=q("presence"))
    L.E(AU, "userPresence with a finger enrolled: AUTH_NEEDED offering biometry and the passcode (3); the passcode opens it",
        frames and frames[0]["methods"] == 3 and r.name == "ITEMS", "%r %r" % (frames, r))
    frames, r = conversation(c, [("touch", 3)], m=q("presence"))
    L.E(AU, "userPresence: a finger opens it too", r.name == "ITEMS" and r["items"][0]["data"] == b"presence", "%r %r" % (frames, r))
    rid = c.send("COPY_MATCHING", q("presence"))
    need = c.read_reply()
    c.send("AUTH_RESPONSE", FALLBACK, rid=rid)
    time.sleep(0.2)
    late = [x for x in c.events]
    quiet = True
    try:
        while True:
            x = c.read_frame(timeout=0.3)
            if not is_notice(x):
                quiet = False
                break
    except TimeoutError:
        pass
    c.send("AUTH_RESPONSE", PW(L.pw), rid=rid)
    r = c.read_reply()
    while is_notice(r):
        r = c.read_reply()
    L.E(AU, "userPresence, fallback: the agent waits silently (nothing but notices), then the passcode gives ITEMS",
        need.name == "AUTH_NEEDED" and quiet and r.name == "ITEMS" and r.rid == rid and not late, "%r %s %r" % (need, quiet, r))
    frames, r = conversation(c, [("touch", 3)], m=q("current"))
    L.E(AU, "biometryCurrentSet: the enrolled finger opens it", r.name == "ITEMS" and r["items"][0]["data"] == b"current", r)
    # LocalAuthentication with the sensor
    frames, r = conversation(c, [("touch", 3)], "LA_EVALUATE", {"policy": 1, "reason": "finger"})
    L.E(AU, "LA_EVALUATE biometrics: AUTH_NEEDED (biometry), a finger, LA_RESULT 0 with biometryType 1 and the domain state",
        frames and frames[0]["methods"] == 2 and r.name == "LA_RESULT" and r["code"] == 0 and r["biometry"] == 1 and
        r["domain"] == st1["domain"], "%r %r" % (frames, r.f))
    for label, answer in (("fallback", FALLBACK), ("a passcode", PW(L.pw))):
        frames, r = conversation(c, [("answer", answer)], "LA_EVALUATE", {"policy": 1, "reason": "finger"})
        L.E(AU, "LA_EVALUATE biometrics answered with %s: userFallback (-3)" % label,
            r.name == "LA_RESULT" and r["code"] == -3 and r["domain"] == b"", r.f)
    frames, r = conversation(c, [("answer", CANCEL)], "LA_EVALUATE", {"policy": 1, "reason": "finger"})
    L.E(AU, "LA_EVALUATE biometrics cancelled: userCancel (-2), biometryType 1, no domain state (sent on success only)",
        r.name == "LA_RESULT" and r["code"] == -2 and r["biometry"] == 1 and r["domain"] == b"", r.f)
    frames, r = conversation(c, [("touch", 3)], "LA_EVALUATE", {"policy": 2, "reason": "owner"})
    L.E(AU, "LA_EVALUATE device owner with a finger enrolled: biometry or passcode (3); a finger gives 0",
        frames and frames[0]["methods"] == 3 and r.get("code") == 0, "%r %r" % ([(f.name, f.f) for f in frames], r.f))
    # lockout: five failed matches in a row (no passcode on this agent meanwhile: see reuse_thread above)
    if reuse_thread is not None:
        reuse_thread.join()
    frames, r = conversation(c, [("touch", 4)] * 5 + [("answer", PW(L.pw))], m=q("presence"))
    kinds = [f.get("kind") for f in frames if f.name == "AUTH_FEEDBACK_KIND" and f["kind"] != 0]
    L.E(AU, "five unknown fingers in a row: four no-match feedbacks (kind 2), then kind 3 (passcode only)",
        kinds == [2, 2, 2, 2, 3], kinds)
    L.E(AU, "... after kind 3 the passcode ends it with ITEMS", r.name == "ITEMS", repr(r))
    st = c.request("BIO", {"op": 5})
    L.E(BI, "a passcode success ends the lockout (lockedOut 0)", st["locked_out"] == 0, st.f)
    frames, pending = conversation(c, [("touch", 4)] * 5 + [("stop",)], m=q("presence"))
    st = toucher.request("BIO", {"op": 5})
    L.E(BI, "after five failed matches in a row: lockedOut 1", st["locked_out"] == 1, st.f)
    r2 = toucher.request("LA_CAN_EVALUATE", {"policy": 1})
    L.E(AU, "LA_CAN_EVALUATE biometrics while locked out: biometryLockout (-8), biometryType 1", r2.get("code") == -8 and
        r2.get("biometry") == 1, r2.f)
    L.E(AU, "... with the domain state all the same (sent whenever a finger is enrolled, whatever the code)",
        r2.get("domain") == st1["domain"], r2.f)
    seen, r3 = talk(toucher, "COPY_MATCHING", q("any"), [CANCEL])
    L.E(AU, "a biometry-only item while biometry is locked out: -25293 without asking",
        not [x for x in seen if x.name == "AUTH_NEEDED"] and L.is_err(r3, errSecAuthFailed), "%r %r" % (seen, r3))
    c.send("AUTH_RESPONSE", PW(L.pw), rid=pending)
    r = c.read_reply(timeout=30)
    while is_notice(r):
        r = c.read_reply(timeout=30)
    L.E(AU, "... the request waiting after kind 3 takes the passcode", r.name == "ITEMS", repr(r))
    st = toucher.request("BIO", {"op": 5})
    L.E(BI, "... and the lockout ends (lockedOut 0)", st["locked_out"] == 0, st.f)
    # a new enrolment makes biometryCurrentSet items unusable
    seen, r = talk(toucher, "BIO", {"op": 1, "name": "left-thumb"}, [PW(L.pw)])
    L.kind(BI, "BIO enroll left-thumb: OK", r, "OK")
    st2 = c.request("BIO", {"op": 5})
    L.E(BI, "the enrolment changed the domain state", st2["enrolled"] == 2 and st2["domain"] != st1["domain"], st2.f)
    seen, r = talk(c, "COPY_MATCHING", q("current"), [CANCEL])
    L.E(AU, "biometryCurrentSet after a change of fingers: -25293 at once, without AUTH_NEEDED",
        not seen and L.is_err(r, errSecAuthFailed), "%r %r" % (seen, r))
    frames, r = conversation(c, [("answer", PW(L.pw))], m=q("current-or-passcode"))
    L.E(AU, "biometryCurrentSet or devicePasscode after the change: asks for the passcode instead (methods 1)",
        frames and frames[0]["methods"] == 1 and r.name == "ITEMS", "%r %r" % (frames, r))
    frames, r = conversation(c, [("touch", 3)], m=q("any"))
    L.E(AU, "biometryAny still opens with a finger after the change", r.name == "ITEMS", r)
    seen, r = talk(toucher, "BIO", {"op": 2, "name": "left-thumb"}, [PW(L.pw)])
    L.kind(BI, "BIO remove left-thumb with the passcode: OK", r, "OK")
    st3 = c.request("BIO", {"op": 5})
    L.E(BI, "the removal changed the domain state again (the emulator never returns to the old one)",
        st3["enrolled"] == 1 and st3["domain"] not in (st1["domain"], st2["domain"]), st3.f)
    seen, r = talk(c, "COPY_MATCHING", q("current"), [CANCEL])
    L.err(AU, "removing the new finger does not bring the old state back: still -25293", r, errSecAuthFailed)
    toucher.close()
    c.close()



def reuse_window_thread(L, out):
    """Authentication: the reuse window runs from the person's passcode; using it MUST NOT move its end.
    Run beside the biometry checks (an agent that does not lock meanwhile)."""
    AU = "Authentication"

    def body():
        c = L.conn()
        svce = L.svc("reuse-window")
        c.add(GENP, {"svce": S(svce), "accc": D(accc([4]))}, b"w")
        c.ok("AUTH_OPTIONS", {"reuse": 2})
        q = {"query": query(GENP, {"svce": S(svce)}, flags=R_DATA)}
        seen1, r1 = talk(c, "COPY_MATCHING", q, [PW(L.pw)])
        t_auth = time.monotonic()
        time.sleep(1.0)
        seen2, r2 = talk(c, "COPY_MATCHING", q, [CANCEL])
        time.sleep(max(0.0, t_auth + 2.4 - time.monotonic()))
        seen3, r3 = talk(c, "COPY_MATCHING", q, [PW(L.pw)])
        out.append((AU, "reuse 2 s: asked once, not asked 1 s later (inside the window)",
                    [x.name for x in seen1 if x.name == "AUTH_NEEDED"] == ["AUTH_NEEDED"] and r1.name == "ITEMS" and
                    not seen2 and r2.name == "ITEMS", "%r %r %r %r" % (seen1, r1, seen2, r2)))
        out.append((AU, "reuse 2 s: 2.4 s after the passcode it asks again (using the window did not move its end)",
                    any(x.name == "AUTH_NEEDED" for x in seen3) and r3.name == "ITEMS", "%r %r" % (seen3, r3)))
        c.close()
        # Flag bit 1: no window at all; the authentication lasts as long as the connection.
        k = L.conn()
        k.ok("AUTH_OPTIONS", {"flags": 2})
        seen1, r1 = talk(k, "COPY_MATCHING", q, [PW(L.pw)])
        time.sleep(2.5)
        seen2, r2 = talk(k, "COPY_MATCHING", q, [CANCEL])
        out.append((AU, "keep for the connection: asked once, not asked again after the longest window the test uses",
                    [x.name for x in seen1 if x.name == "AUTH_NEEDED"] == ["AUTH_NEEDED"] and r1.name == "ITEMS" and
                    not seen2 and r2.name == "ITEMS", "%r %r %r %r" % (seen1, r1, seen2, r2)))
        k.ok("AUTH_OPTIONS", {})
        seen3, r3 = talk(k, "COPY_MATCHING", q, [CANCEL])
        out.append((AU, "keep for the connection: new AUTH_OPTIONS end it (asked again)",
                    any(x.name == "AUTH_NEEDED" for x in seen3), "%r %r" % (seen3, r3)))
        k.close()
        other = L.conn()
        seen4, r4 = talk(other, "COPY_MATCHING", q, [CANCEL])
        out.append((AU, "keep for the connection: another connection holds nothing (asked)",
                    any(x.name == "AUTH_NEEDED" for x in seen4), "%r %r" % (seen4, r4)))
        other.close()

    def run():
        try:
            body()
        except Exception as e:
            out.append((AU, "the reuse-window checks ran to their end", False, "%s: %s" % (type(e).__name__, e)))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def e2e_passcode_sync(L):
    """Passcode sync: the login password changed outside Coffer (the test's pam_matrix passdb rewritten)."""
    PS = "Passcode sync"
    path = L.args.passdb
    with open(path) as f:
        original = f.read()
    first = original.split("\n")[0]
    user, rest = first.split(":", 1)
    service = rest.rsplit(":", 1)[1]
    new_pw = ("outside-%s" % L.tag).encode()
    L.unlock()
    c = L.conn()
    sub = L.conn()
    sub.ok("SUBSCRIBE")
    svce = L.svc("psync")
    c.add(GENP, {"svce": S(svce)}, b"kept")
    try:
        with open(path, "w") as f:
            f.write("%s:%s:%s\n" % (user, new_pw.decode(), service))
        r = c.request("UNLOCK", {"passcode": new_pw}, timeout=120)
        L.err(PS, "UNLOCK with the changed login password (PAM accepts it, the keybag does not open): -25293", r, errSecAuthFailed)
        L.E(PS, "... no unlocked event", no_frame(sub, 0.2))
        r = c.request("PASSCODE_SYNC", {"op": 0})
        L.E(PS, "PASSCODE_SYNC query after that: COUNT 1 (out of sync)", r.name == "COUNT" and r["n"] == 1, repr(r))
        r = c.request("PASSCODE_SYNC", {"op": 1, "previous": b"not-the-previous"}, timeout=120)
        L.err(PS, "PASSCODE_SYNC sync with a wrong previous passcode: -25293", r, errSecAuthFailed)
        rid = sub.send("PASSCODE_SYNC", {"op": 1, "previous": L.pw})
        a = sub.read_frame(timeout=120)
        b = sub.read_frame(timeout=120)
        L.E(PS, "PASSCODE_SYNC sync with the previous passcode: EVENT unlocked, then OK",
            ev(a, 3) and b.name == "OK" and b.rid == rid, "%r %r" % (a, b))
        r = c.request("PASSCODE_SYNC", {"op": 0})
        L.E(PS, "PASSCODE_SYNC query afterwards: COUNT 0", r.name == "COUNT" and r["n"] == 0, repr(r))
        c.ok("LOCK")
        r = c.request("UNLOCK", {"passcode": new_pw}, timeout=120)
        L.kind(PS, "UNLOCK with the new login password now opens the keybag: OK", r, "OK")
        r = c.copy(query(GENP, {"svce": S(svce)}, flags=R_DATA))
        L.E(PS, "nothing is lost: the items read", r.name == "ITEMS" and r["items"][0]["data"] == b"kept", repr(r))
        r = c.request("UNLOCK", {"passcode": L.pw}, timeout=120)
        L.err(PS, "the old password no longer unlocks: -25293", r, errSecAuthFailed)
        L.err(PS, "PASSCODE_SYNC sync while in sync: -25291", c.request("PASSCODE_SYNC", {"op": 1, "previous": L.pw}, timeout=120),
              errSecNotAvailable)
    finally:
        with open(path, "w") as f:
            f.write(original)
        r = c.request("SET_PASSCODE", {"current": new_pw, "new": L.pw}, timeout=120)
    L.kind(PS, "back to the original login password with SET_PASSCODE: OK", r, "OK")
    L.failures_in_a_row = 0
    sub.close()
    c.close()


def idle_thread(L, out):
    """Status and Events with an agent whose idle lock is short (--idle-socket): status requests do not
    count as activity, the idle lock announces willLock, and the authentication timeout ends a conversation."""

    def check(section, desc, cond, detail=""):
        out.append((section, desc, cond, detail))

    def body():
        c = L.conn()
        st = c.status()
        if st["passcode_set"] == 0:
            c.ok("SET_PASSCODE", {"current": b"", "new": L.pw}, timeout=120)
        else:
            L.unlock(c)
        check("Status", "STATUS: idleLockSeconds is the configured idle lock (%d)" % L.args.idle_lock_seconds,
              c.status()["idle_lock"] == L.args.idle_lock_seconds)
        svce = L.svc("timeout")
        c.add(GENP, {"svce": S(svce), "accc": D(accc([4]))}, b"t")
        t0 = time.monotonic()
        seen, r = talk(c, "COPY_MATCHING", {"query": query(GENP, {"svce": S(svce)}, flags=R_DATA)}, [], timeout=30)
        dt = time.monotonic() - t0
        check("Authentication", "nobody answering within the authentication timeout: -128",
              [x.name for x in seen] == ["AUTH_NEEDED"] and L.is_err(r, errSecUserCanceled) and dt < L.args.auth_timeout + 5,
              "%r %r %.1fs" % (seen, r, dt))
        seen, r = talk(c, "LA_EVALUATE", {"policy": 2, "reason": "nobody"}, [], timeout=30)
        check("Authentication", "LA_EVALUATE nobody answers within the authentication timeout: systemCancel (-4)",
              r.name == "LA_RESULT" and r["code"] == -4, "%r %s" % (r, r.f))
        sub = L.conn()
        sub.ok("SUBSCRIBE")
        poll = L.conn()
        L.unlock(c)
        next_event(sub)
        t0 = time.monotonic()
        polls = [("STATUS", None), ("PROTECTIONS", None), ("PROMPTER", None), ("COUNTERS", None),
                 ("SYNC_STATUS", {"op": 1}), ("FILES", {"op": 2, "path": ""})]
        names = set()
        got, i = None, 0
        deadline = t0 + L.args.idle_lock_seconds + 4
        while time.monotonic() < deadline:
            name, m = polls[i % len(polls)]
            i += 1
            rep = poll.request(name, m)
            names.add(rep.name)
            try:
                got = sub.read_frame(timeout=0.25)
                break
            except TimeoutError:
                pass
        dt = time.monotonic() - t0
        check("Status", "STATUS, PROTECTIONS, PROMPTER, COUNTERS, SYNC_STATUS and FILES status every 0.25 s do not count as "
              "activity: the idle lock starts all the same", ev(got, 1) and dt <= L.args.idle_lock_seconds + 2,
              "%r after %.1fs, replies %s" % (got, dt, sorted(names)))
        check("Events", "an idle lock's willLock carries the grace period in milliseconds",
              ev(got, 1) and got["grace"] == int(L.args.idle_lock_grace * 1000), got.f if got else None)
        e2 = next_event(sub, L.args.idle_lock_grace + 3)
        check("Events", "the idle lock's grace period ends in locked", ev(e2, 2), repr(e2))
        check("Status", "after the idle lock: lockState 1", c.status()["lock"] == 1)
        for x in (c, sub, poll):
            x.close()
        if L.args.session_lock:
            e2e_session_lock(L, L.args.idle_lock_grace)

    def run():
        try:
            body()
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)[-1]
            out.append(("Status", "the idle-lock checks ran to their end", False, "%s: %s (line %d)" % (type(e).__name__, e, tb.lineno)))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


if __name__ == "__main__":
    sys.exit(main())
