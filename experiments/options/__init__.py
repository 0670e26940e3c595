"""The options of a run and how they are given: `RunOptions`, one frozen spec per concern
(run_options.py), the rules between options (option_rules.py), their other spellings
(spellings.py), `--engine`'s defaults (engines.py), experiment files (config_file.py) and the
sweep grid (grid.py). No command-line framework here: the console reads these."""
