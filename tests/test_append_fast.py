"""The fast paths of ``append --from`` give what the plain ones give: values, errors and messages.

- each input line is parsed by orjson and, when orjson refuses it, by ``json`` (commands.append);
- canonical base64 bodies are decoded by one ``binascii`` call, anything else by ``b64decode``;
- the builder remembers topic checks and host objects it has seen: a value that differs only in
  its type (``True`` for ``1``) must not take a remembered answer.
"""

from __future__ import annotations

import base64
import json
import os
import random

import pytest

from rmqstore_cli.commands.append import _json_loads
from rmqstore_cli.formats.message import body_from_json
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.log.messages import InputError, MessageBuilder

TRICKY_LINES = [
    '{"a":1}', ' {"a": [1, 2.5, -0, 1e5, true, null]} \n', '{"a":1,"a":2}', '[NaN]', '[Infinity, -Infinity]',
    '1e400', '-1e400', '"\\ud800"', '"\\udc00\\ud800x"', '123456789012345678901234567890', '-9223372036854775809',
    '18446744073709551616', '{"t":"\\u0000\\u007f\\u2028é"}', '{"a":1,}', '{"a" 1}', '[1 2]', '', '   ', '{',
    '{"a":"\t"}', '"abc', '{"a":1}x', 'nul', "{'a':1}", '[01]', '[.5]', '[1.]', '"\\x41"', '[-]', '{"a":1e}',
    '"\\uZZZZ"', '[' * 3000 + ']' * 3000,
]


def _outcome(fn, line):
    try:
        v = fn(line)
        return "ok", json.dumps(v, allow_nan=True), type(v).__name__
    except json.JSONDecodeError as e:
        return "json-error", e.msg, e.lineno, e.colno
    except RecursionError:
        return "recursion"


@pytest.mark.parametrize("line", TRICKY_LINES)
def test_line_parser_equals_json_loads(line):
    assert _outcome(_json_loads(), line) == _outcome(json.loads, line)


def test_line_parser_on_dump_lines_and_random_mutations():
    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    base = ('{"topic":"T\\u0001é","queueId":3,"bornHost":{"ip":"10.0.0.7","ipHex":"0a000007","port":51234},'
            '"properties":{"KEYS":"k"},"propertiesRaw":"KEYS\\u0001k","bodyBase64":"QUJD","storeTimestamp":1}')
    loads = _json_loads()
    for _ in range(3000):
        s = list(base)
        for _ in range(rng.randrange(1, 4)):
            s[rng.randrange(len(s))] = rng.choice('{}[]",:\\0123456789eE.-+ truefalsnNIy\x00\x1fé')
        line = "".join(s)
        assert _outcome(loads, line) == _outcome(json.loads, line), (seed, line)


def test_base64_body_equals_b64decode():
    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    samples = [base64.b64encode(bytes(rng.randrange(256) for _ in range(rng.randrange(20)))).decode()
               for _ in range(500)]
    samples += ["".join(rng.choice("ABab09+/=-_ \n\x00é") for _ in range(rng.randrange(10))) for _ in range(20000)]
    samples += ["QUJD", "QUI=", "QQ==", "QQ=", "QQ===", "=QQ=", "QU=I", "QUJD\n", " QUJD", "QUJDQ", "QUJD====", ""]

    def outcome(fn, s):
        try:
            return "ok", fn(s)
        except (ValueError, TypeError) as e:
            return type(e).__name__, str(e)

    for s in samples:
        assert outcome(lambda t: body_from_json({"bodyBase64": t}), s) == \
            outcome(lambda t: base64.b64decode(t, validate=True), s), (seed, s)


def _msg(**kw):
    m = {"topic": "T", "bornHost": {"ip": "10.0.0.7", "ipHex": "0a000007", "port": 1},
         "storeHost": {"ip": "10.0.0.1", "ipHex": "0a000001", "port": 10911}, "bornTimestamp": 1,
         "bodyHex": "00"}
    m.update(kw)
    return m


