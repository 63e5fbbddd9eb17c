"""Property test of TimedSemaphore on a real event loop: random interleavings of acquire, cancel and release.

Invariants: never more holders than the limit; tasks that had to queue are admitted in arrival order
(strict FIFO; ``locked()`` is true whenever anyone is queued, so no newcomer can pass a waiter); and
permits are conserved: once every holder has released and every task has ended, all permits are free
again and ``limit`` immediate acquisitions succeed. A lost permit would leave the final waiters hanging
(caught by the drain guard); a duplicated one would break the holder bound or make ``release`` raise.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_obs.client.concurrency import TimedSemaphore

_OPS = st.one_of(
    st.just(("spawn", 0)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("step"), st.integers(1, 3)),
    st.just(("main_acquire", 0)),
    st.tuples(st.just("release_then_cancel"), st.integers(0, 30)),
)


@dataclass
class _World:
    sem: TimedSemaphore
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    events: list[asyncio.Event] = field(default_factory=list)
    arrivals: list[int] = field(default_factory=list)
    admissions: list[int] = field(default_factory=list)
    queued: set[int] = field(default_factory=set)  # arrived while the semaphore was locked
    inside: int = 0
    main_held: int = 0
    peak: int = 0

    async def _worker(self, index: int, done: asyncio.Event) -> None:
        self.arrivals.append(index)
        if self.sem.locked():
            self.queued.add(index)
        async with self.sem:
            self.admissions.append(index)
            self.inside += 1
            self.peak = max(self.peak, self.inside + self.main_held)
            try:
                await done.wait()
            finally:
                self.inside -= 1

    def spawn(self) -> None:
        done = asyncio.Event()
        self.events.append(done)
        self.tasks.append(asyncio.create_task(self._worker(len(self.tasks), done)))

    def live(self) -> list[int]:
        return [i for i, task in enumerate(self.tasks) if not task.done()]


async def _run(limit: int, ops: list[tuple[str, int]]) -> None:
    world = _World(TimedSemaphore(limit, site="property"))
    sem = world.sem
    for op, arg in ops:
        live = world.live()
        if op == "spawn":
            world.spawn()
        elif op == "cancel" and live:
            world.tasks[live[arg % len(live)]].cancel()
        elif op == "finish" and live:
            world.events[live[arg % len(live)]].set()
        elif op == "step":
            for _ in range(arg):
                await asyncio.sleep(0)
        elif op == "main_acquire" and not sem.locked():
            await sem.acquire()  # immediate: not locked
            world.main_held += 1
            world.peak = max(world.peak, world.inside + world.main_held)
        elif op == "release_then_cancel" and world.main_held:
            sem.release()  # synchronous hand-off to the oldest waiter, if any ...
            world.main_held -= 1
            if live:  # ... which may be the very task cancelled now, before it resumes
                world.tasks[live[arg % len(live)]].cancel()
        assert sem.active <= limit
        assert world.inside + world.main_held <= limit

    # drain: every holder finishes, main returns its permits; nothing may be left hanging
    for _ in range(world.main_held):
        sem.release()
    world.main_held = 0
    for event in world.events:
        event.set()
    await asyncio.wait_for(asyncio.gather(*world.tasks, return_exceptions=True), timeout=10)

    assert world.peak <= limit
    # Strict FIFO among those who had to wait. A task arriving when ``locked()`` is false (a permit free
    # and nobody queued) may be admitted at once, even before an earlier waiter that was already *handed*
    # its permit resumes: that waiter got its permit first, it just has not run yet.
    waited = [i for i in world.admissions if i in world.queued]
    assert waited == sorted(waited), "admitted out of arrival order"
    assert world.arrivals == sorted(world.arrivals)
    assert (sem.active, sem.waiting, sem.locked()) == (0, 0, False)
    for _ in range(limit):
        assert not sem.locked()
        await sem.acquire()
    assert sem.locked()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(1, 4), ops=st.lists(_OPS, max_size=60))
def test_random_interleavings_conserve_permits_in_fifo_order(limit: int, ops: list[tuple[str, int]]) -> None:
    asyncio.run(_run(limit, ops))
