"""``python -m ddprobe.cli``: kept for scripts that call it so; ``python -m ddprobe`` is the same."""
from . import main

main()
