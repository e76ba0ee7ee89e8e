"""Publishing a checkpoint whole: written aside, then put in place in one rename; removing
what interrupted writes leave behind.

Every class with ``dumps`` (storages, checkpointers, samplers, their ensembles) writes through
:func:`write_aside` (or :func:`publish_file` for a lone file). A checkpoint ``path`` (a
directory or a file) is written into a sibling directory ``.<name>.partial-<id>`` and then
published over ``path`` by one rename: an atomic exchange of the two directories (Linux
``renameat2(RENAME_EXCHANGE)``), or ``os.replace`` for a file. Whatever moment a dump is
interrupted at, even by SIGKILL, ``path`` holds the previous checkpoint or the new one,
complete.

Each writer holds an exclusive ``flock`` on its partial directory while it writes.
Before writing, a dump removes the partial siblings of the same ``path`` that nobody holds:
those of dumps that were killed. A live concurrent dump, in this process or another, holds
its lock and is left alone.

Where the exchange is not available (another kernel, a file system without it), the
previous directory is first renamed to ``.<name>.old-<id>`` and the new one renamed onto
``path``: two renames. A dump killed between them leaves no ``path``; the next dump renames
the previous checkpoint back before anything else.

A checkpoint made of others (a replay buffer's: its storage's, sampler's, writer's) is
written whole into one partial directory, each part dumped into it by its own ``dumps``, and
published once. :func:`published_path` tells a part where its files will be once published:
a storage whose memory-mapped files live there (a ``LazyMemmapStorage`` whose ``scratch_dir``
is the checkpoint's) links them into the partial directory instead of copying them, and what
the previous checkpoint holds besides its own entries is carried over (:func:`carry_over`).

Durability: before a rename publishes anything, every file and directory written aside is
flushed to the disk (``fsync``), and the directory holding ``path`` is flushed after it, the
order SQLite and LMDB use. A power loss then leaves the previous checkpoint or the new one,
whole, as a kill does: never a published name whose data never reached the disk.

Nothing here runs at ``loads``: reading a checkpoint never writes to it.
"""
from __future__ import annotations

import contextvars
import ctypes
import errno
import os
import shutil
import sys
import uuid
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None

__all__ = [
    "PARTIAL_TAG",
    "LIVE_TAG",
    "carry_over",
    "make_locked_sibling",
    "outermost_target",
    "partial_siblings",
    "publish_file",
    "published_path",
    "reading",
    "remove_abandoned",
    "sync_directory",
    "sync_tree",
    "write_aside",
]

PARTIAL_TAG = ".partial-"
OLD_TAG = ".old-"
# the directory a storage living in a checkpoint writes to once moved out of it
LIVE_TAG = ".live-"


def partial_siblings(path: Path) -> list[Path]:
    """The ``.<name>.partial-*`` siblings of ``path``, sorted by name."""
    path = Path(path)
    prefix = f".{path.name}{PARTIAL_TAG}"
    try:
        names = os.listdir(path.parent)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(path.parent / name for name in names if name.startswith(prefix))


def _sibling(path: Path, tag: str) -> Path:
    return path.parent / f".{path.name}{tag}{uuid.uuid4().hex[:12]}"


def _is_leftover(name: str) -> bool:
    """Whether ``name`` is the partial or old sibling of some entry."""
    return name.startswith(".") and (PARTIAL_TAG in name or OLD_TAG in name or LIVE_TAG in name)


