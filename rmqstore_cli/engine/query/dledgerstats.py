"""``stats -j`` on a DLedger log: the message walk inside the entries split by data file.

What ``DLedgerCommitLog.scan(check_crc=False, stop_at_invalid=False)`` gives in one process (the messages of every
entry DLedger's recovery accepts, those that fail the broker's parse left out, the walk ending where the entries
end), through :func:`..log.dledgerjobs.walk_log`: workers walk whole data files, each into its own
:class:`.stats.StatsAccumulator`, and this process merges them in log order, walking a file itself where the entry
chain does not enter it as a worker assumed.
"""

from __future__ import annotations

from ..log.commitlog import Stop
from ..log.dledgerjobs import FilePart, LogWalk, walk_log


def scan_parallel(cl, acc, res, jobs: int) -> None:
    """``for chunk in cl.scan(check_crc=False, result=res, stop_at_invalid=False): acc.add_chunk(...)``, by ``jobs``
    workers (the stop, blanks, records and bytes of ``res`` as that walk fills them)."""
    log = LogWalk()
    for item in walk_log(cl, lambda walk: None, log, jobs=jobs, file_part=_file_stats, args=(cl, type(acc))):
        if isinstance(item, FilePart):
            part, records, nbytes = item.item
            acc.merge(part)
        else:
            h = _messages(cl, item)
            acc.add_chunk(item.buf, h)
            records, nbytes = len(h), int(h.totalSize.sum())
        res.records += records
        res.bytes += nbytes
    walk = log.walk
    res.blanks.extend(walk.blanks)
    es = walk.stop
    res.stop = Stop(es.offset, es.segment, es.position, es.kind, size=es.size, magic=es.magic, entry_level=True,
                    text=f"the DLedger entries end: {es.text()}")
    res.entry_stop, res.entry_walk = es, walk


def _messages(cl, ec):
    """The chunk's messages that pass the broker's parse (CRCs not checked), as ``scan`` yields them."""
    from rmqstore_cli.formats import fast

    h, bad = cl.messages(ec, False, cl.prop_crc_policy(False), cl.magics(False))
    return h if bad >= len(h) else h.select(h.reason == fast.R_OK)


def _file_stats(chunks, cl, accumulator: type):
    """In a worker: one data file's messages into a fresh accumulator."""
    acc = accumulator()
    records = nbytes = 0
    for ec in chunks:
        h = _messages(cl, ec)
        acc.add_chunk(ec.buf, h)
        records += len(h)
        nbytes += int(h.totalSize.sum())
    yield acc, records, nbytes
