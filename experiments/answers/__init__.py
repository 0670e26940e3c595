"""The use cases: each module answers one question from options to result rows (one run, a
sweep, a comparison, a capacity search, a page-size plan and its recommendation, a fleet
plan, host sizing, SLO attainment, calibration, trace statistics). They import no
command-line framework and print nothing: experiments/console/ and cli.py present them."""
