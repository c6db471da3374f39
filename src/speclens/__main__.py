"""``python -m speclens``: Ctrl-C while the command is still importing exits 130 quietly."""

try:
    from speclens.cli import main
except KeyboardInterrupt:
    raise SystemExit(130) from None

main()
