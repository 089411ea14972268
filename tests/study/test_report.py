"""report.time_to_loss: a variant's wall-clock efficiency from a grid's validation curves."""
import pytest

from study.report import time_to_loss


def runs(*curves):
    return {seed: {"curve": curve} for seed, curve in enumerate(curves, 1)}


def test_time_to_loss_interpolates_the_seed_mean_curves():
    # seed means: reference 4, 2, 1 (target 1); variant 4, 1.5, 0.8: it reaches 1 at
    # 100 + 100 * 0.5 / 0.7
    results = {"baseline": runs([[0, 4], [100, 2.5], [200, 1.25]],
                                [[0, 4], [100, 1.5], [200, 0.75]]),
               "unified": runs([[0, 4], [100, 1.5], [200, 0.8]])}
    r = time_to_loss(results, "unified", step_time_ratio=1.25)
    assert r["target_loss"] == 1.0 and r["reference_steps"] == 200
    assert r["steps"] == pytest.approx(100 + 100 * 0.5 / 0.7)
    assert r["token_efficiency"] == pytest.approx(200 / r["steps"])
    assert r["wallclock_efficiency"] == pytest.approx(r["token_efficiency"] / 1.25)


def test_time_to_loss_says_so_when_the_variant_never_gets_there():
    results = {"baseline": runs([[0, 4], [100, 1.0]]), "noscale": runs([[0, 4], [100, 1.1]])}
    r = time_to_loss(results, "noscale")
    assert r["steps"] is None and r["token_efficiency"] is None
    assert r["wallclock_efficiency"] is None
