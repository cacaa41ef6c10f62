"""The health endpoint's errors."""

from __future__ import annotations

from .._exceptions import AelasticError, show_public_module

__all__ = ()


class HealthPortError(AelasticError, OSError):
    """The health endpoint cannot listen on its address (port in use, address not local).

    Also an ``OSError`` with the original ``errno``, so existing handlers still work;
    the message names the address and the fix.
    """


show_public_module(__name__, globals())
