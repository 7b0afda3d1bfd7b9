"""The LMDB guard process: reads one LMDB for a parent and answers over stdin/stdout.

Run as a script with ``python -I`` (it imports nothing from fastload, so starting it does
not import torch). A damaged or shrinking file can kill a process that maps it (SIGBUS,
SIGSEGV); here that kills only this process, and the parent names the error.

First answer, unasked: ``R`` once the LMDB is open (or ``E`` and why not), so the parent
can check that the file it opened is the dataset's. Requests: ``G`` + key length (u32) +
key: the value of one key. ``S``: every (key, value) in key order. Answers: status byte
(``V`` value, ``N`` no such key, ``E`` error text, ``K`` key then ``V`` value for each
scanned item, ``.`` end of scan) + u64 length + bytes.
"""

import json
import os
import struct
import sys

_LEN = struct.Struct("<Q")
_KEY = struct.Struct("<I")


def _send(out, status: bytes, payload: bytes | memoryview) -> None:
    out.write(status + _LEN.pack(len(payload)))
    out.write(payload)


def main() -> None:
    import lmdb

    path, options = sys.argv[1], json.loads(sys.argv[2])
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers
    try:
        env, failed = lmdb.open(path, subdir=os.path.isdir(path), max_readers=4096, **options), None
    except Exception as e:  # answered to every request, so the parent names it
        env, failed = None, f"opening it: {type(e).__name__}: {e}".encode()
    _send(out, b"R" if failed is None else b"E", failed or b"")
    out.flush()
    while True:
        op = inp.read(1)
        if not op:
            return
        try:
            if failed is not None:
                if op == b"G":
                    inp.read(_KEY.unpack(inp.read(_KEY.size))[0])
                _send(out, b"E", failed)
            elif op == b"G":
                assert env is not None  # opened: failed is None
                (size,) = _KEY.unpack(inp.read(_KEY.size))
                key = inp.read(size)
                with env.begin(buffers=True) as txn:
                    value = txn.get(key)
                    if value is None:
                        _send(out, b"N", b"")
                    else:
                        _send(out, b"V", value)
            elif op == b"S":
                assert env is not None  # opened: failed is None
                with env.begin(buffers=True) as txn, txn.cursor() as cur:
                    for key, value in cur:
                        _send(out, b"K", key)
                        _send(out, b"V", value)
                _send(out, b".", b"")
            else:
                _send(out, b"E", f"unknown request {op!r}".encode())
        except Exception as e:  # lmdb's own errors: the parent raises them, named
            _send(out, b"E", f"{type(e).__name__}: {e}".encode())
        out.flush()


if __name__ == "__main__":
    main()
