"""plot_metrics.py: gaps drawn where they can be read, markers, a legend; bad records: sentences."""
import json

import pytest

from tools import plot_metrics

SV = {"blocks.0.attn.qkv.g_in": [1.1, 0.9], "blocks.1.attn.qkv.g_in": [1.2, 1], "g_final": [1, 1]}


def run(folder, evals, steps, val=lambda i: 3 - i / 1000, extra=()):   # as train.py leaves it
    folder.mkdir(parents=True)
    lines = [{"kind": "train", "iter": i, "loss": 4 - i / 100} for i in range(1, steps + 1)] + [
        {"kind": "eval", "iter": i, "val_loss": val(i), "scale_vectors": SV} for i in evals]
    lines = sorted(lines, key=lambda r: r["iter"]) + list(extra)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def test_runs_show_the_gap_the_last_half_and_markers_on_few_points(tmp_path, monkeypatch):
    figures = []   # plot_metrics closes each figure it saved
    monkeypatch.setattr(plot_metrics.pyplot(), "close", figures.append)
    a = run(tmp_path / "a", evals=[0, 250, 500, 750, 1000], steps=1000)
    b = run(tmp_path / "b", evals=[0, 500, 1000], steps=1000, val=lambda i: 2.96 - i / 1000)
    c = run(tmp_path / "c", evals=[0], steps=7)   # stopped at step 7: markers, not invisible
    plot_metrics.main([str(a), str(b), str(c)])
    assert (a / "metrics_compared.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = {ax.get_title().split(" (")[0]: ax for ax in figures[0].axes if ax.get_title()}
    zero, gap, short = panels["gap to a"].lines   # at the evaluations both runs have
    assert list(gap.get_xdata()) == [0, 500, 1000] and list(zero.get_ydata()) == [0, 0]
    assert gap.get_ydata() == pytest.approx([-0.04] * 3, abs=1e-12)   # float rounding only
    assert [list(line.get_xdata()) for line in panels["val loss, last half"].lines] == [
        [500, 750, 1000], [500, 1000], []]
    assert [line.get_marker() for line in panels["loss"].lines] == ["None", "o"] * 2 + ["o"] * 2
    vectors = panels["c: 3 scale vectors"]   # the dash: a legend of kinds; g_final its own
    assert [t.get_text() for t in vectors.get_legend().get_texts()] == ["attn.qkv.g_in", "g_final"]
    plot_metrics.main([str(c), f"--out={tmp_path / 'c.png'}"])   # one run: nothing to compare
    assert (tmp_path / "c.png").is_file() and "gap" not in str([a.title for a in figures[1].axes])
    with pytest.raises(SystemExit, match=r"^error: cannot write .*/none/c.png \(No such file"):
        plot_metrics.main([str(c), f"--out={tmp_path / 'none' / 'c.png'}"])   # a missing folder


@pytest.mark.parametrize("record, why", [
    ({"kind": "eval", "val_loss": 3.0, "scale_vectors": {}}, "it has no 'iter'"),
    ({"kind": "eval", "iter": 9, "val_loss": 3.0}, "it has no 'scale_vectors'"),
    (None, "holds no record in metrics.jsonl")])   # an empty folder
def test_a_foreign_record_is_one_sentence_naming_file_and_line(tmp_path, record, why):
    folder = run(tmp_path / "r", evals=[0], steps=3, extra=[record]) if record else tmp_path
    with pytest.raises(SystemExit) as e:
        plot_metrics.main([str(folder)])
    where = f"{folder / 'metrics.jsonl'}, line 5: a " if record else f"{folder} "   # after 4 lines
    assert str(e.value).startswith(f"error: {where}") and why in str(e.value), e.value
    assert "\n" not in str(e.value)
