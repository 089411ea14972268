"""tools/plot_metrics.py: a short or interrupted run (one evaluation) is drawn with markers, not as
invisible one-point lines, its train-loss records too; the PNG goes into the run's folder unless
--out names a path."""
import json

import matplotlib.figure
import pytest

from tools import plot_metrics


def run(folder, evals, steps):
    """A run folder as train.py leaves it: train and eval records in metrics.jsonl."""
    folder.mkdir(parents=True)
    sv = {"blocks.0.attn.g_in": [1.1, 0.9, 1.3], "g_final": [0.8, 0.7, 0.9]}
    lines = [{"kind": "train", "iter": i, "loss": 4.0 - 0.01 * i} for i in range(1, steps + 1)]
    lines += [{"kind": "eval", "iter": i, "train_loss": 3.0, "val_loss": 3.1, "scale_vectors": sv,
               "moe": {}} for i in evals]
    lines.sort(key=lambda r: r["iter"])
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


@pytest.fixture
def drawn(monkeypatch):
    """The figures plot_metrics saves, kept for their lines."""
    figures, save = [], matplotlib.figure.Figure.savefig
    def keep(fig, *args, **kw):
        figures.append(fig)
        return save(fig, *args, **kw)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures


def test_a_run_with_one_evaluation_is_drawn_with_markers_into_its_folder(tmp_path, drawn):
    folder = run(tmp_path / "out" / "short", evals=[0], steps=7)   # stopped at step 7
    plot_metrics.main([str(folder)])
    png = folder / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loss, vectors = drawn[0].axes
    train, val = loss.lines
    assert list(train.get_xdata()) == list(range(1, 8)) and train.get_marker() == "o"
    assert list(val.get_xdata()) == [0] and val.get_marker() == "o"
    assert len(vectors.lines) == 2 and all(line.get_marker() == "o" for line in vectors.lines)


def test_several_runs_go_into_the_first_ones_folder_or_a_named_path(tmp_path, drawn):
    a = run(tmp_path / "a", evals=[0, 250, 500], steps=500)
    b = run(tmp_path / "b", evals=[0], steps=3)
    plot_metrics.main([str(a), str(b)])
    assert (a / "metrics_compared.png").is_file() and not (b / "metrics_compared.png").exists()
    loss = drawn[0].axes[0]
    # a's 500 train records stay a line; its 3 evaluations and b's 3 steps and 1 evaluation: dots
    assert [line.get_marker() for line in loss.lines] == ["None", "o", "o", "o"]
    plot_metrics.main([str(b), f"--out={tmp_path / 'named.png'}"])
    assert (tmp_path / "named.png").is_file()


def test_a_folder_without_records_is_one_sentence(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds no record in metrics.jsonl"):
        plot_metrics.main([str(tmp_path / "empty")])
