#!/usr/bin/env python3
"""Writes the fuzzer's seed inputs into the directory given as the only
argument: every entry and protocol body in Format/vectors, each prefixed
with the selector byte that routes it to a decoder in Harness.swift."""
import json
import os
import sys

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "Format", "vectors")
JSON_VALUE, JSON_RESPONSE, ENTRY, ENTRY_FIXED_CHECKSUM, FIELDS, PUSH_BODY = range(6)
HEADER_BYTES = 28


def main(directory):
    os.makedirs(directory, exist_ok=True)
    seeds = []
    with open(os.path.join(VECTORS, "entries.json")) as file:
        entries = json.load(file)
    for vector in entries["valid"] + entries["invalid"]:
        if "hex" not in vector:
            continue
        data = bytes.fromhex(vector["hex"])
        seeds += [(ENTRY, data), (ENTRY_FIXED_CHECKSUM, data)]
        if len(data) > HEADER_BYTES:
            seeds.append((FIELDS, data[HEADER_BYTES:]))
    with open(os.path.join(VECTORS, "protocol.json")) as file:
        exchanges = json.load(file)["exchanges"]
    for exchange in exchanges:
        for body in (exchange["request"].get("body"), exchange["response"].get("body")):
            if body is None:
                continue
            text = json.dumps(body).encode()
            seeds += [(JSON_VALUE, text), (JSON_RESPONSE, text)]
            if isinstance(body, dict) and "operations" in body:
                seeds.append((PUSH_BODY, text))
            for key in ("operations", "changes", "results"):
                items = body.get(key) if isinstance(body, dict) else None
                if isinstance(items, list) and items:
                    seeds.append((JSON_VALUE, json.dumps(items[0]).encode()))
    # What the server keeps as unreadable: a number outside binary64, and
    # nesting past the reader's depth (64).
    seeds.append((PUSH_BODY, b'{"operations":[{"data":{"n":1e400,"d":' + b"[" * 70 + b"]" * 70 + b"}}]}"))
    for index, (selector, data) in enumerate(seeds):
        with open(os.path.join(directory, f"seed-{index:04d}"), "wb") as file:
            file.write(bytes([selector]) + data)
    print(f"{len(seeds)} seeds in {directory}")


if __name__ == "__main__":
    main(sys.argv[1])
