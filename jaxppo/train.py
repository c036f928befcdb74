"""``python -m jaxppo.train``: the same as ``jaxppo train`` (:mod:`jaxppo.cli.train`)."""

from jaxppo.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main())
