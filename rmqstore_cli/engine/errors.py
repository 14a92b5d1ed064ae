"""Errors the engine raises, each carrying the CLI exit code it maps to.

The engine never prints or exits; commands turn these into one-line messages.
"""

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_CORRUPT = 2
EXIT_USAGE = 3
EXIT_LOCKED = 4


class RmqStoreError(Exception):
    exit_code = EXIT_USAGE


class UsageError(RmqStoreError):
    """Bad options or environment: missing directory, not a store, unknown topic..."""

    exit_code = EXIT_USAGE


class NotAStoreError(UsageError):
    """The path exists but is not a RocketMQ store root."""


class StoreCorruptError(RmqStoreError):
    """The store cannot be read far enough to do what was asked."""

    exit_code = EXIT_CORRUPT


class StoreInUseError(RmqStoreError):
    """A broker (or another rmqstore) holds the store's lock."""

    exit_code = EXIT_LOCKED


class NotFoundError(RmqStoreError):
    """A lookup found nothing (a finding, not a failure)."""

    exit_code = EXIT_FINDINGS
