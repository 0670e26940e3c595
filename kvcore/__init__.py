"""kvcore: the real paged KV memory system (page table, KV pool, paged allocator, radix cache).

Nothing here knows about time or SimPy; the simulator drives these objects.
"""

__version__ = "0.1.0"
