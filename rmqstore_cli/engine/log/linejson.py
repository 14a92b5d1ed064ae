"""One input line of ``append --from`` the plain way: JSON text -> the messages of
``MessageBuilder.from_json_line`` (the broker's ``MessageExtBrokerInner`` values of one put), with
``json``'s exact values and error messages. The batch route (:mod:`.replay`) sends here every line
it does not recognise, so the errors and the odd cases have this one implementation.
"""

from __future__ import annotations

import json
from typing import Any

from .messages import COMPUTED_FIELDS, INPUT_FIELDS, MessageBuilder


def json_loads():
    """``json.loads`` with its exact results and errors, through msgspec where msgspec agrees.

    msgspec (~3x faster on these lines) accepts a subset of what ``json`` accepts and gives the same
    value for it (integers of any size included, which orjson turns into floats past 64 bits);
    what it rejects (NaN, Infinity, lone surrogate escapes, numbers out of a double's range, bad
    JSON) is parsed again by ``json``, which gives the value or the error message we report."""
    import msgspec

    fast, slow, error = msgspec.json.Decoder().decode, json.loads, msgspec.DecodeError

    def loads(line: str):
        try:
            return fast(line)
        except error:
            return slow(line)

    return loads


def line_messages(builder: MessageBuilder):
    """line -> the messages of ``builder.from_json_line(json.loads(line))``, same errors.

    A line shaped like a ``dump --json`` message (an object of known fields, ``bodyBase64`` valid
    base64) is decoded by msgspec into a typed record, its body decoded in C on the way (a
    quarter of ``b64decode``'s time); any other line (a batch, an unknown field, bad base64,
    anything msgspec refuses) takes the plain route, which gives the values and messages."""
    import msgspec

    unset = msgspec.UNSET
    names = sorted(INPUT_FIELDS | COMPUTED_FIELDS)
    line_type = msgspec.defstruct(
        "DumpLine", [(f, (bytes | msgspec.UnsetType) if f == "bodyBase64" else Any, unset) for f in names],
        forbid_unknown_fields=True)
    typed, error, astuple = msgspec.json.Decoder(line_type).decode, msgspec.DecodeError, msgspec.structs.astuple
    loads = json_loads()
    from_json, from_line = builder.from_json, builder.from_json_line

    def messages(line: str) -> list:
        try:
            rec = typed(line)
        except error:
            return from_line(loads(line))[0]
        obj = {f: v for f, v in zip(names, astuple(rec)) if v is not unset}
        body = obj.get("bodyBase64")
        if body is not None:
            obj["bodyBase64"] = ""  # a string, as json gives; its bytes go separately
        return [from_json(obj, body_base64=body)]

    return messages
