"""The `raylog` command line: argument parsing and one module per command group.

Nothing outside this package imports it; it may import every layer (it assembles clusters).
``python -m raylog.actors.cli`` runs it as the ``raylog`` console script does.
"""
