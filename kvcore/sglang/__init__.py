"""SGLang's memory system: one manager for every layout (kvcore/sglang/policy.py), its radix
cache, allocators, side pools and HiCache tiers. `registered.py` names it as the `paged` and
`paged-nocache` policies (imported by kvcore/policies/__init__.py); DEVELOPERS.md maps the
modules."""
