#!/usr/bin/env python3
"""Reference encoder and decoder for the entry format of Format/storage.md,
version 1, and the generator of Format/vectors/entries.json.

It is written from the text of storage.md, not from the Swift code, and uses
only the Python standard library. The Swift tests never run it: they read the
JSON it writes. Running it proves that the specification is enough to build a
compatible codec, and regenerates the vectors after a deliberate format
change (which must change storage.md in the same commit).

Usage:
    python3 Format/vectors/reference.py          # write entries.json
    python3 Format/vectors/reference.py --check  # exit 1 if entries.json differs

The decoded form of an entry, and the typed form of a value, are the JSON
forms described in Format/README.md ("Test vectors").
"""

import json
import math
import os
import struct
import sys

FORMAT_VERSION = 1
HEADER_BYTES = 28
CHECKSUM_POSITION = 24
ENTRY_BODY_BYTES_MAX = 4 * 1024 * 1024
VALUE_DEPTH_MAX = 32

KINDS = {1: "intent", 2: "ack", 3: "reject", 4: "remote", 5: "conflict", 6: "resync", 7: "snapshot"}
KIND_BYTES = {name: byte for byte, name in KINDS.items()}
INTENT_OPERATIONS = {1: "create", 2: "update", 3: "delete"}
ACK_OUTCOMES = {1: "applied", 2: "duplicate"}
REMOTE_OPERATIONS = {1: "upsert", 2: "delete"}
RESOLUTIONS = {0: "pending", 1: "keep_local", 2: "keep_remote", 3: "merged", 4: "custom"}

TAG_NULL, TAG_FALSE, TAG_TRUE, TAG_INT, TAG_DOUBLE = 0, 1, 2, 3, 4
TAG_STRING, TAG_BYTES, TAG_TIMESTAMP, TAG_ARRAY, TAG_OBJECT = 5, 6, 7, 8, 9

# Error codes, named exactly as storage.md section 12 names them.
TRUNCATED = "truncated"
UNSUPPORTED_VERSION = "unsupported version"
UNKNOWN_KIND = "unknown kind"
INVALID_FLAGS = "invalid flags"
BAD_CHECKSUM = "bad checksum"
LENGTH_OUT_OF_RANGE = "length out of range"
TRAILING_BYTES = "trailing bytes"
INVALID_UTF8 = "invalid UTF-8"
INVALID_TAG = "invalid tag"
UNSORTED_KEYS = "unsorted keys"
NESTING_TOO_DEEP = "nesting too deep"
OFFSET_MISMATCH = "offset mismatch"
INVALID_FIELD = "invalid field"


# ---------------------------------------------------------------- CRC-32C

def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli), reflected, init and final XOR 0xFFFFFFFF.
    `crc` continues from an earlier result (0 to start)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def entry_checksum(data):
    """The checksum of storage.md section 6: bytes 0..<24, then the body."""
    return crc32c(data[HEADER_BYTES:], crc32c(data[:CHECKSUM_POSITION]))


# ---------------------------------------------------------------- errors

class FormatError(Exception):
    def __init__(self, code, position, detail=""):
        super().__init__(f"{code} at byte {position}: {detail}")
        self.code = code
        self.position = position


# ---------------------------------------------------------------- encoding

class Writer:
    """Appends the primitive types of storage.md section 1. `position` is the
    position (within the entry) of the next byte, given where the body starts."""

    def __init__(self, start=HEADER_BYTES):
        self.data = bytearray()
        self.start = start

    @property
    def position(self):
        return self.start + len(self.data)

    def u8(self, value):
        self.data += struct.pack(">B", value)
        return self

    def u16(self, value):
        self.data += struct.pack(">H", value)
        return self

    def u32(self, value):
        self.data += struct.pack(">I", value)
        return self

    def u64(self, value):
        self.data += struct.pack(">Q", value)
        return self

    def i64(self, value):
        self.data += struct.pack(">q", value)
        return self

    def raw(self, data):
        self.data += bytes(data)
        return self

    def bytes_(self, data):
        return self.u32(len(data)).raw(data)

    def string(self, text):
        return self.bytes_(text.encode("utf-8"))


def name_key(name):
    """The sort key of a field name: its UTF-8 bytes (storage.md section 8)."""
    return name.encode("utf-8")


def encode_value(w, typed):
    kind = typed[0]
    if kind == "null":
        w.u8(TAG_NULL)
    elif kind == "bool":
        w.u8(TAG_TRUE if typed[1] else TAG_FALSE)
    elif kind == "int":
        w.u8(TAG_INT).i64(int(typed[1]))
    elif kind == "double":
        w.u8(TAG_DOUBLE).u64(int(typed[1], 16))
    elif kind == "string":
        w.u8(TAG_STRING).string(typed[1])
    elif kind == "bytes":
        w.u8(TAG_BYTES).bytes_(bytes.fromhex(typed[1]))
    elif kind == "timestamp":
        w.u8(TAG_TIMESTAMP).i64(int(typed[1]))
    elif kind == "array":
        w.u8(TAG_ARRAY).u32(len(typed[1]))
        for element in typed[1]:
            encode_value(w, element)
    elif kind == "object":
        w.u8(TAG_OBJECT)
        encode_fields(w, typed[1])
    else:
        raise ValueError(f"unknown typed value {typed!r}")


