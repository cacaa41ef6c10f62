"""The live page of a running two-node job, rendered by a real headless Chromium."""

from __future__ import annotations

import html.parser
import shutil
import urllib.request
from pathlib import Path

import anyio
import anyio.to_thread
from launcher._nodes import free_port

from aelastic.health._settings import HealthSettings
from aelastic.jobview._keys import status_store

from ._live import publish, stepped, two_nodes, write_stale_node

HOSTILE_NODE = "<img src=x onerror=\"document.title='pwned'\">"
HOSTILE_ERROR = "<b>boom</b><script>document.title='pwned'</script>"


class _Dom(html.parser.HTMLParser):
    """The tags, the text of each table cell and the polylines' points of a DOM dump."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.cells: list[str] = []
        self.polylines: list[str] = []
        self.rects: list[str] = []  # the goodput bar's categories
        self.title = ""
        self.text = ""
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "polyline":
            self.polylines.append(dict(attrs).get("points") or "")
        if tag == "rect":
            self.rects.append(dict(attrs).get("data-category") or "")
        if tag in ("td", "title"):
            self._in = tag
            if tag == "td":
                self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._in == "td":
            self.cells[-1] += data
        elif self._in == "title" and not self.title:
            self.title = data


def _headers(url: str) -> dict[str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return {k.lower(): v for k, v in response.headers.items()}


async def test_the_page_shows_both_nodes_a_chart_and_hostile_strings_as_text(
    tmp_path: Path,
) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "needs Debian's chromium: apt-get install -y chromium (.ci/run does)"
    endpoint = f"127.0.0.1:{free_port()}"
    with anyio.fail_after(120):
        async with two_nodes(
            tmp_path,
            rdzv_backend="c10d",
            rdzv_endpoint=endpoint,
            run_id="view-page",
            health=HealthSettings(port=0),
        ) as (w, jobs):
            for _ in range(3):  # three samples per node, each after more steps
                await stepped(w, jobs)
                await publish(jobs)
            publisher = jobs[0].status_publisher
            assert publisher is not None
            found = status_store(publisher.handler)
            assert found is not None
            like = (await publisher.read_view())["nodes"][0]
            failure = {"global_rank": 7, "exitcode": 1, "message": HOSTILE_ERROR}
            marks = [[like["time"], "excluded", HOSTILE_ERROR]]  # a kind aelastic has no name for
            history = {"samples": [], "marks": marks}
            slow = {"slow": {"ranks": {"3": 0.65}, "whole_node": False}}  # a straggler
            await write_stale_node(
                found[0], like, HOSTILE_NODE, last_failure=failure, history=history, stragglers=slow
            )
            address = jobs[1].health_address
            assert address is not None
            url = f"http://{address[0]}:{address[1]}/"
            headers = await anyio.to_thread.run_sync(_headers, url)
            done = await anyio.run_process(
                [
                    chromium, "--headless", "--no-sandbox", "--disable-gpu",
                    # a profile of its own: not ~/.config/chromium, which another
                    # chromium (a second test process) would hold locked
                    f"--user-data-dir={tmp_path / 'chromium'}",
                    "--virtual-time-budget=5000", "--dump-dom", url,
                ],
                check=False,
            )  # fmt: skip
            names = [job.status_publisher.node for job in jobs]  # type: ignore[union-attr]
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["content-security-policy"]
    dom = _Dom()
    dom.feed(done.stdout.decode())
    assert dom.title == "aelastic job"  # no script of the job's data ran
    for name in names:
        assert name in dom.cells
    assert HOSTILE_NODE in dom.cells  # shown as text...
    assert f"rank 7 {HOSTILE_ERROR}" in dom.cells
    assert "rank 3 0.65" in dom.cells  # its slow rank and score
    assert "img" not in dom.tags and "b" not in dom.tags  # ...not as markup
    assert dom.tags.count("script") == 1  # the page's own
    assert f"{HOSTILE_NODE}  excluded  {HOSTILE_ERROR}" in dom.text  # the mark, as text
    drawn = [p for p in dom.polylines if len(p.split()) >= 2]
    assert len(drawn) == 2, dom.polylines  # a line of steps/s per live node
    assert "productive" in dom.rects and "restart" in dom.rects  # the goodput bar
    assert "goodput " in dom.text and "% of " in dom.text
