"""``python -m jaxppo.cli COMMAND [ARGS]``: the same as the ``jaxppo`` console command."""

from jaxppo.cli import main

raise SystemExit(main())
