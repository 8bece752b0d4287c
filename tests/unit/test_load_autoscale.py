"""ReaderDemand: what the pool asks of Ray's autoscaler, with fake nodes and a recorded request."""

from __future__ import annotations

from kinesis_actors.load.autoscale import ReaderDemand, fits, reader_bundle


def test_the_bundle_comes_from_the_reader_options() -> None:
    assert reader_bundle({"num_cpus": 0, "scheduling_strategy": "SPREAD"}) == {}
    assert reader_bundle({"num_cpus": 0.5, "memory": 2**30, "resources": {"kinesis_reader": 1, "zero": 0}}) == \
        {"CPU": 0.5, "memory": float(2**30), "kinesis_reader": 1.0}


def test_fits_reads_each_node_total() -> None:
    assert fits({"kinesis_reader": 1}, [{"CPU": 2}, {"CPU": 1, "kinesis_reader": 4}])
    assert not fits({"kinesis_reader": 1, "CPU": 2}, [{"CPU": 2}, {"CPU": 1, "kinesis_reader": 4}])


def test_an_unplaceable_reader_is_asked_of_the_autoscaler_and_the_request_follows_the_pool() -> None:
    nodes: list[dict[str, float]] = [{"CPU": 2}]
    sent: list[list[dict[str, float]]] = []
    demand = ReaderDemand({"kinesis_reader": 1}, nodes=lambda: nodes, request=sent.append)
    assert not demand.admit(2)
    assert sent == [[{"kinesis_reader": 1.0}] * 2] and demand.requested == 2
    assert not demand.admit(2) and len(sent) == 1  # the same request is not sent again
    nodes.append({"CPU": 1, "kinesis_reader": 4})  # the autoscaler added a node
    assert demand.admit(2) and demand.admit(3)
    assert sent[-1] == [{"kinesis_reader": 1.0}] * 3
    demand.follow(1)  # readers stopped: the request shrinks
    assert sent[-1] == [{"kinesis_reader": 1.0}]
    demand.follow(0)  # the close stopped every reader: nothing is asked any more
    assert sent[-1] == [] and demand.requested == 0


def test_nothing_is_asked_while_readers_fit_or_need_nothing() -> None:
    sent: list[object] = []
    assert ReaderDemand({}, nodes=lambda: [], request=sent.append).admit(5)
    demand = ReaderDemand({"CPU": 1}, nodes=lambda: [{"CPU": 2}], request=sent.append)
    assert demand.admit(5)
    demand.follow(3)
    demand.follow(0)
    assert sent == []


def test_failures_of_ray_never_stop_the_pool() -> None:
    def broken() -> list[dict[str, float]]:
        raise RuntimeError("GCS down")

    def refuse(_: object) -> None:
        raise RuntimeError("no autoscaler")

    assert ReaderDemand({"kinesis_reader": 1}, nodes=broken, request=refuse).admit(1)
    demand = ReaderDemand({"kinesis_reader": 1}, nodes=lambda: [], request=refuse)
    assert not demand.admit(1) and demand.requested is None


def test_the_pool_starts_no_reader_that_no_node_can_hold_and_starts_them_once_one_can() -> None:
    import asyncio

    from kinesis_actors.coordinator.pool import ReaderPool
    from kinesis_actors.coordinator.tasks import TaskSet
    from kinesis_actors.testing import FakeClock

    nodes: list[dict[str, float]] = [{"CPU": 2}]
    sent: list[list[dict[str, float]]] = []
    launched: list[int] = []

    def launch(n: int) -> object:
        launched.append(n)
        raise RuntimeError("not in this test")  # the pool drops it; only the launch matters here

    async def scenario() -> None:
        clock = FakeClock()
        counters = {"reader_start_failures": 0, "readers_replaced": 0}
        demand = ReaderDemand({"kinesis_reader": 1}, nodes=lambda: nodes, request=sent.append)

        async def nothing(*_: object) -> None:
            return None

        pool = ReaderPool(launch=launch, max_shards_per_reader=2, load=lambda _: 0,  # type: ignore[arg-type]
                          on_event=nothing, on_gone=nothing, on_ready=lambda: None, tasks=TaskSet(counters),
                          closing=lambda: False, counters=counters, clock=clock, sleep=clock.sleep, call_timeout_s=1.0,
                          start_timeout_s=1.0, retry_s=0.1, demand=demand)
        pool.grow(4)  # pool size 3
        assert launched == [] and sent == [[{"kinesis_reader": 1.0}] * 3]
        nodes.append({"kinesis_reader": 4})
        pool.grow(4)
        await asyncio.sleep(0)
        assert launched == [1, 2, 3]
        for _ in range(20):  # the failing starts are dropped: the request follows the pool down
            await asyncio.sleep(0)
        assert sent[-1] == []

    asyncio.run(scenario())
