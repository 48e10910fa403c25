"""Guard mode: a YAML policy evaluated against live snapshots, enforced through gputop.actions.

policy (load + validate), conditions (per-target values and operators), engine (durations, grace,
per-user selection, actions), notify (e-mail, webhook, log), state (the channel shared with every face).
"""
