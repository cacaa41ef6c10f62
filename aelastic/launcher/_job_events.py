"""A :class:`~aelastic.Job`'s streams: its state transitions as they happen and
its own events, fanned out to every subscriber from a backlog, so a late subscriber
misses nothing kept.

The job never waits for a reader; the hang and learned-timeout events also update the
job's view. Nothing here blocks; a cancelled reader loses nothing for the next one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from ._job_records import HangInfo, StateChange
from ._job_view import JobView

if TYPE_CHECKING:
    from ..events._subscribe import EventStream

__all__ = ("JobEvents",)

#: Node-gate events marked on the job view's time axis (``aelastic.jobview``), by kind.
_VIEW_MARKS = {"aelastic.node.excluded": "excluded", "aelastic.node.unhealthy": "unhealthy"}


class JobEvents(JobView):
    """A job's state transitions and events, as streams (a part of :class:`Job`)."""

    async def state_changes(self) -> AsyncGenerator[StateChange, None]:
        """Every state transition from ``INIT`` on, as the agent makes it; ends with the job.

        ``async for change in job.state_changes():``. Each call starts from the
        earliest transition kept (the last 1000), then waits for new ones: the agent
        pushes them, nothing polls. A reader never slows the job down; one that falls
        more than 1000 transitions behind skips the oldest. Cancelling the wait loses
        nothing for a new iterator.
        """
        index = self._changes - len(self._history)
        while True:
            while index < self._changes:
                first = self._changes - len(self._history)
                index = max(index, first)
                change = self._history[index - first]
                index += 1
                yield change
            if self._done.is_set():
                return
            await self._changed.wait()

    def events(self, *, max_buffer: int = 10_000) -> EventStream:
        """Stream this job's events (those whose run id is :attr:`run_id`), earlier ones first.

        ``async with job.events() as stream: async for event in stream: ...``. When
        the stream is entered (or first read) it gets the job's last 1000 events
        recorded so far, then each new one as it comes; iteration ends once the job
        has ended (or the ``open_job`` block is left) and the stream is drained, so a
        subscriber entered late, even after the block, misses nothing kept. The job
        never waits for a reader: see :class:`aelastic.events._subscribe.EventStream` for
        ``max_buffer`` and ``dropped``. A stream never used costs nothing.
        """
        from ..events._subscribe import EventStream

        return EventStream(
            None,
            max_buffer,
            "drop_oldest",
            self.run_id,
            attach=self._attach_events,
            detach=self._event_streams_remove,
        )

    def _take_event(self, event: Any) -> None:
        self._event_backlog.append(event)
        for subscriber in self._event_streams:
            subscriber.push(event, "")
        name = getattr(event, "name", None)
        metadata = getattr(event, "metadata", None) or {}
        if name == "aelastic.progress.hang":
            self._note_hang(metadata)
        elif name == "aelastic.progress.learned_timeouts":
            heartbeat = metadata.get("heartbeat")
            if heartbeat is not None:
                self.learned_heartbeat_timeout = float(heartbeat)
        elif name in _VIEW_MARKS and self.status_publisher is not None:
            # on the job view's time axis, with the gate's reason
            self.status_publisher.note(_VIEW_MARKS[name], str(metadata.get("reason", "")))

    def _end_events(self) -> None:
        """Take what the job's subscription holds, then end every subscriber's stream.

        Called when the job is done (its events were all recorded, hence pushed, by
        then) and when the event task ends; idempotent.
        """
        source = self._events_source
        while source is not None:
            try:
                self._take_event(source.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        self._events_ended = True
        for subscriber in list(self._event_streams):
            subscriber.close()

    def _attach_events(self, stream: EventStream) -> None:
        for event in self._event_backlog:
            stream.push(event, "")
        if self._events_ended:
            stream.close()  # the backlog is all there is
        else:
            self._event_streams.append(stream)

    def _event_streams_remove(self, stream: EventStream) -> None:
        if stream in self._event_streams:
            self._event_streams.remove(stream)

    def _note_hang(self, metadata: Mapping[str, Any]) -> None:
        global_rank = metadata.get("global_rank")
        section = metadata.get("section")
        stacks_file = metadata.get("stacks_file")
        self._last_hang = HangInfo(
            global_rank=None if global_rank is None else int(global_rank),
            local_rank=int(metadata.get("local_rank", -1)),
            pid=int(metadata.get("pid", -1)),
            rule=str(metadata.get("rule")),
            section=None if section is None else str(section),
            timeout=float(metadata.get("timeout") or 0.0),
            stacks_file=None if stacks_file is None else str(stacks_file),
            stacks_captured=int(metadata.get("stacks_captured") or 0),
            step=int(metadata.get("step", -1)),
            detected_at=float(metadata.get("detected_at") or 0.0),
        )
        self.hang_count += 1
        self.stacks_captured += self._last_hang.stacks_captured
