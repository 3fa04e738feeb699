"""The entry's one home, ``hpctrain._entry``: parse ``module:function``, find its file and package without importing
anything, find it in a rebuilt tree, import it on the node. identity, submit, launch and bundle all use these."""

from __future__ import annotations

import sys

import pytest

import hpctrain._entry as entry_mod
from hpctrain._entry import entry_location, import_root, load_entry, module_file, split_entry
from hpctrain.errors import UsageError


@pytest.fixture
def userpkg(tmp_path, monkeypatch):
    (tmp_path / "userpkg" / "sub").mkdir(parents=True)
    (tmp_path / "userpkg" / "__init__.py").write_text("def main(ctx):\n    return 'pkg'\n")
    (tmp_path / "userpkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "sub" / "train.py").write_text("class C:\n    def run(ctx):\n        return 'run'\nx = 3\n")
    (tmp_path / "top.py").write_text("def main(ctx):\n    return 'top'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("userpkg", "top")]:
        del sys.modules[name]


def test_split_entry_names_entry_on_every_bad_form():
    assert split_entry("a.b:c.d") == ("a.b", "c.d")
    for bad in ("a.b", ":f", "a:", "a-b:f", "a:f-g", "x" * 1001):
        with pytest.raises(UsageError, match="--entry"):
            split_entry(bad)


def test_entry_location_finds_file_and_package_root_importing_nothing(userpkg):
    train = userpkg / "userpkg" / "sub" / "train.py"
    assert entry_location("userpkg.sub.train:C.run") == (train, userpkg / "userpkg", "")
    assert entry_location("userpkg:main") == (userpkg / "userpkg" / "__init__.py", userpkg / "userpkg", "")
    assert entry_location("top:main") == (userpkg / "top.py", userpkg / "top.py", "")
    assert "userpkg" not in sys.modules and "top" not in sys.modules
    file, root, why = entry_location("userpkg.nope:main")
    assert file is None and root is None and "no module named 'userpkg.nope'" in why
    assert entry_location("not an entry")[2].startswith("--entry")


def test_import_root_and_module_file_find_the_entry_in_a_tree(userpkg):
    train = userpkg / "userpkg" / "sub" / "train.py"
    assert import_root(train, "userpkg.sub.train") == userpkg
    assert import_root(userpkg / "userpkg" / "__init__.py", "userpkg") == userpkg
    assert import_root(userpkg / "top.py", "top") == userpkg
    with pytest.raises(IndexError):
        import_root("train.py", "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q")
    assert module_file(userpkg, "userpkg.sub.train") == train
    assert module_file(userpkg, "userpkg") == userpkg / "userpkg" / "__init__.py"
    assert module_file(userpkg, "userpkg.nope") is None


def test_load_entry_imports_and_checks_callable(userpkg):
    assert load_entry("userpkg.sub.train:C.run")(None) == "run"
    assert load_entry("userpkg:main")(None) == "pkg"
    with pytest.raises(UsageError, match="is not callable"):
        load_entry("userpkg.sub.train:x")
    with pytest.raises(UsageError, match="has no attribute 'nope'"):
        load_entry("userpkg.sub.train:nope")
    with pytest.raises(UsageError, match="importing 'userpkg.gone' failed: ModuleNotFoundError"):
        load_entry("userpkg.gone:main")


def test_the_entry_has_one_home():
    """submit, launch and identity use the ground floor's helpers rather than their own copies."""
    import hpctrain.identity.code as code
    import hpctrain.launch.runner as runner
    import hpctrain.submit.entry as submit_entry

    assert code.entry_location is entry_mod.entry_location
    assert runner.load_entry is entry_mod.load_entry
    assert submit_entry.find_module_file is entry_mod.find_module_file
    assert submit_entry.__all__ == ["check_entry_static", "check_entry_imports"]
