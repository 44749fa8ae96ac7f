"""``python -m kombu_ladder``: the command line."""

from .cli import main

raise SystemExit(main())
