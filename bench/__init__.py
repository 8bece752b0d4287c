"""Benchmarks of kinesis_actors, side by side with the raw limit (issue 9).

One command runs them all and writes ``bench/results.json``::

    python -m bench            # default run (~10 min on 2 cores)
    python -m bench --quick    # tiny input, for a smoke test (~2 min)
    make bench                 # the same as `python -m bench` ($(BENCH_ARGS) passed on)

Sections (``--only``/``--skip`` take their names): ``throughput`` (4 shards of 1 KB
records from TRIM_HORIZON: the product into a counting actor vs raw boto3 single-process
and thread-per-shard drains, plus the ``peer`` async-kinesis from its own virtualenv),
``latency`` (50 rec/s for 30 s, publish -> sink), ``memory`` (USS per ShardReader process
of the pool at rest and under load, the Coordinator pass over 1,000 lease rows),
``failover`` (crash, close, process SIGKILL, SIGKILL of one pool reader -> its shards on
live readers), ``scale`` (16 to 1,000 shards on one node: subscribe and delivery times, USS
per shard, idle request rates, ``max_shards_per_reader`` 1 and a cap sweep, a DynamoDB lease
table at 1,000), ``peer_kcl_rs`` (ours beside kcl-rs, KCL v3 in Rust, from its own virtualenv
``bench/.venv-kclrs``, and async-kinesis and raw boto3: start, throughput, CPU, memory per shard,
crash failover, graceful stop and balancing of two workers; ``python -m bench.peer_kcl_rs``
prints its table), ``skew`` (two hot shards with a CPU-costly ``record_filter``: drain time
under placement by load against count placement and a pool sized by hand, the time from a
reader passing ``reader_target_cpu`` to the move), ``skew_balance`` (two instances and one super-hot
shard of 8 by load and by count: the hot owner's other leases, lease moves in steady load, lease-table
writes; a reader SIGKILL's re-spread), ``demo`` (``kinesis-actors demo`` wall time split).

Every figure in ``results.json`` has ``name``, ``value``, ``unit``, ``anchor`` (what it is
compared to), ``anchor_value``, ``ratio`` (value / anchor_value), ``goal`` and ``goal_met``.
``python -m bench.report`` prints the Markdown table the docs show (``--docs`` writes the site's benchmark page).
"""
