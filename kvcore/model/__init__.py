"""The model and its memory: presets and hybrid layer layouts, config.json, state dtypes, the
memory spec, the capacity planner and the engines' hybrid planning rules by version."""
