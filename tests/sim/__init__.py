"""The deterministic simulator of the lease and read protocol (see ``docs/simulation.md``).

One process, one asyncio loop on virtual time (:mod:`.vloop`): real ``CoordinatorCore`` s, real
``ShardReaderCore`` s and the real ``LeaseRules`` over a simulated table (:mod:`.table`), a
simulated Kinesis (:mod:`.kinesis`) and sinks (:mod:`.sinks`); faults drawn from one seed
(:mod:`.faults`), every history checked (:mod:`.checker`). ``python -m tests.sim --help``.
"""
