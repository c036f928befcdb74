"""Preemption: SIGTERM / SIGINT end a training run at the next step boundary with a verified checkpoint.

:class:`PreemptionWatch` (a context manager around a training loop) replaces the SIGTERM and SIGINT handlers: the
first signal only sets a flag; a second one restores the previous handlers and re-sends itself, so the process
ends at once (by the signal, as without the watch). At each step boundary the loop asks :meth:`requested`; under
several processes (``jax.distributed``) that is a tiny all-reduce of the flag (any process signalled), so every
process stops after the same step. The loop then writes the step's checkpoint, waits until it is complete and
raises :class:`Preempted`; the command-line entry points print it as one line on stderr
(``preempted at step N; saved checkpoint N; resume with trainer.resume=auto``) and exit with
:data:`PREEMPTED_EXIT` (75, ``EX_TEMPFAIL``: a temporary failure, retry to continue).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

#: exit status of a run stopped by SIGTERM / SIGINT after saving its checkpoint (``EX_TEMPFAIL`` of sysexits.h)
PREEMPTED_EXIT = 75

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """A run stopped on a signal after step ``step``; ``saved`` is the newest complete checkpoint (None: none)."""

    def __init__(self, step: int, saved: int | None, directory: str | Path | None = None, signame: str = "signal"):
        self.step, self.saved, self.directory, self.signame = int(step), saved, directory, signame
        where = f"saved checkpoint {saved}" if saved is not None else "no checkpoint could be saved"
        super().__init__(f"preempted at step {step}; {where}; resume with trainer.resume=auto")


class PreemptionWatch:
    """The signal hook of a training loop (module doc). Outside the main thread it installs nothing and never
    reports a request (signals are only delivered to the main thread)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:          # the second signal: abort now, as the process would have
            self._restore()
            os.kill(os.getpid(), signum)
            return
        self.signum = signum

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous = {}

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    @property
    def signame(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "signal"

    def requested(self) -> bool:
        """Whether the run stops at this step boundary: a signal arrived here or, under several processes, on any
        process (a collective: every process calls it at every step boundary)."""
        import jax

        if jax.process_count() == 1:
            return self.signum is not None
        from jaxppo.parallel.host import all_processes

        return not all_processes(self.signum is None)


__all__ = ["PREEMPTED_EXIT", "Preempted", "PreemptionWatch"]
