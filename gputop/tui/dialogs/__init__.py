"""Modal dialogs. Every one starts focused on Cancel and closes on Escape, which cancels."""
