"""The broker's start-up recovery, planned offline, and the commands that write.

- recovery: what DefaultMessageStore.load + recover would do, per version, as a plan of file actions
  (plan: the plan, its queue states and exit code; probes: the file reads planning makes besides the walk)
- derived, derived_plan, derived_windows: derived files that lie, checked against the log (one commitlog window at a time)
- startup: what the next start costs
- apply: carrying a plan out (backup first, journal, fsync, resumable); backup: backup folders and undo
- checkpointfix: the checkpoint a repair leaves; outcome: the repair commands' exit-code contract
- rebuild: consume queues / index from the commitlog (reput into a fresh folder); salvage: reading past corruption
- cleanup: what the running broker's expired-file cleaner deletes (predicted); reclaim: freeing space offline
  under a policy (delete, or move out into a backup folder)
- config_plan: ``config/*.json`` restored or rebuilt, committed offsets set (ConfigManager's persist)
"""
