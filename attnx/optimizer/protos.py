"""Small operations on ONNX protos that the graph transformations share."""

from __future__ import annotations

import contextlib
import heapq
import logging
from collections.abc import Iterator

import onnx

from attnx.exporter.layout import reads


def topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its graph's nodes in an order where every value is made before it is read (ONNX
    Runtime accepts any order, the checker does not), otherwise in their order; a node's subgraphs
    count as reading what they read."""
    nodes = list(model.graph.node)
    producer = {name: index for index, node in enumerate(nodes) for name in node.output if name}
    users: list[list[int]] = [[] for _ in nodes]
    waiting = []
    for index, node in enumerate(nodes):
        needs = {producer[name] for name in reads(node) if name in producer}
        for need in needs:
            users[need].append(index)
        waiting.append(len(needs))
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(nodes[index])
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        raise RuntimeError(f"the graph {model.graph.name} has a cycle")
    del model.graph.node[:]
    model.graph.node.extend(order)
    return model


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node of ``model``'s graph a name (ONNX Runtime's tools tell nodes apart by it)."""
    for index, node in enumerate(model.graph.node):
        node.name = node.name or f"attnx_node_{index}"


@contextlib.contextmanager
def quiet_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