def encode_fields(w, fields):
    """Fields from a dict name -> typed value, written in byte order."""
    encode_pairs(w, sorted(fields.items(), key=lambda pair: name_key(pair[0])))


def encode_pairs(w, pairs):
    """Fields from (name, typed value) pairs in the order given. Only the
    generator of invalid vectors passes an order that is not canonical."""
    w.u32(len(pairs))
    for name, value in pairs:
        w.string(name)
        encode_value(w, value)


def encode_body(entry):
    w = Writer()
    kind = entry["kind"]
    inverse = lambda table, name: {v: k for k, v in table.items()}[name]
    if kind == "intent":
        w.u8(inverse(INTENT_OPERATIONS, entry["operation"]))
        w.string(entry["idempotency_key"]).string(entry["entity_type"]).string(entry["entity_id"])
        w.u64(entry["base_version"])
        encode_fields(w, entry["fields"])
    elif kind == "ack":
        w.u64(entry["intent_offset"]).u8(inverse(ACK_OUTCOMES, entry["outcome"])).u64(entry["server_version"])
    elif kind == "reject":
        w.u64(entry["intent_offset"]).string(entry["code"]).string(entry["message"])
    elif kind == "remote":
        w.string(entry["cursor"]).u8(inverse(REMOTE_OPERATIONS, entry["operation"]))
        w.string(entry["entity_type"]).string(entry["entity_id"]).u64(entry["server_version"])
        encode_fields(w, entry["fields"])
    elif kind == "conflict":
        w.u64(entry["intent_offset"]).string(entry["entity_type"]).string(entry["entity_id"])
        w.u64(entry["server_version"]).u8(1 if entry["server_deleted"] else 0)
        encode_fields(w, entry["server_fields"])
        w.u8(inverse(RESOLUTIONS, entry["resolution"]))
        encode_fields(w, entry["resolved_fields"])
    elif kind == "resync":
        w.string(entry["reason"])
    elif kind == "snapshot":
        w.u64(entry["watermark"]).string(entry["cursor"])
        w.string(entry["entity_type"]).string(entry["entity_id"]).u64(entry["server_version"])
        w.u8(1 if entry["deleted"] else 0)
        encode_fields(w, entry["fields"])
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return bytes(w.data)


def assemble(kind_byte, body, offset, timestamp, version=FORMAT_VERSION, flags=0, length=None, checksum=None):
    """Header and body. The body length and the checksum are the correct ones
    unless given; the generator of invalid vectors overrides them."""
    header = bytearray()
    header += struct.pack(">BBHIQQ", version, kind_byte, flags, len(body) if length is None else length, offset, timestamp)
    data = bytes(header) + b"\0\0\0\0" + bytes(body)
    crc = entry_checksum(data) if checksum is None else checksum
    return data[:CHECKSUM_POSITION] + struct.pack(">I", crc) + data[HEADER_BYTES:]


def encode_entry(entry):
    assert entry["offset"] >= 1, "offsets start at 1"
    body = encode_body(entry)
    assert len(body) <= ENTRY_BODY_BYTES_MAX
    return assemble(KIND_BYTES[entry["kind"]], body, entry["offset"], entry["timestamp"])


# ---------------------------------------------------------------- decoding

class Reader:
    """Reads the primitive types with the checks of storage.md section 11."""

    def __init__(self, data, position):
        self.data = data
        self.position = position

    @property
    def remaining(self):
        return len(self.data) - self.position

    def fixed(self, size, fmt, what):
        if self.remaining < size:  # step 9
            raise FormatError(TRUNCATED, self.position, f"{what} needs {size} bytes")
        (value,) = struct.unpack_from(fmt, self.data, self.position)
        self.position += size
        return value

    def u8(self, what):
        return self.fixed(1, ">B", what)

    def u32(self, what):
        return self.fixed(4, ">I", what)

    def u64(self, what):
        return self.fixed(8, ">Q", what)

    def i64(self, what):
        return self.fixed(8, ">q", what)

    def count(self, what, minimum_element_bytes):
        start = self.position
        count = self.u32(what)
        if count > self.remaining // minimum_element_bytes:  # steps 11, 12, 13
            raise FormatError(LENGTH_OUT_OF_RANGE, start, f"{what} {count}, {self.remaining} bytes remain")
        return count

    def bytes_(self, what):
        count = self.count(what, 1)
        value = self.data[self.position:self.position + count]
        self.position += count
        return value

    def string(self, what):
        start = self.position
        raw = self.bytes_(what)
        try:
            return raw.decode("utf-8", errors="strict")
        except UnicodeDecodeError:
            raise FormatError(INVALID_UTF8, start, f"{what} is not UTF-8") from None

    def enum(self, table, what):
        start = self.position
        byte = self.u8(what)
        if byte not in table:  # step 10
            raise FormatError(INVALID_TAG, start, f"{what} {byte}")
        return table[byte]


def decode_fields(r, depth):
    count = r.count("field count", 5)
    fields = {}
    previous = None
    for _ in range(count):
        name_position = r.position
        name = r.string("field name")
        if previous is not None and not name_key(previous) < name_key(name):
            raise FormatError(UNSORTED_KEYS, name_position, f"{name!r} after {previous!r}")
        fields[name] = decode_value(r, depth)
        previous = name
    return fields


