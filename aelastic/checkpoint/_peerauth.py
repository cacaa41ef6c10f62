"""Who may talk to a checkpoint peer listener: the job's key, a mutual challenge-response,
and a MAC on every header line after it (standard library only: the agent's side).

Every agent of a job holds one key (32 random bytes): read from ``--job-secret-file``,
else agreed through the store the agents share (:func:`agree_key`). A connection starts
with a handshake, both sides proving they hold it without sending it::

    server -> {"aelastic": "peer/1", "nonce": Ns}
    client -> {"nonce": Nc, "proof": HMAC(key, "aelastic-peer-client" | Ns | Nc)}
    server -> {"proof": HMAC(key, "aelastic-peer-server" | Nc | Ns)}

Each JSON line after it goes as ``<MAC> <json>``: HMAC-SHA256 under a key of this
connection (``HMAC(key, "aelastic-peer-session" | Ns | Nc)``) of the direction, the
line's number in that direction and the JSON, so a line can be neither forged, replayed
from another connection, nor reordered. The raw file bytes between the lines carry no
MAC (a MAC over gigabytes would cost more than the copy's budget): they ride a connection
whose every header is authenticated, and an attacker who can rewrite this TCP stream
(on the path between two nodes) is outside the threat model (docs/security.md).

Every comparison is :func:`hmac.compare_digest`. Nothing here logs the key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

__all__ = (
    "KEY_BYTES",
    "LineMac",
    "PeerAuthError",
    "client_proof",
    "new_key",
    "parse_key",
    "read_key_file",
    "server_proof",
    "session_key",
)

#: Bytes of a generated key, and of each side's nonce.
KEY_BYTES = 32
NONCE_BYTES = 16
PROTOCOL = "peer/1"
_MAC_HEX = 64


class PeerAuthError(ValueError):
    """A peer that does not prove it holds the job's key, or a line whose MAC is wrong."""


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


def parse_key(raw: bytes) -> bytes:
    """The key a file or the store holds: its bytes, stripped of surrounding white space
    (a hex text is used as it is written). Raises ValueError when empty."""
    key = raw.strip()
    if not key:
        raise ValueError("it is empty")
    return key


def read_key_file(path: str) -> bytes:
    """The key in ``path`` (``--job-secret-file``). Raises ValueError naming the problem
    and the fix (not readable, empty)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except OSError as exc:
        raise ValueError(
            f"{path}: cannot read the job secret ({exc.strerror or exc}); give a readable "
            "file holding the same secret on every node"
        ) from None
    try:
        return parse_key(raw)
    except ValueError:
        raise ValueError(
            f"{path}: the job secret file is empty; write a secret into it (e.g. "
            "`python -c 'import secrets; print(secrets.token_hex(32))' > FILE`)"
        ) from None


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


def client_proof(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(key, b"aelastic-peer-client", server_nonce, client_nonce)


def server_proof(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(key, b"aelastic-peer-server", client_nonce, server_nonce)


def session_key(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(key, b"aelastic-peer-session", server_nonce, client_nonce)


def check_proof(expected: bytes, given: Any, what: str) -> None:
    """Raise :class:`PeerAuthError` unless ``given`` (hex) is ``expected``."""
    try:
        raw = bytes.fromhex(given) if isinstance(given, str) else b""
    except ValueError:
        raw = b""
    if not hmac.compare_digest(raw, expected):
        raise PeerAuthError(f"{what} does not hold this job's key")


def nonce(value: Any) -> bytes:
    """A nonce of a handshake line. Raises PeerAuthError for anything else."""
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != NONCE_BYTES:
        raise PeerAuthError("no handshake")
    return raw


class LineMac:
    """The MACs of one connection's lines: each direction numbers its lines from 0."""

    def __init__(self, session: bytes, client: bool) -> None:
        self._key = session
        self._out, self._in = (b"c", b"s") if client else (b"s", b"c")
        self._sent = 0
        self._received = 0

    def seal(self, body: bytes) -> bytes:
        mac = _mac(self._key, self._out, self._sent.to_bytes(8, "big"), body)
        self._sent += 1
        return mac.hex().encode() + b" " + body

    def open(self, line: bytes) -> bytes:
        """The JSON of ``line``. Raises PeerAuthError when its MAC is not this line's."""
        given, body = line[:_MAC_HEX], line[_MAC_HEX + 1 :]
        mac = _mac(self._key, self._in, self._received.to_bytes(8, "big"), body)
        try:
            raw = bytes.fromhex(given.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raw = b""
        if line[_MAC_HEX : _MAC_HEX + 1] != b" " or not hmac.compare_digest(raw, mac):
            raise PeerAuthError("a line with a wrong MAC")
        self._received += 1
        return body
