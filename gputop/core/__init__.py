"""The data layer, free of any face: /proc and ownership, orphan verdicts, Slurm jobs, the sampler and its
Snapshot, config, the rogue audit, permissions, the audit log and who is asking. It imports only the
backends and gputop.util; nothing here imports Textual. Keep this file empty of imports: the TUI's
first frame must not pull the process layer in. See docs/architecture.md."""
