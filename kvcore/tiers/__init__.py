"""The lower KV tiers (host DRAM, storage) behind a device pool: the one tier controller
(controller.py) and the storage tier shared by replicas (shared.py); their vocabulary is
kvcore/contract/tiers.py."""
