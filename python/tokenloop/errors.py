"""Exceptions: every tl_error the C library reports becomes one of these,
carrying its message and status (a tl_status: negative)."""
from . import _lib


class TokenloopError(Exception):
    """A failure the C library reported. status: the tl_status."""

    def __init__(self, message, status=_lib.ERR_ARG):
        super().__init__(message)
        self.status = status
        self.message = message


class FileError(TokenloopError, OSError):
    """TL_ERR_IO: a file could not be opened, read or mapped."""


class FormatError(TokenloopError, ValueError):
    """TL_ERR_FORMAT: a file is corrupt, truncated or not what it claims."""


class ArgumentError(TokenloopError, ValueError):
    """TL_ERR_ARG: an invalid argument (a grammar that does not parse, ...)."""


class UnsupportedError(TokenloopError, ValueError):
    """TL_ERR_UNSUPPORTED: valid but not supported (an architecture, a schema keyword, ...)."""


class ContextFullError(TokenloopError, ValueError):
    """TL_ERR_CONTEXT_FULL: the prompt does not fit the context."""


class OutOfMemoryError(TokenloopError, MemoryError):
    """TL_ERR_NOMEM."""


_BY_STATUS = {
    _lib.ERR_IO: FileError,
    _lib.ERR_FORMAT: FormatError,
    _lib.ERR_NOMEM: OutOfMemoryError,
    _lib.ERR_ARG: ArgumentError,
    _lib.ERR_UNSUPPORTED: UnsupportedError,
    _lib.ERR_CONTEXT_FULL: ContextFullError,
}


def from_status(status, message):
    """The exception for a tl_status and its message."""
    cls = _BY_STATUS.get(status, TokenloopError)
    return cls(message or f"tokenloop error {status}", status)


def check(rc, err, what=None):
    """Raises the exception for a failed call's status (rc < 0) and tl_error."""
    if rc >= 0:
        return rc
    msg = err.msg.decode("utf-8", "replace") or f"tokenloop error {rc}"
    status = rc
    raise from_status(status, f"{what}: {msg}" if what else msg)
