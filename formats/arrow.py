"""Commitlog records -> Arrow record batches, column by column.

Fixed fields come from :func:`formats.fast.decode_headers` (numpy columns). Variable-length
fields (body, topic, properties) are cut out of the mapped segment by Arrow itself: the
segment range is wrapped zero-copy as one large-binary array whose values alternate
"field bytes" and "bytes up to the next field", and ``take`` keeps every other value, so
no Python object is made per record for them. The property strings are split into their
entries by a compiled pass over the bytes (formats/propentries.py, the broker parser's rules);
a batch whose properties are not well-formed UTF-8 is split by Arrow's string kernels after
Java's decoding, and one where a record names a key twice by the parser, record by record.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmqstore_cli.formats.fast import R_OK, Headers
from rmqstore_cli.formats.msgid import host_to_str
from rmqstore_cli.formats.properties import parse_properties
from rmqstore_cli.formats.records import TRANSACTION_NAMES

# Spark column name -> Spark SQL type (DDL). RocketMQ's own field names, as in ``dump --json``.
COLUMNS = [
    ("store", "string"),
    ("segment", "string"),
    ("commitLogOffset", "bigint"),  # from the record's position (the field itself is checked by verify)
    ("storeSize", "int"),
    ("magicVersion", "int"),
    ("topic", "string"),
    ("queueId", "int"),
    ("queueOffset", "bigint"),
    ("sysFlag", "int"),
    ("transactionType", "string"),
    ("flag", "int"),
    ("bornTimestamp", "timestamp"),
    ("storeTimestamp", "timestamp"),
    ("bornHost", "string"),
    ("storeHost", "string"),
    ("reconsumeTimes", "int"),
    ("preparedTransactionOffset", "bigint"),
    ("bodyCRC", "int"),
    ("crcOk", "boolean"),
    ("tags", "string"),
    ("keys", "array<string>"),
    ("uniqKey", "string"),
    ("properties", "map<string,string>"),
    ("physicalOffsetField", "bigint"),
    ("finding", "string"),
    ("findingMessage", "string"),
    ("body", "binary"),
]
BODY_COLUMN = "body"


def ddl(with_body: bool) -> str:
    return ", ".join(f"`{n}` {t}" for n, t in COLUMNS if with_body or n != BODY_COLUMN)


_ARROW_TYPES = {
    "string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "boolean": pa.bool_(), "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    # Spark's own Arrow names for nested types (pyspark.sql.pandas.types.to_arrow_type)
    "array<string>": pa.list_(pa.field("element", pa.string(), nullable=True)),
    "map<string,string>": pa.map_(pa.field("key", pa.string(), nullable=False),
                                  pa.field("value", pa.string(), nullable=True)),
}


def arrow_schema(with_body: bool) -> pa.Schema:
    """The Arrow schema Spark derives from :func:`ddl` (every column nullable), without Spark."""
    return pa.schema([pa.field(n, _ARROW_TYPES[t], nullable=True) for n, t in COLUMNS if with_body or n != BODY_COLUMN])


def _slices(data: pa.Buffer, base: int, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """Binary array of data[start-base : start-base+len] for each row (starts must not overlap)."""
    n = len(starts)
    if n == 0:
        return pa.array([], type=pa.binary())
    s = starts.astype(np.int64) - base
    e = s + lens.astype(np.int64)
    small = data.size < (1 << 31)  # 32-bit offsets: the type Spark expects, no cast afterwards
    offs = np.empty(2 * n + 1, dtype=np.int32 if small else np.int64)
    offs[0:2 * n:2] = s
    offs[1:2 * n:2] = e
    offs[2 * n] = e[-1]
    # A value "between" fields runs from one field's end to the next field's start.
    kind = pa.binary() if small else pa.large_binary()
    both = pa.Array.from_buffers(kind, 2 * n, [None, pa.py_buffer(offs), data])
    return both.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def _strings(binary: pa.Array) -> pa.Array:
    """UTF-8 text as Java would decode it (malformed bytes become U+FFFD)."""
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in binary.to_pylist()], pa.string())


def _host_bytes(u8: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The 21 bytes from each of ``starts`` (a byte past either end of ``u8`` reads as the nearest one): each row
    copied whole from a sliding view of ``u8``, three times faster than gathering byte by byte, which the rows
    that reach past an end still are."""
    last = len(u8) - 21
    if last < 0:
        edge = np.arange(len(starts))
        raw = np.empty((len(starts), 21), np.uint8)
    else:
        raw = np.lib.stride_tricks.sliding_window_view(u8, 21)[np.clip(starts, 0, last)]
        edge = np.flatnonzero((starts < 0) | (starts > last))
    if len(edge):
        idx = starts[edge, None] + np.arange(21, dtype=np.int64)
        np.clip(idx, 0, len(u8) - 1, out=idx)
        raw[edge] = u8[idx]
    return raw


