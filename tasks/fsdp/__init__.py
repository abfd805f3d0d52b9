"""Fully sharded data parallelism (PyTorch FSDP, DeepSpeed ZeRO): parameters, gradients and optimizer
state sharded over the data-parallel ranks, gathered for use and reduce-scattered after."""
