"""gputop: a top-like GPU process manager for shared GPU nodes."""

__version__ = "0.1.0"
