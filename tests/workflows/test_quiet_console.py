"""Nothing alarming on the console of a normal run: no kernel-shutdown ERROR, no tqdm or open_clip notices."""
from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from xbench.workflows.reproduce import _kernel_manager_class

PACKAGE = Path(__file__).resolve().parents[2] / "xbench"


def test_stopping_a_finished_notebooks_kernel_sends_no_interrupt():
    """jupyter_client interrupts before each shutdown; a kernel in a handler then logs "KeyboardInterrupt caught"."""
    km = _kernel_manager_class()()
    with pytest.raises(RuntimeError, match="No kernel is running"):  # an interrupt outside shutdown still goes out
        asyncio.run(km._async_interrupt_kernel())
    km.shutting_down = True
    asyncio.run(km._async_interrupt_kernel())  # during shutdown: nothing sent, nothing raised
    assert km.interrupt_kernel is not type(km)._async_interrupt_kernel  # cell-timeout interrupts: jupyter_client's


def test_no_module_uses_tqdm_auto_which_warns_iprogress_not_found_in_a_kernel():
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.match(r"\s*(from tqdm\.(auto|autonotebook|notebook) import|import tqdm\.(auto|notebook))", line)]
    assert not found, f"tqdm.auto/notebook imported at {found}"


def test_building_clip_without_weights_logs_no_open_clip_notice(caplog):
    from xbench.models.clip import build_clip

    with caplog.at_level(logging.WARNING):
        build_clip(seed=0)
    assert not [r for r in caplog.records if "No pretrained weights" in r.getMessage()]
    other = logging.getLogger()
    with caplog.at_level(logging.WARNING):
        other.warning("No pretrained weights loaded elsewhere")  # the filter is gone afterwards
    assert any("elsewhere" in r.getMessage() for r in caplog.records)
