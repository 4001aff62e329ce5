#!/usr/bin/env python3
"""An independent client of Coffer's native wire protocol, written from WireProtocol.md alone.

Everything here was derived from Sources/CofferProtocol/CofferProtocol.docc/WireProtocol.md (the
"spec"); no Swift source of the protocol, the client library or the agent was read to write it. Each
rule below names the spec section it comes from.

Standard library only (Python 3.11). The module has three layers:

- a codec: ``encode_frame`` / ``decode_frame`` for every request and reply the spec defines, with the
  spec's validity rules (a body that breaks them raises ``Malformed``);
- ``Connection``: a live connection to `cofferd` (framing, HELLO, the frame limit of each version,
  events kept apart from replies, the Authentication conversation, descriptor passing);
- small helpers to build attributes and queries.
"""

import errno
import math
import os
import select
import socket
import struct
import time
import unicodedata

# ---------------------------------------------------------------------------------------------------
# Constants (spec: Frames, Messages, Fields, Attributes, Versioning)

MAX_FRAME_SMALL = 262144          # Frames: until a HELLO agreed on version 4 or later
MAX_FRAME_LARGE = 1572864         # Frames: from the frame after a version >= 4 HELLO
LARGE_FRAMES_VERSION = 4          # Versioning: Version 4
MAX_SECRET = 1048576              # Frames: secrets are blobs of at most 1 MiB
MAX_VALUE = 65536                 # Fields: string values and data blobs <= 64 KiB
PREF_LEN = 16                     # Fields: persistentRef exactly 16 bytes (or empty)
MAX_QUERY_REFS = 256              # Fields: a query's persistentRef, up to 256 distinct references one after the other
AGENT_VERSIONS = (1, 2, 3, 4)     # Versioning: "This document describes versions 1 to 4"

# Messages: the type table.
REQUESTS = {
    "HELLO": 0x01, "STATUS": 0x02, "UNLOCK": 0x03, "LOCK": 0x04, "SET_PASSCODE": 0x05, "ADD": 0x06,
    "COPY_MATCHING": 0x07, "UPDATE": 0x08, "DELETE": 0x09, "SUBSCRIBE": 0x0A,
    "COPY_MATCHING_PAGE": 0x0B, "WHOAMI": 0x0C, "AUTHORIZE": 0x0D, "AUTH_OPTIONS": 0x0E,
    "AUTH_RESPONSE": 0x0F, "LA_EVALUATE": 0x10, "LA_CAN_EVALUATE": 0x11, "BIO": 0x12,
    "PASSCODE_SYNC": 0x13, "REMOVE_PASSCODE": 0x14, "ESCROW": 0x15, "BACKUP": 0x16, "CHECK": 0x17,
    "CHECK_PAGE": 0x18, "KEY_CREATE": 0x19, "DELEGATE": 0x1A, "PROTECTIONS": 0x1B,
    "PROMPT_UNLOCK": 0x1C, "PORTAL_SECRET": 0x1D, "SYNC_SETUP": 0x1E, "SYNC_CIRCLE": 0x1F,
    "SYNC_STATUS": 0x20, "SYNC_CONFLICTS": 0x21, "PROMPT_READ": 0x22, "SUBSCRIBE_EVENTS": 0x23,
    "FILES": 0x24, "PROMPTER": 0x25, "COUNTERS": 0x26, "KEY_SIGN": 0x27, "SESSION": 0x28, "NOTE_ACCESS": 0x29,
}
REPLIES = {
    "OK": 0x80, "HELLO_REPLY": 0x81, "STATUS_REPLY": 0x82, "ITEMS": 0x87, "COUNT": 0x88,
    "ITEMS_PAGE": 0x89, "WHOAMI_REPLY": 0x8A, "AUTH_NEEDED": 0x8B, "AUTH_FEEDBACK": 0x8C,
    "LA_RESULT": 0x8D, "BIO_STATUS": 0x8E, "ESCROW_SECRET": 0x8F, "BACKUP_SUMMARY": 0x90,
    "AUTH_FEEDBACK_KIND": 0x91, "CHECK_REPORT": 0x92, "ITEMS_PAGE_SKIPPING": 0x93,
    "CHECK_REPORT_PAGE": 0x94, "PROTECTIONS_REPLY": 0x95, "PORTAL_SECRET_REPLY": 0x97,
    "SYNC_CODE": 0x98, "SYNC_DEVICES": 0x99, "SYNC_STATUS_REPLY": 0x9A,
    "SYNC_CONFLICTS_REPLY": 0x9B, "FILES_REPLY": 0x9C, "PROMPTER_REPLY": 0x9D,
    "COUNTERS_REPLY": 0x9E, "KEY_SIGNATURE": 0x9F, "EVENT": 0xC0, "ERROR": 0xFF,
}
NAMES = {v: k for k, v in list(REQUESTS.items()) + list(REPLIES.items())}

# Fields: itemClass
GENP, INET, KEYS, CERT = 1, 2, 3, 4
CLASS_NAMES = {1: "genp", 2: "inet", 3: "keys", 4: "cert"}
# Fields: returnFlags / present
R_DATA, R_ATTRS, R_REF, R_SKIP, R_LOCKED, R_ACCESS = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
# Fields: limitKind
LIMIT_ONE, LIMIT_ALL, LIMIT_COUNT = 0, 1, 2
# Fields: value tags
T_STRING, T_INT, T_DATA, T_BOOL, T_DATE = 1, 2, 3, 4, 5

# Errors / Messages: OSStatus values named by the spec.
errSecParam = -50
errSecAllocate = -108
errSecUserCanceled = -128
errSecIO = -36
errSecNotAvailable = -25291
errSecAuthFailed = -25293
errSecDuplicateItem = -25299
errSecItemNotFound = -25300
errSecInteractionNotAllowed = -25308
errSecDecode = -26275
errSecMissingEntitlement = -34018
errSecInternalComponent = -2070

# Authentication: LAError codes; "the list above is closed for versions 1 and 2".
LA_CODES = {0, -1, -2, -3, -4, -5, -6, -7, -8, -1004}


class Malformed(Exception):
    """A body (or frame) the spec's grammar refuses."""


class FramingError(Malformed):
    """A length prefix outside 5...MAX_FRAME: the receiver closes (Frames)."""


# ---------------------------------------------------------------------------------------------------
# Primitive encodings (spec: Encodings)

def valid_utf8(raw):
    """Encodings, sstr: valid UTF-8, no overlong forms, no surrogates, nothing above U+10FFFF.
    Python's strict decoder refuses exactly those."""
    try:
        return raw.decode("utf-8", "strict")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8")


