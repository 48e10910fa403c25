"""Subcommands. Each module defines NAME, HELP, ``add_arguments(parser)`` and ``run(args) -> int``.

Add a subcommand by writing a module here and listing it below (by its command name: a "-" in it is a
"_" in the module name); cli.py needs no change.
"""

COMMANDS: list[str] = [
    "status",
    "kill",
    "reap",
    "reset",
    "log",
    "serve",
    "mcp",
    "guard",
    "audit",
    "install-units",
    "completion",
    "slurm",
    "fleet",
]
