"""study/reproduce.py and grids.py, train.py stood in for (Children.run) but in one slow test;
study/walkthrough.py as a script on a small model of data/tiny: the paper's argument, run."""
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import ENV, ROOT, TINY_MODEL, commands
from study import grids, reproduce
from study.grids import Variant

ONE = {"g": [Variant("a", "config/baseline_char.py", [], None, "", 0)]}
G = ["--grid=g", "--max_iters=8", "--results_dir=res[1]"]   # a pattern: matched literally


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):   # each test's results folders: its own
    monkeypatch.chdir(tmp_path)


def dry(capsys, *argv):   # what a dry run of argv prints (the grids, and g)
    assert reproduce.main([*argv, "--dry_run"], {**grids.GRIDS, **ONE}) == 0
    return capsys.readouterr().out


def refused(*argv):   # the one sentence argv is refused with
    with pytest.raises(SystemExit) as e:
        reproduce.main(list(argv), {**grids.GRIDS, **ONE})
    assert str(e.value.code).startswith("error:") and "\n" not in str(e.value.code), e.value.code
    return str(e.value.code)


def args_of(seed, iters=8):
    return reproduce.run_args(ONE["g"][0], iters, [], seed, f"res[1]/runs/a/seed{seed}")


def interrupted(seed, run_json=(), **change):
    """Seed's folder as a stop leaves it: a checkpoint (config `change`d), run.json (None: none)."""
    import torch
    run = Path(f"res[1]/runs/a/seed{seed}")
    run.mkdir(parents=True)
    config = {**reproduce.train_config("config/baseline_char.py", tuple(args_of(seed))),
              "out_dir": "moved/elsewhere", "init_from": "resume", **change}
    torch.save({"model": {"w": torch.zeros(2)}, "optimizers": [], "model_args": {},
                "config": config, "iter_num": 4, "best_val_loss": 2.0, "vocab": {}},
               run / "ckpt_0000004.pt")
    (run / "latest").write_text("ckpt_0000004.pt")
    if run_json is not None:
        (run / "run.json").write_text(json.dumps({"args": [*args_of(seed), *run_json],
                                                  "wall_s": 3.0}))
    return run, {p.name: p.read_bytes() for p in run.iterdir()}