def decode_value(r, depth):
    start = r.position
    tag = r.u8("value tag")
    if tag == TAG_NULL:
        return ["null"]
    if tag == TAG_FALSE:
        return ["bool", False]
    if tag == TAG_TRUE:
        return ["bool", True]
    if tag == TAG_INT:
        return ["int", str(r.i64("int"))]
    if tag == TAG_DOUBLE:
        return ["double", f"{r.u64('double'):016x}"]
    if tag == TAG_STRING:
        return ["string", r.string("string")]
    if tag == TAG_BYTES:
        return ["bytes", r.bytes_("bytes").hex()]
    if tag == TAG_TIMESTAMP:
        return ["timestamp", str(r.i64("timestamp"))]
    if tag in (TAG_ARRAY, TAG_OBJECT):
        if depth >= VALUE_DEPTH_MAX:
            raise FormatError(NESTING_TOO_DEEP, start, f"depth {depth}")
        if tag == TAG_ARRAY:
            count = r.count("array count", 1)
            return ["array", [decode_value(r, depth + 1) for _ in range(count)]]
        return ["object", decode_fields(r, depth + 1)]
    raise FormatError(INVALID_TAG, start, f"value tag {tag}")


def decode_body(kind, r):
    entry = {}
    if kind == "intent":
        entry["operation"] = r.enum(INTENT_OPERATIONS, "operation")
        entry["idempotency_key"] = r.string("idempotency key")
        entry["entity_type"] = r.string("entity type")
        entry["entity_id"] = r.string("entity id")
        entry["base_version"] = r.u64("base version")
        entry["fields"] = decode_fields(r, 0)
    elif kind == "ack":
        entry["intent_offset"] = r.u64("intent offset")
        entry["outcome"] = r.enum(ACK_OUTCOMES, "outcome")
        entry["server_version"] = r.u64("server version")
    elif kind == "reject":
        entry["intent_offset"] = r.u64("intent offset")
        entry["code"] = r.string("code")
        entry["message"] = r.string("message")
    elif kind == "remote":
        entry["cursor"] = r.string("cursor")
        entry["operation"] = r.enum(REMOTE_OPERATIONS, "operation")
        entry["entity_type"] = r.string("entity type")
        entry["entity_id"] = r.string("entity id")
        entry["server_version"] = r.u64("server version")
        entry["fields"] = decode_fields(r, 0)
    elif kind == "conflict":
        entry["intent_offset"] = r.u64("intent offset")
        entry["entity_type"] = r.string("entity type")
        entry["entity_id"] = r.string("entity id")
        entry["server_version"] = r.u64("server version")
        entry["server_deleted"] = r.enum({0: False, 1: True}, "server deleted") is True
        entry["server_fields"] = decode_fields(r, 0)
        entry["resolution"] = r.enum(RESOLUTIONS, "resolution")
        entry["resolved_fields"] = decode_fields(r, 0)
    elif kind == "resync":
        entry["reason"] = r.string("reason")
    elif kind == "snapshot":
        entry["watermark"] = r.u64("watermark")
        entry["cursor"] = r.string("cursor")
        entry["entity_type"] = r.string("entity type")
        entry["entity_id"] = r.string("entity id")
        entry["server_version"] = r.u64("server version")
        entry["deleted"] = r.enum({0: False, 1: True}, "deleted") is True
        entry["fields"] = decode_fields(r, 0)
    return entry


def decode_entry(data, expected_offset=None):
    """Decodes one entry, making the checks of storage.md section 11 in order.
    Raises FormatError(code, position)."""
    data = bytes(data)
    if len(data) < HEADER_BYTES:  # step 1
        raise FormatError(TRUNCATED, 0, f"{len(data)} bytes")
    version, kind_byte, flags, length, offset, timestamp, stored = struct.unpack_from(">BBHIQQI", data, 0)
    if version != FORMAT_VERSION:  # step 2
        raise FormatError(UNSUPPORTED_VERSION, 0, f"version {version}")
    if kind_byte not in KINDS:  # step 3
        raise FormatError(UNKNOWN_KIND, 1, f"kind {kind_byte}")
    if flags != 0:  # step 4
        raise FormatError(INVALID_FLAGS, 2, f"flags {flags:#x}")
    if length > ENTRY_BODY_BYTES_MAX or length != len(data) - HEADER_BYTES:  # step 5
        raise FormatError(LENGTH_OUT_OF_RANGE, 4, f"length {length}")
    if expected_offset is not None and offset != expected_offset:  # step 6
        raise FormatError(OFFSET_MISMATCH, 8, f"{offset} stored at {expected_offset}")
    if offset == 0:  # step 7
        raise FormatError(INVALID_FIELD, 8, "offset 0")
    if entry_checksum(data) != stored:  # step 8
        raise FormatError(BAD_CHECKSUM, CHECKSUM_POSITION, "")
    kind = KINDS[kind_byte]
    r = Reader(data, HEADER_BYTES)
    body = decode_body(kind, r)
    if r.remaining > 0:  # step 14
        raise FormatError(TRAILING_BYTES, r.position, f"{r.remaining} bytes")
    return {"offset": offset, "timestamp": timestamp, "kind": kind, **body}


# ---------------------------------------------------------------- vectors

def hlc(milliseconds, logical=0):
    return milliseconds << 16 | logical


T0 = hlc(1763798400000)  # 2025-11-22T08:00:00Z
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1


def s(text):
    return ["string", text]