def test_remembered_hosts_and_topics_do_not_hide_errors():
    b = MessageBuilder(StoreConfig(version=5))
    ok = b.from_json(_msg())
    assert ok.born_host == (bytes([10, 0, 0, 7]), 1)
    with pytest.raises(InputError, match="bornHost.port True is not a port number"):
        b.from_json(_msg(bornHost={"ip": "10.0.0.7", "ipHex": "0a000007", "port": True}))
    with pytest.raises(InputError, match="bornHost.port 1.0 is not a port number"):
        b.from_json(_msg(bornHost={"ip": "10.0.0.7", "ipHex": "0a000007", "port": 1.0}))
    with pytest.raises(InputError, match="unknown field"):
        b.from_json(_msg(bornHost={"ip": "10.0.0.7", "ipHex": "0a000007", "port": 1, "x": 1}))
    # the same object under the other name: the remembered answer is per field name
    assert b.from_json(_msg(storeHost={"ip": "10.0.0.7", "ipHex": "0a000007", "port": 1})).store_host == ok.born_host
    with pytest.raises(InputError, match="storeHost.ipHex must be 4 or 16 bytes"):
        b.from_json(_msg(storeHost={"ip": "10.0.0.7", "ipHex": "0a0000", "port": 1}))
    with pytest.raises(InputError, match="contains '/'"):
        b.from_json(_msg(topic="a/b"))
    with pytest.raises(InputError, match="topic is missing or empty"):
        b.from_json(_msg(topic=1))
    # a remembered topic keeps its magic; one past 127 bytes gets v2 every time
    assert [b.from_json(_msg(topic="L" * 200)).magic for _ in range(2)] == [b.from_json(_msg(topic="L" * 200)).magic] * 2


def test_properties_raw_parsed_once_still_checked_against_properties():
    b = MessageBuilder(StoreConfig(version=5))
    m = b.from_json(_msg(propertiesRaw="A\x01x\x02B\x01y", properties={"A": "x", "B": "y"}))
    assert m.props_map == {"A": "x", "B": "y"} and m.props_b == b"A\x01x\x02B\x01y\x02"[: len(m.props_b)]
    with pytest.raises(InputError, match="propertiesRaw does not match properties"):
        b.from_json(_msg(propertiesRaw="A\x01x\x02B\x01y", properties={"A": "x"}))
    # a __CRC32# tail is cut (recomputed on write): the map the dispatch sees is that of the rest
    raw = "A\x01x\x02__CRC32#\x010000001234\x02"
    m = b.from_json(_msg(propertiesRaw=raw))
    assert m.crc_prop and "__CRC32#" not in m.props_map and m.props_map == {"A": "x"}


def _messages_outcome(fn, line):
    try:
        return "ok", [m for m in fn(line)]
    except json.JSONDecodeError as e:
        return "json-error", e.msg, e.colno
    except InputError as e:
        return "input-error", str(e)


def test_typed_line_route_equals_the_plain_route():
    """_line_messages (msgspec typed record, body decoded by msgspec) against
    from_json_line(json.loads(line)) on dump lines and on lines built to leave the typed route."""
    from rmqstore_cli.commands.append import _line_messages

    seed = int(os.environ.get("RMQSTORE_FUZZ_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    b = MessageBuilder(StoreConfig(version=5))
    fast = _line_messages(b)
    plain = lambda line: b.from_json_line(json.loads(line))[0]  # noqa: E731
    good = dict(_msg(), propertiesRaw="KEYS\x01k\x02TAGS\x01t", properties={"KEYS": "k", "TAGS": "t"},
                storeTimestamp=5, bodyLen=3, msgId="X", offset=1, queueOffset=0)
    good.pop("bodyHex")
    lines = []
    for body in ["QUJD", "", "QQ==", "QUI=", "QR==", "QQ", "QUJD\n", "Q UJD", "QUJD=", "é", None, 5, [], "QQ==QQ=="]:
        o = dict(good)
        if body is not None:
            o["bodyBase64"] = body
        lines.append(json.dumps(o))
        lines.append(json.dumps(dict(o, bodyHex="00")))  # two body fields
        lines.append(json.dumps(dict(o, bodyLen=9)))
    lines += [json.dumps({"batch": [good, good]}), json.dumps(dict(good, extra=1)), json.dumps([good]),
              json.dumps(dict(good, topic="a/b")), json.dumps(dict(good, queueId=2**40)),
              json.dumps(dict(good, queueId=True)), json.dumps(dict(good, properties={"KEYS": "other"})),
              '{"topic":"T","topic":"U","bornTimestamp":1,"bodyBase64":"QUJD","bodyBase64":"QQ=="}',
              '{"topic":"T","bornTimestamp":1,"bodyBase64":"!!","bodyBase64":"QQ=="}',
              '{"topic":"T","bornTimestamp":1,"queueId":NaN}', '{"topic":"T","bornTimestamp":1,"queueId":1234567890123456789012}',
              '{"topic":"T","bornTimestamp":1,"bodyBase64":"QUJD"', "{}", "null", '"x"',
              '{"topic":"T","bornTimestamp":1,"bodyText":"\\ud800"}', '{"topic":"T","bornTimestamp":1,"bodyBase64":"QUJD"}']
    for _ in range(500):  # random base64-ish bodies
        o = dict(good, bodyBase64="".join(rng.choice("ABab09+/=-_ ") for _ in range(rng.randrange(9))))
        lines.append(json.dumps(o))
    for line in lines:
        # every line gives its bornTimestamp (the default is the clock): whole messages compare
        assert _messages_outcome(fast, line) == _messages_outcome(plain, line), (seed, line)
