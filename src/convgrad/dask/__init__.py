"""convgrad on Dask (the ``convgrad[dask]`` extra): ops on dask arrays and batches on a cluster.

- :mod:`convgrad.dask.arrays`: every op (``Op.__call__`` and the functional API) on dask array
  inputs returns a lazy dask array, chunked along the batch and the spatial axes.
- :mod:`convgrad.dask.blocks`: how a convolution splits into stride-aligned blocks with halos.
- :mod:`convgrad.dask.cluster`: ``convgrad graph|conv --scheduler=...`` runs a batch's cases as
  tasks on a ``dask.distributed`` cluster.

The rest of convgrad never imports this package (nor dask): an op comes here only when one of
its inputs is a dask array.
"""

from ..extras import missing_extra

try:
    import dask.array  # noqa: F401  (the extra's libraries, checked once here)
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "dask", "dask") from exc
