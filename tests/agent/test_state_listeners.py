"""``WorkerGroup`` state listeners: told of each change, removable by the callable added."""

from __future__ import annotations

from aelastic.agent import WorkerGroup, WorkerSpec, WorkerState

from .conftest import LocalRendezvous


class _Watcher:
    def __init__(self) -> None:
        self.seen: list[tuple[WorkerState, WorkerState]] = []

    def on_state(self, group: WorkerGroup, previous: WorkerState) -> None:
        self.seen.append((previous, group.state))


def _group() -> WorkerGroup:
    spec = WorkerSpec(
        role="r", local_world_size=1, rdzv_handler=LocalRendezvous(), entrypoint="/bin/true"
    )
    return WorkerGroup(spec)


def test_a_bound_method_is_removed_by_an_equal_one() -> None:
    group, watcher = _group(), _Watcher()
    group.add_state_listener(watcher.on_state)
    group.state = WorkerState.HEALTHY
    # `watcher.on_state` is a new bound method object each time it is read
    group.remove_state_listener(watcher.on_state)
    group.state = WorkerState.FAILED
    assert watcher.seen == [(WorkerState.INIT, WorkerState.HEALTHY)]


def test_removing_one_listener_keeps_the_others() -> None:
    group, kept, removed = _group(), _Watcher(), _Watcher()
    group.add_state_listener(kept.on_state)
    group.add_state_listener(removed.on_state)
    group.remove_state_listener(removed.on_state)
    group.state = WorkerState.HEALTHY
    assert kept.seen == [(WorkerState.INIT, WorkerState.HEALTHY)] and removed.seen == []
