"""gputop completion: print a bash or zsh completion script made from the command-line parser."""

from __future__ import annotations

import sys

from gputop.util.errors import UnavailableError

NAME = "completion"
HELP = "print a shell completion script (bash or zsh)"
DESCRIPTION = """Print a completion script for bash or zsh, generated from gputop's own parser (every
subcommand and option). Install it once:

  bash: gputop completion bash | sudo tee /etc/bash_completion.d/gputop   (or into ~/.bashrc:
        eval "$(gputop completion bash)")
  zsh:  gputop completion zsh > "${fpath[1]}/_gputop"   (then restart zsh)"""


def add_arguments(p) -> None:
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete for")


def run(args) -> int:
    try:
        import shtab
    except ImportError:
        raise UnavailableError("shell completion needs the 'shtab' package: pip install shtab") from None
    from gputop.commands.cli import build_parser

    parser = build_parser()  # the whole parser, every subcommand imported
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return 0
