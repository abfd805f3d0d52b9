"""Sequence parallelism (Megatron-LM, Korthikanti et al. 2022): activations outside the
tensor-parallel GEMMs split along the tokens, so norms and residuals run on a shard and their
inputs and weight gradients meet the rest of the group through reduce-scatters and all-reduces."""
