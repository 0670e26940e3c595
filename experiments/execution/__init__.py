"""How the cells of an answer run: where (executors.py: local processes or Dask), with one
parsed workload shared by the cells (shared.py), and a progress bar over their requests
(progress.py)."""
