"""Shared test fixtures: where ../shared lives, and a skip with a reason when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XBENCH_SHARED", REPO.parent / "shared"))
TEST_DEVICE = os.environ.get("XBENCH_TEST_DEVICE", "cpu")


# The files that take longest (wall seconds alone on 2 cores, docs/perf/suite_durations_2core.txt), started first: `make test`
# runs the suite on two pytest-xdist workers, one file per worker at a time (``--dist loadfile``, each file's
# module fixtures built once), and a long file taken last would leave one worker running alone at the end.
FIRST = ("tests/notebooks/test_notebooks.py", "tests/security/test_written_files.py", "tests/benchmarks/test_bench_gpu.py",
         "tests/evaluation/test_eval_parallel.py", "tests/inference/test_cache.py", "tests/workflows/test_score.py",
         "tests/models/test_contract.py", "tests/explain/test_explainers.py", "tests/models/test_beyond_biovil_medclip.py",
         "tests/models/test_parity_mavl.py")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker takes its share of the cores for torch's intra-op threads, and the processes it
    starts inherit it (``OMP_NUM_THREADS``): two workers of two threads each on two cores wait on each other. Tests that
    set a thread count themselves keep it; results do not depend on it (tests/metrics/test_blas_portability.py)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        share = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        torch.set_num_threads(share)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the tests of :data:`FIRST` to the front, in that order; the rest keep pytest's order."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def shared_path(*parts: str) -> Path:
    """Path under ``../shared``; skips the calling test with a reason if it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the real annotation files / parity fixtures live in ../shared next to the repo")
    return path


@pytest.fixture
def shared() -> Path:
    return shared_path()


@pytest.fixture(scope="session")
def test_device():
    """Device the model parity tests build their adapters on: ``XBENCH_TEST_DEVICE`` (default ``cpu``).

    Outputs are moved back to the CPU and compared with the same tolerances. On CUDA, TF32 is turned
    off for the session (float32 matmuls and convolutions stay full precision) and restored afterwards.
    """
    import torch

    device = torch.device(TEST_DEVICE)
    if device.type != "cuda":
        yield device
        return
    if not torch.cuda.is_available():
        pytest.fail(f"XBENCH_TEST_DEVICE={TEST_DEVICE!r} but torch sees no CUDA device")
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield device
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


@pytest.fixture(scope="session")
def phantom_cache(tmp_path_factory) -> Path:
    """One phantom cache for the whole session (``XBENCH_CACHE``), so splits are generated once and ~/.cache stays clean."""
    cache = tmp_path_factory.getbasetemp() / "xbench-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XBENCH_CACHE", str(cache))
        yield cache


def tiny_run(output_dir: Path, *, cases: int = 22, models: list | None = None, **changes) -> dict:
    """Raw run config of a small phantom run with the prior baselines (3 chunks of 8, batch 3, 64x64 grid)."""
    return {
        "output_dir": str(output_dir),
        "datasets": [{"name": "phantom", "split": "test", "cases": cases}],
        "models": models or ["center_prior", "random_prior", {"name": "anatomical_prior", "fit_split": "prior"}],
        "grid": [64, 64], "chunk_size": 8, "batch_size": 3, "bootstrap": {"replicates": 20, "seed": 0},
        **changes,
    }


@pytest.fixture(scope="session")
def phantom_run(tmp_path_factory, phantom_cache) -> Path:
    """The run of :func:`tiny_run` (22 phantom cases, the three priors), run once for the whole session.

    Read-only for the tests that use it: a test that writes into a run folder (evaluates again, builds a
    report, runs a notebook) works on :func:`copy_run` of it.
    """
    import warnings

    import torch

    from xbench.spec.config import RunConfig
    from xbench.core.errors import XBenchWarning
    from xbench.workflows.run import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("phantom-run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(RunConfig.from_dict(tiny_run(out)), progress=False)
    torch.set_num_threads(threads)
    return out


def copy_run(run_dir: Path, to: Path) -> Path:
    """A copy of a run folder (store, fitted priors, tables) at ``to``, for a test that writes into it."""
    import shutil

    shutil.copytree(run_dir, to)
    return to


class Files:
    """A minimal dataset for the input feed's tests: rows → samples reading the given image paths."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from xbench.datasets import Sample

        return Sample(case_id=f"c{i}", dataset="files", image_path=self.paths[i], size=(0, 0), view=None, labels={})


@pytest.fixture()
def two_datasets(tmp_path, monkeypatch) -> list[dict]:
    """The phantom test split and a second dataset (the phantom manifest under another name, from a config path)."""
    from xbench.spec import registry

    monkeypatch.setattr(registry, "MODEL_CONFIG_DIRS", list(registry.MODEL_CONFIG_DIRS))
    monkeypatch.setattr(registry, "MANIFEST_DIRS", list(registry.MANIFEST_DIRS))
    folder = tmp_path / "configs"
    (folder / "datasets").mkdir(parents=True)
    (folder / "datasets" / "phantom_b.yaml").write_text((registry.PACKAGE_DIR.parent / "data_manifests" /
                                                         "phantom.yaml").read_text())
    registry.add_search_dir(folder)
    return [{"name": "phantom", "split": "test", "cases": 12}, {"name": "phantom_b", "split": "test", "cases": 10}]
