"""Every command that writes files, with the disk failing under it (tests/inputs/faults.py,
tests/inputs/writers.py): ENOSPC and EROFS, and a Ctrl-C, at every eighth of its writes. Each
case: exit 2 and one `error:` line naming the output and the disk's complaint (130 and
`interrupted` for Ctrl-C), no traceback, and the folder exactly as it was. Then the output
paths users get wrong: read-only, non-empty and symlinked outputs.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from tests.inputs.faults import disk_fault
from tests.inputs.helpers import invoke, listing, rejected
from tests.inputs.writers import FAULTS, Inputs, changes, make_writers, snapshot, sweep

WRITERS = [
    "import hf",
    "import gguf",
    "import onnx",
    "optimize -O2",
    "optimize quantize-weights",
    "optimize --quant int4",
    "build",
    "build decoder",
    "fmt -i",
    "init",
    "run --output-dir",
]


@pytest.fixture(scope="module")
def inputs(llama_dir: Path, llama_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("writers"), llama_dir, llama_gguf)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("name", WRITERS)
def test_disk_fault_at_every_eighth(inputs: Inputs, name: str, fault: str, tmp_path: Path) -> None:
    writers = make_writers(inputs)
    if name not in writers:
        pytest.skip(f"{name}: the package that writes its input is not installed")
    ran, failures = sweep(writers[name], fault, tmp_path / "work")
    assert ran > 0, "the fault never fired: the command wrote nothing under its folder"
    report = "\n".join(f"at write {at}: {'; '.join(o.problems)}" for at, o in failures)
    assert not failures, f"{name} under {fault}, {len(failures)} of {ran} cases:\n{report}"


def test_the_fault_sees_every_kind_of_write(tmp_path: Path) -> None:
    """open/io.open (pathlib, os.fdopen), os.open, os.mkdir, os.write, os.pwrite each count."""
    with disk_fault(tmp_path, errno.ENOSPC) as f:
        (tmp_path / "a").write_text("x")
        fd = os.open(tmp_path / "b", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"x")
        os.pwrite(fd, b"y", 4)
        os.close(fd)
        with os.fdopen(os.open(tmp_path / "c", os.O_WRONLY | os.O_CREAT), "w") as fh:
            fh.write("z")
        (tmp_path / "d").mkdir()
        (tmp_path.parent / "outside").write_text("not counted")
    assert (f.writes, f.creates) == (4, 4)
    with disk_fault(tmp_path, errno.EROFS, at=1), pytest.raises(OSError, match="Read-only"):
        (tmp_path / "e").mkdir()
    with disk_fault(tmp_path, errno.ENOSPC, at=2):
        fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"1")
        with pytest.raises(OSError, match="No space left"):
            os.write(fd, b"2")
        with pytest.raises(OSError, match="No space left"):  # a full disk stays full
            os.write(fd, b"3")
        os.close(fd)


# -- the defects the sweep found, one test each ----------------------------------------------


def test_build_on_a_full_disk_names_the_output(inputs: Inputs, tmp_path: Path) -> None:
    """Was `error: No space left on device`, naming nothing (a failed write names no file)."""
    f = inputs.small(tmp_path)
    before = snapshot(tmp_path)
    with disk_fault(tmp_path, errno.ENOSPC, at=2):
        code, _, err = invoke("build", str(f), "-o", str(tmp_path / "out"))
    rejected(
        code, err, expect=2, names=f"{tmp_path / 'out'}: cannot write the artifact: No space left"
    )
    assert not changes(before, snapshot(tmp_path))


def test_optimize_removes_the_weights_a_pass_wrote(inputs: Inputs, tmp_path: Path) -> None:
    """Was: q.q4.weights.bin left behind when q.llmir could not be written."""
    f = inputs.decoder(tmp_path)
    before = snapshot(tmp_path)
    argv = ["optimize", str(f), "--passes", "quantize-weights{bits=4}", "--allow-unproved"]
    with disk_fault(tmp_path, errno.EROFS, at=2):  # the weights file in, then the .llmir fails
        code, _, err = invoke(*argv, "-o", str(tmp_path / "q.llmir"))
    rejected(code, err, expect=2, names=f"{tmp_path / 'q.llmir'}")
    assert not changes(before, snapshot(tmp_path))


def test_run_output_dir_all_or_nothing(inputs: Inputs, tmp_path: Path) -> None:
    """Was: the output folder (and the outputs written before the failure) left behind."""
    f = inputs.small(tmp_path)
    before = snapshot(tmp_path)
    argv = ["run", str(f), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir"]
    with disk_fault(tmp_path, errno.ENOSPC, at=1):
        code, _, err = invoke(*argv, str(tmp_path / "a" / "b"))
    rejected(code, err, expect=2, names=f"{tmp_path / 'a' / 'b' / 'y.npy'}: write failed")
    assert not changes(before, snapshot(tmp_path))


def test_init_interrupted_while_writing(inputs: Inputs, tmp_path: Path) -> None:
    """Was: the project folder and its staged temp files left after Ctrl-C."""
    writers = make_writers(inputs)
    ran, failures = sweep(writers["init"], "SIGINT", tmp_path / "work")
    assert ran >= 2 and not failures, failures


@pytest.mark.parametrize("fault", ["ENOSPC", "SIGINT"])
def test_a_pulled_file_copied_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Was: a Ctrl-C during the copy of a mirror's file into the cache left its temp file."""
    from llmir_core.errors import InputError
    from llmir_core.registry.pull import link_or_copy

    src = tmp_path / "blob"
    src.write_bytes(b"x" * 100_000)
    cache = tmp_path / "cache"
    cache.mkdir()

    def no_link(a: object, b: object) -> None:  # another file system: copy, not link
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", no_link)
    want = KeyboardInterrupt if fault == "SIGINT" else InputError
    with disk_fault(cache, FAULTS[fault], at=1), pytest.raises(want):
        link_or_copy(src, cache / "model.safetensors")
    assert listing(cache) == set()


