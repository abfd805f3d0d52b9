"""Pipeline parallelism (GPipe, Megatron-LM, PipeDream 1F1B): consecutive layers on consecutive
ranks, activations and their gradients passed point-to-point between stages per micro-batch."""
