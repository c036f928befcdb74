"""``python -m jaxppo.evaluate``: the same as ``jaxppo evaluate`` (:mod:`jaxppo.cli.evaluate`)."""

from jaxppo.cli.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
