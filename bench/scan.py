"""The read path alone: ``CommitLog.find_end(check_crc=True)`` over a store (walk + headers + body CRC).

    python -m bench.scan STORE   -> prints records and stop kind
This is the commitlog phase every command shares (verify's segment walk, recover, rebuild,
dump); bench.run reports it next to the commands so their own per-record work shows up.
"""

from __future__ import annotations

import sys

from rmqstore_cli.engine.store import Store


def main() -> None:
    with Store.open(sys.argv[1]) as st:
        res = st.commitlog.find_end(check_crc=True)
    print(res.records, res.stop.kind if res.stop else None)


if __name__ == "__main__":
    main()
