"""Options shared by every command that opens a store, and the one way to open it."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Optional

import typer

from rmqstore_cli.engine.errors import StoreInUseError
from rmqstore_cli.engine.store import Store

StoreArg = typer.Argument(..., help="Store root directory (the broker's storePathRootDir).", show_default=False)
ConfigOpt = typer.Option(None, "--config", help="The broker's broker.conf (Java properties) for geometry and flags.")
VersionOpt = typer.Option(None, "--broker-version", help="4 (4.9.x rules) or 5 (5.x rules); inferred when omitted.")
CommitLogSizeOpt = typer.Option(None, "--commitlog-file-size", help="mappedFileSizeCommitLog (bytes).")
CqSizeOpt = typer.Option(None, "--cq-file-size", help="mappedFileSizeConsumeQueue (bytes).")
IndexSlotsOpt = typer.Option(None, "--index-slots", help="maxHashSlotNum.")
IndexEntriesOpt = typer.Option(None, "--index-entries", help="maxIndexNum.")
SelfIdOpt = typer.Option(None, "--self-id", help="DLedger store: which dledger-<selfId>/ folder to read "
                         "(dLegerSelfId; needed when there are several).")
JsonOpt = typer.Option(False, "--json", help="JSON Lines on stdout (stable field names).")
SinceOpt = typer.Option(None, "--since", help="Only records stored at or after this time (ISO-8601, local zone "
                        "when none is given, or epoch ms); found by binary search, not a full scan.")
UntilOpt = typer.Option(None, "--until", help="Only records stored at or before this time (ISO-8601 or epoch ms).")


@dataclass
class Geometry:
    """The store-geometry options every store command takes (see :func:`geometry_options`)."""

    config: Optional[str] = None
    broker_version: Optional[int] = None
    commitlog_file_size: Optional[int] = None
    cq_file_size: Optional[int] = None
    index_slots: Optional[int] = None
    index_entries: Optional[int] = None
    self_id: Optional[str] = None


_GEOMETRY_PARAMS = [
    inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=ConfigOpt, annotation=Optional[str]),
    inspect.Parameter("broker_version", inspect.Parameter.KEYWORD_ONLY, default=VersionOpt, annotation=Optional[int]),
    inspect.Parameter("commitlog_file_size", inspect.Parameter.KEYWORD_ONLY, default=CommitLogSizeOpt,
                      annotation=Optional[int]),
    inspect.Parameter("cq_file_size", inspect.Parameter.KEYWORD_ONLY, default=CqSizeOpt, annotation=Optional[int]),
    inspect.Parameter("index_slots", inspect.Parameter.KEYWORD_ONLY, default=IndexSlotsOpt, annotation=Optional[int]),
    inspect.Parameter("index_entries", inspect.Parameter.KEYWORD_ONLY, default=IndexEntriesOpt,
                      annotation=Optional[int]),
    inspect.Parameter("self_id", inspect.Parameter.KEYWORD_ONLY, default=SelfIdOpt, annotation=Optional[str]),
]


def geometry_options(func=None, *, only: tuple[str, ...] | None = None):
    """Give a command the store-geometry options (declared once, here): the command declares a
    ``geometry: Geometry`` parameter and receives them in it. ``only`` limits which are offered."""

    def wrap(f):
        offered = [p for p in _GEOMETRY_PARAMS if only is None or p.name in only]
        sig = inspect.signature(f, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != "geometry"]
        params += [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in offered]

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            values = {p.name: kwargs.pop(p.name, None) for p in offered}
            return f(*args, geometry=Geometry(**values), **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # typer must see the new signature, not the wrapped one
        return wrapper

    return wrap(func) if func is not None else wrap


def parse_time_option(text: Optional[str], name: str) -> Optional[int]:
    """--since/--until/--time: epoch ms or ISO-8601 (local zone when none is given)."""
    if text is None:
        return None
    from rmqstore_cli.engine.query.lookup import parse_time
    from rmqstore_cli.engine.errors import UsageError

    try:
        return parse_time(text, 0)
    except UsageError as e:
        raise UsageError(f"{name}: {e}") from None


def warn_if_live(store: Store) -> None:
    """One line on stderr when a broker holds the store's lock: what is read may change underneath."""
    state = store.lock_state()
    if state.held:
        from .output import warn

        warn(f"store {store.root} is live: its lock file is {state.detail or 'held'} (a running broker?); "
             "reading anyway, the data may change while it is read")


def open_store(store: str, config: "Optional[str] | Geometry" = None, broker_version: Optional[int] = None,
               commitlog_file_size: Optional[int] = None, cq_file_size: Optional[int] = None,
               index_slots: Optional[int] = None, index_entries: Optional[int] = None, *,
               command: Optional[str] = None, writes: bool = False, self_id: Optional[str] = None,
               **extra) -> Store:
    """Open a store read-only with the given geometry (a :class:`Geometry`, or its fields one by one).

    With ``command``, a store whose layout the engine does not understand for that command (read, or
    ``writes``) is refused here, before anything is planned (exit 3)."""
    if isinstance(config, Geometry):
        g = config
        config, broker_version, commitlog_file_size, cq_file_size, index_slots, index_entries, self_id = (
            getattr(g, f.name) for f in fields(Geometry))
    overrides = {
        "version": broker_version,
        "mappedFileSizeCommitLog": commitlog_file_size,
        "mappedFileSizeConsumeQueue": cq_file_size,
        "maxHashSlotNum": index_slots,
        "maxIndexNum": index_entries,
        "dLegerSelfId": self_id,
    }
    overrides.update(extra)
    if broker_version is not None and broker_version not in (4, 5):
        from rmqstore_cli.engine.errors import UsageError

        raise UsageError("--broker-version must be 4 or 5")
    st = Store.open(store, config_file=config, overrides=overrides)
    if command is not None:
        try:
            st.require(command, writes=writes)
        except BaseException:
            st.close()
            raise
    warn_if_live(st)
    return st


def guard_lock(st, force: bool, yes: bool) -> None:
    """Exit 4 if a broker holds the lock (fcntl probe, §12.2), unless --force and confirmed."""
    ls = st.lock_state()
    if ls.held:
        if not force:
            raise StoreInUseError(f"store {st.root} is in use: its lock file is {ls.detail or 'held'} "
                                  f"(a running broker?); stop it first (or --force)")
        if not yes and not typer.confirm(f"The lock of {st.root} is {ls.detail or 'held'}. Writing under a running "
                                         f"broker corrupts the store. Continue?", default=False):
            raise typer.Exit(4)
