"""``python -m speclens``."""

from speclens.cli import main

main()
