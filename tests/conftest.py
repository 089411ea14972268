import re
from collections import Counter

import pytest
import torch

from helpers import tiny_corpus   # and the repo root on sys.path, for the project's modules


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("train"))


@pytest.fixture
def one_thread():
    """torch on one thread: models this small run 5-10x faster than on 2 threads of a busy 2-core
    CPU (check_folding 3.5 -> 0.6 s, an export 10-50x), and sample as sample.py does (ENV)."""
    threads = torch.get_num_threads()
    yield torch.set_num_threads(1)
    torch.set_num_threads(threads)


def pytest_configure(config):   # `-m "not slow"` leaves them out
    config.addinivalue_line("markers", "slow: a test of several processes, or a walk over every "
                            "result or flag combination: 10-40 s on 2 cores")


def pytest_terminal_summary(terminalreporter):
    """`-q` only counts skips: say which optional packages the skipped tests needed."""
    reasons = (str(r.longrepr[2] if isinstance(r.longrepr, tuple) else r.longrepr)
               for r in terminalreporter.stats.get("skipped", []))
    missing = Counter(m.group(1) for m in map(re.compile(r"could not import '([\w.]+)'").search,
                                              reasons) if m)
    for package, n in sorted(missing.items()):
        terminalreporter.write_line(
            f"skipped {n} test(s) that need {package}: pip install -r requirements-test.txt" +
            (" (every export is still checked by an independent Llama forward, helpers."
             "llama_forward)" if package == "transformers" else ""))
