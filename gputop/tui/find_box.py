"""The filter (/ or F4) and search (F3) boxes under the tree: hidden until opened; enter keeps what was
typed, escape closes (the filter box also clears). What is typed reaches the app as Input.Changed."""

from __future__ import annotations

from textual.message import Message
from textual.widgets import Input


class FindBox(Input):
    class Closed(Message):
        """The box closed; ``cleared``: escape emptied the filter."""

        def __init__(self, box: "FindBox", cleared: bool):
            super().__init__()
            self.box = box
            self.cleared = cleared

    def open(self, value: str = "") -> None:
        self.display = True
        self.value = value
        self.focus()

    def close(self, clear: bool) -> None:
        self.display = False
        cleared = clear and self.id == "filter"
        if cleared:
            self.value = ""
        self.post_message(self.Closed(self, cleared))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.close(clear=False)

    def on_key(self, event) -> None:
        if event.key == "escape":
            self.close(clear=True)
            event.stop()
