"""The fleet view's data (issue 31): a cluster's nodes read from a Prometheus (gputop's series and
dcgm-exporter's), aggregated on the server in a few queries, ranked worst first. No Textual here: the TUI
(tui/fleet_*.py) and ``gputop fleet`` (commands/fleet.py) both use it."""