# -- output paths -------------------------------------------------------------------------------


def test_read_only_output_folder_for_every_writer(inputs: Inputs, tmp_path: Path) -> None:
    """The first file or folder a command creates fails: one located line, nothing written."""
    for name, w in make_writers(inputs).items():
        work = tmp_path / name.replace(" ", "_")
        work.mkdir()
        argv = w.setup(work)
        before = snapshot(work)
        with disk_fault(work, errno.EROFS, at=1):
            code, _, err = invoke(*argv)
        line = rejected(code, err, expect=2, names=str(work))
        assert "Read-only file system" in line, (name, line)
        assert not changes(before, snapshot(work)), name


def test_non_empty_output_folders_are_kept(inputs: Inputs, tmp_path: Path) -> None:
    f = inputs.small(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    code, _, err = invoke("build", str(f), "-o", str(out))
    rejected(code, err, expect=2, names=f"{out}: folder exists, is not empty")
    code, _, err = invoke("init", str(out), "--model", str(inputs.llama))
    rejected(code, err, expect=2, names=f"{out} is not empty")
    assert not changes(before, snapshot(tmp_path))


def test_symlinked_outputs(inputs: Inputs, tmp_path: Path) -> None:
    """A file output that is a link is written through (the link stays, its target is the
    output); a folder output that is a link is refused (llmir replaces output folders whole);
    a link to a folder given as a file output is refused."""
    f = inputs.small(tmp_path)
    (tmp_path / "real").mkdir()
    link = tmp_path / "o.llmir"
    link.symlink_to(tmp_path / "real" / "o.llmir")
    code, _, err = invoke("optimize", str(f), "-O2", "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "real" / "o.llmir").is_file()
    assert listing(tmp_path / "real") == {"o.llmir"}  # no temp file beside either

    fmt_link = tmp_path / "f.llmir"
    shutil.copyfile(f, tmp_path / "real" / "f.llmir")
    (tmp_path / "real" / "f.llmir").write_text(f.read_text().replace("  ", "    "))
    fmt_link.symlink_to(tmp_path / "real" / "f.llmir")
    code, _, err = invoke("fmt", "-i", str(fmt_link))
    assert code == 0, err
    canonical = invoke("fmt", str(f))[1]
    assert fmt_link.is_symlink() and (tmp_path / "real" / "f.llmir").read_text() == canonical

    (tmp_path / "dir-link").symlink_to(tmp_path / "real")
    before = snapshot(tmp_path)
    code, _, err = invoke("build", str(f), "-o", str(tmp_path / "dir-link"))
    rejected(code, err, expect=2, names=f"{tmp_path / 'dir-link'}: is a symbolic link")
    code, _, err = invoke("optimize", str(f), "-O2", "-o", str(tmp_path / "dir-link"))
    rejected(code, err, expect=2, names=f"{tmp_path / 'dir-link'}: is a folder")
    assert not changes(before, snapshot(tmp_path))