def _hosts(u8: np.ndarray, starts: np.ndarray, widths: np.ndarray) -> pa.Array:
    """``ip:port`` / ``[v6]:port`` strings; hosts repeat, so format each distinct one once."""
    n = len(starts)
    if n == 0:
        return pa.array([], pa.string())
    raw = _host_bytes(u8, np.asarray(starts, np.int64))
    raw[widths == 8, 8:] = 0
    raw[:, 20] = widths  # the width is part of the identity (v4 vs v6)
    # Records of one producer come in runs: only the first row of each run is sorted for the distinct hosts (a sort
    # of n 21-byte keys was a tenth of an export's batch building, the broker's own host the same in every row)
    change = (raw[1:] != raw[:-1]).any(axis=1)
    heads = np.flatnonzero(np.concatenate(([True], change)))
    run = np.cumsum(change, dtype=np.int64)
    keyed = np.ascontiguousarray(raw[heads]).view(np.dtype((np.void, 21))).reshape(-1)
    uniq, head_inverse = np.unique(keyed, return_inverse=True)
    head_inverse = head_inverse.reshape(-1)
    inverse = head_inverse[np.concatenate(([0], run))]
    texts = []
    for k, w in zip(uniq, widths[heads[np.unique(head_inverse, return_index=True)[1]]]):
        b = bytes(k)
        ip, port = b[: int(w) - 4], int.from_bytes(b[int(w) - 4 : int(w)], "big", signed=True)
        s = host_to_str(ip)
        texts.append(f"[{s}]:{port}" if len(ip) == 16 else f"{s}:{port}")
    return pa.array(texts, pa.string()).take(pa.array(inverse.reshape(-1).astype(np.int64)))


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms.astype(np.int64) * 1000, pa.timestamp("us", tz="UTC"))


_TX_NAMES = pa.array([TRANSACTION_NAMES[k] for k in (0, 4, 8, 12)], pa.string())


def _property_columns_python(props: pa.Array, ok: np.ndarray):
    """tags, keys, uniqKey and the property map, parsed record by record (reference path)."""
    tags, uniq, key_off, key_vals, map_off, map_keys, map_vals = [], [], [0], [], [0], [], []
    for text, good in zip(props.to_pylist(), ok.tolist()):
        d = parse_properties(text) if (good and text) else {}
        tags.append(d.get("TAGS"))
        uniq.append(d.get("UNIQ_KEY"))
        ks = d.get("KEYS")
        if ks:
            key_vals.extend(k for k in ks.split(" ") if k)
        key_off.append(len(key_vals))
        map_keys.extend(d.keys())
        map_vals.extend(d.values())
        map_off.append(len(map_keys))
    keys = pa.ListArray.from_arrays(pa.array(key_off, pa.int32()), pa.array(key_vals, pa.string()))
    pmap = pa.MapArray.from_arrays(pa.array(map_off, pa.int32()), pa.array(map_keys, pa.string()),
                                   pa.array(map_vals, pa.string()))
    return pa.array(tags, pa.string()), keys, pa.array(uniq, pa.string()), pmap


def _offsets(parents: np.ndarray, n: int) -> pa.Array:
    off = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(parents, minlength=n), out=off[1:])
    return pa.array(off)


def _pick(parents: np.ndarray, values: pa.Array, mask: np.ndarray, n: int) -> pa.Array:
    """Per record, the value of the last entry matching ``mask`` (a Java HashMap keeps the last put)."""
    idx = np.full(n, -1, np.int64)
    hits = np.flatnonzero(mask)
    idx[parents[hits]] = hits
    return values.take(pa.array(idx, mask=idx < 0))