def test_done_runs_are_skipped_interrupted_resumed_failed_run_again(tmp_path, monkeypatch, capsys):
    """Seeds 1 done, 2 interrupted, 3 failed once, 4 torn; 5-8 not the grid's: kept, never run."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(reproduce, "ROOT", str(tmp_path))
    Path("train.py").write_text("x = 1")
    git("init", "-q"), git("add", "."), git("commit", "-qm", "one")
    Path("res1/runs/a/seed1").mkdir(parents=True)   # res[1] is no pattern that reaches res1
    Path("res1/runs/a/seed1/ckpt_0000010.pt").write_text("another grid's")
    done = {"variant": "a", "seed": 1, "args": args_of(1), "val_loss": 2.0, "wall_s": 1.0,
            "curve": [[0, 4.0], [8, 2.0]], "sv_means": {}}
    for seed, result in ((1, json.dumps(done)), (4, '{"variant": "a", "se')):
        os.makedirs(f"res[1]/runs/a/seed{seed}")
        Path(f"res[1]/runs/a/seed{seed}/result.json").write_text(result)
    run, files = interrupted(2)
    calls = []   # (command, the bytes of the checkpoint it may resume, None if gone)

    def train(self, cmd, stdout, **kw):   # a train.py that ends at once, its metrics torn
        out, n = reproduce.arg_value(cmd, "out_dir"), int(reproduce.arg_value(cmd, "max_iters"))
        ckpt, metrics = Path(out, "ckpt_0000004.pt"), Path(out, "metrics.jsonl")
        calls.append((cmd[3:], ckpt.read_bytes() if ckpt.exists() else None))
        if "--init_from=resume" not in cmd and (metrics.exists() or [*Path(out).glob("ckpt*")]):
            return stdout.write("error: out_dir holds a run\n") and 1   # as train.py refuses
        recs = [{"kind": "eval", "iter": i, "val_loss": 3.0 - i / 8, "train_loss": 2.5}
                for i in range(0, n + 1, 4)] + [{"kind": "final", "iter": n, "val_loss": 1.5}]
        if len(calls) == 2:   # seed 3, the first time: SIGKILLed after logging step 0
            metrics.write_text(json.dumps(recs[0]) + "\n")
            return stdout.write("the last line\n") and -9
        metrics.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"kind": "eval", "it')
        Path(out, f"ckpt_{n:07d}.pt").write_bytes(b"ckpt")
        return 0
    out = dry(capsys, *G, "--seeds=4")
    assert re.findall(r"^(done|resume|to do) ", out, re.M) == ["done", "resume", "to do", "to do"]
    with reproduce.lock_results("res[1]"):   # held: a second reproduce.py here is refused
        msg = refused(*G)
    assert f"results folder res[1] is in use by another process (pid {os.getpid()})" in msg, msg
    Path("res.txt").write_text("")
    assert refused(*G, "--results_dir=res.txt") == (
        "error: the results folder res.txt is a file: move it away or pass another --results_dir")
    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(
        ("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(
        ("replace", os.path.abspath(b))) or replace(a, b))
    monkeypatch.setattr(reproduce.Children, "run", train)
    lost = [interrupted(5, learning_rate=0.01), interrupted(6, None),
            interrupted(7, ["--learning_rate=0.002"], learning_rate=0.01)]
    Path("res[1]/runs/a/seed8").mkdir()   # a train.py run there by hand, killed before it saved
    Path("res[1]/runs/a/seed8/metrics.jsonl").write_text("{}\n")
    lost.append((Path("res[1]/runs/a/seed8"), {"metrics.jsonl": b"{}\n"}))
    for more in ([], ["--replace"], ["--replace", "--dry_run"]):   # none lets them through
        assert refused(*G, "--seeds=8", *more) == (
            "error: run folders of res[1] hold checkpoints or logs this grid cannot account for "
            "(res[1]/runs/a/seed5: ckpt_0000004.pt was trained with learning_rate=0.01 where its "
            "run.json says 0.001; res[1]/runs/a/seed6: no readable run.json; res[1]/runs/a/seed7: "
            "ckpt_0000004.pt was trained with learning_rate=0.01 where its run.json says 0.002; "
            "res[1]/runs/a/seed8: no readable run.json): they are neither resumed nor deleted; "
            "move them elsewhere (or delete them yourself), or use another --results_dir")
    assert [{p.name: p.read_bytes() for p in run.iterdir()} for run, _ in lost] == [
        files for _, files in lost]   # no tool deletes what it cannot account for
    assert reproduce.main([*G, "--seeds=4", "--jobs=1"], ONE) == 1
    assert "a seed 3: FAILED (exit -9, stopped at iteration 0: the last line)" in (
        capsys.readouterr().out)
    Path("train.py").write_text("x = 2")   # seed 3's second try runs an edit
    assert reproduce.main([*G, "--seeds=4", "--jobs=1"], ONE) == 0
    assert calls == [([*args_of(2), "--init_from=resume"], files["ckpt_0000004.pt"]),
                     (args_of(3), None), (args_of(4), None), (args_of(3), None)], calls
    renamed = [(i, to) for i, (what, to) in enumerate(events) if what == "replace"]
    assert {os.path.basename(to) for _, to in renamed} == {
        "run.json", "result.json", "summary.json", "summary.md"}, events
    for i, to in renamed:   # fsynced as a temporary, renamed, its folder fsynced: never torn
        assert any(path.startswith(f"{to}.tmp") for _, path in events[:i]), (to, events)
        assert ("fsync", os.path.dirname(to)) in events[i + 1:], (to, events)
    result = json.loads((run / "result.json").read_text())
    assert result["wall_s"] >= 3.0 and result["val_loss_full"] == 1.5
    assert result["curve"] == [[0, 3.0], [4, 2.5], [8, 2.0]]
    assert not list(run.glob("ckpt_*"))   # a CPU run's checkpoints go once its result is written
    clean, edit = (reproduce.load_result(f"res[1]/runs/a/seed{s}")["code"] for s in (2, 3))
    assert clean["commit"] == edit["commit"] == git("rev-parse", "HEAD") and not clean["diff"]
    assert edit["diff"] and edit["id"] != clean["id"], (clean, edit)
    assert (f"1 by {edit['id']} (commit {edit['commit'][:12]}, uncommitted edits "
            f"{edit['diff']})") in Path("res[1]/summary.md").read_text()
    Path("notes.md").write_text("prose")   # not code: the same code
    assert reproduce.code_version() == edit
    Path("y.py").write_text("")   # a new .py file is an edit
    assert reproduce.code_version()["diff"] not in (None, edit["diff"])
    assert os.listdir("res1/runs/a/seed1") == ["ckpt_0000010.pt"]
    # an edited result.json is no result: the grid's own run starts afresh over its files
    (run / "result.json").write_text(json.dumps({**result, "val_loss": "1.9"}))
    assert reproduce.main([*G, "--seeds=4", "--jobs=1"], ONE) == 0
    accounted = {"args": [*args_of(5), "--learning_rate=0.01"]}   # as its checkpoint was trained
    (lost[0][0] / "run.json").write_text(json.dumps(accounted))   # --replace runs over it too
    assert reproduce.main([*G, "--seeds=5", "--jobs=1", "--max_iters=12", "--replace"], ONE) == 0
    assert calls[4:] == [(args_of(2), None), *((args_of(s, 12), None) for s in range(1, 6))]


def test_every_file_of_a_run_folder_is_accounted_for_when_the_grid_acts_on_it(monkeypatch,
                                                                             capsys):
    """An older checkpoint of other settings beside the grid's newer one: refused (a dry run and
    --replace too), neither resumed nor deleted. Folders filled while the grid runs seed 1, read
    again at their turn: seed 2's finished run (copied from a cluster) is done, seed 3's checkpoint
    of other settings (no run.json) fails that run; each left as it is."""
    import torch
    snapshot = lambda run: {p.name: p.read_bytes() for p in run.iterdir()}   # noqa: E731
    calls, filled, before = [], {}, {}

    def train(self, cmd, stdout, **kw):   # seed 1's train.py; meanwhile seeds 2 and 3 are filled
        out, n = reproduce.arg_value(cmd, "out_dir"), int(reproduce.arg_value(cmd, "max_iters"))
        calls.append(out)
        done = {"variant": "a", "seed": 2, "args": args_of(2), "val_loss": 2.0, "wall_s": 1.0,
                "curve": [[0, 4.0], [8, 2.0]], "sv_means": {}}
        if not filled:   # once, during seed 1's run
            for seed, extra in ((2, {}), (3, dict(run_json=None, learning_rate=0.01))):
                filled[seed] = interrupted(seed, **extra)[0]
            (filled[2] / "result.json").write_text(json.dumps(done))
            (filled[2] / "metrics.jsonl").write_text('{"kind": "eval", "iter": 8}\n')
            before.update({seed: snapshot(run) for seed, run in filled.items()})
        recs = [{"kind": "eval", "iter": i, "val_loss": 2.0, "train_loss": 2.0} for i in (0, n)]
        Path(out, "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return 0
    monkeypatch.setattr(reproduce.Children, "run", train)
    run, _ = interrupted(1)
    state = torch.load(run / "ckpt_0000004.pt", weights_only=True)
    torch.save({**state, "iter_num": 2, "config": {**state["config"], "learning_rate": 0.01}},
               run / "ckpt_0000002.pt")   # an older run's, by hand
    files = snapshot(run)
    for more in ([], ["--dry_run"], ["--replace"]):
        assert refused(*G, "--seeds=1", *more) == (
            "error: run folders of res[1] hold checkpoints or logs this grid cannot account for "
            "(res[1]/runs/a/seed1: ckpt_0000002.pt was trained with learning_rate=0.01 where its "
            "run.json says 0.001): they are neither resumed nor deleted; move them elsewhere (or "
            "delete them yourself), or use another --results_dir")
    assert snapshot(run) == files and calls == []
    shutil.rmtree(run)
    assert "3 runs, 0 done, 3 to do" in dry(capsys, *G, "--seeds=3")
    assert reproduce.main([*G, "--seeds=3", "--jobs=1"], ONE) == 1
    assert calls == ["res[1]/runs/a/seed1"], calls
    out = capsys.readouterr().out
    assert "a seed 2: done by its turn (a result of these settings came): left as it is" in out
    assert ("a seed 3: FAILED (not started: run folders of res[1] hold checkpoints or logs this "
            "grid cannot account for (res[1]/runs/a/seed3: no readable run.json)") in out, out
    assert {seed: snapshot(run) for seed, run in filled.items()} == before


@pytest.mark.slow   # it recomputes every committed summary
def test_rows_run_what_their_names_say_the_readme_plans_and_the_summaries_regenerate(
        monkeypatch, capsys):
    """Results are read by their row's name, and a results folder holds one grid's settings."""
    checkout = {p: p.stat().st_mtime_ns for p in Path(ROOT, "study/results").rglob("summary.*")}
    for grid in grids.GRIDS.values():
        assert all(reproduce.name_says(v.name) and reproduce.check_named(v) for v in grid())
    assert grids.parse_added("w:config/unified_char.py:--n_embd=192,--n_head=6::-1:ER: lower",
                             grids.default_grid()) == Variant(   # the claim keeps its colons
        "w", "config/unified_char.py", ["--n_embd=192", "--n_head=6"], "baseline", "ER: lower", -1)
    for arg, words in [
            ("--add=..:config/baseline_char.py", "NAME must be new to the grid, made of letters"),
            ("--add=unified_novec:config/unified_char.py", "its name says otherwise of what "
             "config/unified_char.py runs: sv_placement='dnp', not 'dnp_novec'"),
            ("--add=baseline_lr2e-3:config/baseline_char.py", "learning_rate=0.001, not 0.002"),
            ("--add=baseline_s133:config/baseline_char.py:--max_iters=1976",   # s<n>: its steps
             "max_iters=1976, not 133"),
            ("--add=baseline_x2:config/moe_baseline_char.py", "runs: n_experts=4 (study/repro")]:
        assert words in refused("--grid=regime", "--dry_run", arg), arg
    dry(capsys, "--grid=lr", "--seeds=1", "--add=unified_novec:config/unified_char.py:"
        "--sv_placement=dnp_novec:baseline_lr1e-3")
    assert os.listdir() == []   # bad input is one sentence, nothing written
    # a committed summary.json's floats: within a relative 1e-9 (NaN equal); exact but for the
    # scaling fit's power laws (numpy): 4e-14 apart across CPUs
    close = lambda text: pytest.approx(float(text), rel=1e-9, abs=0, nan_ok=True)   # noqa: E731
    shutil.copytree(Path(ROOT, "study/results"), "study/results",   # the runs' --out_dir: relative
                    ignore=shutil.ignore_patterns("*.png", "summary.*"))
    Path("data/shakespeare_char").mkdir(parents=True)   # regime's epoch cap: train.bin's size,
    Path("data/shakespeare_char/train.bin").write_bytes(bytes(2 * 1_003_854))   # not meta.json's
    Path("data/shakespeare_char/meta.json").write_text('{"train_tokens": 1e15}')
    monkeypatch.setattr(reproduce.Runner, "__call__", lambda *a: pytest.fail("must not run"))
    monkeypatch.setattr(reproduce, "plot_grid", lambda *a, **k: None)   # plots: the slow test
    monkeypatch.setattr(reproduce, "plot_report", lambda *a, **k: None)
    # a summary is of its results alone: a slow invocation (10 min a clock reading) changes none
    monkeypatch.setattr(reproduce.time, "time", itertools.count(0, 600).__next__)
    msg = refused("--max_iters=500", "--dry_run")   # other settings than its runs'
    assert ("66 of these runs with other settings" in msg and "has --max_iters=1000" in msg
            and "--max_iters=500" in msg and "--replace" in msg and "--results_dir" in msg), msg
    assert "0 done, 66 to do" in dry(capsys, "--max_iters=500", "--replace")
    lines = [w[3:] for w in commands("study/README.md") if w[1:3] == ["-m", "study.reproduce"]]
    ran = {shlex.join(args): dry(capsys, *args) for args in lines   # but <placeholders>
           if "--dataset=" not in str(args) and "<" not in str(args)}
    assert "66 runs, 66 done, 0 to do" in ran[""]   # more seeds of some variants: not a change
    # 2x64 at 100 tokens/param: 13,920 iterations x 768 tokens over 1,003,854
    assert "over --max_epochs=3.5: baseline_2x64_t100 (10.7 epochs), " in ran[
        "--grid=regime --max_epochs=3.5"] and len(ran) >= 6, ran
    out = dry(capsys, "--grid=node", "--nproc_per_node=8", "--seeds=2", "--tokens=1e9",
              "--tokens_per_s=1e6")
    # 1e9 tokens / 524,288 per iteration: 1908 iterations; warmup 700 of 19,073 scales to 70
    assert "--max_iters=1908 --lr_decay_iters=1908 --warmup_iters=70 --eval_interval=190" in out
    assert "6.00B tokens to train" in out and "1.7 h (at the given 1,000,000 tokens/s)" in out
    assert reproduce.Runner({}, None, ["--standalone"]).launch() == [
        sys.executable, "-m", "torch.distributed.run", "--standalone"]   # what runs it
    for path in sorted(Path(ROOT, "study/results").glob("*/summary.md")):   # all 10
        old = path.read_text().splitlines()
        argv = shlex.split(old[2].split("`")[1])[3:]   # "Last command: `python -m ...`"
        # a summary is of the whole grid: the default grid's, whatever --variants
        assert reproduce.main(argv + ["--variants=noscale"] * (argv == ["--summary_only"])) == 0
        new = Path("study/results", path.parent.name, "summary.md").read_text().splitlines()
        assert new[3:] == old[3:] and len(old) > 10, path
        new, old = ({**json.loads(Path(r, "study/results", path.parent.name, "summary.json")
                                  .read_text(), parse_float=f, parse_constant=f), "command": None}
                    for r, f in ((".", float), (ROOT, close)))
        assert new == old, path
    assert checkout == {p: p.stat().st_mtime_ns   # written under tmp only
                        for p in Path(ROOT, "study/results").rglob("summary.*")}


def test_each_train_py_leads_a_session_of_its_own_and_no_run_starts_after_a_stop():
    """So that a terminal's Ctrl-C reaches a train.py once (from reproduce.py: the slow test)."""
    children = reproduce.Children()
    leads = "import os, sys; sys.exit(os.getsid(0) == os.getpid())"
    assert children.run([sys.executable, "-c", leads]) == 1
    with children.forwarding():
        os.kill(os.getpid(), signal.SIGTERM)
    assert children.stop == signal.SIGTERM
    with pytest.raises(reproduce.Interrupted, match=reproduce.NOT_STARTED):
        children.run([sys.executable, "-c", ""])