def i(number):
    return ["int", str(number)]


def d(bits):
    return ["double", f"{bits:016x}"]


def f(number):
    return d(struct.unpack(">Q", struct.pack(">d", number))[0])


def nested_arrays(levels, inner):
    value = inner
    for _ in range(levels):
        value = ["array", [value]]
    return value


def nested_objects(levels, inner, name="n"):
    value = inner
    for _ in range(levels):
        value = ["object", {name: value}]
    return value


def intent(offset, timestamp, operation, fields, key="idem-1", entity_type="todo", entity_id="te_01JDB2Y4K9", base=0):
    return {"offset": offset, "timestamp": timestamp, "kind": "intent", "operation": operation,
            "idempotency_key": key, "entity_type": entity_type, "entity_id": entity_id,
            "base_version": base, "fields": fields}


def conflict(offset, resolution, deleted, server_fields, resolved_fields):
    return {"offset": offset, "timestamp": T0 + offset, "kind": "conflict", "intent_offset": 1,
            "entity_type": "todo", "entity_id": "te_01JDB2Y4K9", "server_version": 9,
            "server_deleted": deleted, "server_fields": server_fields, "resolution": resolution,
            "resolved_fields": resolved_fields}


def valid_entries():
    """(name, entry) pairs; each must decode from its own encoding."""
    title = {"done": ["bool", False], "title": s("Buy milk")}
    every_type = {
        "null": ["null"], "false": ["bool", False], "true": ["bool", True], "int": i(42),
        "double": f(1.5), "string": s("text"), "bytes": ["bytes", "00ff10"],
        "timestamp": ["timestamp", "1763798400000000"],
        "array": ["array", [i(1), s("two"), ["null"]]],
        "object": ["object", {"inner": ["bool", True]}],
    }
    return [
        ("intent-create", intent(1, T0, "create", title)),
        ("intent-update", intent(2, hlc(1763798400000, 1), "update", {"done": ["bool", True]}, key="idem-2", base=3)),
        ("intent-delete-empty-fields", intent(3, hlc(1763798400001), "delete", {}, key="idem-3", base=4)),
        ("ack-applied", {"offset": 3, "timestamp": hlc(1763798400000, 1), "kind": "ack",
                         "intent_offset": 1, "outcome": "applied", "server_version": 7}),
        ("ack-duplicate", {"offset": 4, "timestamp": T0 + 4, "kind": "ack",
                           "intent_offset": 2, "outcome": "duplicate", "server_version": 8}),
        ("reject", {"offset": 5, "timestamp": T0 + 5, "kind": "reject", "intent_offset": 1,
                    "code": "VALIDATION_ERROR", "message": "title must not be empty \u2014 \u00e9t\u00e9 \u65e5\u672c"}),
        ("reject-empty-strings", {"offset": 6, "timestamp": T0 + 6, "kind": "reject", "intent_offset": 2,
                                  "code": "", "message": ""}),
        ("remote-upsert", {"offset": 7, "timestamp": T0 + 7, "kind": "remote", "cursor": "c_0000000042",
                           "operation": "upsert", "entity_type": "todo", "entity_id": "te_01JDB2Y4K9",
                           "server_version": 12, "fields": title}),
        ("remote-delete", {"offset": 8, "timestamp": T0 + 8, "kind": "remote", "cursor": "c_0000000043",
                           "operation": "delete", "entity_type": "todo", "entity_id": "te_01JDB2Y4K9",
                           "server_version": 13, "fields": {}}),
        ("conflict-pending", conflict(9, "pending", False, title, {})),
        ("conflict-keep-local", conflict(10, "keep_local", False, title, {"done": ["bool", True]})),
        ("conflict-keep-remote-server-deleted", conflict(11, "keep_remote", True, {}, {})),
        ("conflict-merged", conflict(12, "merged", False, title, {"done": ["bool", True], "title": s("Buy oat milk")})),
        ("conflict-custom", conflict(13, "custom", False, {"n": i(1)}, {"n": i(2)})),
        ("resync", {"offset": 14, "timestamp": T0 + 14, "kind": "resync", "reason": "server CURSOR_INVALID"}),
        ("resync-empty-reason-smallest-entry", {"offset": 15, "timestamp": 0, "kind": "resync", "reason": ""}),
        ("snapshot", {"offset": 16, "timestamp": T0 + 16, "kind": "snapshot", "watermark": 15,
                      "cursor": "c_0000000043", "entity_type": "todo", "entity_id": "te_01JDB2Y4K9",
                      "server_version": 13, "deleted": False, "fields": title}),
        ("snapshot-deleted-tombstone", {"offset": 29, "timestamp": T0 + 29, "kind": "snapshot", "watermark": 28,
                                        "cursor": "c_0000000044", "entity_type": "todo", "entity_id": "te_01JDB2Y4KA",
                                        "server_version": 7, "deleted": True, "fields": {}}),
        ("snapshot-cursor-only", {"offset": 30, "timestamp": T0 + 30, "kind": "snapshot", "watermark": 29,
                                  "cursor": "c_0000000045", "entity_type": "", "entity_id": "",
                                  "server_version": 0, "deleted": False, "fields": {}}),
        ("value-every-type", intent(17, T0 + 17, "create", every_type)),
        ("value-int64-extremes", intent(18, T0 + 18, "update", {
            "max": i(I64_MAX), "min": i(I64_MIN), "minus-one": i(-1), "zero": i(0)})),
        ("value-double-specials", intent(19, T0 + 19, "update", {
            "nan": d(0x7FF8000000000000), "nan-negative-payload": d(0xFFF8000000000001),
            "nan-signaling": d(0x7FF0000000000001), "negative-zero": d(0x8000000000000000),
            "positive-zero": d(0), "infinity": d(0x7FF0000000000000), "minus-infinity": d(0xFFF0000000000000),
            "smallest-subnormal": d(1), "largest-finite": d(0x7FEFFFFFFFFFFFFF), "minus-pi": f(-math.pi)})),
        ("value-timestamp-extremes", intent(20, T0 + 20, "update", {
            "before-epoch": ["timestamp", "-1"], "epoch": ["timestamp", "0"],
            "max": ["timestamp", str(I64_MAX)], "min": ["timestamp", str(I64_MIN)]})),
        ("value-bytes", intent(21, T0 + 21, "update", {
            "all-256": ["bytes", bytes(range(256)).hex()], "empty": ["bytes", ""]})),
        ("value-strings-non-ascii", intent(22, T0 + 22, "update", {
            "accent": s("caf\u00e9"), "cjk": s("\u65e5\u672c\u8a9e"), "decomposed": s("cafe\u0301"),
            "emoji": s("\U0001F600"), "empty": s(""), "nul-inside": s("a\u0000b"),
            "long-300": s("x" * 300)})),
        ("field-names-byte-order", intent(23, T0 + 23, "update", {
            "": i(0), "Z": i(1), "a": i(2), "aa": i(3), "ab": i(4), "b": i(5),
            "f": i(7), "\u00e9": i(8), "\u65e5": i(9), "\U0001F600": i(10)},
            key="cl\u00e9-\u65e5", entity_type="t\u00e2che", entity_id="\u00e9\U0001F600")),
        # "e" and a combining acute accent sort before "f", whereas the
        # precomposed "\u00e9" sorts after it. No JSON object here holds two
        # names that are canonically equivalent: Swift's String equality and
        # Foundation's JSON parser would merge them, though the format keeps
        # them apart (storage.md, section 1).
        ("field-names-decomposed", intent(28, T0 + 28, "update", {
            "e\u0301": i(1), "f": i(2), "e": i(3), "\u00e8": i(4)})),
        ("value-nested", intent(24, T0 + 24, "create", {
            "empty-array": ["array", []], "empty-object": ["object", {}],
            "matrix": ["array", [["array", [i(1), i(2)]], ["array", [i(3), ["array", []]]]]],
            "tree": ["object", {"b": ["array", [["object", {"x": ["null"], "y": f(-0.0)}]]],
                                "a": ["object", {"\u00e9": ["object", {}]}]}]})),
        ("value-depth-32-arrays", intent(25, T0 + 25, "update", {"deep": nested_arrays(32, i(1))})),
        ("value-depth-32-objects", intent(26, T0 + 26, "update", {"deep": nested_objects(32, s("leaf"))})),
        ("offset-and-timestamp-max", {"offset": U64_MAX, "timestamp": U64_MAX, "kind": "ack",
                                      "intent_offset": U64_MAX - 1, "outcome": "applied",
                                      "server_version": U64_MAX}),
        ("snapshot-max-values", {"offset": U64_MAX - 1, "timestamp": hlc((1 << 48) - 1, 0xFFFF), "kind": "snapshot",
                                 "watermark": U64_MAX - 2, "cursor": "", "entity_type": "", "entity_id": "",
                                 "server_version": U64_MAX, "deleted": False, "fields": {}}),
        ("intent-create-max-base-version", intent(1 << 32, T0 + 27, "create", {"n": i(1)}, base=U64_MAX)),
    ]


