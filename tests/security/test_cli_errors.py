"""Every hostile input reaches the user as one ``xbench: error:`` line naming the file (and field), exit 2, no
traceback — bounded in time and memory by the file's size.

Each case of :data:`CASES` writes its files into a fresh folder and runs ``xbench ARGS`` in a subprocess under a
memory ceiling (``cli_runner.py``: one worker process, ``RLIMIT_AS`` = its size after imports + 1.5 GiB, running
:func:`xbench.cli.main` with its streams captured) and a time limit. To add a case, append a :class:`Case`
(``build(tmp) -> argv``, the texts the error line must hold). On 5da1164 the pickle
cases allocated gigabytes, hung (hashing or ``str`` of shared nested tuples) or ended in raw tracebacks; the
score-input cases ended in ``ValueError`` / ``MemoryError`` / PyTorch internal-assert tracebacks; the config
cases ran for minutes (YAML aliases) or gave tracebacks."""
from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

import hostile
import xbench

RUNNER = Path(__file__).with_name("cli_runner.py")
ROOT = Path(xbench.__file__).resolve().parents[1]  # the checkout whose xbench the tests import
TIME_LIMIT_S = 60


@dataclass
class Case:
    """``build(tmp)`` writes the files and returns the xbench arguments; ``expect``: texts of the error line."""

    id: str
    build: Callable[[Path], list[str]]
    expect: tuple[str, ...]
    forbid: tuple[str, ...] = field(default=())


def _score_chex(payload: bytes) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        folder = hostile.write_chexlocalize(tmp / "chex", payload)
        return ["score", "--chexlocalize", "--maps", str(folder), "--dataset", "phantom", "--option", "cases=4",
                "--output-dir", str(tmp / "out"), "--bootstrap", "0", "-q"]
    return build


