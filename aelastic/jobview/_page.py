"""The live job page (``page.html`` here): one self-contained HTML document (inline CSS,
JS and SVG), read once when this module is imported (about 10 KB).

It loads nothing from the network: it polls ``view.json`` next to itself every two
seconds and draws every node's table row and steps per second over time, with the
history's marks (restarts, hangs, node losses, any other kind) on the time axis.
Every string from the job is set with ``textContent`` (never parsed as markup), and
the page is served with a Content-Security-Policy that allows only itself.
"""

from __future__ import annotations

from importlib import resources

__all__ = ("PAGE", "PAGE_HEADERS")

#: Sent with the page: inline script and style only, fetches to the same origin only.
PAGE_HEADERS = (
    (
        "content-security-policy",
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
)

#: The page's bytes (UTF-8).
PAGE = resources.files(__package__).joinpath("page.html").read_bytes()
