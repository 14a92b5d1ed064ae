"""The 5.x timer store (FORMAT.md appendix C), mirroring the broker's TimerMessageStore.

    files.py   timerlog/ (TimerLog), timerwheel (TimerWheel), config/timercheck (TimerCheckpoint),
               config/timermetrics (TimerMetrics), read-only
    store.py   TimerStore: the timerlog walked in order with doEnqueue's wheel replayed, and the
               rmq_sys_wheel_timer record each unit points at
    report.py  units, slots with chains, pending messages, the per-topic summary
    check.py   verify's TM_* findings

Sits above log/ and derived/ (it reads the commitlog and the timer queue); verify, query and repair
use it.
"""
