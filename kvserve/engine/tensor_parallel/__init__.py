"""The engine at tensor-parallel size > 1: one engine process per rank, driven by rank 0's scheduler.

`launch` starts the ranks, `driver` is rank 0's runner, `worker` the other ranks' loop, `plan` and
`messages` what rank 0 broadcasts each step; the collectives they run are `kvserve.distributed`'s.
"""
