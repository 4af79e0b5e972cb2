"""Worker of the CLI error harness (``test_cli_errors.py``): runs ``xbench ARGS`` commands under a memory ceiling.

Imports the CLI and torch first (and the modules named in ``XBENCH_CLI_PRELOAD``, comma-separated: the model
libraries a command will import, so that the cap bounds the work on the input, not the code), then caps the address space (``RLIMIT_AS``) at its size plus
``XBENCH_CLI_HEADROOM`` bytes (default 1.5 GiB), then answers JSON lines ``{"argv", "cwd"}`` with
``{"code", "stderr", "stdout"}`` (their last 20,000 characters): :func:`xbench.cli.main` run in ``cwd`` with its
standard streams captured. An exception
that escapes ``main`` is written to ``stderr`` as its traceback (code ``"raised"``), as the console would show it.
With ``--once ARGS`` it runs one command on the real streams and exits with its code."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import resource
import sys
import traceback
import warnings
from pathlib import Path

import torch

import xbench.cli

for _module in filter(None, os.environ.get("XBENCH_CLI_PRELOAD", "").split(",")):
    importlib.import_module(_module)


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _cap() -> int:
    torch.set_num_threads(1)
    ceiling = _vm_bytes() + int(os.environ.get("XBENCH_CLI_HEADROOM", str(3 << 29)))
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    return ceiling


def _serve() -> None:
    out = sys.stdout
    print(json.dumps({"ready": _cap()}), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        os.chdir(request["cwd"])
        err, std = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                code: int | str = xbench.cli.main(request["argv"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 — what the console would print; the test fails on it
                code = "raised"
                err.write(traceback.format_exc())
        logging.captureWarnings(False)  # the next command's setup_logging captures them again (a fresh process's state)
        print(json.dumps({"code": code, "stderr": err.getvalue()[-20000:], "stdout": std.getvalue()[-20000:]}),
              file=out, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--once"]:
        _cap()
        sys.exit(xbench.cli.main(sys.argv[2:]))
    _serve()