def _property_columns(props: pa.Array, ok: np.ndarray):
    """The same columns as :func:`_property_columns_python`, with Arrow kernels over all records at once.

    Rules of MessageDecoder.string2messageProperties (formats.properties): entries split on
    \x02, name and value split at the first \x01, both non-empty. A record that names a key
    twice (the map keeps the last value) sends the batch to the reference path.
    """
    n = len(props)
    entries = pc.split_pattern(props, "\x02")
    parents = np.asarray(pc.list_parent_indices(entries))
    kv = pc.split_pattern(pc.list_flatten(entries), "\x01", max_splits=1)
    two = np.asarray(pc.equal(pc.list_value_length(kv), 2).fill_null(False))
    kv, parents = kv.filter(pa.array(two)), parents[two]
    names, values = pc.list_element(kv, 0), pc.list_element(kv, 1)
    good = np.asarray(pc.and_(pc.greater(pc.binary_length(names), 0), pc.greater(pc.binary_length(values), 0)))
    names, values, parents = names.filter(pa.array(good)), values.filter(pa.array(good)), parents[good]
    # each name as a number: a batch holds a few distinct names, in hundreds of thousands of entries
    encoded = names.dictionary_encode()
    codes = np.asarray(encoded.indices, np.int64)
    number = {name: k for k, name in enumerate(encoded.dictionary.to_pylist())}
    if len(parents) > 1:
        # (record, name) pairs; the entries come record after record, so the pairs are sorted but within a record
        pairs = np.sort(parents.astype(np.int64) * len(number) + codes, kind="stable")
        if (pairs[1:] == pairs[:-1]).any():
            return _property_columns_python(props, ok)

    def named(name: str) -> np.ndarray:
        return codes == number[name] if name in number else np.zeros(len(codes), bool)

    pmap = pa.MapArray.from_arrays(_offsets(parents, n), names, values)
    tags = _pick(parents, values, named("TAGS"), n)
    uniq = _pick(parents, values, named("UNIQ_KEY"), n)
    keys_text = _pick(parents, values, named("KEYS"), n).fill_null("")
    tokens = pc.split_pattern(keys_text, " ")
    tparents = np.asarray(pc.list_parent_indices(tokens))
    flat = pc.list_flatten(tokens)
    nonempty = np.asarray(pc.greater(pc.binary_length(flat), 0))
    keys = pa.ListArray.from_arrays(_offsets(tparents[nonempty], n), flat.filter(pa.array(nonempty)))
    return tags, keys, uniq, pmap


