"""formats.records: the construct Structs and the views derived from the same field lists agree (sizes, offsets,
struct formats, numpy dtypes, bytes built), and importing the module does not import construct (the Structs are
assembled at their first use)."""

from __future__ import annotations

import random
import struct
import subprocess
import sys

import numpy as np

from rmqstore_cli.formats import records
from rmqstore_cli.engine.log import checkpoint

SEED = 20261129
# (Struct name, its field list, its size constant or None)
FIXED = [("CQ_UNIT", records.CQ_UNIT_FIELDS, records.CQ_UNIT_SIZE),
         ("BCQ_UNIT", records.BCQ_UNIT_FIELDS, records.BCQ_UNIT_SIZE),
         ("INDEX_HEADER", records.INDEX_HEADER_FIELDS, records.INDEX_HEADER_SIZE),
         ("INDEX_SLOT", records.INDEX_SLOT_FIELDS, records.INDEX_SLOT_SIZE),
         ("INDEX_ENTRY", records.INDEX_ENTRY_FIELDS, records.INDEX_ENTRY_SIZE),
         ("CHECKPOINT", records.CHECKPOINT_FIELDS, None)]


def _values(rng: random.Random, fields) -> dict:
    return {name: rng.randrange(-(1 << (8 * t.sizeof() - 1)), 1 << (8 * t.sizeof() - 1)) for name, t in fields}


def test_fixed_records_built_by_construct_equal_the_derived_views():
    print("seed", SEED)
    rng = random.Random(SEED)
    for name, fields, size in FIXED:
        st = getattr(records, name)
        assert type(st).__module__.startswith("construct"), name  # a real construct Struct
        assert [sc.name for sc in st.subcons] == [n for n, _ in fields], name
        assert st.sizeof() == records.fields_size(fields) == struct.calcsize(records.struct_format(fields)), name
        assert size is None or size == st.sizeof(), name
        assert records.fields_dtype(fields).itemsize == st.sizeof(), name
        offsets = records.field_offsets(fields)
        for _ in range(20):
            v = _values(rng, fields)
            raw = st.build(v)
            assert raw == struct.pack(records.struct_format(fields), *v.values()), name
            row = np.frombuffer(raw, dtype=records.fields_dtype(fields))[0]
            assert {n: int(row[n]) for n in v} == v, name
            for n, t in fields:  # each field where field_offsets says, big-endian and signed
                assert int.from_bytes(raw[offsets[n]:offsets[n] + t.sizeof()], "big", signed=True) == v[n]


def test_the_checkpoint_format_is_the_declared_one():
    v = _values(random.Random(SEED), records.CHECKPOINT_FIELDS)
    assert checkpoint._FMT.pack(*v.values()) == records.CHECKPOINT.build(v)


def test_the_message_prefix_widths_are_constructs():
    """The message's fixed prefix in the Struct has the declared widths, in order (the hosts and the variable
    tail follow)."""
    subs = records.MESSAGE.subcons
    for (name, t), sc in zip(records.MESSAGE_PREFIX_FIELDS, subs):
        assert sc.name == name and sc.sizeof() == t.sizeof()
    assert records.HOST_V4.sizeof() == 8 and records.HOST_V6.sizeof() == 20


def test_unknown_names_are_attribute_errors():
    try:
        records.NOT_A_STRUCT  # noqa: B018
    except AttributeError as e:
        assert "NOT_A_STRUCT" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_declarations_does_not_import_construct():
    code = ("import sys; import rmqstore_cli.formats.records as r; assert 'construct' not in sys.modules; "
            "r.CQ_UNIT; assert 'construct' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
