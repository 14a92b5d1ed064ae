"""LMQ / multi-dispatch (FORMAT.md §14.3) on the store the real 5.3.3 store code wrote (stores/lmq-5.3.3):
reads against the broker's read-back, writes (rebuild, recover, truncate) against the broker's own files."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app
from rmqstore_cli.engine.config.storeconfig import StoreConfig
from rmqstore_cli.engine.derived.lmq import MultiDispatchRule

from .conftest import STORES, broker_read, files_of, json_lines, recover_plan, tree_digest

NAME = "lmq-5.3.3"
CONF = STORES / NAME / "broker.conf"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def lmq_units():
    return [u for u in broker_read(NAME)["cqUnit"] if u["topic"].startswith("%LMQ%")]


# --- the rules, against the 5.3.3 source's behaviour (MultiDispatchUtils / ConsumeQueue.multiDispatchLmqQueue) ---

def _rule(**kw) -> MultiDispatchRule:
    cfg = StoreConfig(version=5)
    for k, v in kw.items():
        setattr(cfg, k, v)
        cfg.explicit.add(k)
    return MultiDispatchRule(cfg)


def test_rules():
    r = _rule(enableMultiDispatch=True, enableLmq=True)
    assert r.targets("T", 3, "%LMQ%a,%LMQ%b", "4,9") == [("%LMQ%a", 0, 4), ("%LMQ%b", 0, 9)]
    assert r.targets("T", 3, "%LMQ%a,plain", "4,9") == [("%LMQ%a", 0, 4), ("plain", 3, 9)]  # only LMQ names go to 0
    assert r.targets("T", 3, "%LMQ%a,%LMQ%b", "4") == []  # lists of different lengths: nothing
    assert r.targets("T", 3, "%LMQ%a,%LMQ%b,", "4,9,") == [("%LMQ%a", 0, 4), ("%LMQ%b", 0, 9)]  # split drops trailing ""
    assert r.targets("T", 3, "%LMQ%a/x,%LMQ%b", "4,9") == [("%LMQ%b", 0, 9)]  # path separator: skipped
    assert r.targets("T", 3, "%LMQ%a,%LMQ%b,%LMQ%c", "4,x,5") == [("%LMQ%a", 0, 4)]  # parseLong throws: the rest is lost
    assert r.targets("T", 3, " ", "1") == [] and r.targets("T", 3, "%LMQ%a", "") == []  # blank
    for topic in ("%RETRY%g", "rmq_sys_x", "SCHEDULE_TOPIC_XXXX"):
        assert r.targets(topic, 0, "%LMQ%a", "1") == []
    assert _rule(enableMultiDispatch=False).targets("T", 0, "%LMQ%a", "1") == []
    assert _rule(enableMultiDispatch=True, enableLmq=False).targets("T", 2, "%LMQ%a", "1") == [("%LMQ%a", 2, 1)]
    assert MultiDispatchRule(StoreConfig(version=5)).targets("T", 2, "%LMQ%a", "1") == [("%LMQ%a", 0, 1)]  # unset: records decide


# --- reads --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_conf", [True, False])
def test_verify_and_dump_match_broker(with_conf):
    root = STORES / NAME / "store"
    before = tree_digest(root)
    conf = ["--config", CONF] if with_conf else []  # without it the geometry comes from the files
    r = run("verify", root, "--json", *conf)
    assert r.exit_code == 0, r.output
    assert [o for o in json_lines(r.stdout) if o.get("severity") in ("error", "warning")] == []
    r = run("dump", "consumequeue", root, "--json", *conf)
    assert r.exit_code == 0
    got = sorted((o["topic"], o["queueId"], o["queueOffset"], o["phyOffset"], o["size"], o["tagsCode"])
                 for o in json_lines(r.stdout))
    want = sorted((u["topic"], u["queueId"], u["queueOffset"], u["phyOffset"], u["size"], u["tagsCode"])
                  for u in broker_read(NAME)["cqUnit"])
    assert got == want and len(want) == 981
    assert tree_digest(root) == before


def test_recover_dry_run_plans_nothing_on_the_lmq_queues():
    root = STORES / NAME / "store"
    before = tree_digest(root)
    r = run("recover", root, "--dry-run", "--json", "--config", CONF)
    plan = recover_plan(r.stdout)
    assert plan["dataLoss"] == [] and plan["refusals"] == [] and plan["queueRepairs"] == [], r.output
    # the only action: the confirmPhyOffset the broker's next start writes (its reopen wrote 236594, README)
    assert [(a["action"], a["fields"]["confirmPhyOffset"]) for a in plan["actions"]] == [("checkpoint", 236594)]
    assert plan["expectedApplyExitCode"] == 0
    summary = next(o for o in json_lines(r.stdout) if o.get("type") == "recover")
    table = next(t for t in broker_read(NAME)["offsetTable"] if t["table"] == "topicQueueTable")["entries"]
    assert {f"{q['topic']}-{q['queueId']}": q["maxOffset"] for q in summary["queues"]} == table
    assert tree_digest(root) == before


# --- writes ---------------------------------------------------------------------------------------------------

def test_rebuild_gives_the_lmq_queues_back_byte_for_byte(store_copy, tmp_path):
    root = store_copy(NAME)
    want = files_of(root)
    shutil.rmtree(root / "consumequeue")
    r = run("rebuild", "consumequeue", root, "--config", CONF, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    assert files_of(root) == want
    # on the intact store: nothing moves
    r = run("rebuild", "consumequeue", root, "--config", CONF, "--backup-dir", tmp_path / "bk2")
    assert r.exit_code == 0, r.output
    assert files_of(root) == want


def test_rebuild_one_lmq_queue(store_copy, tmp_path):
    root = store_copy(NAME)
    want = files_of(root)
    shutil.rmtree(root / "consumequeue" / "%LMQ%dev%7")
    r = run("rebuild", "consumequeue", root, "--topic", "%LMQ%dev%7", "--config", CONF, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    assert files_of(root) == want


def _zero_from(path, unit: int) -> None:
    d = bytearray(open(path, "rb").read())
    d[unit * 20:] = bytes(len(d) - unit * 20)
    open(path, "wb").write(d)


def test_truncated_lmq_queue_found_and_repaired(store_copy, tmp_path):
    root = store_copy(NAME)
    want = files_of(root)
    name = "%LMQ%room1"
    _zero_from(root / "consumequeue" / name / "0" / ("%020d" % 0), 30)
    r = run("verify", root, "--json", "--config", CONF)
    assert r.exit_code == 1
    (f,) = [o for o in json_lines(r.stdout) if o.get("severity") == "error"]
    units = sorted((u for u in lmq_units() if u["topic"] == name), key=lambda u: u["queueOffset"])
    assert (f["code"], f["topic"], f["queueOffset"], f["phyOffset"], f["count"]) == (
        "LMQ_NOT_DISPATCHED", name, 30, units[30]["phyOffset"], len(units) - 30)
    r = run("recover", root, "--dry-run", "--json", "--config", CONF)
    plan = recover_plan(r.stdout)
    assert plan["dataLoss"] == [] and plan["expectedApplyExitCode"] == 0
    (q,) = plan["queueRepairs"]
    assert (q["topic"], q["firstBadOffset"], q["ours"]["maxOffset"]) == (name, 30, len(units))
    r = run("recover", root, "--config", CONF, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    assert files_of(root) == want
    assert run("verify", root, "--config", CONF).exit_code == 0


def test_lying_lmq_unit_cut_and_rewritten(store_copy, tmp_path):
    root = store_copy(NAME)
    want = files_of(root)
    path = root / "consumequeue" / "%LMQ%chat%b" / "0" / ("%020d" % 0)
    d = bytearray(open(path, "rb").read())
    d[10 * 20 + 8:10 * 20 + 12] = (77).to_bytes(4, "big")  # unit 10: a size no record has
    open(path, "wb").write(d)
    r = run("verify", root, "--json", "--config", CONF)
    assert r.exit_code == 1 and {o["code"] for o in json_lines(r.stdout) if o.get("severity") == "error"} == {"CQ_SIZE"}
    r = run("recover", root, "--dry-run", "--json", "--config", CONF)
    plan = recover_plan(r.stdout)
    assert plan["dataLoss"] == [] and [(q["topic"], q["firstBadOffset"], q["code"]) for q in plan["queueRepairs"]] == [
        ("%LMQ%chat%b", 10, "CQ_SIZE")]
    assert run("recover", root, "--config", CONF, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert files_of(root) == want


def test_abnormal_start_keeps_every_lmq_unit(store_copy, tmp_path):
    root = store_copy(NAME)
    want = files_of(root)
    (root / "abort").write_bytes(b"")
    r = run("recover", root, "--dry-run", "--json", "--config", CONF)
    plan = recover_plan(r.stdout)
    assert plan["dataLoss"] == [] and plan["queueRepairs"] == []
    assert not [a for a in plan["actions"] if a["action"] in ("zero_tail", "move_aside") and "consumequeue" in a["path"]]
    assert run("recover", root, "--config", CONF, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert files_of(root) == want


def test_truncate_cuts_lmq_queues_like_the_broker(store_copy, tmp_path):
    root = store_copy(NAME)
    cut = sorted(m["offset"] for m in broker_read(NAME)["clmsg"])[450]
    r = run("truncate", root, "--offset", cut, "--config", CONF, "--backup-dir", tmp_path / "bk")
    assert r.exit_code == 0, r.output
    r = run("dump", "consumequeue", root, "--json", "--config", CONF)
    got = sorted((o["topic"], o["queueOffset"], o["phyOffset"]) for o in json_lines(r.stdout) if o["topic"].startswith("%LMQ%"))
    # §13.7: every unit whose record starts before the cut stays, the rest goes
    want = sorted((u["topic"], u["queueOffset"], u["phyOffset"]) for u in lmq_units() if u["phyOffset"] < cut)
    assert got == want
    assert run("verify", root, "--config", CONF).exit_code == 0


def _put_lines() -> list[str]:
    """The 600 puts as `append --from` lines: what the harness sent (properties string before the store's additions),
    with the record's own times, hosts and flags as the broker stored them (clmsg raw)."""
    from .conftest import broker_puts

    raw = {m["offset"]: m["raw"] for m in broker_read(NAME)["clmsg"]}
    lines = []
    for p in broker_puts(NAME):
        r = raw[p["result"]["wroteOffset"]]
        lines.append(json.dumps({
            "topic": p["topic"], "queueId": p["queueId"], "bodyHex": p["bodyHex"], "propertiesRaw": p["propertiesStringSent"],
            "flag": r["flag"], "sysFlag": r["sysFlag"], "bornTimestamp": r["bornTimestamp"],
            "storeTimestamp": r["storeTimestamp"], "bornHost": f"127.0.0.1:{40000 + p['i'] % 1000}",
            "storeHost": "127.0.0.1:10911"}))
    return lines


def test_append_assigns_lmq_offsets_like_the_broker(tmp_path):
    """The broker's append (LmqDispatch.wrapLmqDispatch + handlePropertiesForLmqMsg) stores INNER_MULTI_QUEUE_OFFSET
    with the properties re-serialised; dispatch writes the LMQ units: the whole store comes out byte for byte."""
    src = tmp_path / "puts.jsonl"
    src.write_text("\n".join(_put_lines()) + "\n")
    dst = tmp_path / "replay"
    r = run("append", dst, "--from", src, "--config", CONF, "--broker-version", 5, "--quiet")
    assert r.exit_code == 0, r.output
    broker = STORES / NAME / "store"
    for sub in ("commitlog", "consumequeue"):
        assert files_of(dst, sub) == files_of(broker, sub), sub


def test_lmq_group_offsets_audited(store_copy):
    """lmqConsumerOffset.json (LmqConsumerOffsetManager: lmqOffsetTable {"queue@group": offset}, queue 0) against the
    LMQ queues' bounds (the broker's offset table after reopen)."""
    root = store_copy(NAME)
    os.makedirs(root / "config")
    (root / "config" / "lmqConsumerOffset.json").write_text(
        '{\n\t"lmqOffsetTable":{\n\t\t"%LMQ%room1@%LMQ%g1":40,\n\t\t"%LMQ%room2@%LMQ%g1":50\n\t},\n\t"offsetTable":{}\n}')
    table = next(t for t in broker_read(NAME)["offsetTable"] if t["table"] == "topicQueueTable")["entries"]
    r = run("dump", "offsets", root, "--json")
    rows = {o["topic"]: o for o in json_lines(r.stdout) if o.get("type") == "offset"}
    assert set(rows) == {"%LMQ%room1", "%LMQ%room2"} and all(o["lmq"] and o["group"] == "%LMQ%g1" for o in rows.values())
    a, b = rows["%LMQ%room1"], rows["%LMQ%room2"]
    assert (a["maxOffset"], a["lagMessages"], a["code"]) == (table["%LMQ%room1-0"], table["%LMQ%room1-0"] - 40, None)
    assert (b["maxOffset"], b["code"], b["skipped"]) == (table["%LMQ%room2-0"], "CO_ABOVE_MAX", 50 - table["%LMQ%room2-0"])


def test_own_queue_loss_not_hidden_by_lmq_units(store_copy, tmp_path):
    """A record that lost its own unit is missing from its queue even when its LMQ units are there."""
    root = store_copy(NAME)
    want = files_of(root)
    _zero_from(root / "consumequeue" / "LmqTopicA" / "0" / ("%020d" % 0), 40)
    units = broker_read(NAME)["cqUnit"]
    lost = [u for u in units if (u["topic"], u["queueId"]) == ("LmqTopicA", 0) and u["queueOffset"] >= 40]
    kept = [u for u in units if not any(u is x for x in lost)]
    high = max(u["phyOffset"] + u["size"] for u in kept)  # from there the broker re-dispatches at start (lag)
    r = run("verify", root, "--json", "--config", CONF)
    (f,) = [o for o in json_lines(r.stdout) if o.get("severity") == "error"]
    assert (f["code"], f["topic"], f["queueOffset"], f["count"]) == (
        "CQ_NOT_DISPATCHED", "LmqTopicA", 40, sum(u["phyOffset"] < high for u in lost))
    assert run("recover", root, "--config", CONF, "--backup-dir", tmp_path / "bk").exit_code == 0
    assert files_of(root) == want


def test_settings_inferred_from_lmq_queues(tmp_path):
    from rmqstore_cli.engine.config.storeconfig import infer_geometry

    for qid, lmq_on in (("0", True), ("3", False)):  # without enableLmq, LMQ queues keep the record's queue id
        root = tmp_path / qid
        os.makedirs(root / "consumequeue" / "%LMQ%x" / qid)
        cfg = infer_geometry(StoreConfig(version=5), str(root))
        assert (cfg.enableMultiDispatch, cfg.enableLmq) == (True, lmq_on)
        assert MultiDispatchRule(cfg).targets("T", 3, "%LMQ%x", "7") == [("%LMQ%x", 0 if lmq_on else 3, 7)]
    cfg = infer_geometry(StoreConfig(version=5), str(tmp_path / "none"))
    assert (cfg.enableMultiDispatch, cfg.enableLmq) == (False, False)


def _windowed_and_whole(root, monkeypatch) -> tuple:
    """(the windowed check's verdicts, the plan with it, the plan with the whole-record-table check instead)."""
    from rmqstore_cli.engine.repair import derived_windows
    from rmqstore_cli.engine.repair.recovery import plan_recovery
    from rmqstore_cli.engine.store import Store

    def plan():
        with Store.open(str(root)) as st:
            p = plan_recovery(st)
            return [a.__dict__ for a in p.actions], p.notes, p.dispatch, p.summary

    answers = []
    finish = derived_windows.WindowedCheck.finish
    monkeypatch.setattr(derived_windows.WindowedCheck, "finish", lambda self: answers.append(finish(self)) or answers[-1])
    windowed = plan()
    monkeypatch.setattr(derived_windows.WindowedCheck, "start", classmethod(lambda cls, planner, **kw: None))
    return answers, windowed, plan()


@pytest.mark.parametrize("damage", ["lmq_tail", "own_tail", "abort"])
def test_windowed_check_plans_as_the_whole_table(store_copy, damage, monkeypatch):
    """Recovery's derived check window by window (multi-dispatch units checked against their window's records) gives
    the plan the whole-record-table check gives."""
    root = store_copy(NAME)
    if damage == "lmq_tail":
        _zero_from(root / "consumequeue" / "%LMQ%room1" / "0" / ("%020d" % 0), 30)
    elif damage == "own_tail":
        _zero_from(root / "consumequeue" / "LmqTopicA" / "0" / ("%020d" % 0), 40)
    else:
        (root / "abort").write_bytes(b"")
        _zero_from(root / "consumequeue" / "%LMQ%dev%7" / "0" / ("%020d" % 0), 20)

    answers, windowed, whole = _windowed_and_whole(root, monkeypatch)
    assert answers and answers[0] is not None  # the windowed check gave the verdicts
    assert whole == windowed


def test_window_decodes_multi_dispatch_once(monkeypatch, store_copy):
    """Each window's records have their multi-dispatch targets decoded once, for every LMQ queue whose units
    point into the window and for the check that every named unit exists: they were decoded again for each LMQ
    queue (50 decodings of the 600 records here). Findings unchanged: clean, and a unit whose record names
    another LMQ queue still a CQ_TOPIC."""
    from rmqstore_cli.engine.derived import lmq

    real, calls = lmq.record_targets, []

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    from rmqstore_cli.engine.verify import lmq as verify_lmq, queues as verify_queues

    for module in (lmq, verify_lmq, verify_queues):  # wherever it is called from
        monkeypatch.setattr(module, "record_targets", counting, raising=False)
    r = run("verify", STORES / NAME / "store", "--json", "--config", CONF)
    assert r.exit_code == 0, r.output
    assert 0 < len(calls) <= 2, calls  # two commitlog files, a window each
    root = store_copy(NAME)
    a, b = (root / "consumequeue" / q / "0" / ("%020d" % 0) for q in ("%LMQ%chat%b", "%LMQ%chat%a"))
    da, db = bytearray(a.read_bytes()), bytearray(b.read_bytes())
    da[3 * 20:3 * 20 + 20] = db[3 * 20:3 * 20 + 20]  # unit 3 of one LMQ queue points at a record of the other's
    a.write_bytes(bytes(da))
    r = run("verify", root, "--json", "--config", CONF)
    errors = [(o["code"], o["topic"], o["queueOffset"]) for o in json_lines(r.stdout) if o.get("severity") == "error"]
    assert r.exit_code == 1 and errors == [("CQ_TOPIC", "%LMQ%chat%b", 3)], errors


# --- the LMQ checks in array operations, against the one-target-at-a-time rules they replaced ---

def _one_by_one_missing(lt, recs, bounds, high_water):
    """The multi-dispatch check's rule target by target (as it was written): (row, name, qid, qo) of each target
    whose unit is missing and that the broker will not dispatch again."""
    out = []
    for k in range(len(lt)):
        row, name, qid, qo = int(lt.row[k]), lt.names[int(lt.name[k])], int(lt.queue_id[k]), int(lt.queue_offset[k])
        b = bounds.get((name, qid))
        if b is not None and qo < b[1]:
            continue
        if high_water is not None and int(recs.phy[row]) >= high_water:
            continue
        out.append((row, name, qid, qo))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_missing_lmq_units_found_at_once_as_one_by_one(monkeypatch, seed):
    """LmqDispatchCheck.window finds the targets it reports (and skips the rest: prepared or rolled-back records,
    units present or cleaned before the queue's first file, records past the high-water mark) in array operations;
    the same targets, in the same order, as the rule applied target by target. Queue ids include negative and large
    int32 values; seeded, the seed printed."""
    import numpy as np

    from rmqstore_cli.engine.derived.lmq import LmqTargets
    from rmqstore_cli.engine.verify import lmq as verify_lmq

    print("seed", seed)
    rng = np.random.default_rng(seed)
    names = [f"%LMQ%room{i}" for i in range(9)]
    qids = [0, 1, -1, (1 << 31) - 1, -(1 << 31)]
    n, rows = 500, 120
    lt = LmqTargets(np.sort(rng.integers(0, rows, n)), rng.integers(0, len(names), n),
                    rng.choice(qids, n), rng.integers(0, 60, n), names)
    bounds = {}
    for name in names:
        for q in qids:
            if rng.random() < 0.7:
                mn = int(rng.integers(0, 10))
                bounds[(name, q)] = (mn, mn + int(rng.integers(0, 50)))
    flags = rng.choice([0, 0, 0, 0x4, 0x8, 0xC], rows)  # some prepared / commit / rollback records
    phy = np.cumsum(rng.integers(100, 300, rows)).astype(np.int64)
    high_water = None if seed % 2 else int(phy[rows // 2])

    class Recs:
        c = {"sysFlag": flags}

        def __init__(self):
            self.phy = phy

        def __len__(self):
            return rows

        def location(self, row):
            return "commitlog", int(row)

    recs = Recs()
    monkeypatch.setattr(verify_lmq, "window_targets", lambda r: (lt,))
    check = verify_lmq.LmqDispatchCheck.__new__(verify_lmq.LmqDispatchCheck)
    check.high_water, check.agg, check.units_named = high_water, verify_lmq._Agg(), 0
    check.bounds = dict.fromkeys(((nm, q) for nm in names for q in qids), None) | bounds
    monkeypatch.setattr(verify_lmq.LmqDispatchCheck, "active", property(lambda self: True))
    reported = []
    monkeypatch.setattr(check.agg, "add", lambda group, code, *a, **kw: reported.append(
        (kw["phyOffset"], kw["topic"], kw["queueId"], kw["queueOffset"])))
    check.window(recs)

    tran = flags[lt.row] & 0xC
    ok = (tran == 0) | (tran == 0x8)
    kept = LmqTargets(lt.row[ok], lt.name[ok], lt.queue_id[ok], lt.queue_offset[ok], names)
    want = [(int(phy[r]), nm, q, qo) for r, nm, q, qo in _one_by_one_missing(kept, recs, bounds, high_water)]
    assert check.units_named == len(kept)
    assert want and reported == want


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_lmq_units_matched_at_once_as_by_a_set(seed):
    """A unit of an LMQ queue agrees when its (record, offset) is among the targets naming the queue: matched as
    pairs in one array operation, the same answer as a set of pairs (repeated pairs, negative offsets included)."""
    import numpy as np

    from rmqstore_cli.engine.arrays import packed_rows

    print("seed", seed)
    rng = np.random.default_rng(seed)
    t_row, t_qo = rng.integers(0, 50, 300), rng.integers(-3, 40, 300)
    u_row, u_qo = rng.integers(0, 60, 400), rng.integers(-5, 45, 400)
    named = set(zip(t_row.tolist(), t_qo.tolist()))
    want = np.asarray([(r, q) in named for r, q in zip(u_row.tolist(), u_qo.tolist())])
    got = np.isin(packed_rows(u_row, u_qo), packed_rows(t_row, t_qo))
    assert want.any() and not want.all()
    assert (got == want).all()


def test_lmq_targets_take_no_python_step_per_record(monkeypatch):
    """Which records' topics take part in multi-dispatch is decided per topic (lmq.RowTopics): verify of the
    broker's LMQ store asks no record its topic one at a time (its records are ASCII: all parsed in arrays), where
    it asked each of them before. The findings are the broker's (clean)."""
    from rmqstore_cli.engine.derived import lmq

    asked = []
    real = lmq.RowTopics.__call__
    monkeypatch.setattr(lmq.RowTopics, "__call__", lambda self, i: asked.append(i) or real(self, i))
    parts = []
    real_part = lmq.RowTopics.take_part
    monkeypatch.setattr(lmq.RowTopics, "take_part", lambda self, rows: parts.append(len(rows)) or real_part(self, rows))
    r = run("verify", STORES / NAME / "store", "--json", "--config", CONF)
    assert r.exit_code == 0, r.output
    assert sum(parts) > 100 and asked == []


# --- an LMQ queue's units that agree with their records pass in the compiled check ---

def _units_checked_in_python(monkeypatch) -> list:
    """The (topic, units) of every call of the unit-by-unit rules (queues.check_found_units) from now on."""
    from rmqstore_cli.engine.verify import queues as verify_queues, windows as verify_windows

    calls, real = [], verify_queues.check_found_units
    monkeypatch.setattr(verify_windows, "check_found_units",
                        lambda cq, scan, qofs, *a: calls.append((scan.topic, len(qofs))) or real(cq, scan, qofs, *a))
    return calls


def test_agreeing_lmq_units_pass_in_the_compiled_check(monkeypatch, store_copy):
    """An LMQ queue's unit points at another topic's record, which names the queue at the unit's offset among its
    multi-dispatch targets: the compiled check lets it pass, so no unit of the broker's LMQ store reaches the rules
    in Python (every LMQ unit did, each queue's once per window). A unit that disagrees still does, alone."""
    calls = _units_checked_in_python(monkeypatch)
    r = run("verify", STORES / NAME / "store", "--json", "--config", CONF)
    assert r.exit_code == 0, r.output
    assert calls == []
    root = store_copy(NAME)
    a, b = (root / "consumequeue" / q / "0" / ("%020d" % 0) for q in ("%LMQ%chat%b", "%LMQ%chat%a"))
    da, db = bytearray(a.read_bytes()), bytearray(b.read_bytes())
    da[3 * 20:3 * 20 + 20] = db[3 * 20:3 * 20 + 20]  # unit 3 of one LMQ queue points at a record of the other's
    a.write_bytes(bytes(da))
    r = run("verify", root, "--json", "--config", CONF)
    errors = [(o["code"], o["topic"], o["queueOffset"]) for o in json_lines(r.stdout) if o.get("severity") == "error"]
    assert r.exit_code == 1 and errors == [("CQ_TOPIC", "%LMQ%chat%b", 3)], errors
    assert calls == [("%LMQ%chat%b", 1)]


def _damage_lmq(rng, root) -> list:
    """Seeded damage of the LMQ store's queue units and of its records' multi-dispatch offsets (not under the body
    CRC): what was done, as text."""
    import re

    done = []
    queues = sorted((root / "consumequeue").glob("*/*/0*"))
    for _ in range(rng.randrange(1, 5)):
        kind = rng.choice(["size", "phy", "tags", "swap", "other-queue", "offset-prop"])
        path = rng.choice(queues)
        d = bytearray(path.read_bytes())
        n = next((k for k in range(len(d) // 20) if not any(d[k * 20:k * 20 + 20])), len(d) // 20)  # units written
        u, v = rng.sample(range(n), 2)  # two units that point at different records
        if kind == "size":
            d[u * 20 + 8:u * 20 + 12] = rng.randrange(1, 1000).to_bytes(4, "big")
        elif kind == "phy":
            d[u * 20:u * 20 + 8] = d[v * 20:v * 20 + 8]  # another unit's record
        elif kind == "tags":
            d[u * 20 + 12:u * 20 + 20] = rng.randrange(1 << 40).to_bytes(8, "big")
        elif kind == "swap":
            d[u * 20:u * 20 + 20], d[v * 20:v * 20 + 20] = d[v * 20:v * 20 + 20], d[u * 20:u * 20 + 20]
        elif kind == "other-queue":
            other = bytearray(rng.choice([q for q in queues if q != path]).read_bytes())
            d[u * 20:u * 20 + 20] = other[v * 20:v * 20 + 20]  # a unit of another queue (its record names that one)
        else:
            path = rng.choice(sorted((root / "commitlog").iterdir()))
            d = bytearray(path.read_bytes())
            at = [m.end() for m in re.finditer(rb"INNER_MULTI_QUEUE_OFFSET\x01", bytes(d))]
            p = rng.choice(at)
            digits = [p + k for k in range(12) if chr(d[p + k]).isdigit()]
            p = rng.choice(digits)
            d[p] = ord(rng.choice("0123456789".replace(chr(d[p]), "")))
            u = p
        path.write_bytes(bytes(d))
        done.append(f"{kind} {path.parent.parent.name}/{path.name}@{u}")
    return done


@pytest.mark.parametrize("seed", [21, 22, 23, 24, 25, 26, 27, 28])
def test_lmq_units_passed_in_the_compiled_check_as_by_the_rules(monkeypatch, store_copy, seed):
    """Seeded damage of LMQ units and of the records' multi-dispatch offsets: the findings with agreeing LMQ units
    let pass in the compiled check are those of the rules applied in Python to every LMQ unit (each run's key
    withheld from the kernel, as before), for verify and for recover's plan."""
    import random

    from rmqstore_cli.engine.verify.queueruns import QueueRuns

    print("seed", seed)
    rng = random.Random(seed)
    root = store_copy(NAME)
    done = _damage_lmq(rng, root)
    got = [run(*args, "--json", "--config", CONF).stdout for args in (("verify", root), ("recover", root, "--dry-run"))]
    real = QueueRuns._lmq_keys

    def withheld(self, ids, recs):
        key, _ = real(self, ids, recs)
        return key * 0 - 1, None

    monkeypatch.setattr(QueueRuns, "_lmq_keys", withheld)
    want = [run(*args, "--json", "--config", CONF).stdout for args in (("verify", root), ("recover", root, "--dry-run"))]
    assert got == want, (seed, done)
    assert any(o.get("severity") == "error" for o in json_lines(got[0])), (seed, done)  # the damage is seen


@pytest.mark.parametrize("seed", [31, 32, 33, 34, 35, 36])
def test_windowed_check_plans_as_the_whole_table_on_seeded_damage(store_copy, monkeypatch, seed):
    """As above, on seeded damage: queue tails lost (LMQ queues' and the topics' own), units that lie, records whose
    multi-dispatch offsets changed, with or without a crash. The windowed check takes the multi-dispatch units as
    columns (repair/lmqtails.py)."""
    import random

    print("seed", seed)
    rng = random.Random(seed)
    root = store_copy(NAME)
    lies = rng.random() < 0.5
    done = _damage_lmq(rng, root) if lies else []
    queues = sorted((root / "consumequeue").glob("*/*/0*"))
    for path in rng.sample(queues, rng.randrange(1, 4)):
        at = rng.randrange(0, 50)
        _zero_from(path, at)
        done.append(f"tail {path.parent.parent.name} from {at}")
    if rng.random() < 0.5:
        (root / "abort").write_bytes(b"")
        done.append("abort")

    answers, windowed, whole = _windowed_and_whole(root, monkeypatch)
    # lost tails alone: the windowed check gives the verdicts (units that lie send it back to the whole table)
    assert lies or (answers and answers[0] is not None), (seed, done)
    assert whole == windowed, (seed, done)


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_lmq_tails_as_columns_as_unit_by_unit(seed):
    """collect_lmq_tails gives each queue the units at or past its end, in record order (one part per queue and
    window, the same arrays once joined as one part per unit), and NamedUnits holds exactly the (queue, record,
    queue offset) of the dispatchable records' units: against the unit-by-unit rule it replaced (seeded; negative
    and large queue ids, queues known or not)."""
    from types import SimpleNamespace

    import numpy as np

    from rmqstore_cli.engine.derived.lmq import LmqTargets
    from rmqstore_cli.engine.repair.lmqtails import collect_lmq_tails

    print("seed", seed)
    rng = np.random.default_rng(seed)
    n, m = 300, 900
    names = [f"%LMQ%q{k}" for k in range(12)]
    row = np.sort(rng.integers(0, n, m))
    lt = LmqTargets(row, rng.integers(0, len(names), m), rng.choice([0, 1, -1, (1 << 31) - 1], m),
                    rng.integers(0, 60, m), names)
    t = SimpleNamespace(phy=np.cumsum(rng.integers(100, 200, n)).astype(np.int64),
                        c={"size": rng.integers(100, 200, n).astype(np.int32)})
    disp = rng.random(n) < 0.8
    known = {(nm, q): (SimpleNamespace(max_offset=int(rng.integers(0, 60))),) for nm in names[:8] for q in (0, 1, -1)}
    tails = {("%LMQ%q0", 0): [(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))]}  # an earlier part
    want_tails = {k: list(v) for k, v in tails.items()}
    want_named: dict = {}
    for r, nm, q, qo in zip(lt.row.tolist(), lt.name.tolist(), lt.queue_id.tolist(), lt.queue_offset.tolist()):
        if not disp[r]:
            continue
        key = (names[nm], q)
        want_named.setdefault(key, set()).add((r, qo))
        if key in known and qo < known[key][0].max_offset:
            continue
        want_tails.setdefault(key, []).append((t.phy[[r]], t.c["size"][[r]].astype(np.int64), np.asarray([qo])))
    named = collect_lmq_tails(t, disp, lt, known, tails)
    joined = lambda parts: [np.concatenate([p[j] for p in parts]).tolist() for j in range(3)]  # noqa: E731
    assert sorted(tails) == sorted(want_tails)
    assert all(joined(tails[k]) == joined(want_tails[k]) for k in tails)
    queues = sorted(want_named) + [("%LMQ%q0", 7), ("%LMQ%none", 0)]
    rows, offsets = rng.integers(0, n, 2000), rng.integers(0, 60, 2000)
    which = rng.integers(0, len(queues), 2000)
    key = np.asarray([named.key(queues[w]) for w in which.tolist()], np.int64)
    got = named.holds(key, rows, offsets)
    want = np.asarray([(r, o) in want_named.get(queues[w], ()) for w, r, o in zip(which.tolist(), rows.tolist(),
                                                                                     offsets.tolist())])
    assert want.any() and not want.all()
    assert (got == want).all()
