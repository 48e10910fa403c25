"""The long-running faces over one shared live snapshot: faces (LiveSnapshot, the shared sampling and
the action calls), api (``gputop serve``: the HTTP API), metrics (Prometheus), mcp_server (``gputop mcp``).
Their subcommands (gputop.commands.serve, gputop.commands.mcp) parse arguments and start them.
See docs/architecture.md."""
