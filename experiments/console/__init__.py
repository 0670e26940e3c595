"""The command line's presentation: typer options built from the option fields
(command_options.py), how a command fails (command_errors.py), what it prints besides tables
(console_out.py) and docs/cli.md generated from the options (cli_reference.py)."""