class Reader:
    def __init__(self, data):
        self.b = bytes(data)
        self.i = 0

    def take(self, n):
        if n < 0 or self.i + n > len(self.b):
            raise Malformed("cut short")
        out = self.b[self.i:self.i + n]
        self.i += n
        return out

    def u8(self): return self.take(1)[0]
    def u16(self): return struct.unpack(">H", self.take(2))[0]
    def u32(self): return struct.unpack(">I", self.take(4))[0]
    def u64(self): return struct.unpack(">Q", self.take(8))[0]
    def i32(self): return struct.unpack(">i", self.take(4))[0]
    def i64(self): return struct.unpack(">q", self.take(8))[0]

    def f64(self):
        v = struct.unpack(">d", self.take(8))[0]
        if not math.isfinite(v):           # Encodings: NaN and +-inf are malformed
            raise Malformed("date not finite")
        return v

    def blob(self, limit=MAX_SECRET):
        n = self.u32()
        if n > limit:
            raise Malformed("blob too long")
        return self.take(n)

    def sstr(self):
        return valid_utf8(self.take(self.u16()))

    def flag(self):
        v = self.u8()
        if v > 1:
            raise Malformed("flag not 0 or 1")
        return v

    def end(self):
        if self.i != len(self.b):
            raise Malformed("trailing bytes")

    def left(self):
        return len(self.b) - self.i


def u8(v): return struct.pack(">B", v)
def u16(v): return struct.pack(">H", v)
def u32(v): return struct.pack(">I", v)
def u64(v): return struct.pack(">Q", v)
def i32(v): return struct.pack(">i", v)
def i64(v): return struct.pack(">q", v)
def f64(v): return struct.pack(">d", v)
def blob(b): return u32(len(b)) + bytes(b)


def sstr(s):
    raw = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return u16(len(raw)) + raw


# ---------------------------------------------------------------------------------------------------
# Attributes (spec: Fields, Attributes, General attributes)

def S(v): return (T_STRING, v)
def I(v): return (T_INT, v)
def D(v): return (T_DATA, bytes(v))
def B(v): return (T_BOOL, bool(v))
def T(v): return (T_DATE, float(v))


def name_bytes(name):
    return name.encode("utf-8") if isinstance(name, str) else bytes(name)


def attr_limits(version):
    """Fields, attributes: <= 256 names of 1 to 256 bytes; <= 128 of 1 to 32 below version 4."""
    return (256, 256) if version >= LARGE_FRAMES_VERSION else (128, 32)


def encode_value(tv):
    tag, v = tv
    if tag == T_STRING:
        raw = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        return u8(tag) + u32(len(raw)) + raw
    if tag == T_INT:
        return u8(tag) + i64(v)
    if tag == T_DATA:
        return u8(tag) + blob(v)
    if tag == T_BOOL:
        return u8(tag) + u8(1 if v else 0)
    if tag == T_DATE:
        return u8(tag) + f64(v)
    raise ValueError("unknown tag %r" % (tag,))


def encode_attributes(attrs, sort=True):
    """attrs: a dict name -> (tag, value), or a list of pairs (kept in its order with sort=False,
    to build deliberately non-canonical bodies)."""
    pairs = list(attrs.items()) if isinstance(attrs, dict) else list(attrs)
    if sort:
        pairs.sort(key=lambda p: name_bytes(p[0]))
    out = [u16(len(pairs))]
    for name, tv in pairs:
        out.append(sstr(name_bytes(name)))
        out.append(tv if isinstance(tv, (bytes, bytearray)) else encode_value(tv))
    return b"".join(out)


def decode_attributes(r, version):
    max_n, max_name = attr_limits(version)
    n = r.u16()
    if n > max_n:
        raise Malformed("too many attributes")
    out = {}
    prev = None
    nfc = {}
    for _ in range(n):
        raw = r.take(r.u16())
        if not 1 <= len(raw) <= max_name:
            raise Malformed("attribute name length")
        name = valid_utf8(raw)
        if prev is not None and raw <= prev:     # strictly ascending by bytes, no repeats
            raise Malformed("attributes not in order")
        prev = raw
        # General attributes: canonically equivalent names that are not the same bytes MUST NOT both appear.
        key = unicodedata.normalize("NFC", name)
        if key in nfc:
            raise Malformed("canonically equivalent names")
        nfc[key] = name
        tag = r.u8()
        if tag == T_STRING:
            ln = r.u32()
            if ln > MAX_VALUE:
                raise Malformed("string value too long")
            value = valid_utf8(r.take(ln))
        elif tag == T_INT:
            value = r.i64()
        elif tag == T_DATA:
            value = r.blob(MAX_VALUE)
        elif tag == T_BOOL:
            value = bool(r.flag())
        elif tag == T_DATE:
            value = r.f64()
        else:
            raise Malformed("unknown value tag")
        out[name] = (tag, value)
    return out


# ---------------------------------------------------------------------------------------------------
# Queries and items (spec: Fields, Paging, Checking the keychain)

def query(cls=0, attrs=None, limit=LIMIT_ALL, count=0, flags=0, pref=b""):
    return {"cls": cls, "attrs": dict(attrs or {}), "limit": limit, "count": count, "flags": flags,
            "pref": bytes(pref)}


# Which query return flags each request allows (Fields; Checking the keychain: skipUnreadable,
# Access state, Locked matches by reference).
QUERY_FLAGS = {
    "COPY_MATCHING": R_DATA | R_ATTRS | R_REF | R_LOCKED | R_ACCESS,
    "COPY_MATCHING_PAGE": R_DATA | R_ATTRS | R_REF | R_SKIP | R_LOCKED | R_ACCESS,
    "PROMPT_READ": R_DATA | R_ATTRS | R_REF,
    "UPDATE": 0,
    "DELETE": 0,
    "KEY_SIGN": 0,
}


def encode_query(q):
    return (u8(q["cls"]) + encode_attributes(q["attrs"]) + u8(q["limit"]) + u32(q["count"]) +
            u8(q["flags"]) + blob(q["pref"]))