def _score_maps(maps: dict, probs_csv: str | None = None, *extra: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        folder = hostile.write_npz_maps(tmp / "maps", maps, probs_csv)
        return ["score", "--maps", str(folder), "--dataset", "phantom", "--option", "cases=4", "--output-dir",
                str(tmp / "out"), "--bootstrap", "0", "-q", *extra]
    return build


def _score_npy(array: np.ndarray) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        folder = tmp / "maps"
        folder.mkdir()
        for i in range(4):
            np.save(folder / f"test_{i:05d}.npy", array)
        return ["score", "--maps", str(folder), "--dataset", "phantom", "--option", "cases=4", "--output-dir",
                str(tmp / "out"), "--bootstrap", "0", "-q", "--classes", *hostile.PHANTOM_CLASSES]
    return build


def _config(text: str) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        path = tmp / "run.yaml"
        path.write_text(text.replace("{tmp}", str(tmp)))
        return ["check", "--config", str(path), "--no-hash", "-q"]
    return build


def _with_maps(maps: dict, transform: Callable[[dict], dict]) -> dict:
    return transform({case: dict(arrays) for case, arrays in maps.items()})


GOOD = hostile.good_maps()
PROBS = "case_id," + ",".join(hostile.PHANTOM_CLASSES) + "\n" + "".join(
    f"{case}," + ",".join(["0.5"] * 3 + ["0.25"] + ["0.5"] * 2) + "\n" for case in GOOD)
RUN = "output_dir: {tmp}/out\ndatasets: [{name: phantom, cases: 4}]\nmodels: [center_prior]\n"


def _ragged(maps: dict) -> dict:
    maps["test_00001"]["Nodule"] = np.zeros((5, 3), np.float32)
    return maps


def _nan(maps: dict) -> dict:
    maps["test_00002"]["Nodule"][3, 3] = np.nan
    return maps


CASES = [
    # pickles (the restricted unpickler: cheXlocalize maps and checkpoints share it)
    Case("pickle-memo-reuse-codecs", _score_chex(hostile.memo_reuse_pickle()), ("test_00000_Nodule_map.pkl",
         "calling _codecs.encode", "exceed")),
    Case("pickle-memo-reuse-bytearray", _score_chex(hostile.memo_reuse_pickle(func=("builtins", "bytearray"))),
         ("test_00000_Nodule_map.pkl", "calling builtins.bytearray", "exceed")),
    Case("pickle-doubling-tuple-key", _score_chex(hostile.doubling_tuple_pickle(60)),
         ("test_00000_Nodule_map.pkl", "nested parts")),
    Case("pickle-str-of-doubling-tuple", _score_chex(hostile.str_of_doubling_tuple_pickle(60)),
         ("test_00000_Nodule_map.pkl", "str() of a tuple")),
    Case("pickle-doubling-tuple-map", _score_chex(hostile.doubling_tuple_pickle(60, as_key=False)),
         ("test_00000_Nodule_map.pkl", "'map'", "tuple")),
    Case("pickle-doubling-list-map", _score_chex(hostile.nested_list_map_pickle(60)),
         ("test_00000_Nodule_map.pkl", "'map'", "list")),
    Case("pickle-frame-length", _score_chex(hostile.long_length_pickle("FRAME")),
         ("test_00000_Nodule_map.pkl", "passes the end of the pickle")),
    Case("pickle-binunicode8-length", _score_chex(hostile.long_length_pickle("BINUNICODE8")),
         ("test_00000_Nodule_map.pkl", "passes the end of the pickle")),
    Case("pickle-zero-stride-view", _score_chex(hostile.zero_stride_view_pickle()),
         ("test_00000_Nodule_map.pkl", "(1, 1, 20000, 20000)", "storage holds 1")),
    Case("pickle-qint8-dtype", _score_chex(hostile.dtype_view_pickle(torch.qint8)),
         ("test_00000_Nodule_map.pkl", "torch.qint8", "not supported")),
    Case("pickle-bits8-dtype", _score_chex(hostile.dtype_view_pickle(torch.bits8)),
         ("test_00000_Nodule_map.pkl", "torch.bits8", "not supported")),
    # xbench score inputs
    Case("score-text-maps", _score_npy(np.full((6, 8, 8), "abc")), ("test_00000.npy", "text")),
    Case("score-empty-grid", _score_maps({c: {k: np.zeros((0, 0), np.float32) for k in a} for c, a in GOOD.items()}),
         ("0 x 0",)),
    Case("score-ragged-maps", _score_maps(_with_maps(GOOD, _ragged)), ("test_00001.npz", "Nodule", "(5, 3)")),
    Case("score-probs-not-numeric", _score_maps(GOOD, PROBS.replace("0.25", "high", 1)),
         ("probs.csv", "Nodule", "not a number")),
    Case("score-nan-map", _score_maps(_with_maps(GOOD, _nan)), ("test_00002", "Nodule", "NaN"),
         forbid=("nonfinite=",)),
    Case("score-option-list", _score_maps(GOOD, None, "--option", "cases=[1, 2]"), ("--option", "cases")),
    # run configs (YAML)
    Case("yaml-aliases-templates", _config(hostile.billion_laughs() + "\n" + RUN.replace(
        "[center_prior]", "[{name: clip, params: {templates: {positive: *a9, negative: x}}}]")), ("run.yaml", "alias")),
    Case("yaml-aliases-grid", _config(RUN + hostile.billion_laughs() + "\ngrid: *a9\n"), ("run.yaml", "alias")),
    Case("yaml-huge-grid", _config(RUN + "grid: [40000, 40000]\n"), ("run.yaml", "'grid'", "40000")),
    Case("yaml-dict-param-type", _config(RUN.replace("[center_prior]", "[{name: clip, params: {templates: [1, 2]}}]")),
         ("run.yaml", "templates")),
    Case("yaml-nul-output-dir", _config(RUN.replace("{tmp}/out", '"{tmp}/o\\0ut"')),  # the value shown escaped
         ("run.yaml", "'output_dir'", "NUL character"), forbid=("\x00",)),
    Case("yaml-cache-dir-is-file", _config(RUN + "cache_dir: {tmp}/run.yaml\n"), ("run.yaml", "'cache_dir'",
                                                                                  "not a folder")),
]


class CliWorker:
    """One ``cli_runner.py`` process answering commands; restarted after a time-out. ``preload``: modules imported
    before the cap; ``headroom``: bytes of address space above the process's size after imports."""

    def __init__(self, cwd: Path, preload: tuple[str, ...] = (), headroom: int = 3 << 29):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
               "XBENCH_CLI_PRELOAD": ",".join(preload), "XBENCH_CLI_HEADROOM": str(headroom),
               "XBENCH_WEIGHTS": str(cwd / "weights"), "HOME": str(cwd), "XBENCH_CACHE": str(cwd / "cache")}
        self.proc = subprocess.Popen([sys.executable, str(RUNNER)], env=env, cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "ready" in self._answer(120)

    def _answer(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            return {"code": f"died ({self.proc.returncode})", "stderr": self.proc.stderr.read()[-3000:]}
        return json.loads(line)

    def run(self, args: list[str], cwd: Path) -> dict:
        self.proc.stdin.write(json.dumps({"argv": args, "cwd": str(cwd)}) + "\n")
        self.proc.stdin.flush()
        return self._answer(TIME_LIMIT_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    home = tmp_path_factory.mktemp("cli-home")
    holder = {"worker": CliWorker(home), "home": home}
    yield holder
    holder["worker"].close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_gives_one_error_line(tmp_path, case, cli):
    args = case.build(tmp_path)
    try:
        done = cli["worker"].run(args, tmp_path)
    except TimeoutError:
        cli["worker"] = CliWorker(cli["home"])
        pytest.fail(f"xbench {' '.join(args)[:200]} ran past {TIME_LIMIT_S} s")
    err = done["stderr"].strip()
    assert "Traceback" not in err, err[-3000:]
    assert done["code"] == 2, (done["code"], err[-2000:])
    lines = [line for line in err.splitlines() if line.startswith("xbench: error:")]
    assert len(lines) == 1, err[-2000:]
    for text in case.expect:
        assert text in lines[0], (text, lines[0])
    for text in case.forbid:
        assert text not in lines[0], (text, lines[0])
    assert len(lines[0]) < 2000, len(lines[0])


def test_console_process_prints_one_line_and_exits_2(tmp_path):
    """The same boundary in a real ``xbench`` process (the console entry point), on one hostile pickle."""
    args = CASES[0].build(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(RUNNER), "--once", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIME_LIMIT_S * 2)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("xbench: error:") and "calling _codecs.encode" in last, done.stderr[-2000:]
