"""Reader demand for Ray's autoscaler: ask for nodes that can hold a reader, never start machines.

A ``ShardReader`` needs the resources of its ``reader_options`` (``num_cpus``, ``num_gpus``,
``memory``, ``resources``). When no alive node has them (a worker group with a
``kinesis_reader`` resource scaled to zero, say), creating the actor would leave it pending
with nothing in Ray's terms saying why. Instead, before each reader is started,
:class:`ReaderDemand` checks the nodes' total resources; when none can hold one, the reader is
not created yet and the whole pool's demand goes to the autoscaler with
``ray.autoscaler.sdk.request_resources(bundles=[bundle] * readers)``, which asks the
autoscaler (the cluster launcher's or KubeRay's) to keep room for those bundles. Ray's
autoscaler then adds nodes of a type that has the resources; the pool starts the reader at a
later upkeep, once a node can hold it. Shards wait on the readers that exist meanwhile.

The request is a floor on the cluster's capacity (the bundles must fit, counting what already
runs), not a queue: each call replaces the last, whoever makes it, as Ray keeps one request
per cluster. Once made, it follows the pool's size as readers start and stop
(:meth:`ReaderDemand.follow`), down to no bundle at all when the close has stopped every
reader, so the autoscaler may remove the idle nodes after its ``idle_timeout_minutes``.
Nothing is requested for readers that need no resources (the default ``num_cpus=0``) or
while every reader can be placed.

Because the request is one per cluster, this demand is only right while it is the cluster's
only caller of ``request_resources``: another subscription's Coordinator in the same cluster
(each has a :class:`ReaderDemand`), or Ray Data's executions (which sum their own requests in
one actor per cluster), replace it, and a close here clears theirs. A replaced request is
sent again only when this pool's size changes. Summing the callers would need such a
shared actor, which this library does not run (instances share only the lease table). Only
resources are matched: a reader's ``label_selector`` is not part of its bundle, so a node of
the right shape without the labels counts as able to hold it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["reader_bundle", "fits", "ReaderDemand"]

log = logging.getLogger("kinesis_actors.coordinator")

Bundle = dict[str, float]


def reader_bundle(options: Mapping[str, Any]) -> Bundle:
    """One reader's resource bundle from its Ray actor options: ``CPU`` (``num_cpus``), ``GPU``
    (``num_gpus``), ``memory`` (bytes) and the custom ``resources``; zero entries are left out."""
    bundle: Bundle = {}
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
        value = options.get(key)
        if value:
            bundle[name] = float(value)
    for name, value in dict(options.get("resources") or {}).items():
        if value:
            bundle[name] = float(value)
    return bundle


def fits(bundle: Mapping[str, float], nodes: Iterable[Mapping[str, float]]) -> bool:
    """Whether one of ``nodes`` (each node's total resources) has every amount ``bundle`` asks."""
    return any(all(node.get(name, 0.0) >= amount for name, amount in bundle.items()) for node in nodes)


def _ray_nodes() -> list[dict[str, float]]:
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]  # Ray leaves it untyped
    return [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive")]


def _ray_request(bundles: list[Bundle]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)


class ReaderDemand:
    """What one Coordinator asks of Ray's autoscaler for its readers (rules in the module docstring).

    Args:
        bundle: one reader's resources (:func:`reader_bundle`).
        nodes: the alive nodes' total resources (default: ``ray.nodes()``).
        request: sends the bundles to the autoscaler (default:
            ``ray.autoscaler.sdk.request_resources(bundles=...)``).

    Attributes:
        requested: readers asked for now (None: no request made yet).

    No method raises: a failed node look-up admits the reader, a failed request is logged
    and sent again by the next call that needs it (:attr:`requested` keeps the last one sent).
    """

    def __init__(self, bundle: Mapping[str, float], *, nodes: Callable[[], list[dict[str, float]]] = _ray_nodes,
                 request: Callable[[list[Bundle]], None] = _ray_request) -> None:
        self.bundle: Bundle = dict(bundle)
        self._nodes, self._request = nodes, request
        self.requested: int | None = None

    def admit(self, readers: int) -> bool:
        """Whether a new reader can be started now, the pool then having ``readers``. When no
        node can hold one, the autoscaler is asked for ``readers`` bundles and False returned;
        a request made earlier follows ``readers`` either way. A failed look-up of the nodes
        admits the reader (Ray then places it when it can)."""
        if not self.bundle:
            return True
        try:
            ok = fits(self.bundle, self._nodes())
        except Exception as e:  # the GCS did not answer: start the actor; Ray queues it
            log.info("could not list the nodes (%r); starting the reader anyway", e)
            return True
        if not ok or self.requested is not None:
            self._ask(readers)
        if not ok:
            log.info("no node has a reader's resources %s; asked the autoscaler for %d readers", self.bundle, readers)
        return ok

    def follow(self, readers: int) -> None:
        """The pool now has ``readers``: lower (or raise) a request made earlier to match
        (0, once the close stopped every reader: an empty request)."""
        if self.requested is not None and readers != self.requested:
            self._ask(readers)

    def _ask(self, readers: int) -> None:
        if readers == self.requested:
            return
        try:
            self._request([dict(self.bundle) for _ in range(max(0, readers))])
            self.requested = readers
        except Exception as e:  # no autoscaler reachable: readers wait for nodes another way
            log.warning("request_resources failed (%r); readers wait for a node that has %s", e, self.bundle)
