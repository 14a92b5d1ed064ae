"""The commitlog layer (the broker's MappedFileQueue / MappedFile, CommitLog, StoreCheckpoint).

- segments: fixed-size segment files named by offset, read side (MappedFileQueue)
- mappedfile: the writer side, pre-allocated segments and an undo journal (MappedFile)
- commitlog: the read side, a scan yielding one segment's valid records as header-column chunks
  (CommitLog + checkMessageAndReturnSize): the walk every reader streams from
- storetime: the log searched by store time (pickupStoreTimestamp along the segments), for --since/--until
- walk: the broker's recovery walk per version (recoverNormally / recoverAbnormally) and the ways past a bad record
- appender, messages: appends (CommitLog.putMessage) and the messages they write
- lockfile: the ``lock`` and ``abort`` files of a write session
- checkpoint, checkpointwriter: the ``checkpoint`` file (StoreCheckpoint)
"""
