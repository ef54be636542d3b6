"""Confinement of the scorer child: a private reply channel and no effects outside a temp dir.

Answer grammars (``answer_grammar``) keep model text from being evaluated as code; this is the
second line, for the day a scorer or a grammar has a hole. It is what an unprivileged process
can do to itself, portably, in pure Python (the tests run as root, so file permissions would
not stop anything; an audit hook does):

* ``private_channel``: the protocol moves to fresh file descriptors and fds 0, 1 and 2 point at
  ``/dev/null``, so a scorer's ``print`` or ``input`` can never reach or read the protocol;
* ``confine``: cwd, ``HOME`` and ``TMPDIR`` become the worker's own temporary directory,
  ``RLIMIT_FSIZE`` caps what it writes there, no core files, and an audit hook
  (``sys.addaudithook``, irremovable) raises ``PermissionError`` on process creation
  (``os.system``, ``subprocess.Popen``, ``os.exec*``, ``os.fork``, ``os.posix_spawn``; the
  unaudited ``_posixsubprocess.fork_exec`` is replaced),
  signals, sockets, ``ctypes``, raising rlimits, and on opening for writing, creating,
  removing, renaming or changing any path outside that directory.

``PermissionError`` is an ``OSError``: Python's own best-effort writes (bytecode caches) treat
it as "cannot write" and go on.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import IO, Any

FILE_SIZE_LIMIT_BYTES = 16 << 20

_DENIED = (  # events refused whatever their arguments (prefixes)
    "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
    "os.kill", "os.killpg", "os.startfile", "os.chdir", "os.fchdir", "os.chroot",
    "subprocess.Popen", "pty.spawn", "socket.", "ctypes.", "resource.setrlimit",
    "resource.prlimit", "sqlite3.enable_load_extension", "sqlite3.load_extension",
    "webbrowser.open", "sys.remote_exec",
    # what could reach the hook's closure (gc) or watch it run (tracers) from an evaluation
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.setprofile",
    "sys.settrace",
)
# events whose path arguments (positions) must stay inside the sandbox directory
_PATH_EVENTS = {
    "os.mkdir": (0,), "os.rmdir": (0,), "os.remove": (0,), "os.rename": (0, 1),
    "os.link": (0, 1), "os.symlink": (0, 1), "os.truncate": (0,), "os.chmod": (0,),
    "os.chown": (0,), "os.utime": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
    "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,),
    "shutil.move": (1,), "sqlite3.connect": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def private_channel() -> tuple[IO[str], IO[str]]:
    """(requests, replies) on private descriptors; fds 0, 1, 2 become ``/dev/null``."""
    requests_fd, replies_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    requests = os.fdopen(requests_fd, "r", encoding="utf-8", errors="surrogateescape")
    replies = os.fdopen(replies_fd, "w", encoding="utf-8")
    return requests, replies


def _inside(root: str, path: Any, realpath=os.path.realpath, fsdecode=os.fsdecode,
            sep=os.sep, devnull=os.devnull) -> bool:
    # the os functions are bound at definition: patching ``os.path`` later changes nothing here
    if isinstance(path, int):  # a descriptor: only ours are open, and none may be rewritten
        return False
    try:
        real = realpath(fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == root or real.startswith(root + sep) or real == devnull


def _opens_for_writing(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def confine(root: str) -> None:
    """Make ``root`` (an existing, private directory) the only place this process can change."""
    import resource
    import tempfile

    root = os.path.realpath(root)
    os.chdir(root)
    for var in ("HOME", "TMPDIR", "TEMP", "TMP"):
        os.environ[var] = root
    tempfile.tempdir = root
    sys.dont_write_bytecode = True
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the cap: EFBIG, not death
    for limit, value in ((resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT_BYTES), (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):  # a hard limit already lower: keep it
            pass

    # The hook reads only what it closes over, copied here: an evaluated expression that
    # rebinds this module's globals (``_DENIED = ()``) or patches ``os.path.realpath``
    # changes nothing the hook sees, and the ways to reach a closure (gc, frames) are denied.
    denied = tuple(_DENIED)
    path_events = tuple(_PATH_EVENTS.items())
    inside, writes = _inside, _opens_for_writing

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(denied):
            raise PermissionError(f"scorer sandbox: {event} denied")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if writes(mode, flags) and not inside(root, path):
                raise PermissionError(f"scorer sandbox: writing {path!r} denied")
            return
        for name, positions in path_events:
            if name == event:
                for i in positions:
                    if i < len(args) and not inside(root, args[i]):
                        raise PermissionError(f"scorer sandbox: {event} {args[i]!r} denied")

    sys.addaudithook(hook)
    _disarm_fork_exec()


def _disarm_fork_exec() -> None:
    """``subprocess``'s C helper forks and execs without an audit event of its own: replace it.

    Best effort (code already running here could dig it out again); RLIMIT_NPROC is no
    substitute: root ignores it, and for other users it also counts threads.
    """
    try:
        import _posixsubprocess
    except ImportError:  # not POSIX
        return

    def fork_exec(*args: Any, **kwargs: Any) -> None:
        raise PermissionError("scorer sandbox: fork_exec denied")

    _posixsubprocess.fork_exec = fork_exec  # type: ignore[attr-defined]
