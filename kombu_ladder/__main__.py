"""``python -m kombu_ladder``: the ``kombu-ladder`` command line."""

from .cli import main

raise SystemExit(main(prog_name="python -m kombu_ladder"))
