"""experiments: the layer that runs kvsim's experiments, between the CLI and the simulator.

* options.py, config_file.py, grid.py: the options of a run (composed of one spec per
  concern), experiment files, the sweep grid;
* runner.py, executors.py: one simulation or a sweep, and where sweep cells run;
* planning.py: the `kvsim plan` page-size study;
* validation/: the paper-reproduction suite behind `kvsim validate`.

Results are written and drawn by reports/; the simulation itself is simulator/.
"""
