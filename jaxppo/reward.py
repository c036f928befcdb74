"""``python -m jaxppo.reward``: the same as ``jaxppo reward`` (:mod:`jaxppo.cli.reward`)."""

from jaxppo.cli.reward import main

if __name__ == "__main__":
    raise SystemExit(main())
