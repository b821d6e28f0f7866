"""``python -m kernel``: Tandem's command line (see kernel/cli.py)."""

from kernel.cli import main

main()
