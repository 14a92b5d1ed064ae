"""Finding codes produced by the Spark jobs, kept equal to the single-process ``verify``'s.

The single-process verify (rmqstore_cli/engine/verify.py) owns the code names; this table
maps the vectorised codec's reasons and walk stops onto them.
"""

from __future__ import annotations

from formats import fast

REASON_CODES = {
    fast.R_OK: None,
    fast.R_BODY_CRC: "CL_BODY_CRC",
    fast.R_TOPIC_LENGTH: "CL_TOPIC_LENGTH",
    fast.R_LENGTHS: "CL_LENGTHS",
    fast.R_TOTALSIZE: "CL_TOTALSIZE",
    fast.R_PROP_CRC: "CL_PROP_CRC",
    fast.R_MAGIC_VERSION: "CL_MAGIC_VERSION",
}

# Walk stops that are not the normal end of a segment (BLANK) or of the data (zeros).
STOP_CODES = {
    fast.STOP_BAD_MAGIC: ("CL_BAD_MAGIC", "not a record: unknown magic code"),
    fast.STOP_BAD_SIZE: ("CL_BAD_SIZE", "TOTALSIZE smaller than the smallest record"),
    fast.STOP_TORN: ("CL_TORN", "record runs past the end of the segment"),
}
