"""graphkeep's error family, in Python.

One class per ``gk::ErrorKind`` of the C++ library (include/graphkeep/core/check.h,
include/graphkeep/reload/errors.h), all subclasses of :class:`Error`, itself a
``RuntimeError``. An error raised by the C++ library arrives as the class of its
kind with the same text: ``str(exc)`` is the C++ ``what()`` ("graphkeep: <message>"
and where it was raised), ``exc.message`` the message alone, ``exc.where`` the
``(function, file, line)`` it was raised at. The package's Python code (the
collector, the audit) raises the same classes, with ``where`` None.

    try:
        engine.commit(engine.stage(weights))
    except graphkeep.WeightError as e:   # the weight set is incomplete or bad
        print(e.message)                 # names the weight, the shape, the file
"""

from __future__ import annotations

__all__ = [
    "Error", "DeclarationError", "WeightError", "MismatchError", "DriftError", "StateError",
    "InternalError",
]


class Error(RuntimeError):
    """The base of every graphkeep error (``gk::Error``)."""

    def __init__(self, message: str, *, where: tuple[str, str, int] | None = None,
                 what: str | None = None) -> None:
        self.message = message
        self.where = where
        super().__init__(what if what is not None else f"graphkeep: {message}")


class DeclarationError(Error):
    """A class is annotated wrongly: fix the class (``gk::DeclarationError``)."""


class WeightError(Error):
    """The weight set is incomplete or bad: fix the source (``gk::WeightError``).

    Nothing the engine serves changed."""


class MismatchError(Error):
    """PWAL changed a slot's layout: recapture the graphs (``gk::MismatchError``).

    ``paths`` lists every affected slot."""

    def __init__(self, message: str, *, paths: list[str] | tuple[str, ...] = (),
                 where: tuple[str, str, int] | None = None, what: str | None = None) -> None:
        super().__init__(message, where=where, what=what)
        self.paths = list(paths)


class DriftError(Error):
    """A captured address is no longer owned as it was at capture: replay would read
    stale or freed memory, so it is refused (``gk::DriftError``).

    Raised by :func:`graphkeep.guard` with ``result``, the failed
    :class:`graphkeep.VerifyResult`, or by the engine."""

    def __init__(self, message: str, *, result=None, where: tuple[str, str, int] | None = None,
                 what: str | None = None) -> None:
        super().__init__(message, where=where, what=what)
        self.result = result


class StateError(Error):
    """The call is not allowed in the current state (``gk::StateError``)."""


class InternalError(Error):
    """An invariant of graphkeep itself broke: a bug (``gk::InternalError``)."""
