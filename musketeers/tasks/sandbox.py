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
  unaudited ``_posixsubprocess.fork_exec`` is replaced, and loading it again refused),
  signals, sockets, ``ctypes``, raising rlimits, reaching frames, rebinding a function's code
  or defaults, and on opening for writing, creating, removing, renaming or changing any path
  outside that directory.

``PermissionError`` is an ``OSError``: Python's own best-effort writes (bytecode caches) treat
it as "cannot write" and go on.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from collections.abc import Callable
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
    # frames: a scorer's frame holds the reply channel and the request's id, enough to forge
    # a reply; the traceback and generator ways to one are object.__getattr__ (_FRAME_ATTRS)
    "sys._getframe", "sys._current_frames",
)
# function attributes whose rebinding (object.__setattr__) would swap the code of a function
_FUNCTION_INTERNALS = ("__code__", "__defaults__", "__kwdefaults__", "__globals__",
                       "__closure__", "__builtins__")
_FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back")
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
    _disarm_fork_exec()  # before the hook, which then refuses loading the original again
    sys.addaudithook(_hook(root))


def _hook(root: str) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook, built from copies: at call time it looks up no module global, builtin
    or Python-level library function (``os.path.realpath`` reads patchable globals), so an
    evaluated expression that rebinds any of them changes nothing it does. Paths are taken
    only as exact ``str`` or ``bytes``: no code of the caller's runs inside the hook."""
    denied = tuple(_DENIED)
    path_events = tuple(_PATH_EVENTS.items())
    lstat, readlink, is_link = os.lstat, os.readlink, stat.S_ISLNK
    str_, bytes_, type_, int_ = str, bytes, type, int
    denial, os_error = PermissionError, OSError
    sep, devnull, write_flags = os.sep, os.devnull, _WRITE_FLAGS
    internals, frame_attrs = _FUNCTION_INTERNALS, _FRAME_ATTRS

    def resolve(path: str) -> str | None:
        # realpath from system calls alone; relative to root, as chdir is denied
        todo = (path if path.startswith(sep) else root + sep + path).split(sep)[::-1]
        parts: list[str] = []
        hops = 0
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if parts:
                    parts.pop()
                continue
            here = sep + sep.join([*parts, name])
            try:
                mode = lstat(here).st_mode
            except os_error:  # absent (or unreadable): taken literally, as open would
                parts.append(name)
                continue
            except ValueError:  # an embedded NUL: never a path to allow
                return None
            if not is_link(mode):
                parts.append(name)
                continue
            hops += 1
            if hops > 40:  # a link loop
                return None
            target = readlink(here)
            if target.startswith(sep):
                parts = []
            todo.extend(target.split(sep)[::-1])
        return sep + sep.join(parts)

    def inside(path: Any) -> bool:
        if type_(path) is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        if type_(path) is not str_:  # a descriptor or a path object: refused
            return False
        real = resolve(path)
        return real is not None and (real == root or real.startswith(root + sep)
                                     or real == devnull)

    def writes(mode: Any, flags: Any) -> bool:
        if type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
            return True
        return type_(flags) is int_ and bool(flags & write_flags)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(denied):
            raise denial(f"scorer sandbox: {event} denied")
        if event == "object.__setattr__" and args[1] in internals:
            raise denial(f"scorer sandbox: setting {args[1]} denied")
        if event == "object.__getattr__" and args[1] in frame_attrs:
            raise denial(f"scorer sandbox: {args[1]} denied")
        if event == "import" and type_(args[0]) is str_ and \
                args[0].rpartition(".")[2] == "_posixsubprocess":
            raise denial("scorer sandbox: loading _posixsubprocess again denied")
        if event == "open":
            path, mode, flags = (*args, None, None, None)[:3]
            if writes(mode, flags) and not inside(path):
                raise denial(f"scorer sandbox: writing {path!r} denied")
            return
        for name, positions in path_events:
            if name == event:
                for i in positions:
                    if i < len(args) and not inside(args[i]):
                        raise denial(f"scorer sandbox: {event} {args[i]!r} denied")

    return hook


def _disarm_fork_exec() -> None:
    """``subprocess``'s C helper forks and execs without an audit event of its own: replace it.

    Loading the module again (``del sys.modules[...]`` then ``import``) would hand back the
    original; the hook refuses that import. RLIMIT_NPROC is no substitute: root ignores it,
    and for other users it also counts threads.
    """
    try:
        import _posixsubprocess
    except ImportError:  # not POSIX
        return

    def fork_exec(*args: Any, **kwargs: Any) -> None:
        raise PermissionError("scorer sandbox: fork_exec denied")

    _posixsubprocess.fork_exec = fork_exec  # type: ignore[attr-defined]
