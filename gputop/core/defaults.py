"""Defaults that the config and the orphan classifier share, in a module of their own: the config is read
before the TUI's first frame, and the classifier (with the process layer under it) is imported after it."""

# Process names (and argv[0] basenames) that protect a chain: never reaped, whatever its ancestors. Each
# pattern must match the WHOLE name (anchored): "jupyter.*" for jupyter, jupyter-lab, jupyter-notebook;
# "tmux(: .*)?" for tmux and the comm "tmux: server" tmux gives itself. "tmux" does not protect "xmrig-tmux".
DEFAULT_PROTECT = (
    "jupyter.*", "nohup", "tmux(: .*)?", "screen", "code-server",
    "explorer.exe", "services.exe", "svchost.exe",
)
# Full-command-line patterns: a separate, explicit list (see compile_protect). The jupyter kernel runs
# as "python -m ipykernel_launcher -f ...", so neither its name nor argv[0] says jupyter.
DEFAULT_PROTECT_CMDLINE = (r"-m\s+(ipykernel_launcher|ipykernel|jupyter\S*)(\s|$)",)
DEFAULT_MAX_CHAIN = 64
