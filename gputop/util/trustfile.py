"""Files root loads must be root's: the owner and mode check on a policy, config or scenario file.

Running as root (euid 0), gputop reads such a file only when nobody but root could have written it or
could swap it for another (the rule of OpenSSH's StrictModes and of sudo):

- the file is a regular file owned by root and not writable by its group or by others;
- every directory the kernel looks a name up in on the way to it (each ancestor, and each directory a
  symlink on the way leads through) is owned by root and not writable by its group or by others, unless
  it has the sticky bit (/tmp: there another user cannot rename or delete root's entries, and every
  entry on the path must itself be root's);
- every symlink on the way is owned by root (in a sticky directory another user could have made it),
  and is followed only into a place that passes the same test.

The path is walked component by component with lstat (no symlink followed unchecked), then the file is
opened with O_NOFOLLOW and the owner and mode are checked again on the open descriptor with fstat, so
what is read is what was checked. A refusal is ``UntrustedFile`` (a UsageError: one line, exit 2).

Other users keep the plain read (a user's gputop can only act with that user's rights).
"""

from __future__ import annotations

import errno
import os
import stat

from gputop.util.errors import UsageError

MAX_LINKS = 40  # as the kernel's ELOOP limit


class UntrustedFile(UsageError):
    """Root refuses a file that someone other than root could write. ``problem`` and ``fix`` say why
    and what to do; str() is the whole line with ``what`` and the path."""

    def __init__(self, what: str, path: str, problem: str, fix: str):
        self.what, self.path, self.problem, self.fix = what, path, problem, fix
        super().__init__(f"{what} {path} refused: {problem}; {fix}")


def strict() -> bool:
    """Whether the check applies: gputop runs as root."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _who(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check(st: os.stat_result, what: str, path: str, entry: str, kind: str) -> None:
    """Raise UntrustedFile unless ``entry`` (a file, directory or symlink on the way to ``path``) is
    root's and no one else may write it."""
    if st.st_uid != 0:
        fix = {"the file": f"check its content, then run 'chown root {entry}'",
               "symlink": f"check where it leads, then run 'chown -h root {entry}' (or name the file itself)",
               }.get(kind, f"run 'chown root {entry}' (or move the file to a root-owned directory)")
        raise UntrustedFile(what, path, f"{kind} {entry} is owned by {_who(st.st_uid)}, not by root, and "
                            "root only loads files only root can change", fix)
    if kind == "symlink":
        return  # a symlink's own mode means nothing
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o022:
        return
    if kind == "directory":
        if mode & stat.S_ISVTX:
            return  # sticky (/tmp): others cannot replace root's entries, which are checked one by one
        raise UntrustedFile(what, path, f"directory {entry} is writable by others (mode {mode:04o}), who could "
                            "replace the file", f"run 'chmod go-w {entry}' (or move the file to a root-owned "
                            "directory)")
    raise UntrustedFile(what, path, f"{kind} {entry} is writable by others (mode {mode:04o})",
                        f"check its content, then run 'chmod go-w {entry}'")


def _walk(path: str, what: str) -> str:
    """The real path of ``path`` (no symlink left), every directory and symlink on the way checked."""
    full = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    todo = [c for c in full.split("/") if c][::-1]  # components still to look up, the next one last
    cur = "/"
    _check(os.lstat("/"), what, path, "/", "directory")
    links = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)  # cur is a real, checked directory: so are all its ancestors
            continue
        nxt = os.path.join(cur, name)
        st = os.lstat(nxt)  # FileNotFoundError and the like go to the caller
        if stat.S_ISLNK(st.st_mode):
            _check(st, what, path, nxt, "symlink")
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo.extend([c for c in target.split("/") if c][::-1])
            continue
        if todo:
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            _check(st, what, path, nxt, "directory")
            cur = nxt
        else:
            return nxt
    return cur  # the path names a directory: open() says so


def private_dir(path: str) -> bool:
    """Whether ``path`` is a directory only root may write (owned by root, no group or other write, the
    sticky bit no excuse here), reached through directories that pass the rule above."""
    try:
        real = _walk(path, "directory")
        st = os.lstat(real)
    except (UntrustedFile, OSError):
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o022


def open_file(path: str | os.PathLike, what: str) -> int:
    """A read-only descriptor on ``path`` (O_NONBLOCK: a FIFO never blocks). As root, only once the file
    passes the rule above (UntrustedFile otherwise); OSError as open() raises it."""
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not strict():
        return os.open(path, flags)
    real = _walk(path, what)
    fd = os.open(real, flags | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):  # anything else is refused by the reader, with its own message
            _check(st, what, path, real if real != os.path.abspath(path) else path, "the file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path: str | os.PathLike, what: str, limit: int | None = None) -> str:
    """The text of a regular file of at most ``limit`` bytes (safeyaml.read_fd), checked as open_file
    does. Raises UntrustedFile, OSError (FileNotFoundError when missing) or ValueError."""
    from gputop.util import safeyaml

    fd = open_file(path, what)
    try:
        return safeyaml.read_fd(fd, safeyaml.MAX_BYTES if limit is None else limit)
    finally:
        os.close(fd)
