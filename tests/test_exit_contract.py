"""The exit-code contract of recover / truncate / rebuild, on copies of the broker-written stores.

* ``--dry-run`` exits 0 exactly when the plan is empty (no action but the housekeeping the broker does at every
  start and that fixes nothing verify reports, no refusal, nothing damaged), 1 when it has actions or names damage, 2 when data would be lost without an explicit choice.
* An applied repair exits 0 when verify is clean afterwards or only the findings the plan named
  beforehand as kept on purpose remain (and says which in one line), 1 otherwise; the plan predicts it
  (``expectedApplyExitCode``).
* truncate / rebuild leave a checkpoint consistent with the log: verify after them finds nothing.

Damage is placed with the broker's own record offsets (broker-read.jsonl.gz), never with rmqstore's.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
from typer.testing import CliRunner

from rmqstore_cli.app import app

from .conftest import CLEAN_STORES, STORE_NAMES, broker_read, shared_store

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def plan_of(r) -> dict:
    return next(o for o in json_lines(r.stdout) if o.get("type") == "recover-plan")


def version_of(name: str) -> int:
    return 4 if name.startswith("4") else 5


def seg_size(name: str) -> int:
    return broker_read(name)["store"][0]["mappedFileSizeCommitLog"]


def flip_body_byte(root, name: str, rec: dict) -> None:
    """One bit of the record's body changed: its BODYCRC no longer matches (§4.1)."""
    size = seg_size(name)
    start = rec["offset"] - rec["offset"] % size
    body_len = len(rec["msg"]["bodyHex"]) // 2
    assert body_len > 8
    # body = the bytes just before TOPICLEN + topic + PROPLEN + properties at the record's end
    tail = 1 + len(rec["msg"]["topic"].encode()) + 2 + len(rec["msg"]["propertiesRaw"].encode())
    if len(rec["msg"]["topic"].encode()) > 127:
        tail += 1
    pos = rec["offset"] - start + rec["size"] - tail - body_len // 2
    with open(root / "commitlog" / ("%020d" % start), "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def dry_and_apply(root, v: int, *extra):
    """recover --dry-run --json, then recover: (dry exit, plan, applied result)."""
    d = run("recover", root, "--dry-run", "--json", "--broker-version", v, *extra)
    plan = plan_of(d)
    a = run("recover", root, "--broker-version", v, *extra)
    return d.exit_code, plan, a


def check_contract(dry_exit: int, plan: dict, applied) -> None:
    """The three rules every plan and apply must follow."""
    assert dry_exit == plan["exitCode"], plan
    housekeeping_only = all(a.get("housekeeping") for a in plan["actions"])
    fixes = any(f.get("severity") in ("error", "warning") for f in plan["fixedFindings"])
    assert (dry_exit == 0) == (plan["empty"] and housekeeping_only and not fixes and not plan["refusals"] and not plan["dataLoss"]
                                and not plan["keptFindings"] and not plan["leftFindings"]), plan
    assert applied.exit_code == plan["expectedApplyExitCode"], (applied.output[-3000:], plan["leftFindings"])


# --- the four rows of the issue -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
@pytest.mark.parametrize("where", ["early", "mid"])
def test_bad_crc_the_broker_never_rereads(name, where, store_copy):
    """Rows 1 and 2: a bad CRC before the broker's recovery walk starts is kept on purpose: the plan names it
    (dry-run 1), the apply leaves it, says so, and exits 0, the same on 4.9.3 and 5.3.3."""
    root = store_copy(name, f"{name}-{where}")
    recs = broker_read(name)["clmsg"]
    size = seg_size(name)
    lo = 2 * size if where == "early" else len(os.listdir(root / "commitlog")) // 2 * size
    bad = next(m for m in recs if m["offset"] > lo and len(m["msg"]["bodyHex"]) > 200)
    flip_body_byte(root, name, bad)
    dry, plan, applied = dry_and_apply(root, version_of(name))
    assert dry == 1, plan
    assert [(k["code"], k["phyOffset"]) for k in plan["keptFindings"]] == [("CL_BODY_CRC", bad["offset"])]
    assert "never re-reads" in plan["keptFindings"][0]["why"]
    assert plan["leftFindings"] == [] and plan["expectedApplyExitCode"] == 0
    assert plan["commitlog"]["recoveredEnd"] == broker_read(name)["store"][0]["maxPhyOffset"]
    check_contract(dry, plan, applied)
    assert applied.exit_code == 0
    assert "kept on purpose" in applied.output or "keeps on purpose" in applied.output
    # the damage is still there (recover does not cut what the broker keeps) and named again
    again = run("recover", root, "--dry-run", "--json", "--broker-version", version_of(name))
    p2 = plan_of(again)
    assert again.exit_code == 1 and p2["actions"] == [] and len(p2["keptFindings"]) == 1


@pytest.mark.parametrize("v", [4, 5])
def test_zero_length_stray_file_is_work_to_do(v, store_copy):
    """Row 3: a zero-length last commitlog file. 4.9.3 refuses to start, 5.3.3 deletes it at load: either way
    the plan has actions, so dry-run exits 1; applied, verify is clean (0), and then the plan is empty."""
    name = "5.3.3-clean" if v == 5 else "4.9.3-clean"
    root = store_copy(name)
    names = sorted(os.listdir(root / "commitlog"))
    stray = "%020d" % (int(names[-1]) + seg_size(name))
    (root / "commitlog" / stray).write_bytes(b"")
    dry, plan, applied = dry_and_apply(root, v)
    assert dry == 1
    moved = [a for a in plan["actions"] if a["action"] == "move_aside"]
    assert [os.path.basename(a["path"]) for a in moved] == [stray]
    assert bool(plan["refusals"]) == (v == 4)  # the brokers decide differently, and the plan says so
    assert bool(moved[0].get("housekeeping")) == (v == 5)
    check_contract(dry, plan, applied)
    assert applied.exit_code == 0 and "verify after apply: clean" in applied.output
    assert run("recover", root, "--dry-run", "--broker-version", v).exit_code == 0


@pytest.mark.parametrize("name", ["4.9.3-clean", "5.3.3-clean"])
def test_truncate_at_a_boundary_of_a_clean_store(name, store_copy):
    """Row 4: the checkpoint follows the cut (physicMsgTimestamp of the new last record), so verify after
    truncate is clean and the broker's next start has nothing to do."""
    root = store_copy(name)
    recs = broker_read(name)["clmsg"]
    k = 1  # the checkpoint's physic time is far ahead of the second record
    cp_before = broker_read(name)["store"][0]["checkpointBeforeOpen"]
    assert cp_before["physicMsgTimestamp"] > recs[k - 1]["msg"]["storeTimestamp"]
    r = run("truncate", root, "--offset", recs[k]["offset"], "--json")
    assert r.exit_code == 0, r.output
    assert "verify after apply: clean" in r.output
    cp = json_lines(run("dump", "checkpoint", root, "--json").stdout)[0]
    assert cp["physicMsgTimestamp"] == recs[k - 1]["msg"]["storeTimestamp"]
    v = run("verify", root)
    assert v.exit_code == 0, v.output
    assert run("recover", root, "--dry-run", "--broker-version", version_of(name)).exit_code == 0


def boundaries(name: str) -> list[int]:
    """Three record starts: the second record, the first record of a middle segment, the last record."""
    recs = broker_read(name)["clmsg"]
    size = seg_size(name)
    mid_seg = recs[len(recs) // 2]["offset"] // size * size
    first_of_mid = next(m["offset"] for m in recs if m["offset"] >= mid_seg)
    return [recs[1]["offset"], first_of_mid, recs[-1]["offset"]]


@pytest.mark.parametrize("name", STORE_NAMES)
def test_truncate_then_verify_is_clean(name, store_copy, tmp_path):
    """Every shared store, three record boundaries each: truncate exits 0 and verify after it exits 0.
    The crash store is recovered first (truncate refuses a store whose abort file is present)."""
    for i, off in enumerate(boundaries(name)):
        root = store_copy(name, f"{name}-{i}")
        if name.endswith("crash"):
            assert run("recover", root, "--broker-version", 4).exit_code == 0
        dry = run("truncate", root, "--offset", off, "--dry-run", "--json")
        plan = plan_of(dry)
        assert dry.exit_code == plan["exitCode"] == (0 if plan["empty"] else 1)
        assert plan["expectedApplyExitCode"] == 0, plan["leftFindings"]
        r = run("truncate", root, "--offset", off)
        assert r.exit_code == 0, (off, r.output[-2000:])
        v = run("verify", root)
        assert v.exit_code == 0, (off, v.output[-2000:])


@pytest.mark.parametrize("name", CLEAN_STORES)
def test_rebuild_then_verify_is_clean(name, store_copy):
    """rebuild sets logicsMsgTimestamp / indexMsgTimestamp from what it rebuilt: after a cut left the
    checkpoint ahead (written by hand here), rebuild all leaves verify clean."""
    root = store_copy(name)
    recs = broker_read(name)["clmsg"]
    assert run("truncate", root, "--offset", recs[len(recs) // 2]["offset"]).exit_code == 0
    import struct

    with open(root / "checkpoint", "r+b") as f:  # logics and index times after every record
        f.seek(8)
        f.write(struct.pack(">qq", recs[-1]["msg"]["storeTimestamp"] + 10_000, recs[-1]["msg"]["storeTimestamp"] + 10_000))
    codes = {o["code"] for o in json_lines(run("verify", root, "--json").stdout) if "code" in o}
    assert {"CP_LOGICS_AHEAD", "CP_INDEX_AHEAD"} <= codes
    r = run("rebuild", "all", root)
    assert r.exit_code == 0, r.output[-2000:]
    assert run("verify", root).exit_code == 0


def test_rebuild_keeps_commitlog_damage_on_purpose(store_copy):
    """rebuild never changes the commitlog: a bad CRC there is named as kept, and the apply exits 0."""
    name = "4.9.3-clean"
    root = store_copy(name)
    bad = next(m for m in broker_read(name)["clmsg"][100:] if len(m["msg"]["bodyHex"]) > 200)
    flip_body_byte(root, name, bad)
    r = run("rebuild", "index", root)
    assert r.exit_code == 0, r.output[-2000:]
    assert "KEPT CL_BODY_CRC" in r.output and "kept on purpose" in r.output


@pytest.mark.parametrize("what,jobs", [("all", 1), ("index", 1), ("consumequeue", 1), ("all", 2)])
def test_applied_rebuild_keeps_what_its_plan_keeps(what, jobs, store_copy):
    """An applied rebuild runs no verify before it: what it keeps on purpose is sorted from verify after apply
    (in ``-j`` processes with -j). That list equals the one --dry-run predicts from verify before (commitlog
    damage, and the folders not rebuilt), and the exit code is the predicted one."""
    name = "4.9.3-clean"
    root = store_copy(name)
    bad = next(m for m in broker_read(name)["clmsg"][100:] if len(m["msg"]["bodyHex"]) > 200)
    flip_body_byte(root, name, bad)
    qfile = root / "consumequeue" / "OracleTopicA" / "1" / "00000000000000000000"
    with open(qfile, "r+b") as f:  # units that disagree with their records: kept unless consumequeue is rebuilt
        f.seek(100)
        f.write(b"\xff" * 40)
    dry = run("rebuild", what, root, "--dry-run", "--json")
    plan = next(o for o in json_lines(dry.stdout) if o.get("type") == "rebuild-plan")
    applied = run("rebuild", what, root, "--json", "--backup-dir", root.parent / f"bk-{what}", "-j", jobs)
    found = next(o for o in json_lines(applied.stdout) if o.get("type") == "rebuild-findings")
    key = lambda d: (d["code"], d.get("path"), d.get("offset"))  # noqa: E731
    assert sorted(map(key, found["keptFindings"])) == sorted(map(key, plan["keptFindings"])), applied.output[-3000:]
    assert any(k[0] == "CL_BODY_CRC" for k in map(key, plan["keptFindings"]))
    assert any(k[1].startswith("consumequeue") for k in map(key, plan["keptFindings"])) == (what == "index")
    assert applied.exit_code == plan["expectedApplyExitCode"] == 0, applied.output[-3000:]


# --- every shared store, both broker versions ---------------------------------------------------------


@pytest.mark.parametrize("name", STORE_NAMES)
def test_shared_stores_follow_the_contract(name, store_copy):
    """dry-run exit 0 <=> empty plan; applied exit = the plan's prediction; 4.9.3 vs 5.3.3 differ only
    where the plans show the brokers deciding differently."""
    exits = {}
    plans = {}
    for v in (4, 5):
        root = store_copy(name, f"{name}-v{v}")
        dry, plan, applied = dry_and_apply(root, v, "--keep-valid-after")
        check_contract(dry, plan, applied)
        exits[v], plans[v] = dry, plan
    if exits[4] != exits[5]:
        assert broker_decisions(plans[4]) != broker_decisions(plans[5])


def broker_decisions(plan: dict) -> tuple:
    cl = plan["commitlog"]
    return (tuple(plan["refusals"]), tuple(plan["dataLoss"]), cl.get("recoveredEnd"), cl.get("startOffset"),
            tuple(sorted((a["action"], os.path.basename(a["path"] or ""), json.dumps(a.get("fields"), sort_keys=True))
                         for a in plan["actions"])))


# --- the fuzz classes -----------------------------------------------------------------------------------

CONTRACT_CASES = int(os.environ.get("RMQSTORE_FUZZ_CONTRACT_CASES", "30"))
CONTRACT_SEED = int(os.environ.get("RMQSTORE_FUZZ_SEED", "20261122") if os.environ.get("RMQSTORE_FUZZ_SEED") != "random"
                    else random.randrange(100000))


def contract_case(tmp_path, label: str, name: str, damaged, dmg, fuzzlib) -> list[str]:
    """recover --dry-run then recover, on a copy per broker version of the damaged store ``damaged`` (a clone whose
    untouched files are hard links to the template: every file is copied here before recover may write it)."""
    failures, results = [], {}
    for v in (4, 5):
        root = tmp_path / f"{label}-v{v}"
        shutil.copytree(damaged, root, symlinks=True)
        for dp, _, fs in os.walk(root):
            for f in fs:
                os.chmod(os.path.join(dp, f), 0o644)
        d = fuzzlib.run_cli(["recover", "--dry-run", "--json", "--broker-version", str(v), "--keep-valid-after", str(root)])
        probs = fuzzlib.problems_of(d, {0, 1, 2, 3})
        plans = [o for o in fuzzlib.json_lines(d.stdout) if o.get("type") == "recover-plan"]
        if d.exit_code == 3 or not plans:
            results[v] = (d.exit_code, None)
            shutil.rmtree(root, ignore_errors=True)
            if probs:
                failures.append(f"{label} v{v} [{name}] {dmg.describe()}: {probs}")
            continue
        plan = plans[0]
        bk = tmp_path / f"bk-{label}-{v}"
        a = fuzzlib.run_cli(["recover", "--broker-version", str(v), "--keep-valid-after", "--backup-dir", str(bk), str(root)])
        probs += fuzzlib.problems_of(a, {0, 1, 2, 3})
        if d.exit_code != plan["exitCode"]:
            probs.append(f"dry-run exit {d.exit_code} != plan exitCode {plan['exitCode']}")
        repairs = [a for a in plan["actions"] if not a.get("housekeeping")]
        fixes = any(f.get("severity") in ("error", "warning") for f in plan["fixedFindings"])
        empty = not (repairs or fixes or plan["refusals"] or plan["dataLoss"] or plan["keptFindings"]
                     or plan["leftFindings"])
        if (d.exit_code == 0) != empty:
            probs.append(f"dry-run exit {d.exit_code} but plan empty={empty}")
        if a.exit_code != plan["expectedApplyExitCode"]:
            probs.append(f"applied exit {a.exit_code} != predicted {plan['expectedApplyExitCode']}: "
                         f"{a.stderr.strip().splitlines()[-1:] if a.stderr else ''}")
        results[v] = (d.exit_code, plan)
        if probs:
            failures.append(f"{label} v{v} [{name}] {dmg.describe()}: " + "; ".join(probs))
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(bk, ignore_errors=True)
    (e4, p4), (e5, p5) = results[4], results[5]
    if p4 is not None and p5 is not None and e4 != e5 and broker_decisions(p4) == broker_decisions(p5):
        failures.append(f"{label} [{name}] {dmg.describe()}: 4.9.3 exits {e4}, 5.3.3 exits {e5}, "
                        "but the plans show the same broker decisions")
    return failures


def test_fuzz_damage_follows_the_contract(tmp_path):
    """Seeded damage to copies of the broker stores, for both broker versions: the dry-run and the applied
    recover keep the contract. First one case of every fuzz class (damage kind x operation of tests/fuzzlib.py)
    on the small store (ext damage on the ext store), then RMQSTORE_FUZZ_CONTRACT_CASES random cases."""
    from tests import fuzzlib

    print(f"\ncontract fuzz seed {CONTRACT_SEED}: every class, then {CONTRACT_CASES} random cases "
          f"(RMQSTORE_FUZZ_SEED={CONTRACT_SEED} RMQSTORE_FUZZ_CONTRACT_CASES=n)")
    failures, covered, missed = [], [], []
    digests = {}  # each template's files, read when it is made: the cases' clones hard-link to them

    def template_of(name):
        dest = tmp_path / "templates" / name
        if name not in digests:
            fuzzlib.make_template(name, dest)
            digests[name] = fuzzlib.content_digest(dest)
        return dest

    sweep = [("5.3.3-v2topic", k) for k in fuzzlib.KINDS if k != "ext"] + [("4.9.3-ext", "ext")]
    for name, kind in sweep:
        m = fuzzlib.model(name)
        if not m.by_kind(kind):
            continue
        template = template_of(name)
        for op in fuzzlib.OPS:
            for k in range(400):  # the class is drawn inside fuzzlib: draw until this one comes up
                rng = random.Random(f"{CONTRACT_SEED}:contract:{name}:{kind}:{op}:{k}")
                damaged = tmp_path / f"class-{kind}-{op}"
                dmg = fuzzlib.plan_and_apply(rng, m, lambda touched: fuzzlib.clone(template, damaged, touched))
                if (dmg.kind, dmg.op) == (kind, op):
                    failures += contract_case(tmp_path, f"class {kind}/{op} (k={k})", name, damaged, dmg, fuzzlib)
                    covered.append(f"{kind}/{op}")
                    shutil.rmtree(damaged, ignore_errors=True)
                    break
                shutil.rmtree(damaged, ignore_errors=True)
            else:
                missed.append(f"{kind}/{op}")  # e.g. swap of a kind with one file: fuzzlib turns it into a bitflip
    print(f"classes covered: {len(covered)}; not producible: {missed}")
    weights = {"5.3.3-v2topic": 6, "4.9.3-clean": 1, "4.9.3-crash": 1, "5.3.3-clean": 1, "4.9.3-ext": 1}
    names = list(weights)
    for case in range(CONTRACT_CASES):
        rng = random.Random(f"{CONTRACT_SEED}:contract:{case}")
        name = rng.choices(names, [weights[n] for n in names])[0]
        m = fuzzlib.model(name)
        template = template_of(name)
        damaged = tmp_path / f"case{case}"
        dmg = fuzzlib.plan_and_apply(rng, m, lambda touched: fuzzlib.clone(template, damaged, touched))
        failures += contract_case(tmp_path, f"case {case}", name, damaged, dmg, fuzzlib)
        shutil.rmtree(damaged, ignore_errors=True)
    assert not failures, f"seed {CONTRACT_SEED}: {len(failures)} failures:\n" + "\n".join(failures[:12])
    for name, before in digests.items():
        assert fuzzlib.content_digest(tmp_path / "templates" / name) == before, f"template of {name} was written"


@pytest.mark.parametrize("name", ["4.9.3-ext", "5.3.3-v2topic"])
def test_rebuild_dry_run(name, store_copy):
    """rebuild --dry-run changes nothing; 0 on a clean store, 1 once a consume queue lost units (the plan names
    them as fixed), and the applied rebuild then exits 0 as predicted."""
    from .conftest import tree_digest

    root = store_copy(name)
    before = tree_digest(root)
    r = run("rebuild", "all", root, "--dry-run", "--json")
    plan = next(o for o in json_lines(r.stdout) if o.get("type") == "rebuild-plan")
    assert r.exit_code == 0 and plan["empty"], r.output
    assert tree_digest(root) == before
    assert not (root.parent / (root.name + ".rmqstore-backup")).exists()
    qdir = root / "consumequeue"
    topic = sorted(os.listdir(qdir))[0]
    shutil.rmtree(qdir / topic / sorted(os.listdir(qdir / topic))[0])
    r = run("rebuild", "consumequeue", root, "--dry-run", "--json")
    plan = next(o for o in json_lines(r.stdout) if o.get("type") == "rebuild-plan")
    assert r.exit_code == 1 and {f["code"] for f in plan["fixedFindings"]} == {"CQ_NOT_DISPATCHED"}
    applied = run("rebuild", "consumequeue", root)
    assert applied.exit_code == plan["expectedApplyExitCode"] == 0, applied.output[-2000:]


def test_short_file_check_walks_a_mapped_file_to_its_blank(tmp_path):
    """outcome._ends_with_blank (the LOST_SHORT_FILE rule) on a broker segment, cut copies and an empty file."""
    from rmqstore_cli.engine.repair.outcome import _ends_with_blank

    src = sorted((shared_store("4.9.3-clean") / "commitlog").iterdir())[0]
    data = src.read_bytes()
    cases = {"whole": (data, True), "cut": (data[:len(data) // 2], False), "empty": (b"", False)}
    for name, (content, want) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        assert _ends_with_blank(str(p)) is want, name
