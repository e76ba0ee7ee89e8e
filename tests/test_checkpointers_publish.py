"""Publishing a checkpoint in one rename, and what interrupted publishes leave behind.

The exchange path (Linux ``renameat2``) is what dumps use here; the two-rename fallback is
forced by hiding ``renameat2``. A forked child killed between the two renames shows the
fallback's leftovers and their repair.
"""
import errno
import multiprocessing as mp
import os
import signal

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat.storages as ours
from torchrl_compat.checkpointers import _publish as publish

FORK = mp.get_context("fork")
TIMEOUT = 60


def storage_of(value, n=3):
    storage = ours.LazyTensorStorage(8)
    storage.set(range(n), TensorDict({"v": torch.full((n,), value)}, [n]))
    return storage


def loaded(path):
    storage = ours.LazyTensorStorage(8)
    storage.loads(path)
    return storage[:]["v"].tolist()


def write_files(content):
    def write(directory):
        for name, text in content.items():
            (directory / name).write_text(text)

    return write


@pytest.fixture(params=["exchange", "two renames"])
def mode(request, monkeypatch):
    if request.param == "exchange":
        if publish._renameat2 is None:
            pytest.skip("no renameat2 on this system")
    else:
        monkeypatch.setattr(publish, "_renameat2", None)
    return request.param


def test_write_aside_replaces_the_directory(tmp_path, mode):
    path = tmp_path / "ckpt"
    publish.write_aside(path, write_files({"a": "1", "b": "1"}))
    publish.write_aside(path, write_files({"a": "2"}))
    assert sorted(os.listdir(path)) == ["a"] and (path / "a").read_text() == "2"
    assert os.listdir(tmp_path) == ["ckpt"]
    # an empty directory in the way is replaced too
    empty = tmp_path / "empty"
    empty.mkdir()
    publish.write_aside(empty, write_files({"x": "3"}))
    assert os.listdir(empty) == ["x"]


def test_write_aside_failure_keeps_the_previous(tmp_path, mode):
    path = tmp_path / "ckpt"
    publish.write_aside(path, write_files({"a": "1"}))

    def failing(directory):
        (directory / "a").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish.write_aside(path, failing)
    assert (path / "a").read_text() == "1" and os.listdir(tmp_path) == ["ckpt"]


def test_write_aside_refuses_bad_targets(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="exists and is not a directory"):
        publish.write_aside(tmp_path / "file", write_files({}))
    with pytest.raises(FileNotFoundError, match="parent directory .*missing.* does not exist"):
        publish.write_aside(tmp_path / "missing" / "ckpt", write_files({}))


def test_publish_file(tmp_path):
    target = tmp_path / "meta.json"
    publish.publish_file(target, lambda file: file.write_text("old"))
    with pytest.raises(ValueError):
        publish.publish_file(target, lambda file: (file.write_text("ne"), int("x")))
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["meta.json"]
    publish.publish_file(target, lambda file: file.write_text("new"))
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["meta.json"]


def _publish_and_die_between_renames(path):
    """Two-rename publish killed after the previous checkpoint was moved away."""
    publish._renameat2 = None
    real_rename = os.rename

    def rename(src, dst):
        real_rename(src, dst)
        if str(src) == str(path):
            os.kill(os.getpid(), signal.SIGKILL)

    publish.os.rename = rename
    storage_of(2.0).dumps(path)


def test_two_rename_publish_killed_between_its_renames(tmp_path):
    path = tmp_path / "ckpt"
    storage_of(1.0).dumps(path)
    child = FORK.Process(target=_publish_and_die_between_renames, args=(path,))
    child.start()
    child.join(TIMEOUT)
    assert child.exitcode == -signal.SIGKILL
    leftovers = sorted(os.listdir(tmp_path))
    assert "ckpt" not in leftovers and any(name.startswith(".ckpt.old-") for name in leftovers)
    with pytest.raises(FileNotFoundError, match="No storage checkpoint found"):
        loaded(path)
    # the next publish (here, a cleanup alone) puts the previous checkpoint back first
    publish.remove_abandoned(path)
    assert loaded(path) == [1.0] * 3 and os.listdir(tmp_path) == ["ckpt"]
    storage_of(3.0, n=2).dumps(path)
    assert loaded(path) == [3.0] * 2 and os.listdir(tmp_path) == ["ckpt"]


