"""Finding codes of the ``rocketmq`` data source: the single-process ``verify``'s own codes.

rmqstore_cli/engine/verify/pipeline.py owns the names; record reasons come from its table, and the
walk stops map onto the codes it reports for the same damage (docs/findings.md).
"""

from __future__ import annotations

from rmqstore_cli.formats import fast
from rmqstore_cli.engine.findings import WALK_STOP_CODES
from rmqstore_cli.engine.verify.pipeline import REASON_CODES as _VERIFY_REASONS

REASON_CODES = {fast.R_OK: None, **_VERIFY_REASONS}

# Walk stops that are not the normal end of a segment (BLANK) or of the data (zeros).
STOP_CODES = WALK_STOP_CODES
