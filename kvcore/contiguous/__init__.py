"""The contiguous policies (Orca's Max, Pow2 and Oracle reservations): one slot range per
request (policy.py), placed in the address space by a placement (placement.py)."""
