"""The eight basic collectives (NCCL's vocabulary)."""
