"""The examples in the package's docstrings run and print what they show.

Every module of :mod:`fedsonmf` is imported (modules of an optional extra that is not
installed are skipped) and its doctests are run; a module without examples costs nothing.
"""

import doctest
import importlib
import pkgutil

import pytest

import fedsonmf


def _modules():
    names = [fedsonmf.__name__]
    for info in pkgutil.walk_packages(fedsonmf.__path__, prefix="fedsonmf."):
        names.append(info.name)
    return sorted(names)


def _examples(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional extra (flwr, h5py, ray) is not installed
        pytest.skip(f"{name}: {exc}")
    return module, doctest.DocTestFinder(exclude_empty=True).find(module)


def test_the_package_has_examples():
    found = sum(len(_examples(n)[1]) for n in _modules() if not n.startswith("fedsonmf.federation.flower"))
    assert found >= 5


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module, tests = _examples(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see above)"
