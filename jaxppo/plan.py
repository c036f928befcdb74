"""``python -m jaxppo.plan``: the same as ``jaxppo plan`` (:mod:`jaxppo.cli.plan`)."""

from jaxppo.cli.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
