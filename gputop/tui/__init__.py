"""The full-screen Textual TUI. Only this package imports Textual; the data layer never does."""
