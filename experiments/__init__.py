"""experiments: the layer that runs kvsim's experiments, between the CLI and the simulator, in
folders by layer (each imports only those before it; tests/test_import_graph.py):

* options/: the options of a run (`RunOptions`, one spec per concern), the rules between them,
  their other spellings, `--engine`, experiment files, the sweep grid;
* execution/: where the cells of a sweep run, the workload they share, the progress bar;
* answers/: the use cases, each answering one question (run, sweep, compare, capacity, plan,
  calibrate, trace stats, ...) with no command-line framework (tests/experiments/
  test_answers_headless.py);
* console/: the command line's typer options and errors, what the commands print, docs/cli.md;
* validation/: the paper-reproduction suite behind `kvsim validate`.

Results are written and drawn by reports/; the simulation itself is simulator/.
"""
