"""Read-only answers built on the log and derived layers.

- lookup: messages by key, offset, msgId, UNIQ_KEY, queue position (DefaultMessageStore.queryMessage)
- explain: why a lookup finds nothing; timesearch: places by store time without reading before them
- stats: statistics from header columns (StatsAccumulator); export: Parquet / CSV / JSON Lines
- diff: two stores of one broker pair; follow: ``tail -f`` on a live commitlog
"""