def _property_columns_of_bytes(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """The columns of :func:`_property_columns` from the property strings ``u8[starts:starts+lengths]`` (well-formed
    UTF-8), every entry located by one compiled pass (:func:`.propscan.property_entries`) and its bytes copied by
    another, instead of Arrow's string splits and a grouping to find repeated names (a third of an export's batch
    building); None when a record names a key twice (the record-by-record rules say which value stays)."""
    from .propscan import property_entries

    n = len(starts)
    e = property_entries(u8, starts, lengths)
    if e.duplicate:
        return None
    names = _span_strings(u8, e.name_s, e.name_e)
    values = _span_strings(u8, e.value_s, e.value_e)
    pmap = pa.MapArray.from_arrays(_counts_to_offsets(e.counts, n), names, values)
    tags, uniq, _ = (values.take(pa.array(row, mask=row < 0)) for row in e.picks)
    keys = pa.ListArray.from_arrays(_counts_to_offsets(e.tok_counts, n), _span_strings(u8, e.tok_s, e.tok_e))
    return tags, keys, uniq, pmap


def _span_strings(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The spans ``u8[starts:ends]`` as an Arrow string array (pieces of well-formed UTF-8 cut at ASCII separators
    are well-formed: not checked again)."""
    from .propscan import span_bytes

    data, offsets = span_bytes(u8, starts, ends)
    return pa.Array.from_buffers(pa.string(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _counts_to_offsets(counts: np.ndarray, n: int) -> pa.Array:
    off = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=off[1:])
    return pa.array(off)


def build_batch(schema: pa.Schema, *, store: str, segment: str, seg_start: int, buf, u8: np.ndarray, h: Headers,
                crc_ok: np.ndarray, findings: list[str | None], messages: list[str | None],
                with_body: bool) -> pa.RecordBatch:
    """One Arrow batch for the records of ``h`` (a slice of one segment)."""
    n = len(h)
    ok = h.reason == R_OK
    lo = int(h.offsets[0]) if n else 0
    hi = int((h.offsets + h.totalSize.astype(np.int64)).max()) if n else 0
    hi = min(max(hi, lo), len(u8))
    data = pa.py_buffer(memoryview(buf)[lo:hi]) if n else pa.py_buffer(b"")
    # Fields of broken records may point anywhere: give them empty ranges at the record start.
    def field(starts, lens):
        st = np.where(ok, starts, h.offsets)
        ln = np.where(ok, np.maximum(lens, 0), 0)
        return _slices(data, lo, st, ln)

    topic_bin = field(h.topicStart, h.topicLength)
    props_bin = field(h.propsStart, h.propsLength)
    topic = _strings(topic_bin)
    try:
        props_bin.cast(pa.string())
        well_formed = True
    except pa.ArrowInvalid:  # Java's decoder puts U+FFFD in: the text is split as decoded
        well_formed = False
    prop_cols = None
    if well_formed:  # split as bytes
        prop_cols = _property_columns_of_bytes(u8, np.where(ok, h.propsStart, h.offsets),
                                               np.where(ok, np.maximum(h.propsLength, 0), 0))
    if prop_cols is None:
        prop_cols = _property_columns(_strings(props_bin), ok)
    tags, keys, uniq, pmap = prop_cols
    null_if_bad = pa.array(~ok)
    cols = {
        "store": pa.array([store] * n, pa.string()),
        "segment": pa.array([segment] * n, pa.string()),
        "commitLogOffset": pa.array(h.offsets + seg_start, pa.int64()),
        "storeSize": pa.array(h.totalSize, pa.int32()),
        "magicVersion": pa.array(np.where(h.magicCode == -626843477, 2, 1).astype(np.int32)),
        "topic": topic if ok.all() else pc.if_else(null_if_bad, pa.scalar(None, pa.string()), topic),
        "queueId": pa.array(h.queueId, pa.int32()),
        "queueOffset": pa.array(h.queueOffset, pa.int64()),
        "sysFlag": pa.array(h.sysFlag, pa.int32()),
        "transactionType": _TX_NAMES.take(pa.array(((h.sysFlag & 0xC) >> 2).astype(np.int64))),
        "flag": pa.array(h.flag, pa.int32()),
        "bornTimestamp": _timestamps(h.bornTimestamp),
        "storeTimestamp": _timestamps(h.storeTimestamp),
        "bornHost": _hosts(u8, h.bornHostStart, h.bornHostLen),
        "storeHost": _hosts(u8, h.storeHostStart, h.storeHostLen),
        "reconsumeTimes": pa.array(h.reconsumeTimes, pa.int32()),
        "preparedTransactionOffset": pa.array(h.preparedTransactionOffset, pa.int64()),
        "bodyCRC": pa.array(h.bodyCRC, pa.int32()),
        "crcOk": pa.array(crc_ok, pa.bool_()),
        "tags": tags,
        "keys": keys,
        "uniqKey": uniq,
        "properties": pmap,
        "physicalOffsetField": pa.array(h.physicalOffset, pa.int64()),
        "finding": pa.array(findings, pa.string()),
        "findingMessage": pa.array(messages, pa.string()),
    }
    if with_body:
        body = field(h.bodyStart, h.bodyLength)
        cols["body"] = body if ok.all() else pc.if_else(null_if_bad, pa.scalar(None, body.type), body)
    arrays = [cols[f.name].cast(f.type) if cols[f.name].type != f.type else cols[f.name] for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def finding_batch(schema: pa.Schema, *, store: str, segment: str, offset: int, code: str, message: str,
                  size: int | None = None) -> pa.RecordBatch:
    """A single row for a region that is not a record (bad magic, torn tail, ...)."""
    values = {"store": store, "segment": segment, "commitLogOffset": offset, "storeSize": size, "finding": code,
              "findingMessage": message, "crcOk": None}
    arrays = [pa.array([values.get(f.name)], type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
