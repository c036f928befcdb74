"""``python -m jaxppo.dpo``: the same as ``jaxppo dpo`` (:mod:`jaxppo.cli.dpo`)."""

from jaxppo.cli.dpo import main

if __name__ == "__main__":
    raise SystemExit(main())
