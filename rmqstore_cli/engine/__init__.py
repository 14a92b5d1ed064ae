"""The store engine: a RocketMQ broker store opened offline, in the broker's own layers.

The engine never prints and never exits: it returns records, findings (findings.py) and plans, and raises
errors.py's exceptions. ``store.Store`` is the store opened read-only (DefaultMessageStore, read side).

Layers, bottom up (subpackages; each one's docstring lists its modules)::

    config/   broker.conf geometry (MessageStoreConfig), config/*.json (ConfigManager), consumer offsets
    log/      the commitlog: segment files (MappedFileQueue / MappedFile), records (CommitLog and its
              recovery walk), appends (CommitLog.putMessage), lock / abort, checkpoint (StoreCheckpoint)
    derived/  consume queues + ext files (ConsumeQueue, ConsumeQueueExt), index files (IndexService,
              IndexFile) and the dispatch that writes them (ReputMessageService, CommitLogDispatcher)
    verify/   every check the broker makes, and the ones it skips, one commitlog window at a time
    repair/   what the broker's next start would do (DefaultMessageStore.load + recover) as a plan,
              and the commands that write: recover, rebuild, salvage, backup / undo
    query/    read-only answers: lookup (queryMessage), explain, timesearch, stats, diff, follow, export

The streaming pipeline: one walk over the commitlog yields bounded chunks of valid records as header
columns, never crossing a segment (records never do), so a segment is work a ``-j`` worker can take on
its own (parallel.stream_segments hands its results over in order, a few at a time); checks take the
records of one window (a 64 MiB offset range inside a segment) and drop them: memory stays flat
whatever the store or segment size::

    log/segments ─► log/commitlog CommitLog.scan ─► Chunk (consecutive records of one segment, as columns)
                        ├─► verify/commitlog  iter_segment_windows: a report per window (verify_segments:
                        │       one per segment, for Spark)
                        │     ├─► verify/windows    QueueWindows, IndexWindows (cross-checks); windowchecks: -j workers
                        │     └─► repair/derived_windows   recovery's check of the derived files against the log
                        ├─► derived/dispatch  Dispatcher (rebuild, recover's re-dispatch, append)
                        ├─► query/stats       StatsAccumulator (also in Spark executors)
                        └─► query/export      Arrow / JSON Lines batches
    log/walk broker_walk (the broker's recovery loop, per version), lenient_records, rewalk
                        ├─► LogTally                 what the recovered log holds (repair/recovery)
                        └─► derived/dispatchpredict  which consume-queue units a re-dispatch writes
"""
