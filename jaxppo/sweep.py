"""``python -m jaxppo.sweep``: the same as ``jaxppo sweep`` (:mod:`jaxppo.cli.sweep`)."""

from jaxppo.cli.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
