"""Offline verification: every check the broker makes, and the ones it skips.

- pipeline: ``verify_store``: phase 1 per segment, then the cross-checks window by window
- commitlog: phase 1, each commitlog segment on its own (records never cross a segment)
- windows: the consumers of one segment's records (consume queues, index files, dispatch completeness)
- records: merged record columns, reference classification, finding aggregation (shared)
- queues, index: the consume-queue / ext and index / checkpoint / store-root checks (the whole-log
  formulation, and the per-unit and per-entry rules the windows share)
"""
