"""The type stubs nanobind's stubgen writes at build time ship beside the module and say what
the functions take and return."""
import pathlib

import kiln


def stub_text():
    path = pathlib.Path(kiln._kiln.__file__).with_name("_kiln.pyi")
    assert path.is_file(), f"no stubs beside {kiln._kiln.__file__}"
    return path.read_text()


def test_stubs_name_the_types():
    s = stub_text()
    assert "def relu(x: Sym) -> Sym" in s
    assert "def add(a: Sym | float, b: Sym | float) -> Sym" in s
    assert "def input(self, name: str, type: object) -> Sym" in s
    assert "-> dict[str, numpy.ndarray]" in s.split("def __call__(self", 1)[1].split("\n", 1)[0]
    assert "import numpy" in s
    assert "object" not in s.split("def matmul(", 1)[1].split("\n", 1)[0]


def test_help_is_useful():
    doc = kiln.compile.__doc__
    assert "threads" in doc and "target" in doc
    assert kiln.relu.__doc__ and kiln.Tracer.input.__doc__
