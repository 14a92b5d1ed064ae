"""Whether a store may hold a timer store, answered from the file system alone.

Every command that reads or repairs a store asks :class:`.store.TimerStore` whether it has one, and opening a
TimerStore loads the timer modules (~10-25 ms of a start). A store without any of the timer's files is told
apart here first, by the same paths TimerStore reads; anything else (one of them there, or a timer setting to
check) goes to TimerStore, which decides.
"""

from __future__ import annotations

import os

# where the timer store's files are, below the store root (TimerLog, TimerWheel, TimerCheckpoint in files.py)
TIMERLOG_DIR = "timerlog"
WHEEL_FILE = "timerwheel"
CHECKPOINT_FILE = os.path.join("config", "timercheck")


def may_be_present(store) -> bool:
    """False only when :attr:`.store.TimerStore.present` is False and opening a TimerStore could raise nothing:
    no ``timerlog`` entry with anything in it, no ``timerwheel``, no ``config/timercheck``, and no
    ``timerPrecisionMs`` given (TimerStore checks the setting)."""
    if "timerPrecisionMs" in store.config.explicit:
        return True
    root = store.root
    for path in (os.path.join(root, WHEEL_FILE), os.path.join(root, CHECKPOINT_FILE)):
        if os.path.lexists(path):
            return True
    try:
        with os.scandir(os.path.join(root, TIMERLOG_DIR)) as it:
            return any(True for _ in it)
    except (FileNotFoundError, NotADirectoryError):  # TimerLog finds no segment there either
        return False
    except OSError:  # unreadable: TimerStore says so
        return True
