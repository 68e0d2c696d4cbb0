"""``python -m psgate``: the same command line as the ``psgate`` script."""

from psgate.cli import main

main()