@pytest.mark.slow   # train.py in subprocesses
def test_ctrl_c_stops_a_grid_of_train_py_runs_which_resume_and_summarize(workdir, monkeypatch,
                                                                         capsys):
    """Each train.py saves on a Ctrl-C; the same command resumes each iteration once."""
    monkeypatch.chdir(workdir)
    grid = {"t": [Variant("base", "config/baseline_char.py", [], None, "", 0),
                  Variant("hg", "config/hetero_char.py", [], "base", "HG lowers the loss", -1)]}
    argv = ["--grid=t", "--seeds=1", "--max_iters=300", "--jobs=2", "--results_dir=res",
            "--extra=" + " ".join(TINY_MODEL)]
    runs = {v: workdir / "res" / "runs" / v / "seed1" for v in ("base", "hg")}

    def stop():   # Ctrl-C to reproduce.py, once both train.py train
        deadline = time.time() + 300
        while time.time() < deadline and not all(   # three steps logged by each
                reproduce.evals(run, "train")[2:] for run in runs.values()):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)
    old = signal.signal(signal.SIGINT, lambda *a: None)   # a late signal must not stop pytest
    try:
        threading.Thread(target=stop, daemon=True).start()
        assert reproduce.main(argv, grid) == 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGINT, old)
    out = capsys.readouterr().out
    assert out.count("interrupted (stopped at iteration") == out.count("resumes next time") == 2
    assert reproduce.main(argv, grid) == 0
    out = capsys.readouterr().out
    assert "0 done, 2 to do" in out and out.count(" s, resumed), ETA") == 2, out
    for run in runs.values():
        assert "resuming from" in (run / "train.log").read_text()
        assert [r["iter"] for r in reproduce.evals(run, "train")] == list(range(1, 301))
    rows = {r["variant"]: r for r in json.loads(Path("res/summary.json").read_text())["rows"]}
    loss = {v: reproduce.evals(run, "final")[-1]["val_loss"] for v, run in runs.items()}
    assert rows["hg"]["diff_mean"] == loss["hg"] - loss["base"]   # one float64 subtraction
    assert all(Path("res", png).stat().st_size > 1000
               for png in ("val_loss.png", "diff_vs_baseline.png", "scale_vectors.png"))


