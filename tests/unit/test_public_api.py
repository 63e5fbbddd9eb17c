"""The curated top-level API: every name in ``__all__`` resolves, and importing gym_obs stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gym_obs


@pytest.mark.parametrize("name", gym_obs.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(gym_obs, name) is not None


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = gym_obs.no_such_thing  # type: ignore[attr-defined]


def test_raise_boundary_failure_is_the_client_one() -> None:
    from gym_obs.client import http_client

    assert gym_obs.raise_boundary_failure is http_client.raise_boundary_failure


def test_import_does_not_load_the_server_stack() -> None:
    code = "import sys, gym_obs; print(any(m.startswith(('fastapi', 'aiohttp')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_all_lists_exactly_the_lazy_exports() -> None:
    assert sorted(gym_obs.__all__) == sorted(["__version__", *gym_obs._EXPORTS])