def intent_body(fields_writer, key="k", entity_type="t", entity_id="i", operation=1):
    """An intent body whose Fields part `fields_writer` writes; returns the
    body and the position where the Fields start."""
    w = Writer()
    w.u8(operation).string(key).string(entity_type).string(entity_id).u64(0)
    fields_at = w.position
    fields_writer(w)
    return bytes(w.data), fields_at


def invalid_entries():
    """(name, bytes, expected_offset, code, position). The code and position
    are stated from the layout of the bytes built here; the generator checks
    that the reference decoder reports the same."""
    good_ack = encode_entry({"offset": 1, "timestamp": T0, "kind": "ack", "intent_offset": 1,
                             "outcome": "applied", "server_version": 1})
    good_intent = encode_entry(intent(1, T0, "create", {"a": i(1)}))
    ack_body = Writer().u64(1).u8(1).u64(1).data
    ack = lambda body, **kw: assemble(2, body, kw.pop("offset", 1), T0, **kw)
    intent_entry = lambda body, **kw: assemble(1, body, 1, T0, **kw)
    vectors = []
    add = lambda *vector: vectors.append(vector)

    # Header checks, steps 1 to 7.
    add("truncated-header-empty", b"", 1, TRUNCATED, 0)
    add("truncated-header-27-bytes", good_ack[:27], 1, TRUNCATED, 0)
    add("truncated-header-before-version-check", b"\x02", None, TRUNCATED, 0)
    add("truncated-body-cut-short", good_ack[:-1], 1, LENGTH_OUT_OF_RANGE, 4)
    add("truncated-body-header-only", good_intent[:HEADER_BYTES], 1, LENGTH_OUT_OF_RANGE, 4)
    add("unsupported-version-0", ack(ack_body, version=0), 1, UNSUPPORTED_VERSION, 0)
    add("unsupported-version-2", ack(ack_body, version=2), 1, UNSUPPORTED_VERSION, 0)
    add("unsupported-version-255", ack(ack_body, version=255), 1, UNSUPPORTED_VERSION, 0)
    add("unknown-kind-0", assemble(0, ack_body, 1, T0), 1, UNKNOWN_KIND, 1)
    add("unknown-kind-8", assemble(8, ack_body, 1, T0), 1, UNKNOWN_KIND, 1)
    add("unknown-kind-255", assemble(255, ack_body, 1, T0), 1, UNKNOWN_KIND, 1)
    add("invalid-flags-low-bit", ack(ack_body, flags=0x0001), 1, INVALID_FLAGS, 2)
    add("invalid-flags-high-bit", ack(ack_body, flags=0x8000), 1, INVALID_FLAGS, 2)
    add("body-length-larger-than-body", ack(ack_body, length=18), 1, LENGTH_OUT_OF_RANGE, 4)
    add("body-length-smaller-than-body", ack(ack_body, length=16), 1, LENGTH_OUT_OF_RANGE, 4)
    add("body-length-over-limit", ack(ack_body, length=ENTRY_BODY_BYTES_MAX + 1), 1, LENGTH_OUT_OF_RANGE, 4)
    add("body-length-u32-max", ack(ack_body, length=0xFFFFFFFF), 1, LENGTH_OUT_OF_RANGE, 4)
    add("offset-mismatch", ack(ack_body, offset=5), 6, OFFSET_MISMATCH, 8)
    add("offset-mismatch-max", ack(ack_body, offset=U64_MAX), 1, OFFSET_MISMATCH, 8)
    add("offset-zero-no-expected-offset", ack(ack_body, offset=0), None, INVALID_FIELD, 8)
    add("offset-zero-expected-zero", ack(ack_body, offset=0), 0, INVALID_FIELD, 8)
    add("offset-zero-expected-one", ack(ack_body, offset=0), 1, OFFSET_MISMATCH, 8)

    # The checksum, step 8, and what is checked before it.
    flipped_checksum = bytearray(good_ack)
    flipped_checksum[27] ^= 0x01
    add("bad-checksum-field-flipped", bytes(flipped_checksum), 1, BAD_CHECKSUM, 24)
    flipped_body = bytearray(good_ack)
    flipped_body[44] ^= 0x80
    add("bad-checksum-body-flipped", bytes(flipped_body), 1, BAD_CHECKSUM, 24)
    flipped_timestamp = bytearray(good_ack)
    flipped_timestamp[16] ^= 0x40
    add("bad-checksum-timestamp-flipped", bytes(flipped_timestamp), 1, BAD_CHECKSUM, 24)
    add("bad-checksum-zero", ack(ack_body, checksum=0), 1, BAD_CHECKSUM, 24)
    bad_tag_body, _ = intent_body(lambda w: w.u32(1).string("a").u8(10))
    add("bad-checksum-checked-before-body", intent_entry(bad_tag_body, checksum=0), 1, BAD_CHECKSUM, 24)
    add("unknown-kind-checked-before-checksum", assemble(9, ack_body, 1, T0, checksum=0), 1, UNKNOWN_KIND, 1)
    add("offset-mismatch-checked-before-checksum", ack(ack_body, offset=2, checksum=0), 1, OFFSET_MISMATCH, 8)

    # Body checks (steps 9 to 14), all with a correct checksum.
    add("truncated-field-ack-server-version", ack(ack_body[:10]), 1, TRUNCATED, 37)
    add("truncated-field-string-length", assemble(6, b"\x00\x00", 1, T0), 1, TRUNCATED, 28)
    add("truncated-field-empty-intent-body", intent_entry(b""), 1, TRUNCATED, 28)
    w = Writer().u64(1).string("CODE")
    add("truncated-field-reject-missing-message", assemble(3, w.data, 1, T0), 1, TRUNCATED, w.position)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(TAG_INT).u32(7))
    add("truncated-field-int-value", intent_entry(body), 1, TRUNCATED, at + 4 + 5 + 1)
    body, at = intent_body(lambda w: None)
    add("truncated-field-fields-count-missing", intent_entry(body), 1, TRUNCATED, at)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(TAG_ARRAY).u32(2).u8(TAG_INT).i64(5))
    add("truncated-field-array-element-missing", intent_entry(body), 1, TRUNCATED, at + 4 + 5 + 1 + 4 + 9)

    add("trailing-bytes-ack", ack(ack_body + b"\x00"), 1, TRAILING_BYTES, 45)
    w = Writer().string("why")
    add("trailing-bytes-resync", assemble(6, w.data + b"\xff\xff", 1, T0), 1, TRAILING_BYTES, w.position)
    body = bytes(good_intent[HEADER_BYTES:]) + b"\x00\x00\x00\x00"
    add("trailing-bytes-intent", intent_entry(body), 1, TRAILING_BYTES, len(good_intent))

    add("length-string-longer-than-entry", assemble(6, b"\x00\x00\x00\x05abcd", 1, T0), 1, LENGTH_OUT_OF_RANGE, 28)
    add("length-string-u32-max", assemble(6, b"\xff\xff\xff\xffabcd", 1, T0), 1, LENGTH_OUT_OF_RANGE, 28)
    body, at = intent_body(lambda w: w.u32(2).string("a").u8(TAG_NULL))
    add("length-fields-count-over-remaining-div-5", intent_entry(body), 1, LENGTH_OUT_OF_RANGE, at)
    body, at = intent_body(lambda w: w.u32(2).string("a").u8(TAG_INT).i64(1))
    add("truncated-fields-count-within-bound", intent_entry(body), 1, TRUNCATED, at + 4 + 5 + 9)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(TAG_ARRAY).u32(3).u8(TAG_NULL).u8(TAG_NULL))
    add("length-array-count-over-remaining", intent_entry(body), 1, LENGTH_OUT_OF_RANGE, at + 4 + 5 + 1)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(TAG_BYTES).u32(0xFFFFFFFF))
    add("length-bytes-value-u32-max", intent_entry(body), 1, LENGTH_OUT_OF_RANGE, at + 4 + 5 + 1)

    add("invalid-utf8-lone-continuation-in-key", intent_entry(Writer().u8(1).bytes_(b"\x80").data), 1,
        INVALID_UTF8, 29)
    body = Writer().u8(1).string("k").string("t").bytes_(b"\xc3").data
    add("invalid-utf8-cut-sequence-in-entity-id", intent_entry(body), 1, INVALID_UTF8, 29 + 5 + 5)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(TAG_STRING).bytes_(b"\xc0\xaf"))
    add("invalid-utf8-overlong-in-string-value", intent_entry(body), 1, INVALID_UTF8, at + 4 + 5 + 1)
    body, at = intent_body(lambda w: w.u32(1).bytes_(b"\xed\xa0\x80").u8(TAG_NULL))
    add("invalid-utf8-surrogate-in-field-name", intent_entry(body), 1, INVALID_UTF8, at + 4)
    body, at = intent_body(lambda w: w.u32(2).string("a").u8(TAG_NULL).bytes_(b"\xf4\x90\x80\x80").u8(TAG_NULL))
    add("invalid-utf8-above-u10ffff-checked-before-order", intent_entry(body), 1, INVALID_UTF8, at + 4 + 6)
    # "a" and a stray 0xff sorts before "b": the name is read as a string
    # (step 11) before its order is checked (step 12).
    body, at = intent_body(lambda w: w.u32(2).string("b").u8(TAG_NULL).bytes_(b"a\xff").u8(TAG_NULL))
    add("invalid-utf8-in-unsorted-field-name", intent_entry(body), 1, INVALID_UTF8, at + 4 + 6)
    add("invalid-utf8-reject-message", assemble(3, Writer().u64(1).string("C").bytes_(b"ok\xff").data, 1, T0),
        1, INVALID_UTF8, 28 + 8 + 5)

    def unsorted(names, bad_index):
        def write(w):
            w.u32(len(names))
            for name in names:
                w.string(name).u8(TAG_NULL)
        body, at = intent_body(write)
        position = at + 4 + sum(4 + len(name.encode()) + 1 for name in names[:bad_index])
        return intent_entry(body), position

    for name, names, bad in [
        ("unsorted-keys-b-before-a", ["b", "a"], 1),
        ("unsorted-keys-lowercase-before-uppercase", ["a", "Z"], 1),
        ("unsorted-keys-accent-before-z", ["\u00e9", "z"], 1),
        ("unsorted-keys-precomposed-before-decomposed", ["\u00e9", "e\u0301"], 1),
        ("unsorted-keys-longer-before-prefix", ["a", "ab", "a"], 2),
        ("duplicate-keys", ["a", "b", "b"], 2),
        ("duplicate-keys-empty-name", ["", ""], 1),
    ]:
        data, position = unsorted(names, bad)
        add(name, data, 1, UNSORTED_KEYS, position)
    body, at = intent_body(lambda w: w.u32(1).string("o").u8(TAG_OBJECT).u32(2).string("x").u8(TAG_NULL)
                           .string("x").u8(TAG_NULL))
    add("duplicate-keys-in-nested-object", intent_entry(body), 1, UNSORTED_KEYS, at + 4 + 5 + 1 + 4 + 6)
    w = Writer().u64(1).string("t").string("i").u64(2).u8(0).u32(0).u8(0)
    resolved_at = w.position
    w.u32(2).string("y").u8(TAG_NULL).string("x").u8(TAG_NULL)
    add("unsorted-keys-in-conflict-resolved-fields", assemble(5, w.data, 1, T0), 1, UNSORTED_KEYS,
        resolved_at + 4 + 6)

    body, at = intent_body(lambda w: w.u32(1).string("a").u8(10))
    add("invalid-value-tag-10", intent_entry(body), 1, INVALID_TAG, at + 9)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(255))
    add("invalid-value-tag-255", intent_entry(body), 1, INVALID_TAG, at + 9)
    body, at = intent_body(lambda w: w.u32(1).string("a").u8(TAG_ARRAY).u32(2).u8(TAG_TRUE).u8(0x0A))
    add("invalid-value-tag-in-array", intent_entry(body), 1, INVALID_TAG, at + 9 + 5 + 1)
    for name, operation in [("invalid-enum-intent-operation-0", 0), ("invalid-enum-intent-operation-4", 4)]:
        body, _ = intent_body(lambda w: w.u32(0), operation=operation)
        add(name, intent_entry(body), 1, INVALID_TAG, 28)
    for name, outcome in [("invalid-enum-ack-outcome-0", 0), ("invalid-enum-ack-outcome-3", 3)]:
        add(name, ack(Writer().u64(1).u8(outcome).u64(1).data), 1, INVALID_TAG, 36)
    for name, operation in [("invalid-enum-remote-operation-0", 0), ("invalid-enum-remote-operation-3", 3)]:
        w = Writer().string("c")
        at = w.position
        w.u8(operation).string("t").string("i").u64(1).u32(0)
        add(name, assemble(4, w.data, 1, T0), 1, INVALID_TAG, at)
    w = Writer().u64(1).string("t").string("i").u64(2)
    deleted_at = w.position
    w.u8(2).u32(0).u8(0).u32(0)
    add("invalid-enum-conflict-server-deleted-2", assemble(5, w.data, 1, T0), 1, INVALID_TAG, deleted_at)
    w = Writer().u64(1).string("c").string("t").string("i").u64(2)
    snapshot_deleted_at = w.position
    w.u8(2).u32(0)
    add("invalid-enum-snapshot-deleted-2", assemble(7, w.data, 1, T0), 1, INVALID_TAG, snapshot_deleted_at)
    w = Writer().u64(1).string("t").string("i").u64(2).u8(0).u32(0)
    resolution_at = w.position
    w.u8(5).u32(0)
    add("invalid-enum-conflict-resolution-5", assemble(5, w.data, 1, T0), 1, INVALID_TAG, resolution_at)

    def too_deep(value, per_level):
        body, at = intent_body(lambda w: (w.u32(1).string("deep"), encode_value(w, value)))
        return intent_entry(body), at + 4 + 8 + 32 * per_level

    data, position = too_deep(nested_arrays(33, i(1)), 5)
    add("nesting-33-arrays", data, 1, NESTING_TOO_DEEP, position)
    data, position = too_deep(nested_objects(33, ["null"]), 1 + 4 + 5)
    add("nesting-33-objects", data, 1, NESTING_TOO_DEEP, position)
    data, position = too_deep(nested_arrays(40, i(1)), 5)
    add("nesting-40-arrays-reports-the-33rd", data, 1, NESTING_TOO_DEEP, position)
    data, position = too_deep(nested_arrays(33, ["array", [i(7), ["bool", True]]]), 5)
    add("nesting-34-arrays-reports-the-33rd", data, 1, NESTING_TOO_DEEP, position)
    # The 33rd container sits at depth 32 even when its count is damaged:
    # depth is checked before the count is read.
    value_bytes = Writer(0)
    encode_value(value_bytes, nested_arrays(33, ["null"]))
    body, at = intent_body(lambda w: w.u32(1).string("deep").raw(value_bytes.data[:32 * 5 + 1] + b"\xff\xff\xff\xff"))
    add("nesting-checked-before-array-count", intent_entry(body), 1, NESTING_TOO_DEEP, at + 4 + 8 + 32 * 5)
    return vectors


