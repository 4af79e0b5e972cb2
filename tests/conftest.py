"""Shared test fixtures: where ../shared lives, and a skip with a reason when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XBENCH_SHARED", REPO.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """Path under ``../shared``; skips the calling test with a reason if it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the real annotation files / parity fixtures live in ../shared next to the repo")
    return path


@pytest.fixture
def shared() -> Path:
    return shared_path()
