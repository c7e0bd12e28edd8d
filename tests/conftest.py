"""Fixtures every test file may use. Test-specific fixtures live in their own test files.

Markers are declared in pyproject.toml ([tool.pytest.ini_options]): `slow` for tests that
start process worlds; `timeout` (pytest-timeout) to give one test more than the default.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

# Figures are drawn off-screen: CI has no display, and notebooks use the inline backend.
os.environ.setdefault("MPLBACKEND", "Agg")

REPO_ROOT = Path(__file__).resolve().parents[1]

# tests/html checks the built book in a browser: `make test-html` runs it (after `make book`
# and check.mjs) with --confcutdir=tests/html, so this file and this line do not apply there.
collect_ignore = ["html"]

# Variables torchrun sets. minipar.runtime.launch joins an existing world when it sees them, so a
# test must never inherit them from the shell that started pytest.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def _no_inherited_torchrun_world(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo_root() -> Path:
    """The repository root (for running the CLI, reading notebooks or the book)."""
    return REPO_ROOT


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_rank_may_start(monkeypatch):
    """Bad input is refused before any process starts: starting one fails the test."""
    from minipar.runtime import launch

    def refuse(*a, **k):
        raise AssertionError("a rank was started for input that could be checked first")
    monkeypatch.setattr(launch, "run_local", refuse)
