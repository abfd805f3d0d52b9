"""The runner keeps a round's prepared layouts (and so a graph block's CUDA graph) across rounds."""

from __future__ import annotations

import torch

from pkb_tui.engine import channel
from pkb_tui.engine.runner import Runner


def _specs(calls: int) -> tuple[list, list]:
    layout = channel.Layout()
    inputs = [layout.place((torch.zeros(4),)) for _ in range(calls)]
    outputs = [layout.place(torch.zeros(4)) for _ in range(calls)]
    return inputs, outputs


def test_a_rounds_three_layouts_are_prepared_once_and_reused_every_later_round() -> None:
    runner = Runner({"rank": 0, "world_size": 1, "mode": "cpu", "device": "cpu"}, -1, -1, None)
    runner.arena = torch.zeros(1 << 16, dtype=torch.uint8)
    # A round as the judge sends it: the eager block, the graph block (inputs of its own), a call alone.
    layouts = {"eager": _specs(5), "graph": _specs(40), "single": _specs(1)}
    built = []
    for round_index in range(3):
        for key, (inputs, outputs) in layouts.items():
            reply = runner.op_prepare({"inputs": inputs, "outputs": outputs, "key": key})
            if not reply["same"]:
                built.append((round_index, key))
            runner.graphs = runner.graphs or {False: f"graph of {key}"}  # what a capture would leave
            assert len(runner.inputs) == len(inputs)
    assert built == [(0, "eager"), (0, "graph"), (0, "single")]  # rounds 1 and 2 rebuilt nothing
    runner.op_prepare({"inputs": layouts["graph"][0], "outputs": layouts["graph"][1], "key": "graph"})
    assert runner.graphs == {False: "graph of graph"}  # the graph block's own graph came back with it