def test_published_path_inside_nested_writes(tmp_path, mode):
    path = tmp_path / "ckpt"
    seen = {}

    def inner(directory):
        seen["inner"] = publish.published_path(directory / "x")

    def outer(directory):
        seen["outer"] = publish.published_path(directory / "storage")
        publish.write_aside(directory / "storage", inner)

    publish.write_aside(path, outer)
    assert seen == {"outer": path / "storage", "inner": path / "storage" / "x"}
    assert publish.published_path(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    assert (path / "storage").is_dir()


def test_carry_over(tmp_path, monkeypatch):
    source, dest = tmp_path / "source", tmp_path / "dest"
    (source / "sub").mkdir(parents=True)
    for name in ("keep", "sub/deep", "own", "copied", "dropped"):
        (source / name).write_text(name)
    (source / ".own.partial-0123456789ab").mkdir()  # an interrupted write's leftover
    (source / "sub" / ".deep.old-0123456789ab").write_text("old")
    os.symlink("keep", source / "link")
    dest.mkdir()
    choices = {"copied": publish.COPY, "dropped": None}
    publish.carry_over(source, dest, skip=("own",), how=lambda file: choices.get(file.name, publish.LINK))
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == ["copied", "keep", "link", "sub", "sub/deep"]
    assert os.path.samefile(dest / "keep", source / "keep") and os.path.samefile(dest / "sub" / "deep", source / "sub" / "deep")
    assert not os.path.samefile(dest / "copied", source / "copied") and (dest / "copied").read_text() == "copied"
    assert os.readlink(dest / "link") == "keep"
    publish.carry_over(tmp_path / "missing", dest)  # nothing to carry

    # a file system without hard links: a copy by default, an error naming the file for LINK
    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(publish.os, "link", no_link)
    other = tmp_path / "other"
    other.mkdir()
    publish.carry_over(source, other, skip=("own",))
    assert (other / "keep").read_text() == "keep" and not os.path.samefile(other / "keep", source / "keep")
    strict = tmp_path / "strict"
    strict.mkdir()
    with pytest.raises(OSError, match=r"Cannot link .*source/copied into the checkpoint"):
        publish.carry_over(source, strict, how=lambda file: publish.LINK)


def test_docstring_examples():
    import doctest

    result = doctest.testmod(publish, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# -----------------------------------------------------------------------------
# durability: flushed before the rename that publishes, the parent after it
# -----------------------------------------------------------------------------
@pytest.fixture
def disk_events(monkeypatch):
    """The fsyncs (the path flushed) and publishing renames, in order; the real calls run."""
    events = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace
    real_exchange = publish._renameat2

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", os.fsdecode(src), os.fsdecode(dst)))
        return real_rename(src, dst, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        events.append(("rename", os.fsdecode(src), os.fsdecode(dst)))
        return real_replace(src, dst, *args, **kwargs)

    def exchange(fd_a, a, fd_b, b, flags):
        result = real_exchange(fd_a, a, fd_b, b, flags)
        if result == 0:
            events.append(("rename", os.fsdecode(a), os.fsdecode(b)))
        return result

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    if real_exchange is not None:
        monkeypatch.setattr(publish, "_renameat2", exchange)
    return events


def _publishes(events, path):
    """The index of the rename that put something at ``path``."""
    (index,) = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(path)]
    return index


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name the flushed files")
def test_write_aside_flushes_before_publishing(tmp_path, mode, disk_events):
    path = tmp_path / "ckpt"
    for version in ("1", "2"):
        disk_events.clear()
        written = []

        def write(directory):
            (directory / "sub").mkdir()
            for name in ("a", "sub/b"):
                (directory / name).write_text(version)
                written.append(str(directory / name))
            written.extend([str(directory / "sub"), str(directory)])

        publish.write_aside(path, write)
        at = _publishes(disk_events, path)
        flushed = [e[1] for e in disk_events[:at] if e[0] == "fsync"]
        # every file and directory, each directory after what it holds, all before the rename
        assert sorted(flushed) == sorted(written) and len(flushed) == len(written)
        position = {name: i for i, name in enumerate(flushed)}
        for name in written:
            parent = os.path.dirname(name)
            if parent in position:
                assert position[name] < position[parent], (name, flushed)
        assert disk_events[at + 1:] == [("fsync", str(tmp_path))] or (
            mode == "two renames" and ("fsync", str(tmp_path)) in disk_events[at + 1:]
        )
        assert (path / "sub" / "b").read_text() == version


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name the flushed files")
def test_publish_file_flushes_before_publishing(tmp_path, disk_events):
    path = tmp_path / "file.json"
    publish.publish_file(path, lambda file: file.write_text("{}"))
    at = _publishes(disk_events, path)
    (flushed,) = [e for e in disk_events[:at] if e[0] == "fsync"]
    assert flushed[1].endswith("/file.json") and os.path.dirname(flushed[1]) != str(tmp_path)
    assert disk_events[at + 1] == ("fsync", str(tmp_path))
    assert path.read_text() == "{}"
