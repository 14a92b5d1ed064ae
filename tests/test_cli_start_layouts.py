"""A start on a classic store loads none of the engine's modules for layouts the store does not have (the timer
store, DLedger, the RocksDB consume queue), nor what only ``-j`` needs (multiprocessing), nor what none of these
commands needs (ctypes.util, tempfile; construct, whose Structs the derived views they read through do not need):
checked by the modules a real run has imported, never by a timing. verify on stores that have those layouts does
load them (the check can fail)."""

from __future__ import annotations

import pytest

from tests.conftest import STORES
from tests.test_cli_start import CASES, imported

LAYOUT_MODULES = {
    "timer": {"rmqstore_cli.engine.timer.files", "rmqstore_cli.engine.timer.store", "rmqstore_cli.engine.timer.check",
              "rmqstore_cli.engine.timer.report", "rmqstore_cli.engine.repair.timerfix", "rmqstore_cli.formats.timer"},
    "dledger": {"rmqstore_cli.engine.log.dledger", "rmqstore_cli.engine.log.dledgerjobs",
                "rmqstore_cli.engine.verify.dledger", "rmqstore_cli.formats.dledger"},
    "rocksdb": {"rmqstore_cli.engine.derived.rocksdbqueue", "rmqstore_cli.formats.rocksdbcq"},
}
# what a -j 1 start on a classic store needs none of
NEVER_AT_J1 = {"multiprocessing", "ctypes.util", "tempfile", "construct"}


@pytest.mark.parametrize("case", ["verify", "recover", "rebuild", "dump"])
def test_a_classic_store_start_loads_no_other_layout(tmp_path, case):
    """With the ahead-of-time kernels (as scripts/setup.sh builds them): numba's own import brings multiprocessing,
    ctypes.util and tempfile with it."""
    from rmqstore_cli.formats import aot

    if not aot.loaded():
        pytest.skip("the AOT kernel extension is not built or not current (python -m rmqstore_cli.formats.aotbuild)")
    argv = CASES[case][0]
    mods, p = imported(tmp_path, argv, aot=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "rmqstore_cli.engine.store" in mods and "rmqstore_cli.formats._aotkernels" in mods  # a real run
    for layout, names in LAYOUT_MODULES.items():
        assert not names & mods, (layout, sorted(names & mods))
    assert not NEVER_AT_J1 & mods, sorted(NEVER_AT_J1 & mods)


@pytest.mark.parametrize("layout, store", [("timer", "timer-5.3.3"), ("dledger", "dledger-4.9.3-clean"),
                                           ("rocksdb", "rocksdbcq-5.3.3")])
def test_a_store_with_the_layout_loads_its_modules(tmp_path, layout, store):
    """verify on a broker-written store of that layout loads the layout's verify modules."""
    mods, p = imported(tmp_path, ["verify", str(STORES / store / "store")], aot=True)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    wanted = {"timer": "rmqstore_cli.engine.timer.check", "dledger": "rmqstore_cli.engine.verify.dledger",
              "rocksdb": "rmqstore_cli.engine.derived.rocksdbqueue"}[layout]
    assert wanted in mods