# -----------------------------------------------------------------------------
# Locks
# -----------------------------------------------------------------------------
def _open_locked(path: Path, block: bool) -> int | None:
    """An fd on ``path`` holding its exclusive flock, or ``None`` if ``path`` is gone, is
    held by someone else (``block=False``) or was replaced while waiting."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return None
        # whoever held the lock before may have removed or replaced what the name points to
        if os.path.samestat(os.stat(path), os.fstat(fd)):
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


def _make_locked(path: Path, make, tag: str = PARTIAL_TAG) -> tuple[Path, int | None]:
    """Creates a fresh locked sibling of ``path`` with ``make(name)``: ``(name, fd)`` (no
    fd without ``fcntl``: nothing is locked, and nothing is cleaned up either)."""
    while True:
        name = _sibling(path, tag)
        make(name)
        if fcntl is None:
            return name, None
        # blocks only while a cleaner that locked the new, empty entry first removes it
        fd = _open_locked(name, block=True)
        if fd is not None:
            return name, fd


def make_locked_sibling(path: Path, tag: str) -> tuple[Path, int | None]:
    """A new directory ``.<name><tag><id>`` beside ``path`` and the fd holding its lock
    (``None`` without ``fcntl``); :func:`remove_abandoned` leaves it while the fd is open."""
    return _make_locked(Path(path), os.mkdir, tag)


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        try:
            os.unlink(entry)
        except FileNotFoundError:
            pass


def remove_abandoned(path) -> list[Path]:
    """Removes the partial siblings of ``path`` left by interrupted writes, and the homes of
    storages moved out of it whose process is gone.

    An entry is abandoned when no process holds its lock: its writer was killed (a live
    writer, in this process or another, holds it until it is done; a storage's home is held
    for as long as the storage lives). Without ``fcntl``
    nothing can be told apart, and nothing is removed. If ``path`` is missing while a
    previous checkpoint waits under an ``.old-`` name (a two-rename publish cut between its
    renames), that checkpoint is renamed back to ``path`` first.

    Args:
        path (str or Path): the checkpoint path whose siblings are examined.

    Returns:
        the entries removed.
    """
    if fcntl is None:
        return []
    path = Path(path).absolute()
    try:
        names = sorted(os.listdir(path.parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    # old checkpoints first: one may have to be restored before the rest is judged
    for tag in (OLD_TAG, PARTIAL_TAG, LIVE_TAG):
        prefix = f".{path.name}{tag}"
        for name in names:
            if not name.startswith(prefix):
                continue
            entry = path.parent / name
            fd = _open_locked(entry, block=False)
            if fd is None:
                continue
            try:
                if tag == OLD_TAG and not os.path.lexists(path):
                    os.rename(entry, path)
                    continue
                _remove(entry)
                removed.append(entry)
            finally:
                os.close(fd)
    return removed


# -----------------------------------------------------------------------------
# Checkpoints written inside checkpoints
# -----------------------------------------------------------------------------
# The (partial directory, path it will be published as) pairs of the write_aside calls
# running in this thread, outermost first.
_WRITING_ASIDE = contextvars.ContextVar("_WRITING_ASIDE", default=())


def published_path(path) -> Path:
    """Where ``path`` will be once the partial directories it is being written in are
    published: ``path`` itself outside :func:`write_aside`.

    Args:
        path (str or Path): a path, inside a partial directory or not.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> seen = []
        >>> with tempfile.TemporaryDirectory() as root:
        ...     write_aside(Path(root) / "ckpt", lambda tmp: seen.append(published_path(tmp / "storage")))
        ...     seen == [Path(root) / "ckpt" / "storage"]
        True
    """
    path = Path(path).absolute()
    # innermost first; each target is already a published path
    for aside, target in reversed(_WRITING_ASIDE.get()):
        if path == aside or aside in path.parents:
            return target / path.relative_to(aside)
    return path


# The checkpoints being read (loads) in this thread, outermost first.
_READING = contextvars.ContextVar("_READING", default=())


def outermost_target(path) -> Path:
    """The outermost checkpoint being written (by :func:`write_aside`, in this thread) or
    read (inside :func:`reading`) around ``path``; ``path`` itself outside both."""
    frames = _WRITING_ASIDE.get()
    if frames:
        return frames[0][1]
    read = _READING.get()
    if read:
        return read[0]
    return Path(path).absolute()


class reading:
    """Marks ``path`` as a checkpoint being read while the ``with`` block runs (see
    :func:`outermost_target`).

    Args:
        path (str or Path): the checkpoint.
    """

    def __init__(self, path):
        self._path = Path(path).absolute()
        self._token = None

    def __enter__(self):
        self._token = _READING.set(_READING.get() + (self._path,))
        return self

    def __exit__(self, *exc):
        _READING.reset(self._token)
        return False


LINK, COPY = "link", "copy"
_LINK_OR_COPY = "link or copy"
# what a file system that cannot make a hard link answers
_NO_LINK_ERRORS = frozenset({errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def _carry_file(source: Path, dest: Path, how: str) -> None:
    if how == COPY:
        shutil.copy2(source, dest)
        return
    try:
        os.link(source, dest)
    except OSError as err:
        if how != LINK and err.errno in _NO_LINK_ERRORS:
            shutil.copy2(source, dest)
        elif how == LINK:
            raise OSError(
                err.errno,
                f"Cannot link {source} into the checkpoint being written ({err.strerror}): it is "
                "live data that must stay the same file once the checkpoint is published, so it "
                "is not copied. Keep such files on a file system with hard links.",
                str(dest),
            ) from None
        else:
            raise


def carry_over(source, dest, *, skip=(), how=None) -> None:
    """Recreates in directory ``dest`` the tree under ``source``, so that ``dest`` published
    in place of ``source`` keeps what it held.

    Files become hard links (no data is copied, and a file that something still writes
    through, such as a live memory map, stays the same file under the same name); a file
    system that cannot make the link gets a copy. Directories are recreated and symbolic
    links copied as links. The partial and old siblings of interrupted writes are left out,
    and so are the top-level names in ``skip``. A missing ``source`` carries nothing, as does
    an entry removed while it is being carried.

    Args:
        source (str or Path): the directory that will be replaced.
        dest (str or Path): the directory written aside, to be published in its place.

    Keyword Args:
        skip (collection of str, optional): names in ``source`` to leave out (the entries
            the new checkpoint writes itself). Defaults to none.
        how (callable, optional): ``how(file)`` picks, for each file (a ``Path`` under
            ``source``), :data:`LINK` (a hard link or an ``OSError``, never a copy),
            :data:`COPY`, or ``None`` to leave it out. Defaults to a hard link, or a copy
            where the file system has none.
    """
    source, dest = Path(source), Path(dest)
    try:
        entries = sorted(os.scandir(source), key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name in skip or _is_leftover(entry.name):
            continue
        target = dest / entry.name
        try:
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir():
                target.mkdir(exist_ok=True)
                carry_over(entry.path, target, how=how)
            else:
                choice = how(Path(entry.path)) if how is not None else _LINK_OR_COPY
                if choice is not None:
                    _carry_file(Path(entry.path), target, choice)
        except FileNotFoundError:
            if os.path.lexists(entry.path):
                raise


# -----------------------------------------------------------------------------
# Durability
# -----------------------------------------------------------------------------
def _fsync_path(path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(path) -> None:
    """Flushes the entries of directory ``path`` (names created, renamed or removed) to the disk."""
    _fsync_path(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def sync_tree(root) -> None:
    """Flushes every file under ``root`` (``root`` itself if it is a file), then every
    directory, deepest first, to the disk: what a rename is about to publish.

    A file that is also a live memory map (a storage's file linked into a checkpoint) gets
    the pages written through the map flushed with it. Symbolic links are not followed.
    """
    root = Path(root)
    if not root.is_dir() or root.is_symlink():
        _fsync_path(root)
        return
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            file = os.path.join(directory, name)
            if not os.path.islink(file):
                _fsync_path(file)
        sync_directory(directory)


# -----------------------------------------------------------------------------
# Publishing
# -----------------------------------------------------------------------------
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _load_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, musl
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swaps the entries ``a`` and ``b``. ``False`` if this system cannot;
    raises ``FileNotFoundError`` if ``b`` does not exist."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.ENOENT:
        raise FileNotFoundError(code, os.strerror(code), str(b))
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _publish_directory(tmp: Path, path: Path) -> Path | None:
    """Puts directory ``tmp`` in place of ``path``. Returns what now holds the previous
    content, to be removed, or ``None``."""
    while True:
        try:
            if _exchange(tmp, path):
                return tmp
        except FileNotFoundError:
            pass  # no previous checkpoint
        else:
            return _publish_by_two_renames(tmp, path)
        try:
            os.rename(tmp, path)  # replaces an empty directory too
            return None
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # a concurrent dump published first: exchange with it


def _publish_by_two_renames(tmp: Path, path: Path) -> Path | None:
    old = None
    if os.path.lexists(path):
        # locked, so that a cleaner does not restore it between the two renames
        fd = _open_locked(path, block=True)
        if fd is None:
            return _publish_directory(tmp, path)
        try:
            old = _sibling(path, OLD_TAG)
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)
                raise
        finally:
            os.close(fd)
    else:
        os.rename(tmp, path)
    return old


def write_aside(path, write_fn) -> None:
    """Runs ``write_fn(tmp_dir)`` into a sibling directory, then publishes it as ``path``.

    ``path`` is untouched until ``write_fn`` has returned, and the previous content is only
    removed once the new one is in place. What ``write_fn`` wrote is flushed to the disk
    before the rename, and the parent directory after it (:func:`sync_tree`). Abandoned
    siblings of earlier interrupted writes are removed first (:func:`remove_abandoned`).
    While ``write_fn`` runs, :func:`published_path` maps paths under the sibling directory
    to their place under ``path``.

    Args:
        path (str or Path): the checkpoint directory.
        write_fn (callable): writes the checkpoint into the directory it is given.

    Raises:
        NotADirectoryError: if ``path`` exists and is not a directory.
        FileNotFoundError: if the parent directory of ``path`` does not exist.
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(
            f"Cannot write a checkpoint at {path}: it is not a directory (a checkpoint replaces "
            "a directory only, and this path exists and is not a directory)."
        )
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"Cannot write a checkpoint at {path}: the parent directory "
            f"{path.parent} does not exist."
        )
    remove_abandoned(path)
    # os.mkdir (not mkdtemp) keeps the umask-derived mode a plain mkdir would give
    tmp, fd = _make_locked(path, os.mkdir)
    try:
        try:
            token = _WRITING_ASIDE.set(_WRITING_ASIDE.get() + ((tmp, published_path(path)),))
            try:
                write_fn(tmp)
            finally:
                _WRITING_ASIDE.reset(token)
            # the content reaches the disk before the name that publishes it
            sync_tree(tmp)
            previous = _publish_directory(tmp, path)
            sync_directory(path.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if previous is not None:
            _remove(previous)
    finally:
        _close(fd)


def publish_file(path, write_fn) -> None:
    """Runs ``write_fn(tmp_file)``, then renames the file it wrote onto ``path``.

    Readers see the previous file or the new one, never a prefix of the new one, and the
    new one is flushed to the disk before the rename (its directory after it). The file is
    written inside a locked partial directory (the lock cannot be on the file itself: HDF5
    takes its own ``flock`` on the files it writes). Abandoned siblings of earlier
    interrupted writes are removed first.

    Args:
        path (str or Path): the file.
        write_fn (callable): creates and writes the file whose path it is given.
    """
    path = Path(path).absolute()
    remove_abandoned(path)
    tmp, fd = _make_locked(path, os.mkdir)
    try:
        write_fn(tmp / path.name)
        sync_tree(tmp / path.name)
        os.replace(tmp / path.name, path)
        sync_directory(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _close(fd)
