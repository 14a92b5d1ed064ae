"""Every compiled kernel compiled (or loaded from numba's cache) once, ahead of the first command:
``python -m rmqstore_cli.formats.warmup`` (the set-up script runs it), and before ``verify -j`` forks its workers.

It imports each kernel module; none of them imports this one (formats.kernel holds only the shared
``_jit`` helper and the commitlog kernels, so the kernels do not import one another in a circle).
"""

from __future__ import annotations

import numpy as np


def one_i64() -> np.ndarray:
    return np.ones(1, np.int64)


def warm_up(full: bool = False, part: int | None = None) -> None:
    """Compile (or load from the cache) every kernel once, with the argument types the callers use.

    With the ahead-of-time kernels in use (formats/aot.py) nothing is loaded here unless ``full``: the routed
    kernels came with the extension, and importing numba before a ``-j`` fork (~0.15 s, and numba's kernels
    loaded besides) would be a fixed cost the workers do not need; a worker that calls a kernel only numba has
    imports it then. The set-up and the extension's build warm everything (``full``).

    ``part`` (0 or 1): only that half of the kernels (the reads' walk, properties and cross-checks; the writers and
    the other formats' walks), so that the set-up compiles the two halves in two processes at once."""
    from . import aot

    if not full and aot.loaded():
        return
    if full:
        aot.use_numba()  # this process warms numba's kernels: its routes give those, not the extension's
    if part in (None, 0):
        _warm_reads()
    if part in (None, 1):
        _warm_writes()


def _warm_reads() -> None:
    from . import entrykernel, fast, indexchain, kernel, propscan

    data = bytes(256)
    u8 = fast.kernel_view(data)
    fast.walk(data)
    h = fast.decode_headers(data, np.zeros(1, dtype=np.int64))
    fast.validate(data, h, True, kernel.PROP_IF_PRESENT)
    fast.check_body_crc(data, h)
    fast.check_property_crc(data, 0, 128)
    fast.scan_records(data, 0, len(data))
    kernel.crc32_of(u8, 0, 16)
    pv = propscan.scan(u8, np.zeros(1, np.int64), np.ones(1, np.int64))
    propscan.key_hashes(u8, np.ones(1, bool), np.zeros(1, np.uint32), pv)
    propscan.utf8_tags(u8, np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64), pv, np.zeros(1, np.int64))
    propscan.dispatch_hashes(u8, np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64))
    propscan.delay_codes(u8, np.zeros(1, np.int64), pv, np.zeros(1, np.int64), propscan.delay_millis({1: 1000}),
                         np.zeros(1, np.int64))
    propscan.java_hash_spans(u8, np.zeros(1, np.int64), np.ones(1, np.int64))
    propscan.group_spans(u8, np.zeros(1, np.int64), np.ones(1, np.int64))
    propscan.property_entries(u8, np.zeros(1, np.int64), np.ones(1, np.int64))  # the export's property columns
    propscan.span_bytes(u8, np.zeros(1, np.int64), np.ones(1, np.int64))
    indexchain.chain_block(np.ones(1, np.int32), np.zeros(1, np.int32), 1, 4, np.zeros(4, np.int32))
    entrykernel.warm_up()  # verify's cross-check passes (formats.checkkernel's too)


def _warm_writes() -> None:
    from . import aot, fast, indexbuild, jsonl, replayencode, replaykernel

    dledgerkernel = aot.kernels("dledgerkernel")  # routed: the extension's build exports what is compiled here

    data = bytes(256)
    u8 = fast.kernel_view(data)
    h = fast.new_headers(1)[0]
    from .kernel import PROP_IF_PRESENT

    # rebuild's index writer: one entry into a scratch file of 4 slots and 2 entries
    indexbuild.put_entries(np.zeros(40 + 4 * 4 + 2 * 20, np.uint8), 4, 1, np.ones(1, np.int64), one_i64(), one_i64(), 0)
    jsonl.kernel_lines(data, h.take(0), 0, "none")  # dump --json's writer (formats.jsonkernel)
    # the DLedger entry walk, with the argument types engine/log/dledger.walk_entries passes
    dledgerkernel.walk_entries(u8, 0, len(data), 0, -1, -1, 4, tuple(np.empty(4, np.int64) for _ in dledgerkernel.COLUMNS))
    dh, d32, d64 = fast.new_headers(4)  # and the walk that decodes each entry's message (DLedgerCommitLog.scan)
    dledgerkernel.walk_messages(u8, 0, len(data), 0, -1, -1, 4, tuple(np.empty(4, np.int64) for _ in dledgerkernel.COLUMNS),
                                True, PROP_IF_PRESENT, d32, d64, dh.reason)
    line = (b'{"topic":"T","bornTimestamp":1,"storeTimestamp":1,"bornHost":{"ip":"a","ipHex":"01020304","port":1},'
            b'"storeHost":{"ip":"a","ipHex":"01020304","port":1},"properties":{"K":"v"},"propertiesRaw":"K\\u0001v",'
            b'"bodyBase64":"AA=="}')  # append --from's batch route (formats.replaykernel, formats.replayencode)
    u8 = np.frombuffer(line, np.uint8)
    cols, _, side = replaykernel.parse(u8, np.zeros(1, np.int64), np.full(1, len(line), np.int64), True)
    replaykernel.line_ends(np.frombuffer(b"a\n", np.uint8), np.empty(4, np.int64))  # its block scan (read-only blocks)
    one = np.ones(1, np.int64)
    replayencode.encode_records(u8, side, cols, np.zeros(1, np.int64), one, one * 200, one, one, np.zeros(256, np.uint8),
                                np.zeros(1, np.int64))
    replayencode.layout(one * 100, 0, 1 << 20, np.zeros(1, np.int64), np.zeros(1, np.int64))


def record_compile_times(part: int | None) -> None:
    """The seconds numba took to compile each kernel in this process (those not loaded from its cache), kept beside
    the ahead-of-time build (``aot.COMPILE_TIMES``, one file per warm-up part; a kernel loaded from the cache this
    time keeps the seconds recorded when it was compiled): the build deals the kernels to the processes compiling
    its parts by them (:func:`formats.aotbuild.deal`)."""
    import gc
    import json
    import os

    from numba.core.dispatcher import Dispatcher

    from . import aot

    times: dict = {}
    for d in gc.get_objects():
        if isinstance(d, Dispatcher) and d.py_func.__module__.startswith(aot.PACKAGE + "."):
            spent = sum((cres.metadata or {}).get("timers", {}).get("compiler_lock", 0.0)
                        for cres in d.overloads.values())
            if spent:
                key = d.py_func.__module__.rpartition(".")[2] + "." + d.py_func.__name__
                times[key] = times.get(key, 0.0) + spent
    if times:
        path = os.path.join(aot.HERE, aot.COMPILE_TIMES.format(part=part or 0))
        try:
            with open(path) as f:
                times = {**json.load(f), **times}
        except (OSError, ValueError, TypeError):
            pass
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(times, f, sort_keys=True)
            os.replace(path + ".tmp", path)
        except OSError:  # a read-only install: the build deals by its own rough measure
            pass


if __name__ == "__main__":
    import sys

    from . import kernel

    half = int(sys.argv[sys.argv.index("--part") + 1]) if "--part" in sys.argv else None  # the set-up: 0 and 1 at once
    warm_up(full=True, part=half)
    record_compile_times(half)
    if half != 1:
        print(f"rmqstore kernels ready (CRC32: {kernel.CRC_IMPLEMENTATION}; cache: {kernel.scan_records.stats.cache_path})")
