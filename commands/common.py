"""Options shared by every command that opens a store, and the one way to open it."""

from __future__ import annotations

from typing import Optional

import typer

from rmqstore_cli.engine.store import Store

StoreArg = typer.Argument(..., help="Store root directory (the broker's storePathRootDir).", show_default=False)
ConfigOpt = typer.Option(None, "--config", help="The broker's broker.conf (Java properties) for geometry and flags.")
VersionOpt = typer.Option(None, "--broker-version", help="4 (4.9.x rules) or 5 (5.x rules); inferred when omitted.")
CommitLogSizeOpt = typer.Option(None, "--commitlog-file-size", help="mappedFileSizeCommitLog (bytes).")
CqSizeOpt = typer.Option(None, "--cq-file-size", help="mappedFileSizeConsumeQueue (bytes).")
IndexSlotsOpt = typer.Option(None, "--index-slots", help="maxHashSlotNum.")
IndexEntriesOpt = typer.Option(None, "--index-entries", help="maxIndexNum.")
JsonOpt = typer.Option(False, "--json", help="JSON Lines on stdout (stable field names).")


def warn_if_live(store: Store) -> None:
    """One line on stderr when a broker holds the store's lock: what is read may change underneath."""
    state = store.lock_state()
    if state.held:
        from .output import warn

        warn(f"store {store.root} is live: its lock file is {state.detail or 'held'} (a running broker?); "
             "reading anyway, the data may change while it is read")


def open_store(store: str, config: Optional[str] = None, broker_version: Optional[int] = None,
               commitlog_file_size: Optional[int] = None, cq_file_size: Optional[int] = None,
               index_slots: Optional[int] = None, index_entries: Optional[int] = None, **extra) -> Store:
    overrides = {
        "version": broker_version,
        "mappedFileSizeCommitLog": commitlog_file_size,
        "mappedFileSizeConsumeQueue": cq_file_size,
        "maxHashSlotNum": index_slots,
        "maxIndexNum": index_entries,
    }
    overrides.update(extra)
    if broker_version is not None and broker_version not in (4, 5):
        from rmqstore_cli.engine.errors import UsageError

        raise UsageError("--broker-version must be 4 or 5")
    st = Store.open(store, config_file=config, overrides=overrides)
    warn_if_live(st)
    return st
