"""timer.presence.may_be_present: a store without the timer's files is told apart before the timer modules load,
and it never says "absent" where a TimerStore would find one (or would raise on a timer setting)."""

from __future__ import annotations

import os
import shutil

import pytest

from rmqstore_cli.engine.errors import UsageError
from rmqstore_cli.engine.store import Store
from rmqstore_cli.engine.timer.presence import may_be_present
from rmqstore_cli.engine.timer.store import TimerStore
from tests.conftest import STORES


def _present(root, overrides=None) -> tuple[bool, bool]:
    """(may_be_present, TimerStore.present) of the store at ``root``."""
    with Store.open(str(root), overrides=overrides) as st:
        quick = may_be_present(st)
        ts = TimerStore(st)
        try:
            return quick, bool(ts.present)
        finally:
            ts.close()


@pytest.mark.parametrize("name", sorted(p.name for p in STORES.iterdir() if (p / "store").is_dir()))
def test_never_absent_where_the_timer_store_is_present(name):
    """Every broker-written store: where TimerStore finds a timer store, so does the quick check; the timer
    samples have one, the classic 4.9.3 ones none."""
    quick, present = _present(STORES / name / "store")
    assert quick or not present, name
    if name.startswith("timer-"):
        assert quick and present
    if name in ("4.9.3-clean", "4.9.3-crash", "4.9.3-ext"):
        assert not quick and not present


def test_each_timer_file_alone_makes_it_maybe_present(store_copy):
    root = store_copy("4.9.3-clean")
    assert _present(root) == (False, False)
    os.mkdir(root / "timerlog")  # an empty folder: no segment, as TimerLog sees it
    assert _present(root) == (False, False)
    (root / "timerlog" / "00000000000000000000").write_bytes(bytes(52))
    assert _present(root)[0]
    shutil.rmtree(root / "timerlog")
    (root / "timerlog").write_bytes(b"")  # a file where the folder should be: no segment either
    assert _present(root) == (False, False)
    os.remove(root / "timerlog")
    (root / "timerwheel").write_bytes(bytes(32))
    assert _present(root) == (True, True)
    os.remove(root / "timerwheel")
    (root / "config" / "timercheck").write_bytes(bytes(56))
    assert _present(root) == (True, True)


def test_a_timer_setting_goes_to_the_timer_store(store_copy):
    """timerPrecisionMs given: TimerStore checks it, so the quick check does not answer for it."""
    root = store_copy("4.9.3-clean")
    with Store.open(str(root), overrides={"timerPrecisionMs": 0}) as st:
        assert may_be_present(st)
        with pytest.raises(UsageError):
            TimerStore(st)
