from gputop.commands.cli import entry

entry()
