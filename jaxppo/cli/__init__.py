"""``jaxppo COMMAND [ARGS]``: the console entry point (``[project.scripts]``); ``python -m jaxppo.cli`` is the same.

Each command is ``main(argv)`` of the module of the same name in this package; ``python -m jaxppo.<command>`` runs the
same (a one-line module at the package root). The table below is also what ``jaxppo --help`` prints.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: command -> (module whose ``main(argv)`` runs it, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("jaxppo.cli.train", "offline PPO: train, evaluate before/after, export hf/"),
    "evaluate": ("jaxppo.cli.evaluate", "a trained policy against the reference on the same held-out prompts"),
    "collect": ("jaxppo.cli.collect", "build an offline dataset: K samples per prompt with token log-probs, scored"),
    "reward": ("jaxppo.cli.reward", "train / apply a Bradley-Terry reward model; pairs to a scored dataset"),
    "prompts": ("jaxppo.cli.prompts", "prompts of one side of a preference config's by-prompt split"),
    "dpo": ("jaxppo.cli.dpo", "DPO, the offline preference baseline"),
    "sweep": ("jaxppo.cli.sweep", "seeds x variants of a base config, resumable"),
    "report": ("jaxppo.sweeps.report", "regenerate the sweep and claims tables of docs/results.md"),
    "calibrate": ("jaxppo.sweeps.calibrate", "error rates of the sweep statistics on synthetic A/A sweeps"),
    "prereg": ("jaxppo.sweeps.prereg", "check and analyse a pre-registered experiment"),
    "plan": ("jaxppo.cli.plan", "per-device memory of a config's run, compiled ahead of time"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: jaxppo COMMAND [ARGS]   (jaxppo COMMAND --help for its options)\n\ncommands:\n{rows}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv[0]`` to its command's ``main(argv[1:])``; ``--help`` or no command prints the table (exit 0 /
    2); an unknown command is one line on stderr naming the known ones, exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        (sys.stdout if args else sys.stderr).write(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"jaxppo: unknown command {name!r} (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)
