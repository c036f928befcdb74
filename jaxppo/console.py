"""What the commands print and what they only log: a record logged with ``extra=PRINTED`` has been printed on
the console by the command already, so the root logger's stderr handler (``jaxppo.cli.util.configure_logging``)
leaves it out; the log file keeps it at its level."""

from __future__ import annotations

import logging

#: ``logger.warning(msg, extra=PRINTED)``: the same text was printed by the command
PRINTED = {"jaxppo_printed": True}


def not_printed(record: logging.LogRecord) -> bool:
    """A handler filter: False for a record marked :data:`PRINTED`."""
    return not getattr(record, "jaxppo_printed", False)


__all__ = ["PRINTED", "not_printed"]
