"""Vocabulary parallelism (Megatron-LM, NeMo-RL): the LM head's logits sharded along the vocabulary,
so softmax statistics and the chosen token's logit are reduced over ranks instead of gathered."""
