"""What numba adds to the start of a record-reading command, timed in process.

    python -m bench.clistart STORE   -> one JSON line

Imports the CLI (``rmqstore_cli.app``) and the store engine as a command does, then times the
import of the compiled kernels' module (numba's import) and twice opening STORE and walking its
whole commitlog with CRC: the first loads the cached kernels, the second only does the work, so
their difference is the load.
The target: cached kernels keep a CLI start within 0.3 s of the start before numba; this sum
(numba import + cached kernel load) is that difference for a command that reads records.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    t0 = time.perf_counter()
    import rmqstore_cli.app  # noqa: F401
    from rmqstore_cli.engine.store import Store  # noqa: F401  (what the command imports before reading)

    t1 = time.perf_counter()
    import rmqstore_cli.formats.kernel  # noqa: F401  (numba)

    t2 = time.perf_counter()
    _open_and_walk(sys.argv[1])  # loads the cached kernels it calls
    t3 = time.perf_counter()
    _open_and_walk(sys.argv[1])  # the same work with the kernels loaded
    t4 = time.perf_counter()
    load = max(0.0, (t3 - t2) - (t4 - t3))
    print(json.dumps({"import_app_s": round(t1 - t0, 4), "numba_import_s": round(t2 - t1, 4),
                      "kernel_load_s": round(load, 4), "numba_added_s": round(t2 - t1 + load, 4)}))


def _open_and_walk(root: str) -> None:
    from rmqstore_cli.engine.store import Store

    with Store.open(root) as st:
        st.commitlog.find_end(check_crc=True)


if __name__ == "__main__":
    main()