@pytest.mark.slow
def test_the_walkthrough_runs_as_a_script_and_shows_the_papers_argument(workdir, tmp_path):
    p = subprocess.run([sys.executable, "-m", "study.walkthrough", "--dataset=tiny",
                        "--max_iters=40", "--n_layer=2", "--n_embd=32", "--n_head=2",
                        "--block_size=32", f"--out_dir={tmp_path / 'walk'}"], cwd=workdir,
                       env={**ENV, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    out = p.stdout
    assert p.returncode == 0, p.stderr
    # a line every tenth of the steps: step, loss, elapsed seconds
    progress = re.findall(r"^(\w+) step (\d+)/40: loss \d+\.\d{4}, \d+ s$", out, re.M)
    assert progress == [(v, str(i)) for v in ("baseline", "unified") for i in range(4, 41, 4)], out
    assert sorted(f.name for f in (tmp_path / "walk").glob("*.png")) == [
        "folding.png", "g_per_layer.png", "loss.png", "preconditioning.png"]
    assert not (workdir / "out").exists()   # only the folder it was given
    # float32: the folded W * g rounds once, W(g * z) twice: 9.5e-7 measured at 4 x 64, logits 7.7
    diff = float(re.search(r"max \|logit difference\| (\S+) over", out).group(1))
    # float64: a difference of two close matrices; 2.8e-13 measured
    err = float(re.search(r"folded model's step, to a relative (\S+) \(", out).group(1))
    assert diff < 1e-4 and err < 1e-9 and "with g's own step, at least g_i^2: True" in out, out
    # DNP's output side has a Norm after it, so the walkthrough says why unified does not fold
    assert ("unified: cannot fold scale vectors: blocks.0.attn.qkv.g_out has a Norm, not a "
            "linear map, after it") in out, out
    assert re.search(r"unified - baseline: [-+]\d\.\d{4} val loss", out), out


@pytest.mark.slow
def test_ctrl_c_ends_the_walkthrough_without_a_traceback(workdir, tmp_path):
    """SIGINT mid-training (after its first progress line): exit 130, as sample.py, nothing on
    stderr."""
    p = subprocess.Popen([sys.executable, "-m", "study.walkthrough", "--dataset=tiny",
                          "--max_iters=2000", "--n_layer=1", "--n_embd=16", "--n_head=2",
                          "--block_size=16", "--batch_size=2", f"--out_dir={tmp_path / 'walk'}"],
                         cwd=workdir, env={**ENV, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,   # SIGINT at its default (sample's)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().startswith("baseline step 200/2000"), p.stderr.read()
    p.send_signal(signal.SIGINT)   # 1,800 steps of the baseline and 2,000 of unified to go
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "", err