# ---------------------------------------------------------------- the JSON

def build():
    valid = []
    names = set()
    for name, entry in valid_entries():
        assert name not in names, name
        names.add(name)
        data = encode_entry(entry)
        decoded = decode_entry(data, expected_offset=entry["offset"])
        assert decoded == canonical(entry), name
        assert encode_entry(decoded) == data, name
        valid.append({"name": name, "hex": data.hex(), "entry": decoded})
    invalid = []
    for name, data, expected_offset, code, position in invalid_entries():
        assert name not in names, name
        names.add(name)
        try:
            decode_entry(data, expected_offset=expected_offset)
        except FormatError as error:
            assert (error.code, error.position) == (code, position), (name, error.code, error.position, position)
        else:
            raise AssertionError(f"{name} decoded")
        invalid.append({"name": name, "hex": bytes(data).hex(), "expected_offset": expected_offset,
                        "error": code, "position": position})
    return {"valid": valid, "invalid": invalid}


def canonical(entry):
    """The decoded form of an entry built by hand: fields in byte order (JSON
    objects are unordered, but the file reads better this way)."""
    def value(typed):
        if typed[0] == "array":
            return ["array", [value(element) for element in typed[1]]]
        if typed[0] == "object":
            return ["object", fields(typed[1])]
        return typed

    def fields(pairs):
        return {name: value(pairs[name]) for name in sorted(pairs, key=name_key)}

    return {key: fields(item) if key in ("fields", "server_fields", "resolved_fields") else item
            for key, item in entry.items()}


def pretty(value, level=0):
    """JSON with one line per vector field and per entity field: typed values
    (lists that start with their type name) stay on one line."""
    inner = "  " * (level + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(key)}: {pretty(item, level + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        items = [inner + pretty(item, level + 1) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * level + "]"
    return json.dumps(value, ensure_ascii=True)


def self_test():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283


def main():
    self_test()
    text = pretty(build()) + "\n"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "entries.json")
    if "--check" in sys.argv[1:]:
        with open(path, encoding="utf-8") as existing:
            if existing.read() != text:
                print(f"{path} is not what reference.py generates", file=sys.stderr)
                return 1
        return 0
    with open(path, "w", encoding="utf-8") as output:
        output.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
