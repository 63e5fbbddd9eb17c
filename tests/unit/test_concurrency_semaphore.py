"""TimedSemaphore behaviour: validation, FIFO hand-off, cancellation safety, context manager."""

from __future__ import annotations

import asyncio

import pytest

import gym_obs
from gym_obs.client.concurrency import TimedSemaphore


def test_is_the_public_name() -> None:
    assert gym_obs.TimedSemaphore is TimedSemaphore


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(ValueError, match="positive int"):
        TimedSemaphore(limit, site="ok")


@pytest.mark.parametrize("limit", [1.5, "3", True, None])
def test_limit_must_be_an_int(limit: object) -> None:
    with pytest.raises(TypeError, match="positive int"):
        TimedSemaphore(limit, site="ok")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "site",
    ["", "Rollouts", "has space", "rollout/123", "https://host/x", "9lives", "a" * 49, "x\n", "é"],
)
def test_site_must_be_a_short_identifier(site: str) -> None:
    with pytest.raises(ValueError, match="code-chosen identifier") as err:
        TimedSemaphore(2, site=site)
    assert len(str(err.value)) < 300  # a long value is cut, not echoed whole


def test_site_must_be_a_str() -> None:
    with pytest.raises(TypeError, match="site must be a str"):
        TimedSemaphore(2, site=7)  # type: ignore[arg-type]


@pytest.mark.parametrize("site", ["harness.rollouts", "agent_calls", "a", "model-calls.v2", "a" * 48])
def test_valid_sites(site: str) -> None:
    sem = TimedSemaphore(3, site=site)
    assert (sem.site, sem.limit, sem.active, sem.waiting) == (site, 3, 0, 0)


async def test_context_manager_holds_and_returns_a_permit() -> None:
    sem = TimedSemaphore(1, site="cm")
    async with sem:
        assert sem.active == 1
        assert sem.locked()
    assert sem.active == 0
    assert not sem.locked()


async def test_context_manager_releases_on_error() -> None:
    sem = TimedSemaphore(1, site="cm")
    with pytest.raises(RuntimeError):
        async with sem:
            raise RuntimeError("boom")
    assert sem.active == 0


async def test_release_without_acquire_is_an_error() -> None:
    sem = TimedSemaphore(2, site="over")
    with pytest.raises(ValueError, match="released more times"):
        sem.release()
    await sem.acquire()
    sem.release()
    with pytest.raises(ValueError, match="released more times"):
        sem.release()


async def test_waiters_are_admitted_in_arrival_order() -> None:
    sem = TimedSemaphore(1, site="fifo")
    await sem.acquire()
    admitted: list[int] = []

    async def waiter(i: int) -> None:
        await sem.acquire()
        admitted.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(20)]
    await asyncio.sleep(0)
    assert sem.waiting == 20
    for _ in range(20):
        sem.release()
        # a latecomer arriving right after the release must not overtake the woken waiter
        late = asyncio.create_task(waiter(100))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
    await asyncio.gather(*tasks)
    assert admitted == list(range(20))
    assert sem.active == 1


async def test_a_fresh_arrival_cannot_take_a_permit_handed_to_a_waiter() -> None:
    sem = TimedSemaphore(1, site="steal")
    await sem.acquire()
    first = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    sem.release()  # handed to `first`, which has not resumed yet
    assert sem.locked()
    second = asyncio.create_task(sem.acquire())
    await first
    await asyncio.sleep(0)
    assert not second.done()
    sem.release()
    await second
    sem.release()
    assert sem.active == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    sem = TimedSemaphore(1, site="cancel")
    await sem.acquire()
    task = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    assert sem.waiting == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sem.waiting == 0
    sem.release()
    assert sem.active == 0


async def test_waiter_cancelled_as_it_is_handed_the_permit_passes_it_on() -> None:
    sem = TimedSemaphore(1, site="handoff")
    await sem.acquire()
    doomed = asyncio.create_task(sem.acquire())
    nxt = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    sem.release()  # the permit now belongs to `doomed` ...
    doomed.cancel()  # ... which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await doomed
    await nxt  # the permit went to the next waiter instead of vanishing
    assert sem.active == 1
    sem.release()
    assert sem.active == 0
    assert not sem.locked()


async def test_handed_permit_returns_to_the_pool_when_no_one_else_waits() -> None:
    sem = TimedSemaphore(2, site="handoff")
    await sem.acquire()
    await sem.acquire()
    doomed = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    sem.release()
    doomed.cancel()
    await asyncio.gather(doomed, return_exceptions=True)
    assert sem.active == 1
    await asyncio.wait_for(sem.acquire(), timeout=5)
    assert sem.active == 2


async def test_wait_for_timeout_does_not_leak() -> None:
    sem = TimedSemaphore(1, site="timeout")
    await sem.acquire()
    for _ in range(5):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sem.acquire(), timeout=0.01)
    assert (sem.waiting, sem.active) == (0, 1)
    sem.release()
    assert sem.active == 0
