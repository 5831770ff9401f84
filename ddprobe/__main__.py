"""``python -m ddprobe``: the same command line as the ``ddprobe`` script."""
from .cli import main

main()
