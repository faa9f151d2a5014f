#!/usr/bin/env python3
"""Seeds for the page fuzzer (`Tools/fuzz/run`): small `data.mdb` files
written by liblmdb itself (through ctypes), so that the fuzzer starts from
the structures LMDB makes: leaves, branches, overflow pages, named tables
and a free list.

    page_seeds.py OUT_DIR
"""
import ctypes
import ctypes.util
import os
import sys
import tempfile

MDB_CREATE = 0x40000
MDB_NOSYNC = 0x10000

lmdb = ctypes.CDLL(ctypes.util.find_library("lmdb") or "liblmdb.so.0")


class Value(ctypes.Structure):
    _fields_ = [("mv_size", ctypes.c_size_t), ("mv_data", ctypes.c_void_p)]


def check(result, what):
    if result != 0:
        raise SystemExit(f"{what}: error {result}")


def value(data):
    buffer = ctypes.create_string_buffer(data, len(data))
    return Value(len(data), ctypes.cast(buffer, ctypes.c_void_p)), buffer


def write_store(directory, tables, deletes):
    """tables: {name: [(key, value)]}, written in one commit; then deletes:
    {name: [key]} in a second one (which leaves pages in the free list)."""
    env = ctypes.c_void_p()
    check(lmdb.mdb_env_create(ctypes.byref(env)), "mdb_env_create")
    check(lmdb.mdb_env_set_maxdbs(env, 8), "mdb_env_set_maxdbs")
    check(lmdb.mdb_env_open(env, directory.encode(), MDB_NOSYNC, 0o644), "mdb_env_open")
    for commit in (tables, deletes):
        if not commit:
            continue
        txn = ctypes.c_void_p()
        check(lmdb.mdb_txn_begin(env, None, 0, ctypes.byref(txn)), "mdb_txn_begin")
        for name, items in commit.items():
            dbi = ctypes.c_uint()
            check(lmdb.mdb_dbi_open(txn, name.encode(), MDB_CREATE, ctypes.byref(dbi)), "mdb_dbi_open")
            for item in items:
                key, key_buffer = value(item[0] if isinstance(item, tuple) else item)
                if isinstance(item, tuple):
                    data, data_buffer = value(item[1])
                    check(lmdb.mdb_put(txn, dbi, ctypes.byref(key), ctypes.byref(data), 0), "mdb_put")
                else:
                    check(lmdb.mdb_del(txn, dbi, ctypes.byref(key), None), "mdb_del")
        check(lmdb.mdb_txn_commit(txn), "mdb_txn_commit")
    lmdb.mdb_env_close(env)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    keys = [b"key-%05d" % n for n in range(400)]
    seeds = {
        "one-leaf": ({"t": [(b"a", b"1"), (b"b", b"22"), (b"c", b"333")]}, {}),
        "two-levels-and-free": (
            {"t": [(k, bytes([n % 251]) * 60) for n, k in enumerate(keys)], "gone": [(b"x", b"y")]},
            {"t": keys[::3], "gone": [b"x"]},
        ),
        "overflow": ({"big": [(b"one", b"\x01" * 6000), (b"two", b"\x02" * 9000)]}, {}),
    }
    for name, (tables, deletes) in seeds.items():
        with tempfile.TemporaryDirectory() as directory:
            write_store(directory, tables, deletes)
            with open(os.path.join(directory, "data.mdb"), "rb") as source:
                data = source.read()
        with open(os.path.join(out, name + ".mdb"), "wb") as seed:
            seed.write(data)


if __name__ == "__main__":
    main()
