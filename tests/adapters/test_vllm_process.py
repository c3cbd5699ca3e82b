"""The CPU worker binding xconf sets per engine never leaks into the next engine."""

from __future__ import annotations

import os

import pytest

from xconf.adapters.vllm import process

BIND = "VLLM_CPU_OMP_THREADS_BIND"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND, raising=False)
    monkeypatch.setattr(process, "_own_bind", [])
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def test_each_tp_engine_gets_its_own_round_robin_binding() -> None:
    process._bind_cpu_workers(2)
    assert os.environ[BIND] == "0|1"
    process._bind_cpu_workers(3)  # after a TP=2 engine: three workers, three entries
    assert os.environ[BIND] == "0|1|0"
    process._bind_cpu_workers(1)  # an in-process TP=1 engine: no binding of xconf's left
    assert BIND not in os.environ


def test_a_binding_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BIND, "1|0")
    process._bind_cpu_workers(2)
    assert os.environ[BIND] == "1|0"
    process._bind_cpu_workers(1)
    assert os.environ[BIND] == "1|0"
