"""The leaf room: helpers that import nothing from gputop outside this room (errors and exit codes,
safe text, units, bounded regexes and YAML, trusted files). Every other room may import them.
See docs/architecture.md."""
