"""Findings: what verify, recover and the readers report about a store.

Every finding has a stable ``code`` (docs/findings.md lists them), a ``severity``
(``error``: the data is wrong or the broker would stumble; ``warning``: suspicious but
readable; ``info``), a location (file path and byte offset in it) and one line of text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}  # how every report sorts its findings: errors first


@dataclass
class Finding:
    """One thing verify (or a plan) found: a stable code (docs/findings.md), its severity, where, and what."""

    code: str
    severity: str
    path: str | None
    offset: int | None
    message: str
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        d = {"code": self.code, "severity": self.severity, "path": self.path, "offset": self.offset, "message": self.message}
        d.update(self.extra)
        return d


# Walk stops that are not the normal end of a segment (BLANK) or of the data (zeros), with the
# code verify reports for the same damage (keys are formats.fast.STOP_* names).
WALK_STOP_CODES = {
    "bad_magic": ("CL_GARBAGE", "bytes that are not a record (unknown magic code)"),
    "bad_size": ("CL_GARBAGE", "a record with TOTALSIZE smaller than the smallest record"),
    "torn": ("CL_TORN_TAIL", "record runs past the end of the segment"),
}
