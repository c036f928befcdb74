"""``python -m jaxppo.collect``: the same as ``jaxppo collect`` (:mod:`jaxppo.cli.collect`)."""

from jaxppo.cli.collect import main

if __name__ == "__main__":
    raise SystemExit(main())
