"""UNIQ_KEY (client message id) times under a fixed clock and an explicit time zone (FORMAT.md §6.2).

Java's MessageClientIDSetter stores ``(int) (now - monthStart)`` (monthStart = the 1st, 00:00 local time):
a long narrowed to int, negative once 2^31 ms (~24.9 days) of the month have passed; its decoder
(getNearlyTimeFromID) reads the four bytes unsigned. Expected values are computed here with zoneinfo and
a narrowing done through the bytes of a Java long, not with the code under test; the real broker's ids come
from ../shared/stores/timer-5.3.3 (a 5.3.3 producer in UTC, ids made on the 26th: their time wrapped).
"""

from __future__ import annotations

import gzip
import json
import struct
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.log import appender as appender_mod
from rmqstore_cli.engine.log import messages
from rmqstore_cli.engine.store import Store

from .conftest import STORES

ZONES = ["Asia/Shanghai", "Europe/Berlin"]  # Berlin: March 2027 changes to summer time on the 28th
# (day, hour, minute, second, microsecond) in March 2027 (a 31-day month)
MOMENTS = {"1st 00:00:00.5": (1, 0, 0, 0, 500_000), "25th 23:59": (25, 23, 59, 0, 0),
           "31st 12:00": (31, 12, 0, 0, 0), "31st 23:59:59.999": (31, 23, 59, 59, 999_000)}


@pytest.fixture
def zone(request, monkeypatch):
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


def epoch_ms(zone_name: str, y: int, m: int, d: int, hh=0, mm=0, ss=0, us=0) -> int:
    return round(datetime(y, m, d, hh, mm, ss, us, tzinfo=ZoneInfo(zone_name)).timestamp() * 1000)


def java_int(value: int) -> int:
    """Java's (int) of a long: its low four bytes, read as a signed int."""
    return struct.unpack(">i", struct.pack(">q", value)[4:])[0]


def expected_field(zone_name: str, now: int) -> int:
    local = datetime.fromtimestamp(now / 1000, ZoneInfo(zone_name))
    diff = java_int(now - epoch_ms(zone_name, local.year, local.month, 1))
    return 0 if -1_000_000 < diff < 0 else diff


def time_bytes(key: str) -> bytes:
    raw = bytes.fromhex(key)
    ip_len = 16 if len(raw) == 28 else 4
    return raw[ip_len + 6: ip_len + 10]


def decoded_ms(key: str, ref_ms: int) -> int:
    r = CliRunner().invoke(app, ["msgid", "decode", key, "--kind", "uniq", "--ref-time", str(ref_ms), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout.splitlines()[0])
    return round(datetime.fromisoformat(d["asUniqKey"]["approxBornTime"]).timestamp() * 1000)


@pytest.mark.parametrize("zone", ZONES, indirect=True)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_time_field_and_decode_at_fixed_clocks(zone, moment):
    now = epoch_ms(zone, 2027, 3, *MOMENTS[moment])
    want = expected_field(zone, now)
    if moment.startswith(("25th", "31st")):
        assert want < 0  # past 2^31 ms: Java's int wrapped
    if moment.startswith("1st"):
        assert want == 500
    assert messages.uniq_key_time_field(now) == want
    key = messages.new_uniq_key(bytes([10, 0, 0, 7]), now=now)
    assert time_bytes(key) == struct.pack(">i", want)
    # decoded in the same month, and at the start of the next (getNearlyTimeFromID steps back one month)
    assert decoded_ms(key, now + 1000) == now
    assert decoded_ms(key, epoch_ms(zone, 2027, 4, 1)) == now


@pytest.mark.parametrize("zone", ZONES, indirect=True)
@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("moment", ["25th 23:59", "31st 23:59:59.999"])
def test_append_at_the_end_of_a_month(tmp_path, monkeypatch, zone, version, moment):
    """A send with the clock at a month's end (5.x computes a UNIQ_KEY, 4.x stores none): the record is written,
    its born and store times are the clock, and a 5.x UNIQ_KEY's time is Java's wrapped int."""
    now = epoch_ms(zone, 2027, 3, *MOMENTS[moment])
    monkeypatch.setattr(messages, "now_ms", lambda: now)
    monkeypatch.setattr(appender_mod, "_time", lambda: now / 1000)
    root = tmp_path / "store"
    r = CliRunner().invoke(app, ["append", str(root), "--broker-version", str(version), "--topic", "T", "--body", "x",
                                 "--json"])
    assert r.exit_code == 0, r.output
    with Store.open(str(root)) as st:
        (rec,) = list(st.commitlog.records())
    assert rec["bornTimestamp"] == now and rec["storeTimestamp"] == now
    key = rec["properties"].get("UNIQ_KEY")
    if version < 5:
        assert key is None
        return
    assert time_bytes(key) == struct.pack(">i", expected_field(zone, now))
    assert decoded_ms(key, now + 60_000) == now


def broker_ids() -> list[tuple[str, int]]:
    """(UNIQ_KEY, bornTimestamp) of the messages a 5.3.3 producer sent to the timer sample."""
    out = []
    with gzip.open(STORES / "timer-5.3.3" / "broker-read.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            m = o.get("message") if o.get("type") == "timerlog_unit" else None
            if m and m.get("uniqKey"):
                out.append((m["uniqKey"], m["bornTimestamp"]))
    return out


@pytest.mark.parametrize("zone", ["UTC"], indirect=True)
def test_real_producer_ids_decode_to_their_born_time(zone):
    ids = broker_ids()
    assert len(ids) > 10
    wrapped = 0
    for key, born in ids:
        field = struct.unpack(">i", time_bytes(key))[0]
        wrapped += field < 0
        made = decoded_ms(key, born + 60_000)  # decoded a minute later, in the month it was made
        assert 0 <= born - made < 5_000, (key, born, made)  # the id is made just before the send
        assert messages.uniq_key_time_field(made) == field  # our encoder gives the producer's bytes
    assert wrapped == len(ids)  # made on the 26th: every one wrapped negative
