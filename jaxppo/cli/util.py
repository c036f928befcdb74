"""Command-line plumbing shared by the entry points (``jaxppo.train``, ``collect``, ``evaluate``, ``reward``,
``dpo``): argument parsing, log files and one-line user errors. No library logic lives here."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")


def parse_config_args(prog: str, description: str, argv: Sequence[str] | None, *, commands: Sequence[str] = ()):
    """Parse ``[command] --config FILE [dotted.key=value ...]`` and load the config.

    Returns ``(command or None, Config)``; a bad key or value exits with the ConfigError message.
    """
    args, cfg = parse_args_and_config(prog, description, argv, commands=commands)
    return (args.command if commands else None), cfg


def parse_args_and_config(prog: str, description: str, argv: Sequence[str] | None, *, commands: Sequence[str] = (),
                          add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                          config_required: bool = False) -> tuple[argparse.Namespace, Any]:
    """:func:`parse_config_args` for commands with options of their own: ``add_arguments(parser)`` adds them;
    returns ``(parsed args, Config)``. ``--config`` is required with ``config_required``."""
    from jaxppo.config import ConfigError, load_config
    from jaxppo.config_names import check_config_names

    ap = argparse.ArgumentParser(prog=prog, description=description)
    if commands:
        ap.add_argument("command", choices=list(commands))
    ap.add_argument("--config", "-c", default=None, required=config_required, help="YAML config file")
    ap.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. trainer.output_dir=runs/x")
    if add_arguments is not None:
        add_arguments(ap)
    # intermixed: ``train --config F a=1`` and ``--config F train a=1`` both work
    args = ap.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = load_config(args.config, args.overrides)
        check_config_names(cfg)
    except ConfigError as e:
        ap.exit(2, f"{prog}: config error: {e}\n")
    return args, cfg


def setup_logging(out_dir: str | Path | None = None, name: str = "log.txt") -> None:
    """Write jaxppo's INFO logs to ``out_dir/name`` (console output is printed by the commands).

    ``out_dir`` is created first (:func:`jaxppo.trainer.run_folder.prepare_output_dir`: an unusable folder is an
    ``OutputDirError`` naming ``trainer.output_dir``, a user error of :func:`run_cli`).

    A handler added by an earlier call is replaced, so repeated calls in one process do not stack. Under several
    processes (``launch/multihost.py``) only process 0 writes the file; the others log jaxppo's INFO records to
    stderr instead.

    Records below WARNING never reach stderr through the root logger, so the one-line error of a failed command
    is not preceded by INFO lines: absl's logging functions call ``logging.basicConfig()`` when the root logger has
    no handler (Orbax logs through absl when it is imported), which prints every record that reaches the root,
    jaxppo's INFO records included. So a plain stderr handler of the root (absl's) is raised to WARNING, and when the
    root has no handler one at WARNING is added first, so absl adds none. Records the command has printed already
    (``extra=jaxppo.console.PRINTED``) are left out by that handler, so a warning is shown once. Other root handlers
    (a caller's, pytest's) are left as they are.
    """
    from jaxppo.console import not_printed

    top = logging.getLogger()
    for h in top.handlers:
        if type(h) is logging.StreamHandler and h.stream in (sys.stderr, sys.__stderr__):
            h.setLevel(max(h.level, logging.WARNING))
            if not_printed not in h.filters:
                h.addFilter(not_printed)
    if not top.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
        h.setLevel(logging.WARNING)
        h.addFilter(not_printed)
        top.addHandler(h)
    root = logging.getLogger("jaxppo")
    root.setLevel(logging.INFO)
    for h in [h for h in root.handlers if getattr(h, "_jaxppo_cli", False)]:
        root.removeHandler(h)
        h.close()
    jax = sys.modules.get("jax")   # imported (and initialised) by launch/multihost.py under several processes
    if out_dir is not None:
        from jaxppo.trainer.run_folder import prepare_output_dir

        prepare_output_dir(out_dir)
    # process 0, or a single process (not asked: that would start the backend of a process that has not yet)
    first = jax is None or not jax.distributed.is_initialized() or jax.process_index() == 0
    if out_dir is not None and first:
        h = logging.FileHandler(Path(out_dir) / name, encoding="utf-8")
        h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    elif not first:   # below WARNING here; the root logger's stderr handler prints the rest
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
        h.addFilter(lambda record: record.levelno < logging.WARNING)
    else:
        return
    h._jaxppo_cli = True  # type: ignore[attr-defined]
    root.addHandler(h)


# errors that are the user's input (config values, files, data): printed as one line, exit status 2
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError)


def report_user_error(prog: str, err: BaseException) -> int:
    """Print ``prog: error: <message>`` to stderr and return the exit status 2."""
    print(f"{prog}: error: {type(err).__name__}: {err}", file=sys.stderr)
    return 2


def run_cli(prog: str, work: Callable[[], T], report: Callable[[T], Any] | None = None, *,
            errors: tuple[type[BaseException], ...] = (), config_error_form: bool = False) -> int:
    """A command's body with its one-line user errors: ``work()``, then ``report(result)`` (the console output,
    outside the error handling); returns the exit status.

    An exception of ``USER_ERRORS`` or ``errors`` raised by ``work`` is printed by :func:`report_user_error`
    (``prog: error: <type>: <message>``) and gives status 2; with ``config_error_form`` a ``ConfigError`` is
    printed as ``prog: config error: <message>`` (the form of a bad key at parse time). A run stopped by a signal
    (``jaxppo.trainer.preemption.Preempted``) prints ``prog: preempted at step N; saved checkpoint N; resume with
    trainer.resume=auto`` and gives ``PREEMPTED_EXIT`` (75). Anything else propagates. Otherwise the status is 0.
    """
    from jaxppo.config import ConfigError
    from jaxppo.trainer.preemption import PREEMPTED_EXIT, Preempted

    try:
        result = work()
    except Preempted as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return PREEMPTED_EXIT
    except (*USER_ERRORS, *errors) as e:
        if config_error_form and isinstance(e, ConfigError):
            print(f"{prog}: config error: {e}", file=sys.stderr)
            return 2
        return report_user_error(prog, e)
    if report is not None:
        report(result)
    return 0
