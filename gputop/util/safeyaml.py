"""Bounded YAML for files other people write (policies, configs, scenarios).

A 1 KB "billion laughs" file of nested aliases expands to billions of nodes once anything walks it. Here
the size of the text is capped before parsing, and while the YAML is composed (before any Python object
is built) every node is counted, as is the size the document would have with every alias expanded, and
its nesting depth. Past a limit, composition stops with ``YamlLimitError`` and a one-line reason.

``BoundedLoader`` is a ``yaml.SafeLoader``: use ``load()`` for plain data, or ``BoundedLoader(text)`` with
``get_single_node()`` when the caller wants the node tree (line numbers), as guard.policy does.
"""

from __future__ import annotations

import os
import stat

import yaml

MAX_BYTES = 1 << 20  # 1 MiB of YAML text
MAX_NODES = 50_000  # nodes as written
MAX_EXPANDED = 200_000  # nodes with every alias expanded
MAX_DEPTH = 64  # nesting of mappings and sequences


class YamlLimitError(yaml.YAMLError):
    """The document is over a limit (size, nodes, alias expansion or depth)."""


class BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream):
        if isinstance(stream, (str, bytes)) and len(stream) > MAX_BYTES:
            raise YamlLimitError(f"the file is {len(stream)} bytes; at most {MAX_BYTES} are allowed")
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> expanded size

    def compose_node(self, parent, index):
        is_alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlLimitError(f"nesting deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if is_alias and id(node) not in self._sizes:
            raise YamlLimitError("an alias refers to the node that contains it (a recursive alias)")
        if not is_alias:
            self._nodes += 1
            if self._nodes > MAX_NODES:
                raise YamlLimitError(f"more than {MAX_NODES} nodes")
            self._sizes[id(node)] = self._expanded(node)
        return node

    def _expanded(self, node) -> int:
        if isinstance(node, yaml.MappingNode):
            kids = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            kids = node.value
        else:
            return 1
        size = 1 + sum(self._sizes.get(id(k), 1) for k in kids)
        if size > MAX_EXPANDED:
            raise YamlLimitError(f"aliases expand to more than {MAX_EXPANDED} nodes (a 'billion laughs' file?)")
        return size


def load(text: str | bytes):
    """``yaml.safe_load`` with the limits above. Raises yaml.YAMLError (YamlLimitError over a limit)."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_regular(path: str | os.PathLike, limit: int = MAX_BYTES) -> str:
    """Read a text file that must be a regular file (a FIFO or a device never blocks: O_NONBLOCK, then
    fstat) and at most ``limit`` bytes. Raises OSError (FileNotFoundError when missing) or ValueError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


class NotUtf8(ValueError):
    """A file's bytes are not UTF-8 (the message says where)."""


def read_fd(fd: int, limit: int = MAX_BYTES) -> str:
    """The text of the open file ``fd``, which must be a regular file of at most ``limit`` bytes (fstat on
    the descriptor itself). Raises ValueError or OSError; the caller closes ``fd``."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > limit:
        raise ValueError(f"the file is {st.st_size} bytes; at most {limit} are allowed")
    chunks, total = [], 0
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        total += len(b)
        if total > limit:
            raise ValueError(f"the file is over {limit} bytes")
        chunks.append(b)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:  # a ValueError whose own words name a codec, not the problem
        line = data.count(b"\n", 0, e.start) + 1
        raise NotUtf8(f"the file is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}): save it as "
                      "UTF-8") from None
