"""The reader process of an LMDB (run as a script by :mod:`.lmdb_reader`, never imported).

lmdb reads pages straight from a memory map: a data file cut short under it is SIGBUS,
a damaged B-tree page can be SIGSEGV, and either kills the process that reads. This
script is that process, so the training process only ever sees a named error. It
imports nothing but the standard library and lmdb (so it starts in a fraction of a
second) and answers requests on stdin with replies on stdout:

- ``G`` + key length (u32) + key: ``V`` + value length (u64) + value, or ``N`` (no such key);
- ``S``: every (key, value) of the database as ``K`` + u32 + key + u64 + value, then ``D``;
- ``C``: ``V`` + u64 length + the entry count as ASCII;
- any lmdb error: ``E`` + u32 length + its message (UTF-8).

Before every read the data file's size is compared with the size it had when opened
(``required``): a file that shrank is reported, not read.
"""

import json
import os
import struct
import sys

U32, U64 = struct.Struct("<I"), struct.Struct("<Q")


def _read(stream, n):
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


def _error(out, message):
    raw = message.encode("utf-8", "replace")
    out.write(b"E" + U32.pack(len(raw)) + raw)
    out.flush()


def main():
    path, data_file, required, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    del sys.path[0]  # the package's folder: its module names must not shadow any the lmdb import needs
    import lmdb

    stdin, out = sys.stdin.buffer, sys.stdout.buffer
    try:
        env = lmdb.open(path, **options)
    except Exception as e:
        _error(out, f"{type(e).__name__}: {e}")
        return
    out.write(b"R")
    out.flush()

    def shrunk():
        size = os.stat(data_file).st_size
        return f"shrunk to {size} bytes" if size < required else ""

    while True:
        try:
            op = _read(stdin, 1)
        except EOFError:  # the parent is gone or closed us
            return
        key = _read(stdin, U32.unpack(_read(stdin, 4))[0]) if op == b"G" else b""
        problem = shrunk()
        if problem:
            _error(out, "TRUNCATED " + problem)
            continue
        try:
            with env.begin(buffers=True) as txn:
                if op == b"G":
                    value = txn.get(key)
                    if value is None:
                        out.write(b"N")
                    else:
                        out.write(b"V" + U64.pack(len(value)))
                        out.write(value)
                elif op == b"C":
                    raw = str(txn.stat()["entries"]).encode()
                    out.write(b"V" + U64.pack(len(raw)) + raw)
                elif op == b"S":
                    with txn.cursor() as cursor:
                        for k, v in cursor:
                            out.write(b"K" + U32.pack(len(k)) + bytes(k) + U64.pack(len(v)))
                            out.write(v)
                    out.write(b"D")
                else:
                    _error(out, f"unknown request {op!r}")
                    continue
            out.flush()
        except Exception as e:
            _error(out, f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
