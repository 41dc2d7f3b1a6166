"""numba's disk cache under processes that compile at once (``microkernel._keyed``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODULE = textwrap.dedent('''
    from convgrad import kernel_cache
    from convgrad.engines.fast import microkernel

    @DECORATOR
    def twice(x):
        return x * 2 + 1
''')

SWAP = textwrap.dedent('''
    import numpy as np, cachedmod
    f = cachedmod.twice
    f(np.arange(3)), f(np.arange(3.0))           # both variants compiled and saved
    cache = f._cache._cache_file
    overloads = cache._load_index()
    keys = list(overloads)
    assert len(keys) == 2, overloads
    overloads[keys[0]], overloads[keys[1]] = overloads[keys[1]], overloads[keys[0]]
    cache._save_index(overloads)                  # what two processes racing on the index leave
''')

RUN = textwrap.dedent('''
    import numpy as np, cachedmod
    print(cachedmod.twice(np.arange(3)).tolist(), cachedmod.twice(np.arange(3.0)).tolist())
''')


def _python(code: str, where: Path) -> str:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(where / "cache"), PYTHONPATH=os.pathsep.join(
        [str(where), str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.parametrize("decorator", ["microkernel.cached_njit()", "kernel_cache.njit()"])
def test_an_index_entry_naming_another_variants_code_is_compiled_again(tmp_path, decorator):
    """numba numbers a new entry's data file from an index read without a lock: two processes
    compiling variants of one function can leave the index mapping one variant's key to the
    other's machine code. Our cached kernels store each entry's key with its data and take such
    an entry as a miss: after the index is made to swap two variants' files, a new process
    computes both correctly (it ran the float variant's code on the integers before)."""
    (tmp_path / "cachedmod.py").write_text(MODULE.replace("DECORATOR", decorator))
    _python(SWAP, tmp_path)
    assert _python(RUN, tmp_path) == "[1, 3, 5] [1.0, 3.0, 5.0]"
    assert _python(RUN, tmp_path) == "[1, 3, 5] [1.0, 3.0, 5.0]"      # and saved correct entries again
    assert any((tmp_path / "cache").rglob("*.nbi.lock"))                 # the lock beside the index