def decode_query(r, version, request):
    cls = r.u8()
    if cls > 4:
        raise Malformed("unknown item class")
    attrs = decode_attributes(r, version)
    limit = r.u8()
    count = r.u32()
    if limit > 2:
        raise Malformed("unknown limit kind")
    if limit in (0, 1) and count != 0:
        raise Malformed("limit count must be 0")
    if limit == 2 and count < 1:
        raise Malformed("limit count must be at least 1")
    flags = r.u8()
    if flags & ~QUERY_FLAGS[request] & 0xFF:
        raise Malformed("undefined return flag")
    if flags & R_ACCESS and not flags & R_ATTRS:
        raise Malformed("access state without attributes")
    if request in ("UPDATE", "DELETE") and limit != LIMIT_ALL:
        raise Malformed("UPDATE and DELETE need limit all")
    pref = r.blob(PREF_LEN * MAX_QUERY_REFS)
    if len(pref) % PREF_LEN:
        raise Malformed("persistent reference length")
    refs = [pref[i:i + PREF_LEN] for i in range(0, len(pref), PREF_LEN)]
    if len(set(refs)) != len(refs):
        raise Malformed("a persistent reference named twice")
    return {"cls": cls, "attrs": attrs, "limit": limit, "count": count, "flags": flags, "pref": pref}


def encode_item(it):
    p = it["present"]
    out = u8(it["cls"]) + u8(p)
    if p & R_DATA:
        out += blob(it["data"])
    if p & R_ATTRS:
        out += encode_attributes(it["attrs"])
    if p & R_REF:
        out += blob(it["pref"])
    return out


def decode_item(r, version, query_flags=None):
    cls = r.u8()
    if not 1 <= cls <= 4:
        raise Malformed("unknown item class")
    p = r.u8()
    allowed = R_DATA | R_ATTRS | R_REF | R_LOCKED | R_ACCESS
    if p & ~allowed:
        raise Malformed("undefined present bit")
    if p & R_LOCKED and p != R_LOCKED | R_REF:      # Locked matches: exactly 0x14
        raise Malformed("locked bit in another combination")
    if p & R_ACCESS and not p & R_ATTRS:            # Access state: bit 5 only beside bit 1
        raise Malformed("access state without attributes")
    if query_flags is not None:
        if p & R_LOCKED and not query_flags & R_LOCKED:
            raise Malformed("locked bit in a reply to a query without it")
        if p & R_ACCESS and not query_flags & R_ACCESS:
            raise Malformed("access-state bit in a reply to a query without it")
    it = {"cls": cls, "present": p}
    if p & R_DATA:
        it["data"] = r.blob()
    if p & R_ATTRS:
        it["attrs"] = decode_attributes(r, version)
    if p & R_REF:
        it["pref"] = r.blob()
        if len(it["pref"]) != PREF_LEN:
            raise Malformed("persistent reference length")
    return it


def encode_items(items):
    return u32(len(items)) + b"".join(encode_item(i) for i in items)


def decode_items(r, version, query_flags=None):
    n = r.u32()
    if n > r.left() // 2:
        raise Malformed("item count beyond the body")
    return [decode_item(r, version, query_flags) for _ in range(n)]


def encode_finding(f):
    return blob(f["pref"]) + u8(f["reason"]) + u8(f["quarantined"]) + sstr(f["detail"])


def decode_finding(r):
    pref = r.blob(64)
    reason = r.u8()
    if not 1 <= reason <= 4:                    # Checking the keychain: other reasons malformed
        raise Malformed("unknown finding reason")
    return {"pref": pref, "reason": reason, "quarantined": r.flag(), "detail": r.sstr()}


# ---------------------------------------------------------------------------------------------------
# Text rules of particular fields

def is_printable_ascii_name(s):
    """BIO: 1-64 printable ASCII, no spaces."""
    return 1 <= len(s) <= 64 and all(0x21 <= ord(c) <= 0x7E for c in s)


