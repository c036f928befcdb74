"""``python -m jaxppo.prompts``: the same as ``jaxppo prompts`` (:mod:`jaxppo.cli.prompts`)."""

from jaxppo.cli.prompts import main

if __name__ == "__main__":
    raise SystemExit(main())
