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


STATS = textwrap.dedent('''
    import sys, numpy as np
    from convgrad import kernel_cache
    if sys.argv[1:] == ["edited"]:                 # as if another file of convgrad had changed
        kernel_cache._package_stamp = lambda: (("engines/fast/microkernel.py", 0, 0),)
    import cachedmod
    cachedmod.twice(np.arange(3))
    print(len(cachedmod.twice.stats.cache_hits), len(cachedmod.twice.stats.cache_misses))
''')


def test_an_entry_is_dated_by_every_file_of_convgrad(tmp_path):
    """A cached function's machine code holds what it inlined from other modules (the
    micro-kernel's IR): an entry saved under other files of convgrad than today's is a miss,
    compiled again; under the same files, a hit."""
    (tmp_path / "cachedmod.py").write_text(MODULE.replace("DECORATOR", "kernel_cache.njit()"))
    assert _python(STATS, tmp_path) == "0 1"                                  # compiled and saved
    assert _python(STATS, tmp_path) == "1 0"                                  # loaded
    assert _python(STATS.replace("sys.argv[1:]", '["edited"]'), tmp_path) == "0 1"   # dated by the files


STRICT = textwrap.dedent('''
    import warnings, numpy as np, ml_dtypes, convgrad as cg
    from convgrad.engines.fast.plan import Plan, forced_plan
    warnings.simplefilter("error")
    with np.errstate(all="raise"):
        for dt in (ml_dtypes.bfloat16, np.float16):
            x, w = np.ones((2, 3, 5, 4), dt), np.ones((2, 3, 3, 2), dt)
            with forced_plan(Plan.of("direct", loops="general")):
                y = cg.convolution(x, w, strides=[2, 1], pads_begin=[1, 2], pads_end=[3, 1], dilations=[1, 2],
                                   data_format="NCX", weights_format="OIX")
    print(float(np.asarray(y, np.float32).max()))
''')


def test_a_first_compile_under_warnings_as_errors(tmp_path):
    """Promise 6 on a cold numba cache: numba's own warnings while it compiles (the 16-bit loads'
    ``NumbaIRAssumptionWarning``) are not raised into a caller who set warnings to errors
    (``kernel_cache.quiet``: the first 16-bit call of the direct loops failed before)."""
    assert _python(STRICT, tmp_path) == "18.0"
