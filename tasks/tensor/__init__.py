"""Tensor parallelism (Megatron-LM): one layer's weights split over ranks, so every linear layer
either gathers its sharded outputs or sums its partial outputs, on the critical path of every
forward and backward pass."""