def has_control(s):
    """Sync: bytes below 0x20, 0x7F."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)


def is_flatpak_app_id(s):
    """Portal secrets: 3+ dot-separated elements of [A-Za-z0-9_-], none empty or starting with a
    digit, at most 255 bytes."""
    if len(s.encode("utf-8")) > 255:
        return False
    parts = s.split(".")
    if len(parts) < 3:
        return False
    ok = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
    return all(p and not p[0].isdigit() and set(p) <= ok for p in parts)


def is_normal_path(s, allow_empty=False):
    """Protected directories: absolute, no empty, . or .. component, no trailing / (but /), no NUL,
    at most 4095 bytes."""
    if s == "" and allow_empty:
        return True
    if not s.startswith("/") or "\0" in s or len(s.encode("utf-8")) > 4095:
        return False
    if s == "/":
        return True
    comps = s[1:].split("/")
    return all(c not in ("", ".", "..") for c in comps)


# ---------------------------------------------------------------------------------------------------
# Request payloads (spec: Messages; the sections each message points to)

def _need(cond, why):
    if not cond:
        raise Malformed(why)


def decode_request_payload(name, r, version):
    m = {}
    if name == "HELLO":
        m["min"], m["max"] = r.u16(), r.u16()
        m["client"] = r.sstr()
    elif name in ("STATUS", "LOCK", "SUBSCRIBE", "WHOAMI", "PROTECTIONS", "PROMPT_UNLOCK", "PROMPTER",
                  "COUNTERS"):
        pass
    elif name == "UNLOCK":
        m["passcode"] = r.blob()
    elif name == "SET_PASSCODE":
        m["current"], m["new"] = r.blob(), r.blob()
    elif name == "ADD":
        m["cls"] = r.u8()
        _need(1 <= m["cls"] <= 4, "item class")      # 0 is only valid in a query
        m["attrs"] = decode_attributes(r, version)
        m["secret"] = r.blob()
        m["flags"] = r.u8()
        _need(m["flags"] & ~(R_DATA | R_ATTRS | R_REF) == 0, "undefined return flag")
    elif name in ("COPY_MATCHING", "DELETE", "PROMPT_READ"):
        m["query"] = decode_query(r, version, name)
    elif name == "COPY_MATCHING_PAGE":
        m["query"] = decode_query(r, version, name)
        m["cursor"] = r.u64()
    elif name == "SESSION":
        m["event"] = r.u8()
        _need(m["event"] in (1, 2), "SESSION's event is 1 (opened) or 2 (closed)")
    elif name == "NOTE_ACCESS":
        m["operation"] = r.u8()
        _need(1 <= m["operation"] <= 5, "NOTE_ACCESS's operation is 1 (add) to 5 (find)")
    elif name == "KEY_SIGN":
        # Keys: a query of limit one and return flags 0, the data, ssh-agent's signature flags (bits 1, 2).
        m["query"] = decode_query(r, version, name)
        _need(m["query"]["limit"] == LIMIT_ONE, "KEY_SIGN's query has limit one")
        m["data"] = r.blob()
        m["flags"] = r.u32()
        _need(m["flags"] & ~0x6 == 0, "undefined signature flag")
    elif name == "UPDATE":
        m["query"] = decode_query(r, version, name)
        m["changes"] = decode_attributes(r, version)
        has = r.u8()
        _need(has in (0, 1), "hasSecret")
        m["secret"] = r.blob() if has else None
    elif name == "AUTHORIZE":
        m["group"] = r.sstr()
        _need(m["group"] != "", "empty access group")
        m["passcode"] = r.blob()
    elif name == "AUTH_OPTIONS":
        m["flags"] = r.u8()
        _need(m["flags"] & ~3 == 0, "undefined flag")
        m["prompt"] = r.sstr()
        _need(len(m["prompt"].encode()) <= 512, "operation prompt too long")
        m["reuse"] = r.u32()
        _need(m["reuse"] <= 300, "reuse above 300 s")
        _need(not (m["flags"] & 2) or m["reuse"] == 0, "keep for the connection with a reuse duration")
        m["passcode"] = r.blob() if r.flag() else None
        m["app_password"] = r.blob() if r.flag() else None
    elif name == "AUTH_RESPONSE":
        m["kind"] = r.u8()
        _need(m["kind"] <= 4, "unknown kind")
        if m["kind"] in (1, 4):
            m["secret"] = r.blob()
    elif name == "LA_EVALUATE":
        m["policy"] = r.u8()
        _need(m["policy"] in (1, 2), "unknown policy")
        m["reason"] = r.sstr()
        _need(1 <= len(m["reason"].encode()) <= 512, "reason length")
    elif name == "LA_CAN_EVALUATE":
        m["policy"] = r.u8()
        _need(m["policy"] in (1, 2), "unknown policy")
    elif name == "BIO":
        m["op"] = r.u8()
        _need(1 <= m["op"] <= 5, "unknown operation")
        m["name"] = r.sstr()
        if m["op"] <= 3:
            _need(is_printable_ascii_name(m["name"]), "finger name")
        else:
            _need(m["name"] == "", "a name where none belongs")
    elif name == "PASSCODE_SYNC":
        m["op"] = r.u8()
        _need(m["op"] in (0, 1), "unknown operation")
        if m["op"] == 1:
            m["previous"] = r.blob()
    elif name == "REMOVE_PASSCODE":
        m["current"] = r.blob()
    elif name == "ESCROW":
        m["op"] = r.u8()
        _need(m["op"] in (1, 2, 3), "unknown operation")
        if m["op"] in (2, 3):
            m["secret"] = r.blob()
    elif name == "BACKUP":
        m["op"] = r.u8()
        _need(m["op"] in (1, 2, 3), "unknown operation")
        m["path"] = r.sstr()
        _need(m["path"].startswith("/"), "path not absolute")
        m["password"] = r.blob()
    elif name == "CHECK":
        m["op"] = r.u8()
        _need(1 <= m["op"] <= 4, "unknown operation")
        m["pref"] = r.blob()
        _need(len(m["pref"]) == (PREF_LEN if m["op"] == 4 else 0), "reference length")
    elif name == "CHECK_PAGE":
        m["op"] = r.u8()
        _need(1 <= m["op"] <= 3, "unknown operation")
        m["cursor"] = r.u64()
    elif name == "KEY_CREATE":
        m["op"] = r.u8()
        _need(m["op"] in (1, 2), "unknown operation")
        m["attrs"] = decode_attributes(r, version)
        m["key"] = r.blob()
        _need((m["op"] == 1) == (len(m["key"]) == 0), "key given to generate, or none to import")
        m["flags"] = r.u8()
        _need(m["flags"] & ~(R_ATTRS | R_REF) == 0, "return flag data or undefined bit")
    elif name == "DELEGATE":
        m["pid"] = r.u32()
        _need(1 <= m["pid"] <= 0x7FFFFFFF, "pid")
        m["start"] = r.u64()
    elif name == "PORTAL_SECRET":
        m["app"] = r.sstr()
        _need(is_flatpak_app_id(m["app"]), "not a Flatpak application id")
    elif name == "SYNC_SETUP":
        m["op"] = r.u8()
        _need(m["op"] in (1, 2), "unknown operation")
        m["remote"], m["device"] = r.sstr(), r.sstr()
        _need(1 <= len(m["remote"].encode()) <= 4096 and not has_control(m["remote"]), "remote")
        _need(1 <= len(m["device"].encode()) <= 64 and not has_control(m["device"]), "device name")
    elif name == "SYNC_CIRCLE":
        m["op"] = r.u8()
        _need(1 <= m["op"] <= 4, "unknown operation")
        m["arg"] = r.sstr()
        if m["op"] in (1, 2):
            _need(1 <= len(m["arg"].encode()) <= 64 and not has_control(m["arg"]), "argument")
        else:
            _need(m["arg"] == "", "argument where none belongs")
    elif name == "SYNC_STATUS":
        m["op"] = r.u8()
        _need(m["op"] in (1, 2), "unknown operation")
    elif name == "SYNC_CONFLICTS":
        m["op"] = r.u8()
        _need(m["op"] in (1, 2), "unknown operation")
        if m["op"] == 2:
            m["conflict"] = r.sstr()
            _need(1 <= len(m["conflict"].encode()) <= 64, "conflict id")
    elif name == "SUBSCRIBE_EVENTS":
        m["topics"] = r.u8()
        _need(1 <= m["topics"] <= 7, "topics")
    elif name == "FILES":
        m["op"] = r.u8()
        _need(1 <= m["op"] <= 5, "unknown operation")
        if m["op"] in (1, 2, 4, 5):
            m["path"] = r.sstr()
            _need(is_normal_path(m["path"], allow_empty=(m["op"] == 2)), "path")
        if m["op"] == 1:
            m["fclass"] = r.u8()
            _need(1 <= m["fclass"] <= 4, "unknown class")
        if m["op"] in (4, 5):
            m["file"] = r.sstr()
            fb = m["file"].encode()
            _need(1 <= len(fb) <= 255 and b"/" not in fb and b"\0" not in fb and m["file"] not in (".", ".."),
                  "file name")
        if m["op"] == 5:
            m["dropId"] = r.take(16)
            m["index"] = r.u32()
            m["final"] = r.u8()
            _need(m["final"] in (0, 1), "final is 0 or 1")
        if m["op"] in (4, 5):
            m["contents"] = r.blob(196096)
    else:
        raise Malformed("not a request")
    return m


def encode_request_payload(name, m):
    if name == "HELLO":
        return u16(m["min"]) + u16(m["max"]) + sstr(m["client"])
    if name in ("STATUS", "LOCK", "SUBSCRIBE", "WHOAMI", "PROTECTIONS", "PROMPT_UNLOCK", "PROMPTER",
                "COUNTERS"):
        return b""
    if name == "UNLOCK":
        return blob(m["passcode"])
    if name == "SET_PASSCODE":
        return blob(m["current"]) + blob(m["new"])
    if name == "ADD":
        return u8(m["cls"]) + encode_attributes(m["attrs"]) + blob(m["secret"]) + u8(m["flags"])
    if name in ("COPY_MATCHING", "DELETE", "PROMPT_READ"):
        return encode_query(m["query"])
    if name == "SESSION":
        return u8(m["event"])
    if name == "NOTE_ACCESS":
        return u8(m["operation"])
    if name == "KEY_SIGN":
        return encode_query(m["query"]) + blob(m["data"]) + u32(m["flags"])
    if name == "COPY_MATCHING_PAGE":
        return encode_query(m["query"]) + u64(m["cursor"])
    if name == "UPDATE":
        out = encode_query(m["query"]) + encode_attributes(m["changes"])
        return out + (u8(0) if m.get("secret") is None else u8(1) + blob(m["secret"]))
    if name == "AUTHORIZE":
        return sstr(m["group"]) + blob(m["passcode"])
    if name == "AUTH_OPTIONS":
        out = u8(m.get("flags", 0)) + sstr(m.get("prompt", "")) + u32(m.get("reuse", 0))
        for k in ("passcode", "app_password"):
            out += u8(0) if m.get(k) is None else u8(1) + blob(m[k])
        return out
    if name == "AUTH_RESPONSE":
        return u8(m["kind"]) + (blob(m["secret"]) if m["kind"] in (1, 4) else b"")
    if name == "LA_EVALUATE":
        return u8(m["policy"]) + sstr(m["reason"])
    if name == "LA_CAN_EVALUATE":
        return u8(m["policy"])
    if name == "BIO":
        return u8(m["op"]) + sstr(m.get("name", ""))
    if name == "PASSCODE_SYNC":
        return u8(m["op"]) + (blob(m["previous"]) if m["op"] == 1 else b"")
    if name == "REMOVE_PASSCODE":
        return blob(m["current"])
    if name == "ESCROW":
        return u8(m["op"]) + (blob(m["secret"]) if m["op"] in (2, 3) else b"")
    if name == "BACKUP":
        return u8(m["op"]) + sstr(m["path"]) + blob(m["password"])
    if name == "CHECK":
        return u8(m["op"]) + blob(m.get("pref", b""))
    if name == "CHECK_PAGE":
        return u8(m["op"]) + u64(m["cursor"])
    if name == "KEY_CREATE":
        return u8(m["op"]) + encode_attributes(m["attrs"]) + blob(m.get("key", b"")) + u8(m.get("flags", 0))
    if name == "DELEGATE":
        return u32(m["pid"]) + u64(m["start"])
    if name == "PORTAL_SECRET":
        return sstr(m["app"])
    if name == "SYNC_SETUP":
        return u8(m["op"]) + sstr(m["remote"]) + sstr(m["device"])
    if name == "SYNC_CIRCLE":
        return u8(m["op"]) + sstr(m.get("arg", ""))
    if name == "SYNC_STATUS":
        return u8(m["op"])
    if name == "SYNC_CONFLICTS":
        return u8(m["op"]) + (sstr(m["conflict"]) if m["op"] == 2 else b"")
    if name == "SUBSCRIBE_EVENTS":
        return u8(m["topics"])
    if name == "FILES":
        out = u8(m["op"])
        if m["op"] in (1, 2, 4, 5):
            out += sstr(m["path"])
        if m["op"] == 1:
            out += u8(m["fclass"])
        if m["op"] == 4:
            out += sstr(m["file"]) + blob(m["contents"])
        if m["op"] == 5:
            out += sstr(m["file"]) + bytes(m["dropId"]) + u32(m["index"]) + u8(m["final"]) + blob(m["contents"])
        return out
    raise ValueError("not a request: " + name)


# ---------------------------------------------------------------------------------------------------
# Reply payloads

def decode_reply_payload(name, r, version, query_flags=None):
    m = {}
    if name == "OK":
        pass
    elif name == "HELLO_REPLY":
        m["version"], m["agent"] = r.u16(), r.sstr()
    elif name == "STATUS_REPLY":
        m["lock"] = r.u8()
        _need(m["lock"] <= 2, "lock state")           # Status: other values malformed
        m["passcode_set"] = r.flag()
        m["items"] = r.u64()
        m["agent"] = r.sstr()
        m["locked_memory"] = r.u64()
        m["idle_lock"] = r.u32()
    elif name == "PROTECTIONS_REPLY":
        m["device_key"] = r.flag()
        m["attempts"] = r.u8()
        _need(m["attempts"] <= 2, "attempt counting")
        m["rollback"] = r.flag()
    elif name == "ITEMS":
        m["items"] = decode_items(r, version, query_flags)
    elif name == "COUNT":
        m["n"] = r.u64()
    elif name in ("ITEMS_PAGE", "ITEMS_PAGE_SKIPPING"):
        if name == "ITEMS_PAGE_SKIPPING":
            m["unreadable"] = r.u32()
        m["next"] = r.u64()
        m["items"] = decode_items(r, version, query_flags)
        _need(not (m["next"] != 0 and not m["items"]), "a page with a next cursor and no item")
    elif name == "WHOAMI_REPLY":
        m["kind"] = r.u8()
        _need(m["kind"] <= 2, "identity kind")
        m["app"] = r.sstr()
        _need((m["kind"] == 0) == (m["app"] == ""), "app id empty exactly when kind is 0")
        m["pid"] = r.u32()
        m["exe"] = r.sstr()
        m["note"] = r.sstr()
        m["groups"] = [r.sstr() for _ in range(r.u16())]
        m["may_authorize"] = r.flag()
    elif name == "AUTH_NEEDED":
        m["methods"] = r.u8()
        _need(m["methods"] != 0 and m["methods"] & ~7 == 0, "methods")
        m["app"], m["prompt"] = r.sstr(), r.sstr()
    elif name == "AUTH_FEEDBACK":
        m["text"] = r.sstr()
    elif name == "AUTH_FEEDBACK_KIND":
        m["kind"] = r.u8()
        _need(m["kind"] <= 3, "unknown feedback kind")
        m["text"] = r.sstr()
    elif name == "LA_RESULT":
        m["code"] = r.i32()
        _need(m["code"] in LA_CODES, "unknown LAError code")
        m["biometry"] = r.flag()
        m["domain"] = r.blob(64)
        m["message"] = r.sstr()
    elif name == "BIO_STATUS":
        m["authenticator"] = r.sstr()
        m["available"] = r.flag()
        m["enrolled"] = r.u32()
        m["locked_out"] = r.flag()
        m["domain"] = r.blob(64)
        m["detail"] = r.sstr()
    elif name == "ESCROW_SECRET":
        m["secret"] = r.blob()
        _need(len(m["secret"]) == 32, "escrow secret of 32 bytes")
    elif name == "BACKUP_SUMMARY":
        m["added"], m["duplicates"], m["other_device"] = r.u32(), r.u32(), r.u32()
    elif name == "PORTAL_SECRET_REPLY":
        m["secret"] = r.blob()
    elif name == "SYNC_CODE":
        m["device"], m["code"] = r.sstr(), r.sstr()
    elif name == "SYNC_DEVICES":
        m["devices"] = []
        for _ in range(r.u16()):
            d = {"id": r.sstr(), "name": r.sstr(), "flags": r.u8()}
            _need(d["flags"] & ~3 == 0, "device flags")
            m["devices"].append(d)
    elif name == "SYNC_STATUS_REPLY":
        m["state"] = r.u8()
        _need(m["state"] <= 3, "sync state")
        m["running"] = r.flag()
        m["last_success"], m["last_attempt"] = r.u64(), r.u64()
        m["last_error"] = r.sstr()
        m["interval"], m["conflicts"], m["applied"], m["sent"] = r.u32(), r.u32(), r.u32(), r.u32()
        m["phase"] = r.u8()
        m["done"], m["total"] = r.u32(), r.u32()
        _need(m["phase"] <= 4, "unknown phase")
        _need(not (m["running"] == 0 and m["phase"] != 0), "a phase while not running")
        _need(m["done"] <= m["total"], "done above total")
    elif name == "SYNC_CONFLICTS_REPLY":
        m["conflicts"] = []
        for _ in range(r.u32()):
            m["conflicts"].append({"id": r.sstr(), "class": r.sstr(), "service": r.sstr(), "account": r.sstr(),
                                   "winner": r.u64(), "loser": r.u64(), "device": r.sstr(),
                                   "deleted": r.flag()})
    elif name == "FILES_REPLY":
        m["dirs"] = []
        for _ in range(r.u32()):
            d = {"path": r.sstr(), "fclass": r.u8(), "key_id": r.take(16), "key_state": r.u8(),
                 "problem": r.sstr()}
            _need(is_normal_path(d["path"]), "path")
            _need(1 <= d["fclass"] <= 4, "class")
            _need(d["key_state"] <= 3, "key state")
            n = r.u16()
            _need(n <= 1024, "too many processes")
            d["procs"] = [(r.u32(), r.sstr()) for _ in range(n)]
            m["dirs"].append(d)
    elif name == "PROMPTER_REPLY":
        m["program"] = r.sstr()
        _need(m["program"] == "" or m["program"].startswith("/"), "program not absolute")
        m["reason"] = r.sstr()
        m["display_known"] = r.flag()
        m["display"] = r.sstr()
    elif name == "COUNTERS_REPLY":
        m["connections"], m["requests"], m["identifications"], m["searches"] = r.u64(), r.u64(), r.u64(), r.u64()
    elif name == "KEY_SIGNATURE":
        m["signature"] = r.blob()
        _need(1 <= len(m["signature"]) <= 8192, "signature of 1 to 8192 bytes")
    elif name == "EVENT":
        m["kind"] = r.u8()
        _need(1 <= m["kind"] <= 5, "event kind")
        if m["kind"] == 5:
            n = r.u32()
            _need(1 <= n <= 256, "group count")
            groups = []
            for _ in range(n):
                raw = r.take(r.u16())
                valid_utf8(raw)
                _need(raw != b"", "empty group")
                _need(not groups or raw > groups[-1], "groups not strictly ascending")
                groups.append(raw)
            m["groups"] = [g.decode() for g in groups]
        else:
            m["grace"] = r.u32()
            _need(not (m["kind"] == 4 and m["grace"] != 0), "itemsChanged with a non-zero u32")
    elif name == "ERROR":
        m["status"] = r.i32()
        _need(m["status"] != 0, "ERROR status 0")
        m["message"] = r.sstr()
    elif name == "CHECK_REPORT":
        m["checked"], m["skipped"] = r.u32(), r.u32()
        m["findings"] = [decode_finding(r) for _ in range(r.u32())]
    elif name == "CHECK_REPORT_PAGE":
        m["checked"], m["skipped"] = r.u32(), r.u32()
        m["next"] = r.u64()
        m["findings"] = [decode_finding(r) for _ in range(r.u32())]
        _need(not (m["next"] != 0 and not m["findings"]), "a page with a next cursor and no finding")
    else:
        raise Malformed("not a reply")
    return m


def encode_reply_payload(name, m):
    if name == "OK":
        return b""
    if name == "HELLO_REPLY":
        return u16(m["version"]) + sstr(m["agent"])
    if name == "STATUS_REPLY":
        return (u8(m["lock"]) + u8(m["passcode_set"]) + u64(m["items"]) + sstr(m["agent"]) +
                u64(m["locked_memory"]) + u32(m["idle_lock"]))
    if name == "PROTECTIONS_REPLY":
        return u8(m["device_key"]) + u8(m["attempts"]) + u8(m["rollback"])
    if name == "ITEMS":
        return encode_items(m["items"])
    if name == "COUNT":
        return u64(m["n"])
    if name == "ITEMS_PAGE":
        return u64(m["next"]) + encode_items(m["items"])
    if name == "ITEMS_PAGE_SKIPPING":
        return u32(m["unreadable"]) + u64(m["next"]) + encode_items(m["items"])
    if name == "WHOAMI_REPLY":
        return (u8(m["kind"]) + sstr(m["app"]) + u32(m["pid"]) + sstr(m["exe"]) + sstr(m["note"]) +
                u16(len(m["groups"])) + b"".join(sstr(g) for g in m["groups"]) + u8(m["may_authorize"]))
    if name == "AUTH_NEEDED":
        return u8(m["methods"]) + sstr(m["app"]) + sstr(m["prompt"])
    if name == "AUTH_FEEDBACK":
        return sstr(m["text"])
    if name == "AUTH_FEEDBACK_KIND":
        return u8(m["kind"]) + sstr(m["text"])
    if name == "LA_RESULT":
        return i32(m["code"]) + u8(m["biometry"]) + blob(m["domain"]) + sstr(m["message"])
    if name == "BIO_STATUS":
        return (sstr(m["authenticator"]) + u8(m["available"]) + u32(m["enrolled"]) + u8(m["locked_out"]) +
                blob(m["domain"]) + sstr(m["detail"]))
    if name in ("ESCROW_SECRET", "PORTAL_SECRET_REPLY"):
        return blob(m["secret"])
    if name == "BACKUP_SUMMARY":
        return u32(m["added"]) + u32(m["duplicates"]) + u32(m["other_device"])
    if name == "SYNC_CODE":
        return sstr(m["device"]) + sstr(m["code"])
    if name == "SYNC_DEVICES":
        return u16(len(m["devices"])) + b"".join(sstr(d["id"]) + sstr(d["name"]) + u8(d["flags"]) for d in m["devices"])
    if name == "SYNC_STATUS_REPLY":
        return (u8(m["state"]) + u8(m["running"]) + u64(m["last_success"]) + u64(m["last_attempt"]) +
                sstr(m["last_error"]) + u32(m["interval"]) + u32(m["conflicts"]) + u32(m["applied"]) +
                u32(m["sent"]) + u8(m["phase"]) + u32(m["done"]) + u32(m["total"]))
    if name == "SYNC_CONFLICTS_REPLY":
        return u32(len(m["conflicts"])) + b"".join(
            sstr(c["id"]) + sstr(c["class"]) + sstr(c["service"]) + sstr(c["account"]) + u64(c["winner"]) +
            u64(c["loser"]) + sstr(c["device"]) + u8(c["deleted"]) for c in m["conflicts"])
    if name == "FILES_REPLY":
        out = u32(len(m["dirs"]))
        for d in m["dirs"]:
            out += (sstr(d["path"]) + u8(d["fclass"]) + bytes(d["key_id"]) + u8(d["key_state"]) + sstr(d["problem"]) +
                    u16(len(d["procs"])) + b"".join(u32(p) + sstr(n) for p, n in d["procs"]))
        return out
    if name == "PROMPTER_REPLY":
        return sstr(m["program"]) + sstr(m["reason"]) + u8(m["display_known"]) + sstr(m["display"])
    if name == "KEY_SIGNATURE":
        return blob(m["signature"])
    if name == "COUNTERS_REPLY":
        return u64(m["connections"]) + u64(m["requests"]) + u64(m["identifications"]) + u64(m["searches"])
    if name == "EVENT":
        if m["kind"] == 5:
            return u8(5) + u32(len(m["groups"])) + b"".join(sstr(g) for g in m["groups"])
        return u8(m["kind"]) + u32(m["grace"])
    if name == "ERROR":
        return i32(m["status"]) + sstr(m["message"])
    if name == "CHECK_REPORT":
        return u32(m["checked"]) + u32(m["skipped"]) + u32(len(m["findings"])) + b"".join(
            encode_finding(f) for f in m["findings"])
    if name == "CHECK_REPORT_PAGE":
        return (u32(m["checked"]) + u32(m["skipped"]) + u64(m["next"]) + u32(len(m["findings"])) +
                b"".join(encode_finding(f) for f in m["findings"]))
    raise ValueError("not a reply: " + name)


# ---------------------------------------------------------------------------------------------------
# Frames (spec: Frames)

def frame_bytes(type_code, request_id, payload):
    body = u8(type_code) + u32(request_id) + payload
    return u32(len(body)) + body


def encode_frame(name, request_id, m=None):
    m = m or {}
    if name in REQUESTS:
        return frame_bytes(REQUESTS[name], request_id, encode_request_payload(name, m))
    return frame_bytes(REPLIES[name], request_id, encode_reply_payload(name, m))


def check_length(length, max_frame=MAX_FRAME_SMALL):
    """Frames: 5 <= length <= MAX_FRAME, else a framing error (close, no reply, no body read)."""
    if not 5 <= length <= max_frame:
        raise FramingError("frame length outside 5...MAX_FRAME")


def decode_body(body, direction, version=4, query_flags=None):
    """Decodes one frame body (type, id, payload) sent in `direction` ("request": to the agent,
    "reply": to the client). Returns (name, request_id, fields)."""
    r = Reader(body)
    code = r.u8()
    rid = r.u32()
    name = NAMES.get(code)
    table = REQUESTS if direction == "request" else REPLIES
    if name is None or name not in table:      # undefined types, and the other direction's types
        raise Malformed("unknown message type")
    if direction == "request":
        m = decode_request_payload(name, r, version)
    else:
        m = decode_reply_payload(name, r, version, query_flags)
    r.end()
    return name, rid, m


def decode_frame(frame, direction, version=4, max_frame=MAX_FRAME_SMALL, query_flags=None):
    """A whole frame: the length prefix is checked first (as a receiver does after 4 bytes), then the
    body must be exactly that long."""
    if len(frame) < 4:
        raise Malformed("no length")
    length = struct.unpack(">I", frame[:4])[0]
    check_length(length, max_frame)
    if len(frame) - 4 != length:
        raise Malformed("frame not complete" if len(frame) - 4 < length else "bytes after the frame")
    return decode_body(frame[4:], direction, version, query_flags)


def encode_decoded(name, rid, m):
    """Re-encodes what decode_body returned."""
    return encode_frame(name, rid, m)


# ---------------------------------------------------------------------------------------------------
# A live connection

class AgentError(Exception):
    def __init__(self, status, message, rid=None):
        Exception.__init__(self, "%d %s" % (status, message))
        self.status, self.message, self.rid = status, message, rid


class Closed(Exception):
    """The agent closed the connection (EOF or reset)."""


class Reply:
    def __init__(self, name, rid, fields, raw=b""):
        self.name, self.rid, self.f, self.raw = name, rid, fields, raw

    def __getitem__(self, k):
        return self.f[k]

    def get(self, k, d=None):
        return self.f.get(k, d)

    @property
    def status(self):
        return self.f.get("status") if self.name == "ERROR" else 0

    def __repr__(self):
        if self.name == "ERROR":
            return "ERROR %d %r" % (self.f["status"], self.f["message"])
        return "%s(id=%d)" % (self.name, self.rid)


class Connection:
    """One native connection. ``hello`` negotiates the version; frame limits then follow it."""

    def __init__(self, path, timeout=30.0, connect=True):
        self.path = path
        self.timeout = timeout
        self.version = None
        self.agent_version = None
        self.max_frame_in = MAX_FRAME_SMALL     # what the agent may send us
        self.events = []                        # EVENT frames read while waiting for replies
        self.buf = b""
        self.next_id = 1
        self.sock = None
        if connect:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)

    # -- plumbing
    def fileno(self):
        return self.sock.fileno()

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def new_id(self):
        rid = self.next_id
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF or 1
        return rid

    def send_raw(self, data, fds=None):
        data = bytes(data)
        if fds:
            sent = socket.send_fds(self.sock, [data], list(fds))
            if sent < len(data):
                self.sock.sendall(data[sent:])
        else:
            self.sock.sendall(data)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no reply in time")
        r, _, _ = select.select([self.sock], [], [], remaining)
        if not r:
            raise TimeoutError("no reply in time")
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise Closed("closed by the agent")
        self.buf += chunk

    def read_frame(self, timeout=None, query_flags=None):
        """The next frame the agent sends, decoded; a framing error is raised as Malformed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < 4:
            self._fill(deadline)
        length = struct.unpack(">I", self.buf[:4])[0]
        check_length(length, self.max_frame_in)
        while len(self.buf) < 4 + length:
            self._fill(deadline)
        body, self.buf = self.buf[4:4 + length], self.buf[4 + length:]
        name, rid, fields = decode_body(body, "reply", self.version or 1, query_flags)
        return Reply(name, rid, fields, body)

    def read_reply(self, timeout=None, query_flags=None, keep_events=True):
        """The next frame that is not an EVENT (events are kept in self.events)."""
        while True:
            rep = self.read_frame(timeout, query_flags)
            if rep.name == "EVENT":
                if keep_events:
                    self.events.append(rep)
                continue
            return rep

    def is_closed(self, timeout=2.0):
        """True when the agent closed the connection (EOF) within `timeout` with nothing more to read;
        False when it stays open (nothing readable) or sent something."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            r, _, _ = select.select([self.sock], [], [], remaining)
            if not r:
                return False
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self.buf += chunk
            return False

    # -- requests
    def send(self, name, m=None, rid=None, fds=None):
        rid = self.new_id() if rid is None else rid
        self.send_raw(encode_frame(name, rid, m or {}), fds)
        return rid

    def request(self, name, m=None, rid=None, timeout=None, fds=None, auth=None, query_flags=None):
        """Sends one request and returns its final reply. `auth` answers AUTH_NEEDED: a callable
        (conn, rid, reply) -> AUTH_RESPONSE fields or None (no answer); without one an AUTH_NEEDED is
        returned as the reply."""
        rid = self.send(name, m, rid, fds)
        while True:
            rep = self.read_reply(timeout, query_flags)
            if rep.rid != rid:
                raise Malformed("reply id %d for request %d" % (rep.rid, rid))
            if rep.name in ("AUTH_NEEDED", "AUTH_FEEDBACK", "AUTH_FEEDBACK_KIND") and auth is not None:
                answer = auth(self, rid, rep)
                if answer is not None:
                    self.send("AUTH_RESPONSE", answer, rid=rid)
                continue
            return rep

    def hello(self, lo=1, hi=4, client="outside-client"):
        rep = self.request("HELLO", {"min": lo, "max": hi, "client": client})
        if rep.name == "HELLO_REPLY":
            self.accept_hello(rep)
        return rep

    def accept_hello(self, rep):
        self.version = rep["version"]
        self.agent_version = rep["agent"]
        if self.version >= LARGE_FRAMES_VERSION:
            self.max_frame_in = MAX_FRAME_LARGE

    @property
    def max_frame(self):
        return MAX_FRAME_LARGE if (self.version or 0) >= LARGE_FRAMES_VERSION else MAX_FRAME_SMALL

    # -- conveniences
    def ok(self, name, m=None, **kw):
        rep = self.request(name, m, **kw)
        if rep.name == "ERROR":
            raise AgentError(rep["status"], rep["message"], rep.rid)
        return rep

    def status(self):
        return self.ok("STATUS")

    def add(self, cls, attrs, secret=b"", flags=0, **kw):
        return self.request("ADD", {"cls": cls, "attrs": attrs, "secret": secret, "flags": flags}, **kw)

    def copy(self, q, **kw):
        return self.request("COPY_MATCHING", {"query": q}, query_flags=q["flags"], **kw)

    def page(self, q, cursor=0, **kw):
        return self.request("COPY_MATCHING_PAGE", {"query": q, "cursor": cursor}, query_flags=q["flags"], **kw)

    def update(self, q, changes, secret=None, **kw):
        return self.request("UPDATE", {"query": q, "changes": changes, "secret": secret}, **kw)

    def delete(self, q, **kw):
        return self.request("DELETE", {"query": q}, **kw)

    def page_all(self, q, max_pages=10000):
        """Every page of a paged search (Paging: the limit holds across pages). Returns (items, pages)
        or raises AgentError."""
        q = dict(q)
        items, pages, cursor = [], [], 0
        while len(pages) < max_pages:
            rep = self.page(q, cursor)
            if rep.name == "ERROR":
                if cursor == 0 and rep["status"] == errSecItemNotFound:
                    return [], [rep]
                raise AgentError(rep["status"], rep["message"], rep.rid)
            pages.append(rep)
            items.extend(rep["items"])
            if rep["next"] == 0:
                break
            if q["limit"] == LIMIT_COUNT:
                q["count"] -= len(rep["items"])
                if q["count"] <= 0:
                    break
            cursor = rep["next"]
        return items, pages


def passcode_answer(passcode):
    """An `auth` callable for Connection.request that answers every AUTH_NEEDED with the passcode."""
    def answer(conn, rid, rep):
        if rep.name == "AUTH_NEEDED":
            return {"kind": 1, "secret": passcode}
        return None
    return answer


def connect(path, lo=1, hi=4, client="outside-client", timeout=30.0):
    c = Connection(path, timeout)
    rep = c.hello(lo, hi, client)
    if rep.name != "HELLO_REPLY":
        c.close()
        raise AgentError(rep["status"], rep["message"])
    return c


if __name__ == "__main__":
    import sys
    import argparse
    ap = argparse.ArgumentParser(description="A tiny client of cofferd's native socket (written from WireProtocol.md).")
    ap.add_argument("--socket", required=True)
    ap.add_argument("command", choices=["status", "whoami"])
    a = ap.parse_args()
    with connect(a.socket) as conn:
        rep = conn.ok(a.command.upper())
        print(rep.name, rep.f)
    sys.exit(0)
