"""Expert parallelism (Megatron-LM MoE, DeepEP): experts spread over ranks, so every MoE layer
sends each token to the ranks of its chosen experts and back (all-to-alls with data-dependent,
uneven sizes), and the router's statistics are reduced over ranks."""
