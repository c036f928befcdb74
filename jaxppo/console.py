"""What the commands print and what they only log: a record logged with ``extra=PRINTED`` has been printed on
the console by the command already, so the root logger's stderr handler (``jaxppo.cli.util.setup_logging``)
leaves it out; the log file keeps it at its level."""

from __future__ import annotations

import logging

#: ``logger.warning(msg, extra=PRINTED)``: the same text was printed by the command
PRINTED = {"jaxppo_printed": True}


def not_printed(record: logging.LogRecord) -> bool:
    """A handler filter: False for a record marked :data:`PRINTED`."""
    return not getattr(record, "jaxppo_printed", False)


def warn(logger: logging.Logger, text: str, *, label: str = "warning") -> None:
    """Print ``<label>: <text>`` on the console (stdout, flushed) and log ``text`` at WARNING marked
    :data:`PRINTED`: the user sees it once, the log file keeps it."""
    print(f"{label}: {text}", flush=True)
    logger.warning("%s", text, extra=PRINTED)


__all__ = ["PRINTED", "not_printed", "warn"]
