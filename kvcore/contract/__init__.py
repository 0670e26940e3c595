"""The contract every KV policy keeps and every layer above reads: the policy interface and its
configuration (policy.py), the optional capabilities (capabilities.py), what a policy reports
(breakdown.py), the page table (req_to_token_pool.py), the tier vocabulary (tiers.py), and the
shared plumbing of names, spec fields and argument checks (registry.py, fields.py,
validation.py)."""
